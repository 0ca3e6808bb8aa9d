// A field named with a raw identifier is named the same way in the attribute.
use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "TicketOpened", topic = "tickets", key = r#type)]
pub struct TicketOpened {
    pub r#type: String,
}

fn main() {
    let event = TicketOpened { r#type: "bug".to_owned() };
    assert_eq!(event.key().as_deref(), Some("bug"));
}
