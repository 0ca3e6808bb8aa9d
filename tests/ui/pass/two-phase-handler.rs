use serde::{Deserialize, Serialize};
use inoutbox::prelude::*;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCreated", group = "billing", mode = "two_phase", ordered = true)]
async fn send_receipt(
    event: OrderCreated,
    _tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    let _ = (event.order_id, meta.attempt);
    Ok(())
}

#[inbox_handler(event = "OrderCreated", group = "mailing", mode = "one_phase")]
async fn count_order(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {
    let modes: Vec<_> = inoutbox::__private::registrations()
        .filter(|r| r.name.ends_with("send_receipt") || r.name.ends_with("count_order"))
        .map(|r| (r.name.rsplit("::").next().unwrap_or(""), r.mode.is_two_phase(), r.mode.is_ordered()))
        .collect();
    assert!(modes.contains(&("send_receipt", true, true)), "{modes:?}");
    assert!(modes.contains(&("count_order", false, false)), "{modes:?}");
}
