use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id, aggregate_id = id)]
pub struct OrderCreated {
    pub order_id: u64,
}

fn main() {}
