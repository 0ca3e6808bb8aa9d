use serde::Deserialize;
use inoutbox::prelude::*;

#[derive(Debug, Deserialize, InboxEvent)]
#[inbox(event_type = "OrderPlaced", topic = "orders")]
pub struct OrderPlaced {
    pub order_id: u64,
}

fn main() {}
