use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: i64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)")
        .bind(event.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

fn main() {}
