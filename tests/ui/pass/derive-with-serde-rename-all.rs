use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[serde(rename_all = "camelCase")]
#[outbox(event_type = "order.created.v1", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
    pub total_cents: i64,
}

fn main() {
    let event = OrderCreated { order_id: 7, total_cents: 250 };
    assert_eq!(OrderCreated::EVENT_TYPE, "order.created.v1");
    assert_eq!(event.key().as_deref(), Some("7"));
    // The key names the Rust field; the wire format follows serde.
    let json = serde_json::to_string(&event).unwrap();
    assert_eq!(json, r#"{"orderId":7,"totalCents":250}"#);
}
