use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct OrderCancelled {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCancelled", group = "billing")]
async fn cancel_invoice(_event: OrderCancelled, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
