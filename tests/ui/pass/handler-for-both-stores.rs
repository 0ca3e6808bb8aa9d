use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: i64,
}

// One handler for both stores: written once, generic over the store, with `inoutbox::sql`
// statements and chained outbox events; the metadata parameter works as usual.
#[inbox_handler(event = "OrderCreated", group = "billing", stores(postgres, sqlite))]
async fn create_invoice<D: Db>(
    event: OrderCreated,
    tx: &mut Tx<'_, D>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    let done = inoutbox::sql("UPDATE orders SET invoiced = $1 WHERE id = $2")
        .bind(meta.attempt as i64)
        .bind(event.order_id)
        .execute(tx)
        .await?;
    let _row = inoutbox::sql("SELECT id FROM orders WHERE id = $1").bind(event.order_id).fetch_optional(&mut *tx).await?;
    if done == 1 {
        inoutbox::outbox::enqueue(tx, &event).await?;
    }
    Ok(())
}

// A batch handler for both stores.
#[inbox_handler(event = "OrderCreated", group = "audit", batch, stores(sqlite, postgres))]
async fn audit<D: Db>(events: Vec<OrderCreated>, tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    for event in events {
        inoutbox::sql("INSERT INTO audit (order_id) VALUES ($1)").bind(event.order_id).execute(tx).await?;
    }
    Ok(())
}

fn main() {
    // Callable directly on either store.
    let _ = create_invoice::<sqlx::Postgres>;
    let _ = create_invoice::<sqlx::Sqlite>;
}
