use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize)]
pub struct OrderId(u64);

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: OrderId,
}

fn main() {}
