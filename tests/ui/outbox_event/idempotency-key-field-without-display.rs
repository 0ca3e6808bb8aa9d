use serde::{Deserialize, Serialize};
use inoutbox::OutboxEvent;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CreditGranted", topic = "accounts", idempotency_key = lines)]
pub struct CreditGranted {
    pub account: u64,
    pub lines: Vec<u8>,
}

fn main() {}
