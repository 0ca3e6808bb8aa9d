use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: uuid::Uuid,
    pub total_cents: i64,
}

// The example of the reference docs (src/docs/inbox_handler.md): one statement for the batch.
#[inbox_handler(event = "OrderCreated", group = "billing", batch)]
async fn create_invoices(
    events: Vec<OrderCreated>,
    tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    let orders: Vec<uuid::Uuid> = events.iter().map(|e| e.order_id).collect();
    let totals: Vec<i64> = events.iter().map(|e| e.total_cents).collect();
    sqlx::query(
        "INSERT INTO invoices (order_id, total_cents) \
         SELECT * FROM unnest($1::uuid[], $2::int8[])",
    )
    .bind(&orders)
    .bind(&totals)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// With the metadata, one per event, and another error type; the full path of `Vec` works too.
#[inbox_handler(event = "OrderCreated", group = "audit", batch)]
async fn audit_orders(
    events: std::vec::Vec<OrderCreated>,
    tx: &mut PgTx<'_>,
    metas: &[MessageMeta],
) -> anyhow::Result<()> {
    for (event, meta) in events.iter().zip(metas) {
        let _ = (event.order_id, &meta.event_id, meta.attempt, &mut **tx);
    }
    Ok(())
}

fn event() -> OrderCreated {
    OrderCreated {
        order_id: uuid::Uuid::nil(),
        total_cents: 100,
    }
}

#[allow(dead_code)]
async fn call_directly(tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    create_invoices(vec![event(), event()], tx).await
}

#[allow(dead_code)]
async fn call_directly_with_metadata(tx: &mut PgTx<'_>, meta: &MessageMeta) -> anyhow::Result<()> {
    audit_orders(vec![event()], tx, std::slice::from_ref(meta)).await
}

fn main() {}
