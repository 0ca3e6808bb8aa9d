// The user's own items named like the paths generated code could use: the expansion must name
// only `::inoutbox::__private` and `::core` / `::std` paths.
#![allow(dead_code)]

use ::serde::{Deserialize as De, Serialize as Ser};
use inoutbox::{inbox_handler, HandlerError as TxError, OutboxEvent, PgTx};

type Result<T> = ::std::result::Result<T, TxError>;
struct Error;
struct Option;
struct Some;
struct None;
struct String;
struct Box;
struct Send;
struct Any;
struct TypeId;
mod inventory {}
mod serde {}
mod serde_json {}
mod core {}
mod std {}
mod __private {}
fn decode() {}
fn into_future() {}
fn fail() {}

#[derive(::std::fmt::Debug, Ser, De, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id, aggregate_id = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<()> {
    let _ = event;
    ::std::result::Result::Ok(())
}

async fn call_directly(tx: &mut PgTx<'_>) -> Result<()> {
    create_invoice(OrderCreated { order_id: 1 }, tx).await
}

fn main() {}
