// A service that depends on another sqlx major than inoutbox's: its `sqlx::Transaction` is
// another type than inoutbox's `PgTx`, and the error says which sqlx inoutbox needs.
use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(
    _event: OrderCreated,
    _tx: &mut sqlx_0_8::Transaction<'_, sqlx_0_8::Postgres>,
) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
