use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event = "OrderCreated", topic = "orders")]
pub struct OrderCreated {
    pub order_id: u64,
}

fn main() {}
