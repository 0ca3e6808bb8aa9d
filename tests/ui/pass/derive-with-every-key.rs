use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(
    event_type = "OrderShipped",
    topic = "shipping-events",
    key = customer_id,
    aggregate_type = "Order",
    aggregate_id = order_id
)]
pub struct OrderShipped {
    pub order_id: uuid::Uuid,
    pub customer_id: String,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Heartbeat", topic = "ops")]
pub struct Heartbeat {
    pub at: i64,
}

fn main() {
    let id = uuid::Uuid::nil();
    let event = OrderShipped { order_id: id, customer_id: "c-42".to_owned() };
    assert_eq!(OrderShipped::EVENT_TYPE, "OrderShipped");
    assert_eq!(OrderShipped::TOPIC, "shipping-events");
    assert_eq!(OrderShipped::AGGREGATE_TYPE, Some("Order"));
    assert_eq!(event.key().as_deref(), Some("c-42"));
    assert_eq!(event.aggregate_id(), Some(id.to_string()));

    // Without `key`, there is no key and no aggregate.
    let beat = Heartbeat { at: 1 };
    assert_eq!(beat.key(), None);
    assert_eq!(beat.aggregate_id(), None);
    assert_eq!(Heartbeat::AGGREGATE_TYPE, None);
}
