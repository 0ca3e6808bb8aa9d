use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

// Consumed only: no topic to publish it to.
#[derive(Debug, Serialize, Deserialize, InboxEvent)]
#[inbox(event_type = "OrderPlaced")]
pub struct OrderPlaced {
    pub order_id: u64,
}

async fn place(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) {
    let _ = inoutbox::outbox::enqueue(tx, &OrderPlaced { order_id: 1 }).await;
}

fn main() {}
