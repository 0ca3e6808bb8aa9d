use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", event_type = "OrderPlaced")]
pub struct OrderCreated {
    pub order_id: u64,
}

fn main() {}
