use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCancelled", topic = "orders", key = order_id)]
pub struct OrderCancelled {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(event = "OrderCancelled", group = "billing")]
async fn cancel_invoice(_event: OrderCancelled, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(event = "OrderCreated", group = "shipping")]
async fn prepare_shipment(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[allow(dead_code)]
async fn call_directly(tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    create_invoice(OrderCreated { order_id: 1 }, tx).await?;
    cancel_invoice(OrderCancelled { order_id: 1 }, tx).await?;
    prepare_shipment(OrderCreated { order_id: 1 }, tx).await
}

fn main() {}
