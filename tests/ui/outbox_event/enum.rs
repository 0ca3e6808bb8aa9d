use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Order", topic = "orders")]
pub enum OrderEvent {
    Created { order_id: u64 },
    Cancelled { order_id: u64 },
}

fn main() {}
