use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
    pub total_cents: i64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    let _ = (event.order_id, &mut **tx, &meta.event_id, meta.attempt);
    Ok(())
}

#[allow(dead_code)]
async fn call_directly(tx: &mut PgTx<'_>, meta: &MessageMeta) -> Result<(), HandlerError> {
    create_invoice(OrderCreated { order_id: 1, total_cents: 100 }, tx, meta).await
}

fn main() {}
