use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: i64,
}

#[inbox_handler(event = "OrderCreated", group = "billing", stores(postgres, mysq))]
async fn create_invoice<D: Db>(_event: OrderCreated, _tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
