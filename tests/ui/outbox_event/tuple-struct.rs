use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders")]
pub struct OrderCreated(pub u64, pub i64);

fn main() {}
