// Both macros with `crate = "..."`: the generated code names `my_inoutbox::__private`, the path
// this crate reaches inoutbox by (a crate re-exporting inoutbox would pass its own path).
extern crate inoutbox as my_inoutbox;

use my_inoutbox::{inbox_handler, HandlerError, OutboxEvent, PgTx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id, crate = "my_inoutbox")]
pub struct OrderCreated {
    pub order_id: u64,
}

mod billing {
    use super::*;

    #[inbox_handler(event = "OrderCreated", group = "billing", crate = "my_inoutbox")]
    pub async fn create_invoice(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {
    let event = OrderCreated { order_id: 7 };
    assert_eq!(event.key().as_deref(), Some("7"));
    let registered = my_inoutbox::__private::registrations()
        .any(|r| r.name.ends_with("billing::create_invoice") && r.group == "billing");
    assert!(registered, "the handler is registered");
}
