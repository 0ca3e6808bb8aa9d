use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CreditGranted", topic = "accounts")]
pub struct CreditGranted {
    #[outbox(idempotency_key)]
    pub operation_id: uuid::Uuid,
    #[outbox(idempotency_key)]
    pub request_id: uuid::Uuid,
}

fn main() {}
