use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

// The only error is on the derive: the handler naming the type reports nothing more.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
