//! `#[inbox_handler]` registers each handler through inventory, with its location, and the
//! dispatch table of a group refuses two handlers for one event type, naming both.
//!
//! The registry is reached through `inoutbox::__private` until the facade re-exports it.

use inoutbox::__private::{registrations, DispatchTable, HandlerRegistration, RegistryError};
use inoutbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: u64,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCancelled", topic = "orders", key = order_id)]
pub struct OrderCancelled {
    pub order_id: u64,
}

const CREATE_INVOICE_LINE: u32 = line!() + 2;
#[inbox_handler(event = "OrderCreated", group = "registry-billing")]
async fn create_invoice(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

const CANCEL_INVOICE_LINE: u32 = line!() + 2;
#[inbox_handler(event = "OrderCancelled", group = "registry-billing")]
async fn cancel_invoice(
    _event: OrderCancelled,
    _tx: &mut PgTx<'_>,
    _meta: &MessageMeta,
) -> anyhow::Result<()> {
    Ok(())
}

mod first {
    use super::*;

    #[inbox_handler(event = "OrderCreated", group = "registry-duplicate")]
    pub async fn ship(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

mod second {
    use super::*;

    #[inbox_handler(event = "OrderCreated", group = "registry-duplicate")]
    pub async fn ship_again(_event: OrderCreated, _tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn find(name: &str) -> &'static HandlerRegistration {
    registrations().find(|r| r.name == name).unwrap_or_else(|| {
        panic!(
            "{name} is not registered; have {:#?}",
            registrations().collect::<Vec<_>>()
        )
    })
}

#[test]
fn handlers_are_registered_with_their_location() {
    let create = find("registry::create_invoice");
    assert_eq!(
        (create.event_type, create.group),
        ("OrderCreated", "registry-billing")
    );
    assert_eq!(create.file, file!());
    assert_eq!(create.line, CREATE_INVOICE_LINE);

    let cancel = find("registry::cancel_invoice");
    assert_eq!(
        (cancel.event_type, cancel.group),
        ("OrderCancelled", "registry-billing")
    );
    assert_eq!(cancel.line, CANCEL_INVOICE_LINE);

    assert_eq!(find("registry::first::ship").group, "registry-duplicate");
}

#[test]
fn handlers_declare_the_postgres_transaction_type() {
    let table = DispatchTable::for_group("registry-billing").expect("no duplicates");
    table
        .check_tx_type::<sqlx::Transaction<'static, sqlx::Postgres>>("postgres")
        .expect("handlers take &mut PgTx<'_>");
    assert!(table.check_tx_type::<()>("other").is_err());
}

#[test]
fn dispatch_table_of_a_group_holds_its_handlers_by_event_type() {
    let table = DispatchTable::for_group("registry-billing").expect("no duplicates");
    assert_eq!(
        table.event_types().collect::<Vec<_>>(),
        ["OrderCancelled", "OrderCreated"]
    );
    assert_eq!(
        table.get("OrderCreated").map(|r| r.name),
        Some("registry::create_invoice")
    );
    assert!(table.get("OrderShipped").is_none());
}

#[test]
fn two_handlers_for_one_event_and_group_are_a_start_up_error_naming_both() {
    let error = DispatchTable::for_group("registry-duplicate").expect_err("duplicate");
    let message = error.to_string();
    assert!(
        matches!(error, RegistryError::Duplicate { .. }),
        "{message}"
    );
    for expected in [
        "registry::first::ship (",
        "registry::second::ship_again (",
        file!(),
    ] {
        assert!(message.contains(expected), "`{expected}` not in: {message}");
    }
}

#[test]
fn the_same_handler_function_can_be_called_directly() {
    // Typechecks only: calling needs a database transaction.
    let _: fn(OrderCreated, &'static mut PgTx<'static>) -> _ = create_invoice;
}

#[tokio::test]
async fn the_registered_wrapper_rejects_a_payload_that_does_not_decode_as_a_bad_message() {
    let reg = find("registry::create_invoice");
    let meta = MessageMeta::new("registry-billing", "id-1", "OrderCreated");
    let error = (reg.invoke)(b"not json", &mut (), &meta)
        .await
        .expect_err("bad payload");
    assert_eq!(
        error.kind(),
        inoutbox::inbox::ErrorKind::BadMessage,
        "{error}"
    );
    assert!(error.to_string().contains("OrderCreated"), "{error}");
}

#[tokio::test]
async fn the_registered_wrapper_refuses_a_transaction_of_another_type() {
    let reg = find("registry::cancel_invoice");
    let meta = MessageMeta::new("registry-billing", "id-2", "OrderCancelled");
    let error = (reg.invoke)(br#"{"order_id":7}"#, &mut (), &meta)
        .await
        .expect_err("not a PgTx");
    assert_eq!(
        error.kind(),
        inoutbox::inbox::ErrorKind::Permanent,
        "{error}"
    );
    assert!(
        error.to_string().contains("not the transaction type"),
        "{error}"
    );
}

const RECORD_LINE: u32 = line!() + 2;
#[inbox_handler(event = "OrderCreated", group = "registry-postgres")]
async fn record(event: OrderCreated, tx: &mut PgTx<'_>, meta: &MessageMeta) -> anyhow::Result<()> {
    sqlx::query("INSERT INTO registry_seen (order_id, event_id) VALUES ($1, $2)")
        .bind(event.order_id as i64)
        .bind(&meta.event_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The same default as the other integration tests; the test fails loudly without a database.
fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

#[tokio::test]
async fn the_registered_wrapper_runs_the_handler_in_the_given_postgres_transaction() {
    let pool = sqlx::PgPool::connect(&database_url())
        .await
        .expect("PostgreSQL must be running (set DATABASE_URL)");
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("CREATE TEMP TABLE registry_seen (order_id bigint, event_id text) ON COMMIT DROP")
        .execute(&mut *tx)
        .await
        .expect("temp table");

    let table = DispatchTable::for_group("registry-postgres").expect("one handler");
    let reg = table.get("OrderCreated").expect("registered");
    assert_eq!((reg.name, reg.line), ("registry::record", RECORD_LINE));
    let meta = MessageMeta::new("registry-postgres", "id-42", "OrderCreated");
    (reg.invoke)(br#"{"order_id":42}"#, &mut tx, &meta)
        .await
        .expect("handler ran");

    let row: (i64, String) = sqlx::query_as("SELECT order_id, event_id FROM registry_seen")
        .fetch_one(&mut *tx)
        .await
        .expect("the handler's row, in the same transaction");
    assert_eq!(row, (42, "id-42".to_owned()));
    tx.rollback().await.expect("rollback");
}
