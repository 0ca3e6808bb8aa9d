use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders")]
pub struct OrderCreated {
    pub order_id: u64,
}

/// Doc comments, lint attributes and visibility stay on the function as written.
#[inbox_handler(event = "OrderCreated", group = "billing")]
#[allow(clippy::needless_return)]
pub(crate) async fn create_invoice(
    OrderCreated { order_id }: OrderCreated,
    _tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    if order_id == 0 {
        return Err(HandlerError::permanent("order id 0"));
    }
    return Ok(());
}

fn main() {
    // A handler is an ordinary async fn: it can be named as a value.
    let _f = create_invoice;
}
