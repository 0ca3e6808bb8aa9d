use inoutbox::prelude::*;

mod events {
    use serde::{Deserialize, Serialize};
    use inoutbox::OutboxEvent;

    #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
    #[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
    pub struct OrderCreated {
        pub order_id: u64,
    }
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: events::OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    let _ = event.order_id;
    Ok(())
}

#[inbox_handler(event = "OrderCreated", group = "shipping")]
async fn ship(event: crate::events::OrderCreated, _tx: &mut inoutbox::PgTx<'_>) -> Result<(), inoutbox::HandlerError> {
    let _ = event.order_id;
    Ok(())
}

#[allow(dead_code)]
async fn call_directly(tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    create_invoice(events::OrderCreated { order_id: 1 }, tx).await?;
    ship(events::OrderCreated { order_id: 1 }, tx).await
}

fn main() {}
