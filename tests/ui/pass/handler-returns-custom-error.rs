use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders")]
pub struct OrderCreated {
    pub order_id: u64,
}

#[derive(Debug)]
pub enum BillingError {
    Rejected(u64),
}

impl std::fmt::Display for BillingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BillingError::Rejected(id) => write!(f, "order {id} rejected"),
        }
    }
}

impl std::error::Error for BillingError {}

type BillingResult = Result<(), BillingError>;

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), BillingError> {
    if event.order_id == 0 {
        return Err(BillingError::Rejected(event.order_id));
    }
    Ok(())
}

// A type alias for the result works too: the check is on the type, not its spelling.
#[inbox_handler(event = "OrderCreated", group = "audit")]
async fn audit(event: OrderCreated, _tx: &mut PgTx<'_>) -> BillingResult {
    let _ = event;
    Ok(())
}

#[allow(dead_code)]
async fn call_directly(tx: &mut PgTx<'_>) -> Result<(), BillingError> {
    create_invoice(OrderCreated { order_id: 1 }, tx).await?;
    audit(OrderCreated { order_id: 1 }, tx).await
}

fn main() {}
