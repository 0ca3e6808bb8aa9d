use serde::Serialize;
use inoutbox::prelude::*;

#[derive(Debug, Serialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}


fn main() {}
