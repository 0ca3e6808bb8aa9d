use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CreditGranted", topic = "accounts", key = account, idempotency_key = operation)]
pub struct CreditGranted {
    pub account: u64,
    pub operation_id: uuid::Uuid,
}

fn main() {}
