use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;
use inoutbox::OutboxEvent as _;

// The business key on the event (either form) ...
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CreditGranted", topic = "accounts", key = account, idempotency_key = operation_id)]
pub struct CreditGranted {
    pub account: u64,
    pub operation_id: uuid::Uuid,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "DebitBooked", topic = "accounts")]
pub struct DebitBooked {
    #[outbox(idempotency_key)]
    pub request: String,
    pub transfer_no: u64,
}

#[inbox_handler(event = "CreditGranted", group = "ledger")]
async fn credit(_event: CreditGranted, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

// ... or on the handler, also of a batch handler, and also for an event that has one.
#[inbox_handler(event = "DebitBooked", group = "ledger", dedup_by = transfer_no)]
async fn debit(_event: DebitBooked, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(event = "DebitBooked", group = "audit", batch, dedup_by = r#transfer_no)]
async fn audit(_events: Vec<DebitBooked>, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

// Two event types of one group in one key space: a chargeback and a refund request of one
// order are one operation. By default each event type has its own.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "ChargebackOpened", topic = "disputes")]
pub struct ChargebackOpened {
    pub order_id: u64,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "RefundRequested", topic = "disputes")]
pub struct RefundRequested {
    pub order_id: u64,
}

#[inbox_handler(event = "ChargebackOpened", group = "disputes", dedup_by = order_id, dedup_scope = "disputes")]
async fn chargeback(_event: ChargebackOpened, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(event = "RefundRequested", group = "disputes", dedup_by = order_id, dedup_scope = "disputes")]
async fn refund(_event: RefundRequested, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

// A shared scope for the event's own `idempotency_key`.
#[inbox_handler(event = "CreditGranted", group = "credits", dedup_scope = "operations")]
async fn credit_once(_event: CreditGranted, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {
    let event = CreditGranted { account: 7, operation_id: uuid::Uuid::nil() };
    assert_eq!(event.idempotency_key(), Some(uuid::Uuid::nil().to_string()));
    assert_eq!(CreditGranted::IDEMPOTENCY_KEY, Some("operation_id"));
    let debit = DebitBooked { request: "r-1".into(), transfer_no: 1 };
    assert_eq!(debit.idempotency_key().as_deref(), Some("r-1"));
}
