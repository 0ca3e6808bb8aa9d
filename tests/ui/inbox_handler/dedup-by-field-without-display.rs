use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CreditGranted", topic = "accounts", key = account)]
pub struct CreditGranted {
    pub account: u64,
    pub operation_id: uuid::Uuid,
    pub lines: Vec<u8>,
}

// A field whose type has no `Display` cannot be a business key.
#[inbox_handler(event = "CreditGranted", group = "ledger", dedup_by = lines)]
async fn credit(_event: CreditGranted, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
