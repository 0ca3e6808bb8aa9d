use serde::Deserialize;
use inoutbox::prelude::*;

#[derive(Debug, Deserialize, InboxEvent)]
pub struct OrderPlaced {
    pub order_id: u64,
}

fn main() {}
