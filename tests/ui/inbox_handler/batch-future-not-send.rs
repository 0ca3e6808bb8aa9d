use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

async fn audit() {}

#[inbox_handler(event = "OrderCreated", group = "billing", batch)]
async fn create_invoices(
    _events: Vec<OrderCreated>,
    _tx: &mut PgTx<'_>,
    _metas: &[MessageMeta],
) -> Result<(), HandlerError> {
    let counter = std::rc::Rc::new(1);
    audit().await;
    let _ = counter;
    Ok(())
}

fn main() {}
