//! Business-key deduplication: an event's `idempotency_key = field`, or a handler's `dedup_by =
//! field`, makes the inbox refuse a second event with the same business key in the same group
//! and key space (a second unique key beside the event id), reported as
//! `Outcome::DuplicateBusinessKey` with the key as held, `scope:key`; the business-key window
//! frees a key after a while. The key space is the event type's own unless handlers of the group
//! share one with `dedup_scope`: `OrderPlaced` and `OrderCancelled` with one `order_id` both run
//! (the refund case). On PostgreSQL and SQLite.

mod support;

use std::time::Duration;

use inoutbox::inbox::{Delivery, Inbox, InboxConfig};
use inoutbox::prelude::*;
use inoutbox::store::InboxStore;
use inoutbox::Outcome;
use serde::{Deserialize, Serialize};
use support::kit::TempDir;
use support::TestDb;
use uuid::Uuid;

/// "Credit 100": a producer bug may send it twice with two event ids; the operation id is the
/// same.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "AccountCredited", topic = "accounts", key = account, idempotency_key = operation_id)]
pub struct AccountCredited {
    pub account: Uuid,
    pub operation_id: Uuid,
    pub cents: i64,
}

/// An event without an `idempotency_key`: its handler says what to deduplicate by.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "TransferBooked", topic = "accounts", key = account)]
pub struct TransferBooked {
    pub account: Uuid,
    pub transfer_no: u64,
    pub cents: i64,
}

async fn credit_pg(tx: &mut PgTx<'_>, account: Uuid, cents: i64) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(account)
        .bind(cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "AccountCredited", group = "bk-event")]
async fn credit_postgres(event: AccountCredited, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.account, event.cents).await
}

#[inbox_handler(event = "AccountCredited", group = "bk-event")]
async fn credit_sqlite(
    event: AccountCredited,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.account)
        .bind(event.cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "TransferBooked", group = "bk-handler", dedup_by = transfer_no)]
async fn book_transfer(event: TransferBooked, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.account, event.cents).await
}

#[inbox_handler(event = "TransferBooked", group = "bk-batch", batch, dedup_by = transfer_no)]
async fn book_transfers(
    events: Vec<TransferBooked>,
    tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    for event in events {
        credit_pg(tx, event.account, event.cents).await?;
    }
    Ok(())
}

/// A business key whose `Display` panics on one value: user code run on producer data.
#[derive(Debug, Serialize, Deserialize)]
pub struct TicketNo(u64);

impl std::fmt::Display for TicketNo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        assert!(self.0 != 13, "no ticket 13");
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "TicketBooked", topic = "accounts", key = account)]
pub struct TicketBooked {
    pub account: Uuid,
    pub ticket: TicketNo,
    pub cents: i64,
}

#[inbox_handler(event = "TicketBooked", group = "bk-panic", dedup_by = ticket)]
async fn book_ticket(event: TicketBooked, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.account, event.cents).await
}

fn delivery(offset: i64, event_id: &str, event_type: &str, payload: Vec<u8>) -> Delivery {
    Delivery {
        topic: "accounts".into(),
        partition: 0,
        offset,
        key: None,
        payload: Some(payload),
        headers: vec![
            ("ce_id".into(), Some(event_id.as_bytes().to_vec())),
            ("ce_type".into(), Some(event_type.as_bytes().to_vec())),
        ],
    }
}

fn credited(offset: i64, event_id: &str, operation_id: Uuid) -> Delivery {
    let event = AccountCredited {
        account: Uuid::new_v4(),
        operation_id,
        cents: 100,
    };
    let payload = serde_json::to_vec(&event).unwrap();
    delivery(offset, event_id, "AccountCredited", payload)
}

fn transfer(offset: i64, event_id: &str, transfer_no: u64) -> Delivery {
    let event = TransferBooked {
        account: Uuid::new_v4(),
        transfer_no,
        cents: 100,
    };
    let payload = serde_json::to_vec(&event).unwrap();
    delivery(offset, event_id, "TransferBooked", payload)
}

fn no_shutdown() -> inoutbox::shutdown::CancellationToken {
    inoutbox::shutdown::CancellationToken::new()
}

/// The same operation sent twice with two event ids, a redelivery of the first, another
/// operation: the operation applies once, and each outcome says why.
async fn same_operation_twice<S: InboxStore>(inbox: &Inbox<S>) {
    let shutdown = no_shutdown();
    let operation = Uuid::new_v4();
    assert_eq!(
        inbox
            .process(&credited(0, "evt-1", operation), &shutdown)
            .await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(
        inbox
            .process(&credited(1, "evt-2", operation), &shutdown)
            .await,
        Outcome::DuplicateBusinessKey {
            key: format!("AccountCredited:{operation}")
        },
        "a second event id with the same operation id is a duplicate by meaning"
    );
    assert_eq!(
        inbox
            .process(&credited(2, "evt-1", Uuid::new_v4()), &shutdown)
            .await,
        Outcome::Duplicate,
        "a redelivery is a duplicate by id"
    );
    assert_eq!(
        inbox
            .process(&credited(3, "evt-3", Uuid::new_v4()), &shutdown)
            .await,
        Outcome::Processed { attempt: 1 }
    );
}

#[tokio::test]
async fn postgres_refuses_a_second_event_with_the_same_idempotency_key() {
    let db = TestDb::new("bk_pg").await;
    let inbox = Inbox::new(
        db.migrated_store().await,
        "bk-event",
        InboxConfig::default(),
    )
    .unwrap();
    same_operation_twice(&inbox).await;
    assert_eq!(db.invoices().await, 2, "two operations, each applied once");
}

#[tokio::test]
async fn sqlite_refuses_a_second_event_with_the_same_idempotency_key() {
    let dir = TempDir::new("bk-sqlite");
    let store = sqlite_store(&dir).await;
    let pool = store.pool().clone();
    let inbox = Inbox::new(store, "bk-event", InboxConfig::default()).unwrap();
    same_operation_twice(&inbox).await;
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(invoices, 2, "two operations, each applied once");
}

#[tokio::test]
async fn a_handler_dedup_by_field_refuses_a_second_event_with_the_same_field() {
    let db = TestDb::new("bk_handler").await;
    let inbox = Inbox::new(
        db.migrated_store().await,
        "bk-handler",
        InboxConfig::default(),
    )
    .unwrap();
    let shutdown = no_shutdown();
    assert_eq!(
        inbox.process(&transfer(0, "t-1", 42), &shutdown).await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(
        inbox.process(&transfer(1, "t-2", 42), &shutdown).await,
        Outcome::DuplicateBusinessKey {
            key: "TransferBooked:42".into()
        }
    );
    assert_eq!(db.invoices().await, 1);
}

#[tokio::test]
async fn in_one_batch_the_first_event_of_a_business_key_runs_and_the_later_one_is_refused() {
    let db = TestDb::new("bk_batch").await;
    let inbox = Inbox::new(
        db.migrated_store().await,
        "bk-batch",
        InboxConfig::default(),
    )
    .unwrap();
    let batch = [
        transfer(0, "b-1", 7),
        transfer(1, "b-2", 7),
        transfer(2, "b-3", 8),
        transfer(3, "b-4", 8),
        transfer(4, "b-5", 9),
    ];
    let refs: Vec<&Delivery> = batch.iter().collect();
    let outcomes = inbox.process_batch(&refs, &no_shutdown()).await;
    let processed = Outcome::Processed { attempt: 1 };
    let dup = |k: &str| Outcome::DuplicateBusinessKey {
        key: format!("TransferBooked:{k}"),
    };
    assert_eq!(
        outcomes,
        [
            processed.clone(),
            dup("7"),
            processed.clone(),
            dup("8"),
            processed
        ]
    );
    assert_eq!(db.invoices().await, 3);
}

#[tokio::test]
async fn a_business_key_older_than_the_window_no_longer_refuses_an_event() {
    let db = TestDb::new("bk_window").await;
    let mut config = InboxConfig::default();
    config.business_key_window = Some(Duration::from_secs(3600));
    let inbox = Inbox::new(db.migrated_store().await, "bk-event", config).unwrap();
    let shutdown = no_shutdown();
    let (old, recent) = (Uuid::new_v4(), Uuid::new_v4());
    inbox.process(&credited(0, "evt-old", old), &shutdown).await;
    inbox
        .process(&credited(1, "evt-recent", recent), &shutdown)
        .await;
    // The first operation was received two hours ago: outside the one-hour window.
    sqlx::query(
        "UPDATE inoutbox_inbox SET received_at = now() - interval '2 hours' WHERE event_id = 'evt-old'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        inbox
            .process(&credited(2, "evt-old-2", old), &shutdown)
            .await,
        Outcome::Processed { attempt: 1 },
        "outside the window: applied again"
    );
    assert_eq!(
        inbox
            .process(&credited(3, "evt-recent-2", recent), &shutdown)
            .await,
        Outcome::DuplicateBusinessKey {
            key: format!("AccountCredited:{recent}")
        },
        "inside the window: refused"
    );
    assert_eq!(
        inbox
            .process(&credited(4, "evt-old-3", old), &shutdown)
            .await,
        Outcome::DuplicateBusinessKey {
            key: format!("AccountCredited:{old}")
        },
        "the key taken again is refused again"
    );
    assert_eq!(db.invoices().await, 3);
}

/// A fresh SQLite database in a temporary directory, migrated, with an invoices table.
async fn sqlite_store(dir: &TempDir) -> inoutbox::SqliteStore {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let options = SqliteConnectOptions::new()
        .filename(dir.0.join("bk.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("open SQLite");
    sqlx::raw_sql(
        "CREATE TABLE invoices (id integer PRIMARY KEY AUTOINCREMENT, order_id blob NOT NULL, \
         total_cents integer NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("invoices");
    let store = inoutbox::SqliteStore::new(pool);
    store.migrate().await.expect("migrate");
    store
}

/// Round one of the `a_batch_frees_every_expired_business_key_it_holds_*` tests: three
/// operations.
async fn three_operations<S: InboxStore>(inbox: &Inbox<S>, ops: &[Uuid; 3]) {
    let batch: Vec<Delivery> = (0..3)
        .map(|i| credited(i, &format!("first-{i}"), ops[i as usize]))
        .collect();
    let refs: Vec<&Delivery> = batch.iter().collect();
    let outcomes = inbox.process_batch(&refs, &no_shutdown()).await;
    assert!(
        outcomes
            .iter()
            .all(|o| *o == Outcome::Processed { attempt: 1 }),
        "{outcomes:?}"
    );
}

/// Round two: the same operations again under new event ids, in one batch; the first two
/// were received outside the window, the third inside.
async fn the_same_operations_again<S: InboxStore>(inbox: &Inbox<S>, ops: &[Uuid; 3]) {
    let batch: Vec<Delivery> = (0..3)
        .map(|i| credited(10 + i, &format!("again-{i}"), ops[i as usize]))
        .collect();
    let refs: Vec<&Delivery> = batch.iter().collect();
    let outcomes = inbox.process_batch(&refs, &no_shutdown()).await;
    let processed = Outcome::Processed { attempt: 1 };
    assert_eq!(
        outcomes,
        [
            processed.clone(),
            processed,
            Outcome::DuplicateBusinessKey {
                key: format!("AccountCredited:{}", ops[2])
            }
        ],
        "the two expired keys are freed by the batch, the recent one still refuses"
    );
}

fn one_hour_window() -> InboxConfig {
    let mut config = InboxConfig::default();
    config.business_key_window = Some(Duration::from_secs(3600));
    config
}

#[tokio::test]
async fn a_batch_frees_every_expired_business_key_it_holds_on_postgres() {
    let db = TestDb::new("bk_window_batch").await;
    let inbox = Inbox::new(db.migrated_store().await, "bk-event", one_hour_window()).unwrap();
    let ops = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    three_operations(&inbox, &ops).await;
    sqlx::query(
        "UPDATE inoutbox_inbox SET received_at = now() - interval '2 hours' \
         WHERE event_id IN ('first-0', 'first-1')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    the_same_operations_again(&inbox, &ops).await;
    assert_eq!(db.invoices().await, 5);
}

#[tokio::test]
async fn a_batch_frees_every_expired_business_key_it_holds_on_sqlite() {
    let dir = TempDir::new("bk-sqlite-window");
    let store = sqlite_store(&dir).await;
    let pool = store.pool().clone();
    let inbox = Inbox::new(store, "bk-event", one_hour_window()).unwrap();
    let ops = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    three_operations(&inbox, &ops).await;
    sqlx::query(
        "UPDATE inoutbox_inbox SET received_at = '2000-01-01T00:00:00.000Z' \
         WHERE event_id IN ('first-0', 'first-1')",
    )
    .execute(&pool)
    .await
    .unwrap();
    the_same_operations_again(&inbox, &ops).await;
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(invoices, 5);
}

/// Reading the business key panics for one event (its field's `Display`): that event is
/// dead-lettered with the reason, and the next one is processed.
#[tokio::test]
async fn a_business_key_that_panics_dead_letters_its_event_and_the_next_one_runs() {
    let db = TestDb::new("bk_panic").await;
    let inbox = Inbox::new(
        db.migrated_store().await,
        "bk-panic",
        InboxConfig::default(),
    )
    .unwrap();
    let ticket = |offset, id: &str, no| {
        let event = TicketBooked {
            account: Uuid::new_v4(),
            ticket: TicketNo(no),
            cents: 100,
        };
        delivery(
            offset,
            id,
            "TicketBooked",
            serde_json::to_vec(&event).unwrap(),
        )
    };
    let shutdown = no_shutdown();
    let outcome = inbox.process(&ticket(0, "k-13", 13), &shutdown).await;
    assert!(
        matches!(&outcome, Outcome::DeadLettered { reason, .. }
            if reason.contains("business key") && reason.contains("no ticket 13")),
        "{outcome:?}"
    );
    assert_eq!(
        inbox.process(&ticket(1, "k-14", 14), &shutdown).await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(db.invoices().await, 1);
}

/// The refund case: a payments service consumes `OrderPlaced` (capture) and `OrderCancelled`
/// (refund), both deduplicated by `order_id` in one group.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderPlaced", topic = "orders", key = order_id)]
pub struct OrderPlaced {
    pub order_id: Uuid,
    pub cents: i64,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCancelled", topic = "orders", key = order_id)]
pub struct OrderCancelled {
    pub order_id: Uuid,
}

#[inbox_handler(event = "OrderPlaced", group = "bk-refund", dedup_by = order_id)]
async fn capture_postgres(event: OrderPlaced, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.order_id, event.cents).await
}

#[inbox_handler(event = "OrderCancelled", group = "bk-refund", dedup_by = order_id)]
async fn refund_postgres(event: OrderCancelled, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.order_id, -100).await
}

async fn write_sqlite(
    tx: &mut inoutbox::SqliteTx<'_>,
    order_id: Uuid,
    cents: i64,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(order_id)
        .bind(cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "OrderPlaced", group = "bk-refund", dedup_by = order_id)]
async fn capture_sqlite(
    event: OrderPlaced,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    write_sqlite(tx, event.order_id, event.cents).await
}

#[inbox_handler(event = "OrderCancelled", group = "bk-refund", dedup_by = order_id)]
async fn refund_sqlite(
    event: OrderCancelled,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    write_sqlite(tx, event.order_id, -100).await
}

fn placed(offset: i64, event_id: &str, order_id: Uuid) -> Delivery {
    let payload = serde_json::to_vec(&OrderPlaced {
        order_id,
        cents: 100,
    })
    .unwrap();
    delivery(offset, event_id, "OrderPlaced", payload)
}

fn cancelled(offset: i64, event_id: &str, order_id: Uuid) -> Delivery {
    let payload = serde_json::to_vec(&OrderCancelled { order_id }).unwrap();
    delivery(offset, event_id, "OrderCancelled", payload)
}

/// An order placed, then cancelled: the cancel's handler runs (the refund is not lost), and
/// each type still refuses a second event of its own with the same order id.
async fn place_and_cancel<S: InboxStore>(inbox: &Inbox<S>) {
    let shutdown = no_shutdown();
    let order = Uuid::new_v4();
    let processed = Outcome::Processed { attempt: 1 };
    assert_eq!(
        inbox.process(&placed(0, "o-1", order), &shutdown).await,
        processed
    );
    assert_eq!(
        inbox.process(&cancelled(1, "c-1", order), &shutdown).await,
        processed,
        "the cancel of a placed order runs its handler: the same order id in another event \
         type is another key"
    );
    assert_eq!(
        inbox.process(&placed(2, "o-2", order), &shutdown).await,
        Outcome::DuplicateBusinessKey {
            key: format!("OrderPlaced:{order}")
        },
        "a second OrderPlaced of the order is still refused"
    );
    assert_eq!(
        inbox.process(&cancelled(3, "c-2", order), &shutdown).await,
        Outcome::DuplicateBusinessKey {
            key: format!("OrderCancelled:{order}")
        },
        "and so is a second OrderCancelled"
    );
}

#[tokio::test]
async fn postgres_runs_the_cancel_of_a_placed_order_with_the_same_business_key() {
    let db = TestDb::new("bk_refund_pg").await;
    let store = db.migrated_store().await;
    let inbox = Inbox::new(store, "bk-refund", InboxConfig::default()).unwrap();
    place_and_cancel(&inbox).await;
    assert_eq!(
        db.invoices().await,
        2,
        "the capture and the refund, once each"
    );
}

#[tokio::test]
async fn sqlite_runs_the_cancel_of_a_placed_order_with_the_same_business_key() {
    let dir = TempDir::new("bk-refund-sqlite");
    let store = sqlite_store(&dir).await;
    let pool = store.pool().clone();
    let inbox = Inbox::new(store, "bk-refund", InboxConfig::default()).unwrap();
    place_and_cancel(&inbox).await;
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(invoices, 2, "the capture and the refund, once each");
}

/// Two kinds of dispute of one order are one operation: their handlers share a key space.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "ChargebackOpened", topic = "disputes", key = order_id)]
pub struct ChargebackOpened {
    pub order_id: Uuid,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "RefundRequested", topic = "disputes", key = order_id)]
pub struct RefundRequested {
    pub order_id: Uuid,
}

#[inbox_handler(event = "ChargebackOpened", group = "bk-shared", dedup_by = order_id, dedup_scope = "disputes")]
async fn open_chargeback(event: ChargebackOpened, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.order_id, -100).await
}

#[inbox_handler(event = "RefundRequested", group = "bk-shared", dedup_by = order_id, dedup_scope = "disputes")]
async fn request_refund(event: RefundRequested, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.order_id, -100).await
}

#[tokio::test]
async fn a_shared_dedup_scope_refuses_an_event_of_another_type_with_the_same_key() {
    let db = TestDb::new("bk_shared").await;
    let inbox = Inbox::new(
        db.migrated_store().await,
        "bk-shared",
        InboxConfig::default(),
    )
    .unwrap();
    let shutdown = no_shutdown();
    let order = Uuid::new_v4();
    let payload = serde_json::to_vec(&ChargebackOpened { order_id: order }).unwrap();
    let chargeback = delivery(0, "cb-1", "ChargebackOpened", payload.clone());
    assert_eq!(
        inbox.process(&chargeback, &shutdown).await,
        Outcome::Processed { attempt: 1 }
    );
    let refund = delivery(1, "rr-1", "RefundRequested", payload);
    assert_eq!(
        inbox.process(&refund, &shutdown).await,
        Outcome::DuplicateBusinessKey {
            key: format!("disputes:{order}")
        },
        "the refund request of a charged-back order is the same operation"
    );
    assert_eq!(db.invoices().await, 1, "the order is paid back once");
}

/// One event handled on two stores, deduplicated in two key spaces: a mistake.
#[inbox_handler(event = "OrderPlaced", group = "bk-conflict", dedup_by = order_id)]
async fn conflict_postgres(event: OrderPlaced, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    credit_pg(tx, event.order_id, event.cents).await
}

#[inbox_handler(event = "OrderPlaced", group = "bk-conflict", dedup_by = order_id, dedup_scope = "orders")]
async fn conflict_sqlite(
    event: OrderPlaced,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    write_sqlite(tx, event.order_id, event.cents).await
}

#[tokio::test]
async fn conflicting_dedup_scopes_in_a_group_are_refused_at_set_up_naming_both_handlers() {
    let db = TestDb::new("bk_conflict").await;
    let Err(error) = Inbox::new(
        db.migrated_store().await,
        "bk-conflict",
        InboxConfig::default(),
    ) else {
        panic!("conflicting scopes are refused");
    };
    let error = error.to_string();
    assert!(error.contains("conflict_postgres"), "{error}");
    assert!(error.contains("conflict_sqlite"), "{error}");
    assert!(
        error.contains(
            "event `OrderPlaced` is deduplicated in scope `OrderPlaced` by one and \
             `orders` by the other"
        ),
        "{error}"
    );
}
