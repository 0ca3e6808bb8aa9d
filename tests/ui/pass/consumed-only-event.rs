// A service that only consumes `OrderPlaced` declares its event type and nothing of
// publishing: no topic, no key.
use serde::Deserialize;
use inoutbox::prelude::*;
use inoutbox::InboxEvent as _;

#[derive(Debug, Deserialize, InboxEvent)]
#[inbox(event_type = "OrderPlaced")]
pub struct OrderPlaced {
    pub order_id: u64,
}

#[derive(Debug, Deserialize, InboxEvent)]
#[inbox(event_type = "OrderCancelled", idempotency_key = order_id)]
pub struct OrderCancelled {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderPlaced", group = "payments", dedup_by = order_id)]
async fn capture(_event: OrderPlaced, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(event = "OrderCancelled", group = "payments")]
async fn refund(_event: OrderCancelled, _tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {
    assert_eq!(OrderPlaced::EVENT_TYPE, "OrderPlaced");
    assert_eq!(OrderCancelled::IDEMPOTENCY_KEY, Some("order_id"));
    let cancelled = OrderCancelled { order_id: 7 };
    assert_eq!(cancelled.idempotency_key().as_deref(), Some("7"));
}
