// `#[outbox(key)]` on a field is the same as `key = field` on the struct; likewise
// `#[outbox(aggregate_id)]`.
use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderShipped", topic = "shipping")]
pub struct OrderShipped {
    #[outbox(aggregate_id)]
    pub order_id: u64,
    #[outbox(key)]
    pub customer_id: String,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderPaid", topic = "payments", key = order_id)]
pub struct OrderPaid {
    // Both forms naming the same field agree.
    #[outbox(key)]
    pub order_id: u64,
}

fn main() {
    let shipped = OrderShipped { order_id: 42, customer_id: "c-7".to_owned() };
    assert_eq!(shipped.key().as_deref(), Some("c-7"));
    assert_eq!(shipped.aggregate_id().as_deref(), Some("42"));
    assert_eq!(OrderPaid { order_id: 3 }.key().as_deref(), Some("3"));
}
