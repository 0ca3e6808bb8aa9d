use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order)]
pub struct OrderCreated {
    pub order_id: u64,
    pub total_cents: i64,
}

fn main() {}
