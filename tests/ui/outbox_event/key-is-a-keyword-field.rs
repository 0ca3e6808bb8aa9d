use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "TicketOpened", topic = "tickets", key = type)]
pub struct TicketOpened {
    pub r#type: String,
}

fn main() {}
