use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated")]
pub struct OrderCreated {
    #[outbox(topic = "orders")]
    pub order_id: u64,
}

fn main() {}
