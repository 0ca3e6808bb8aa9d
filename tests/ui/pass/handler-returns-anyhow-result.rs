use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders")]
pub struct OrderCreated {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: OrderCreated, _tx: &mut PgTx<'_>) -> anyhow::Result<()> {
    anyhow::ensure!(event.order_id != 0, "order id 0");
    Ok(())
}

#[allow(dead_code)]
async fn call_directly(tx: &mut PgTx<'_>) -> anyhow::Result<()> {
    create_invoice(OrderCreated { order_id: 1 }, tx).await
}

fn main() {}
