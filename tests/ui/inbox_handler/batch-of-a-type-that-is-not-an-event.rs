use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize)]
pub struct OrderCancelled {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCancelled", group = "billing", batch)]
async fn cancel_invoices(
    _events: Vec<OrderCancelled>,
    _tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
