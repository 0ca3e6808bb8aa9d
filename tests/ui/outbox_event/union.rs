use inoutbox::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders")]
pub union OrderCreated {
    pub order_id: u64,
    pub legacy_id: i64,
}

fn main() {}
