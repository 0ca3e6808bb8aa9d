//! Deferred messages (`HandlerError::defer`), on PostgreSQL, SQLite and MariaDB, through
//! consumers on the in-memory broker: the payments service's cancel that arrives before its order defers
//! until the order exists, the partition goes on past it (the order, later on the same key, is
//! handled first), and the cancel runs once when due; a redelivery of the deferred message is a
//! duplicate, also while its deferred run races it; two consumers of one group never both run a
//! due message; a message deferred more often than `max_deferrals` is dead-lettered.
//!
//! No timed assertion: the handlers defer for a few milliseconds and the tests wait for
//! conditions with a bounded poll.

mod support;

use std::time::{Duration, Instant};

use inoutbox::inbox::{Delivery, Inbox};
use inoutbox::prelude::*;
use inoutbox::store::InboxStore;
use inoutbox::Outcome;
use serde::{Deserialize, Serialize};
use support::kit::TempDir;
use support::memory::{MemoryBroker, MemoryTransport, Message, RunningConsumer};
use support::TestDb;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "PayOrderPlaced", topic = "payments", key = order_id)]
pub struct OrderPlaced {
    pub order_id: String,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "PayOrderCancelled", topic = "payments", key = order_id)]
pub struct OrderCancelled {
    pub order_id: String,
}

/// How long a cancel waits for its order.
const AGAIN_IN: Duration = Duration::from_millis(40);

/// How long a cancel's transaction stays open once its order exists: a window for a second
/// run of the same message to overlap the first, were one allowed.
const REFUND_TAKES: Duration = Duration::from_millis(30);

/// What the payments group's handlers do, on one store's connection type: an order is stored;
/// a cancel of an order not stored yet is deferred, else it cancels the order and refunds it.
/// (The handlers themselves are written out below: `#[inbox_handler]` inside a `macro_rules!`
/// loses its generated names to hygiene.)
macro_rules! payments {
    ($conn:ty, $place:ident, $cancel:ident) => {
        async fn $place(event: OrderPlaced, tx: &mut $conn) -> Result<(), HandlerError> {
            inoutbox::sql("INSERT INTO orders (id, status) VALUES ($1, 'placed')")
                .bind(event.order_id.as_str())
                .execute(&mut *tx)
                .await?;
            inoutbox::sql("INSERT INTO history (what) VALUES ($1)")
                .bind(format!("placed {}", event.order_id))
                .execute(&mut *tx)
                .await?;
            Ok(())
        }

        async fn $cancel(event: OrderCancelled, tx: &mut $conn) -> Result<(), HandlerError> {
            let status = inoutbox::sql("SELECT status FROM orders WHERE id = $1")
                .bind(event.order_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            if status.is_none() {
                let reason = format!("order {} is not placed yet", event.order_id);
                return Err(HandlerError::defer_because(AGAIN_IN, reason));
            }
            inoutbox::sql("UPDATE orders SET status = 'cancelled' WHERE id = $1")
                .bind(event.order_id.as_str())
                .execute(&mut *tx)
                .await?;
            tokio::time::sleep(REFUND_TAKES).await;
            inoutbox::sql("INSERT INTO refunds (order_id) VALUES ($1)")
                .bind(event.order_id.as_str())
                .execute(&mut *tx)
                .await?;
            inoutbox::sql("INSERT INTO history (what) VALUES ($1)")
                .bind(format!("cancelled {}", event.order_id))
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
    };
}

payments!(sqlx::PgConnection, place_on_pg, cancel_on_pg);
payments!(sqlx::SqliteConnection, place_on_sqlite, cancel_on_sqlite);
#[cfg(feature = "mysql")]
payments!(sqlx::MySqlConnection, place_on_mysql, cancel_on_mysql);

#[inbox_handler(event = "PayOrderPlaced", group = "payments")]
async fn place_pg(event: OrderPlaced, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    place_on_pg(event, tx).await
}

#[inbox_handler(event = "PayOrderCancelled", group = "payments")]
async fn cancel_pg(event: OrderCancelled, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    cancel_on_pg(event, tx).await
}

#[inbox_handler(event = "PayOrderPlaced", group = "payments")]
async fn place_sqlite(
    event: OrderPlaced,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    place_on_sqlite(event, tx).await
}

#[inbox_handler(event = "PayOrderCancelled", group = "payments")]
async fn cancel_sqlite(
    event: OrderCancelled,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    cancel_on_sqlite(event, tx).await
}

#[cfg(feature = "mysql")]
#[inbox_handler(event = "PayOrderPlaced", group = "payments")]
async fn place_mysql(event: OrderPlaced, tx: &mut MySqlTx<'_>) -> Result<(), HandlerError> {
    place_on_mysql(event, tx).await
}

#[cfg(feature = "mysql")]
#[inbox_handler(event = "PayOrderCancelled", group = "payments")]
async fn cancel_mysql(event: OrderCancelled, tx: &mut MySqlTx<'_>) -> Result<(), HandlerError> {
    cancel_on_mysql(event, tx).await
}

const GROUP: &str = "payments";
const TOPIC: &str = "payments";

/// One store with the payments tables, and what the tests read from it.
trait Payments: Sized {
    type Store: InboxStore + Clone;
    async fn open(name: &str) -> Self;
    fn store(&self) -> Self::Store;
    async fn count(&self, sql: &str) -> i64;
    async fn exec(&self, sql: &str);
    async fn history(&self) -> Vec<String>;
    async fn text(&self, sql: &str) -> String;
}

struct Pg(TestDb);

impl Payments for Pg {
    type Store = inoutbox::PgStore;

    async fn open(name: &str) -> Self {
        let db = TestDb::new(name).await;
        db.exec(
            "CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL); \
             CREATE TABLE refunds (id bigserial PRIMARY KEY, order_id text NOT NULL); \
             CREATE TABLE history (seq bigserial PRIMARY KEY, what text NOT NULL)",
        )
        .await;
        db.migrated_store().await;
        Pg(db)
    }

    fn store(&self) -> Self::Store {
        self.0.store()
    }

    async fn count(&self, sql: &str) -> i64 {
        self.0.count(sql).await
    }

    async fn exec(&self, sql: &str) {
        self.0.exec(sql).await
    }

    async fn history(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT what FROM history ORDER BY seq")
            .fetch_all(&self.0.pool)
            .await
            .expect("history")
    }

    async fn text(&self, sql: &str) -> String {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.0.pool)
            .await
            .expect(sql)
    }
}

struct Lite {
    store: inoutbox::SqliteStore,
    _dir: TempDir,
}

impl Payments for Lite {
    type Store = inoutbox::SqliteStore;

    async fn open(name: &str) -> Self {
        let dir = TempDir::new(name);
        let url = format!("sqlite:{}", dir.0.join("payments.db").display());
        let store = inoutbox::SqliteStore::connect(&url)
            .await
            .expect("open SQLite");
        sqlx::raw_sql(
            "CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL); \
             CREATE TABLE refunds (id integer PRIMARY KEY AUTOINCREMENT, order_id text NOT NULL); \
             CREATE TABLE history (seq integer PRIMARY KEY AUTOINCREMENT, what text NOT NULL)",
        )
        .execute(store.pool())
        .await
        .expect("payments tables");
        store.migrate().await.expect("migrate");
        Lite { store, _dir: dir }
    }

    fn store(&self) -> Self::Store {
        self.store.clone()
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.store.pool())
            .await
            .expect(sql)
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(self.store.pool())
            .await
            .expect(sql);
    }

    async fn history(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT what FROM history ORDER BY seq")
            .fetch_all(self.store.pool())
            .await
            .expect("history")
    }

    async fn text(&self, sql: &str) -> String {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.store.pool())
            .await
            .expect(sql)
    }
}

/// MariaDB: a database of its own (the contract kit's), with the payments tables.
#[cfg(feature = "mysql")]
struct My(support::kit::MySqlKit);

#[cfg(feature = "mysql")]
impl Payments for My {
    type Store = inoutbox::MySqlStore;

    async fn open(name: &str) -> Self {
        use support::kit::Kit;
        let kit = support::kit::MySqlKit::new(name).await;
        kit.exec(
            "CREATE TABLE orders (id varchar(64) PRIMARY KEY, status text NOT NULL); \
             CREATE TABLE refunds (id bigint AUTO_INCREMENT PRIMARY KEY, order_id varchar(64) NOT NULL); \
             CREATE TABLE history (seq bigint AUTO_INCREMENT PRIMARY KEY, what text NOT NULL)",
        )
        .await;
        My(kit)
    }

    fn store(&self) -> Self::Store {
        support::kit::Kit::store(&self.0)
    }

    async fn count(&self, sql: &str) -> i64 {
        support::kit::Kit::count(&self.0, sql).await
    }

    async fn exec(&self, sql: &str) {
        support::kit::Kit::exec(&self.0, sql).await
    }

    async fn history(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT what FROM history ORDER BY seq")
            .fetch_all(self.store().pool())
            .await
            .expect("history")
    }

    async fn text(&self, sql: &str) -> String {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.store().pool())
            .await
            .expect(sql)
    }
}

fn placed(order: &str) -> Message {
    event("PayOrderPlaced", &format!("placed-{order}"), order)
}

fn cancelled(order: &str) -> Message {
    event("PayOrderCancelled", &format!("cancelled-{order}"), order)
}

fn event(event_type: &str, id: &str, order: &str) -> Message {
    keyed(event_type, id, order, order)
}

/// An event about `order` sent with the message key `key`.
fn keyed(event_type: &str, id: &str, key: &str, order: &str) -> Message {
    let payload = serde_json::json!({ "order_id": order }).to_string();
    Message::new(payload)
        .key(key)
        .header("ce_id", id)
        .header("ce_type", event_type)
}

/// The delivery of a message as a broker hands it (for the tests that call the inbox).
fn delivery(offset: i64, m: &Message) -> Delivery {
    Delivery {
        topic: TOPIC.into(),
        partition: 0,
        offset,
        key: m.key.clone(),
        payload: m.payload.clone(),
        headers: m.headers.clone(),
    }
}

/// Polls `sql` (a count) until it is `target`; panics with `what` after 30 s.
async fn wait_count<P: Payments>(db: &P, sql: &str, target: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = db.count(sql).await;
        if n == target {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: `{sql}` is {n}, expected {target} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Refunds of `order`.
fn refunds_of(order: &str) -> String {
    format!("SELECT count(*) FROM refunds WHERE order_id = '{order}'")
}

fn consumer<S: InboxStore>(
    store: S,
    broker: &MemoryBroker,
) -> inoutbox::ConsumerBuilder<S, MemoryTransport> {
    inoutbox::Consumer::builder(GROUP, store, MemoryTransport::new(broker, [TOPIC]))
        .deferred_poll(Duration::from_millis(10))
}

// ---------------------------------------------------------------------------------------------
// The payments case: the cancel arrives before its order.

/// The cancel of `o-1` comes before its order on the same key, and the broker delivers every
/// message twice (the redelivery restarts two messages back after each commit). The cancel is
/// deferred, the partition goes on and handles the order first, and the cancel runs once when
/// due; its redeliveries are duplicates. A second pair, `o-2`, produced after `o-1` is
/// refunded, runs through the same worker: `o-1`, due earlier, is not run again before it.
async fn cancel_before_capture<P: Payments>(db: &P) {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1);
    broker.produce(TOPIC, Some(0), cancelled("o-1"));
    broker.produce(TOPIC, Some(0), placed("o-1"));
    let builder = inoutbox::Consumer::builder(
        GROUP,
        db.store(),
        MemoryTransport::new(&broker, [TOPIC]).redeliver(2),
    )
    .deferred_poll(Duration::from_millis(10));
    let running = RunningConsumer::start(builder);

    wait_count(db, &refunds_of("o-1"), 1, "the deferred cancel ran").await;
    broker.produce(TOPIC, Some(0), cancelled("o-2"));
    broker.produce(TOPIC, Some(0), placed("o-2"));
    wait_count(db, &refunds_of("o-2"), 1, "the second deferred cancel ran").await;
    broker
        .wait_settled(GROUP, TOPIC, Duration::from_secs(30))
        .await;
    let reports = running.stop().await;

    assert_eq!(
        db.history().await,
        ["placed o-1", "cancelled o-1", "placed o-2", "cancelled o-2"],
        "each order is handled before its cancel, which came first on the same key; each once"
    );
    assert_eq!(db.count(&refunds_of("o-1")).await, 1, "o-1 refunded once");
    assert_eq!(
        db.count("SELECT count(*) FROM orders WHERE status = 'cancelled'")
            .await,
        2
    );
    assert_eq!(
        broker.committed(GROUP, TOPIC, 0),
        Some(4),
        "every message committed"
    );
    let outcomes: Vec<&Outcome> = reports.iter().map(|r| &r.outcome).collect();
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, Outcome::Deferred { deferrals: 1, .. })),
        "the cancels were deferred from the partition: {outcomes:?}"
    );
    assert!(
        outcomes.iter().any(|o| **o == Outcome::Duplicate),
        "the redeliveries were duplicates: {outcomes:?}"
    );
    wait_count(
        db,
        "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL",
        0,
        "no deferred row left",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_cancel_before_its_order_is_deferred_and_runs_once_after_the_order() {
    cancel_before_capture(&Pg::open("defer_case").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_cancel_before_its_order_is_deferred_and_runs_once_after_the_order() {
    cancel_before_capture(&Lite::open("defer-case").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_cancel_before_its_order_is_deferred_and_runs_once_after_the_order() {
    cancel_before_capture(&My::open("defer_case").await).await;
}

// ---------------------------------------------------------------------------------------------
// A redelivery of the deferred message racing its deferred run.

/// The cancel is deferred through the inbox; its order is stored; then, while a consumer's
/// deferred worker runs it, the same message is redelivered again and again until the refund
/// exists: every redelivery is a duplicate and the refund applies once.
async fn redelivery_races_the_deferred_run<P: Payments>(db: &P) {
    let inbox = Inbox::new(db.store(), GROUP, Default::default()).expect("inbox");
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let cancel = delivery(0, &cancelled("o-9"));
    assert!(
        matches!(
            inbox.process(&cancel, &shutdown).await,
            Outcome::Deferred { deferrals: 1, .. }
        ),
        "the cancel before its order is deferred"
    );
    assert_eq!(
        inbox.process(&cancel, &shutdown).await,
        Outcome::Duplicate,
        "a redelivery of the deferred message is a duplicate"
    );
    db.exec("INSERT INTO orders (id, status) VALUES ('o-9', 'placed')")
        .await;
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1);
    let running = RunningConsumer::start(consumer(db.store(), &broker));
    let mut redeliveries = 0;
    while db.count(&refunds_of("o-9")).await == 0 {
        assert_eq!(
            inbox.process(&cancel, &shutdown).await,
            Outcome::Duplicate,
            "a redelivery while the deferred run is due or running is a duplicate"
        );
        redeliveries += 1;
        assert!(redeliveries < 100_000, "the deferred run never came");
    }
    assert_eq!(
        inbox.process(&cancel, &shutdown).await,
        Outcome::Duplicate,
        "a redelivery after the deferred run is a duplicate"
    );
    running.stop().await;
    assert_eq!(db.count(&refunds_of("o-9")).await, 1, "refunded once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_redelivery_racing_the_deferred_run_is_a_duplicate() {
    redelivery_races_the_deferred_run(&Pg::open("defer_race").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_redelivery_racing_the_deferred_run_is_a_duplicate() {
    redelivery_races_the_deferred_run(&Lite::open("defer-race").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_redelivery_racing_the_deferred_run_is_a_duplicate() {
    redelivery_races_the_deferred_run(&My::open("defer_race").await).await;
}

// ---------------------------------------------------------------------------------------------
// Two consumers of one group.

/// Two consumers of the group (two processes' worth: each its own store handle and deferred
/// worker) and twelve cancels deferred over two partitions; once their orders exist, every
/// cancel is refunded once, whichever worker ran it.
async fn two_consumers_run_each_due_message_once<P: Payments>(db: &P) {
    const N: usize = 12;
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 2);
    for i in 0..N {
        broker.produce(TOPIC, None, cancelled(&format!("m-{i}")));
    }
    let a = RunningConsumer::start(consumer(db.store(), &broker));
    let b = RunningConsumer::start(consumer(db.store(), &broker));
    wait_count(
        db,
        "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL AND due_at IS NOT NULL",
        N as i64,
        "every cancel deferred",
    )
    .await;
    broker
        .wait_settled(GROUP, TOPIC, Duration::from_secs(30))
        .await;
    let values: Vec<String> = (0..N).map(|i| format!("('m-{i}', 'placed')")).collect();
    db.exec(&format!(
        "INSERT INTO orders (id, status) VALUES {}",
        values.join(", ")
    ))
    .await;
    wait_count(
        db,
        "SELECT count(DISTINCT order_id) FROM refunds",
        N as i64,
        "every cancel ran",
    )
    .await;
    wait_count(
        db,
        "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL",
        0,
        "no deferred row left",
    )
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(
        db.count("SELECT count(*) FROM refunds").await,
        N as i64,
        "no cancel ran twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_consumers_of_a_group_never_both_run_a_due_message() {
    two_consumers_run_each_due_message_once(&Pg::open("defer_two").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_two_consumers_of_a_group_never_both_run_a_due_message() {
    two_consumers_run_each_due_message_once(&Lite::open("defer-two").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_two_consumers_of_a_group_never_both_run_a_due_message() {
    two_consumers_run_each_due_message_once(&My::open("defer_two").await).await;
}

// ---------------------------------------------------------------------------------------------
// The limit.

/// A cancel whose order never comes is deferred `max_deferrals` times, then dead-lettered with
/// the reason; its inbox row is gone, and a replay of the letter runs it anew (deferred again).
async fn deferred_past_the_limit_is_dead_lettered<P: Payments>(db: &P) {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1);
    broker.produce(TOPIC, Some(0), cancelled("never"));
    let store = db.store();
    let running = RunningConsumer::start(consumer(db.store(), &broker).max_deferrals(2));
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.count_dead_letters(GROUP).await.expect("count") == 0 {
        assert!(Instant::now() < deadline, "no dead letter within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.stop().await;
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_dead_letters").await,
        1
    );
    let error = db.text("SELECT error FROM inoutbox_dead_letters").await;
    assert!(
        error.contains("deferred 3 times, more than max_deferrals = 2")
            && error.contains("order never is not placed yet"),
        "the letter says why: {error}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_inbox").await,
        0,
        "the deferred row is deleted with its letter"
    );
    assert_eq!(db.count("SELECT count(*) FROM refunds").await, 0);

    // A replay of the letter runs the handler, which defers again: the message is back in the
    // inbox (its count starting over) and the letter is replayed.
    let id = db.count("SELECT id FROM inoutbox_dead_letters").await;
    let inbox = Inbox::new(db.store(), GROUP, Default::default()).expect("inbox");
    let replayed = inbox.replay(id).await.expect("replay");
    assert!(
        matches!(replayed, Outcome::Deferred { deferrals: 1, .. }),
        "{replayed:?}"
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL AND due_at IS NOT NULL"
        )
        .await,
        1,
        "back in the inbox, deferred"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_dead_letters WHERE replayed_at IS NOT NULL")
            .await,
        1,
        "the letter is replayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_message_deferred_more_than_max_deferrals_is_dead_lettered() {
    deferred_past_the_limit_is_dead_lettered(&Pg::open("defer_limit").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_message_deferred_more_than_max_deferrals_is_dead_lettered() {
    deferred_past_the_limit_is_dead_lettered(&Lite::open("defer-limit").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_message_deferred_more_than_max_deferrals_is_dead_lettered() {
    deferred_past_the_limit_is_dead_lettered(&My::open("defer_limit").await).await;
}

// ---------------------------------------------------------------------------------------------
// A two-phase handler defers (PostgreSQL and MariaDB: two-phase handlers run there in parallel).

#[inbox_handler(
    event = "PayOrderCancelled",
    group = "payments-two-phase",
    mode = "two_phase",
    ordered = true
)]
async fn cancel_two_phase(event: OrderCancelled, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    cancel_on_pg(event, tx).await
}

/// The cancel is received, acknowledged and run by a two-phase worker, which defers it; the
/// two-phase workers leave the deferred row alone (and a later row of its key is not held
/// behind it), and the deferred worker runs it once its order exists.
#[cfg(feature = "mysql")]
#[inbox_handler(
    event = "PayOrderCancelled",
    group = "payments-two-phase",
    mode = "two_phase",
    ordered = true
)]
async fn cancel_two_phase_mysql(
    event: OrderCancelled,
    tx: &mut MySqlTx<'_>,
) -> Result<(), HandlerError> {
    cancel_on_mysql(event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_two_phase_handler_defers_and_its_message_runs_once_when_due() {
    two_phase_defers(&Pg::open("defer_two_phase").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_two_phase_handler_defers_and_its_message_runs_once_when_due() {
    two_phase_defers(&My::open("defer_two_phase").await).await;
}

async fn two_phase_defers<P: Payments>(db: &P) {
    let group = "payments-two-phase";
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1);
    broker.produce(TOPIC, Some(0), cancelled("t-1"));
    let builder =
        inoutbox::Consumer::builder(group, db.store(), MemoryTransport::new(&broker, [TOPIC]))
            .deferred_poll(Duration::from_millis(10))
            .two_phase_poll(Duration::from_millis(10))
            // t-1 waits for its order as long as the test needs.
            .max_deferrals(u32::MAX);
    let running = RunningConsumer::start(builder);
    wait_count(
        db,
        "SELECT count(*) FROM inoutbox_inbox WHERE event_id = 'cancelled-t-1' \
           AND processed_at IS NULL AND deferrals >= 1",
        1,
        "the two-phase worker deferred the cancel",
    )
    .await;
    // A later message of the same key, with its order already there: not held behind t-1.
    db.exec("INSERT INTO orders (id, status) VALUES ('t-1-later', 'placed')")
        .await;
    broker.produce(
        TOPIC,
        Some(0),
        keyed(
            "PayOrderCancelled",
            "cancelled-t-1-later",
            "t-1",
            "t-1-later",
        ),
    );
    wait_count(
        db,
        &refunds_of("t-1-later"),
        1,
        "the later message of the key ran while t-1 was deferred",
    )
    .await;
    assert_eq!(db.count(&refunds_of("t-1")).await, 0, "t-1 still deferred");
    db.exec("INSERT INTO orders (id, status) VALUES ('t-1', 'placed')")
        .await;
    wait_count(db, &refunds_of("t-1"), 1, "the deferred cancel ran").await;
    wait_count(
        db,
        "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL",
        0,
        "no row left unprocessed",
    )
    .await;
    running.stop().await;
    assert_eq!(
        db.count("SELECT count(*) FROM refunds").await,
        2,
        "each once"
    );
}
