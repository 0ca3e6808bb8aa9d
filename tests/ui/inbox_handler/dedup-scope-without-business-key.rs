use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCancelled", topic = "orders", key = order_id)]
pub struct OrderCancelled {
    pub order_id: u64,
}

// A scope for keys the handler does not have: `dedup_by` is missing.
#[inbox_handler(event = "OrderCancelled", group = "payments", dedup_scope = "orders")]
async fn refund(_event: OrderCancelled, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
