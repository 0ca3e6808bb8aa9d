// Both macros with `crate = "..."`: the generated code names `my_txbox::__private`, the path
// this crate reaches txbox by (a crate re-exporting txbox would pass its own path).
extern crate txbox as my_txbox;

use my_txbox::{inbox_handler, HandlerError, OutboxEvent, PgTx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id, crate = "my_txbox")]
pub struct OrderCreated {
    pub order_id: u64,
}

mod billing {
    use super::*;

    #[inbox_handler(event = "OrderCreated", group = "billing", crate = "my_txbox")]
    pub async fn create_invoice(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {
    let event = OrderCreated { order_id: 7 };
    assert_eq!(event.key().as_deref(), Some("7"));
    let registered = my_txbox::__private::registrations()
        .any(|r| r.name.ends_with("billing::create_invoice") && r.group == "billing");
    assert!(registered, "the handler is registered");
}
