//! The batched inbox engine: several messages of one partition in one transaction, with each
//! failure isolated to its message; partitions that never wait for each other; key-ordered
//! lanes. Each test has its own broker, topic and schema.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inoutbox::inbox::{Backoff, Ordering};
use inoutbox::prelude::*;
use inoutbox::{Consumer, Outcome, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::child::ChildProcess;
use support::{send, Broker, Msg, Running, TestDb};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

struct Setup {
    broker: Broker,
    db: TestDb,
    store: inoutbox::PgStore,
    topic: String,
    producer: rdkafka::producer::FutureProducer,
}

impl Setup {
    async fn new(name: &str, partitions: i32) -> Self {
        let broker = Broker::start();
        let db = TestDb::new(name).await;
        let store = db.migrated_store().await;
        let topic = support::unique(name);
        broker.create_topic(&topic, partitions).await;
        let producer = support::producer(&broker.brokers);
        Self {
            broker,
            db,
            store,
            topic,
            producer,
        }
    }

    /// A consumer whose batches wait long enough to gather a whole backlog.
    fn consumer(
        &self,
        group: &str,
    ) -> inoutbox::ConsumerBuilder<inoutbox::PgStore, inoutbox::KafkaConfig> {
        Consumer::builder(
            group,
            self.store.clone(),
            support::kafka(&self.broker.brokers, &self.topic),
        )
        .max_wait(Duration::from_millis(300))
        .retry(RetryPolicy::default().max_attempts(3).backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(1),
        )))
    }

    /// Sends orders with totals `0..n` (the total says which message it is) to `partition`,
    /// all with one key: the default order (per key) then keeps them in offset order in one
    /// lane, as these tests of a partition's batches need.
    async fn send_orders(&self, n: i64, partition: i32) -> Vec<Uuid> {
        let mut orders = Vec::new();
        for i in 0..n {
            let order = Uuid::new_v4();
            let mut msg = Msg::order(&Uuid::new_v4().to_string(), order, i).on_partition(partition);
            msg.key = Some(format!("partition-{partition}"));
            send(&self.producer, &self.topic, msg).await;
            orders.push(order);
        }
        orders
    }

    async fn invoices_of(&self, order: Uuid) -> i64 {
        self.db
            .count(&format!(
                "SELECT count(*) FROM invoices WHERE order_id = '{order}'"
            ))
            .await
    }

    async fn dead_letters(&self) -> i64 {
        self.db
            .count(&format!(
                "SELECT count(*) FROM {}",
                self.db.tables.dead_letters
            ))
            .await
    }
}

async fn insert_invoice(event: &OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The transaction a handler runs in.
async fn txid(tx: &mut PgTx<'_>) -> i64 {
    sqlx::query_scalar("SELECT txid_current()")
        .fetch_one(&mut **tx)
        .await
        .expect("txid")
}

// ---------------------------------------------------------------------------------------------
// A batch that holds a duplicate of one of its own messages.

static DUP_RUNS: Mutex<Vec<(i64, i64)>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "batch-dup")]
async fn batch_dup(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    let id = txid(tx).await;
    DUP_RUNS.lock().unwrap().push((event.total_cents, id));
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_holding_a_duplicate_of_its_own_message_runs_the_handler_once() {
    let s = Setup::new("batchdup", 1).await;
    let mut ids: Vec<String> = Vec::new();
    for i in 0..10 {
        // Message 6 repeats message 2's event id (a producer retry).
        let id = if i == 6 {
            ids[2].clone()
        } else {
            Uuid::new_v4().to_string()
        };
        ids.push(id.clone());
        // One key: one lane, so that the copy is in its first's batch.
        let mut msg = Msg::order(&id, Uuid::new_v4(), i);
        msg.key = Some("one-key".into());
        send(&s.producer, &s.topic, msg).await;
    }
    let mut c = Running::start(s.consumer("batch-dup"));
    let reports = c.take(10).await;
    c.stop().await;

    let outcomes: Vec<&Outcome> = reports.iter().map(|r| &r.outcome).collect();
    assert_eq!(reports[6].outcome, Outcome::Duplicate, "{outcomes:?}");
    assert_eq!(
        reports
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Processed { attempt: 1 }))
            .count(),
        9,
        "{outcomes:?}"
    );
    let runs = DUP_RUNS.lock().unwrap().clone();
    assert_eq!(
        runs.len(),
        9,
        "the handler ran once per distinct event: {runs:?}"
    );
    assert!(
        !runs.iter().any(|(total, _)| *total == 6),
        "the in-batch duplicate did not run"
    );
    let transactions: std::collections::HashSet<i64> = runs.iter().map(|(_, t)| *t).collect();
    assert!(
        transactions.len() < runs.len(),
        "messages shared a transaction (batching on): {runs:?}"
    );
    assert_eq!(s.db.invoices().await, 9);
}

// ---------------------------------------------------------------------------------------------
// Message 3 of 10 fails once, transiently: every effect applies once, only message 3 retried.

static TRANSIENT_FAILED: AtomicBool = AtomicBool::new(false);
static TRANSIENT_RUNS: Mutex<Vec<(i64, u32)>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "batch-transient")]
async fn fails_once_on_three(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    TRANSIENT_RUNS
        .lock()
        .unwrap()
        .push((event.total_cents, meta.attempt));
    insert_invoice(&event, tx).await?;
    if event.total_cents == 3 && !TRANSIENT_FAILED.swap(true, AtomicOrdering::SeqCst) {
        return Err(HandlerError::transient("message 3 fails once"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_three_of_ten_failing_once_is_retried_alone_and_nothing_doubles() {
    let s = Setup::new("batchtransient", 1).await;
    let orders = s.send_orders(10, 0).await;
    let mut c = Running::start(s.consumer("batch-transient"));
    let reports = c.take(10).await;
    c.stop().await;

    for (i, r) in reports.iter().enumerate() {
        let want = if i == 3 { 2 } else { 1 };
        assert_eq!(
            r.outcome,
            Outcome::Processed { attempt: want },
            "message {i}: {reports:#?}"
        );
    }
    for order in &orders {
        assert_eq!(s.invoices_of(*order).await, 1, "order {order} once");
    }
    assert_eq!(s.db.invoices().await, 10);
    let attempts_of_three: Vec<u32> = TRANSIENT_RUNS
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| *t == 3)
        .map(|(_, a)| *a)
        .collect();
    assert_eq!(
        attempts_of_three,
        vec![1, 2],
        "message 3: one failed run, one retry"
    );
}

// ---------------------------------------------------------------------------------------------
// Message 3 of 10 fails permanently: 9 effects, one dead letter, the offset past all 10.

#[inbox_handler(event = "OrderCreated", group = "batch-permanent")]
async fn permanent_on_three(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    if event.total_cents == 3 {
        return Err(HandlerError::permanent("message 3 can never succeed"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_three_of_ten_failing_permanently_is_dead_lettered_and_the_rest_commit() {
    let s = Setup::new("batchpermanent", 1).await;
    s.send_orders(10, 0).await;
    let mut c = Running::start(s.consumer("batch-permanent"));
    let reports = c.take(10).await;
    let committed =
        support::wait_committed(&s.broker.brokers, "batch-permanent", &s.topic, 0, 10).await;
    c.stop().await;

    assert!(
        matches!(reports[3].outcome, Outcome::DeadLettered { .. }),
        "{reports:#?}"
    );
    assert_eq!(s.db.invoices().await, 9);
    assert_eq!(s.dead_letters().await, 1);
    assert_eq!(committed, Some(10), "the offset is committed past all 10");
}

// ---------------------------------------------------------------------------------------------
// SIGKILL in the middle of a batch, after handler 4 of 10 and before the commit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_batch_before_commit_applies_each_event_once_after_restart() {
    let s = Setup::new("batchkill", 1).await;
    let orders = s.send_orders(10, 0).await;
    let args = ["--topic", s.topic.as_str()];
    let mut first = ChildProcess::start(
        "billing",
        &s.db,
        &s.broker.brokers,
        &args,
        Some("after_handler:4"),
    );
    first.wait_for(
        "inoutbox failpoint after_handler reached",
        Duration::from_secs(60),
    );
    first.kill9();
    // The keys of the partition run side by side (the default order): batches before the one
    // in hand may have committed; the one in hand (handler 4's) died with the process.
    let before =
        s.db.count("SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL")
            .await;
    assert!(
        before < 4,
        "the batch in hand died with the process, uncommitted: {before} rows processed"
    );

    let mut second = ChildProcess::start("billing", &s.db, &s.broker.brokers, &args, None);
    support::wait_committed(&s.broker.brokers, "billing", &s.topic, 0, 10).await;
    let status = second.terminate();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    for order in &orders {
        assert_eq!(s.invoices_of(*order).await, 1, "order {order} exactly once");
    }
}

// ---------------------------------------------------------------------------------------------
// One blocked partition never holds up another, and the member stays in the group.

static RELEASE_BLOCKED: AtomicBool = AtomicBool::new(false);
static BLOCKED_RUNS: AtomicUsize = AtomicUsize::new(0);

#[inbox_handler(event = "OrderCreated", group = "batch-isolation")]
async fn blocks_partition_zero(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    if meta.partition == 0 && event.total_cents == 0 {
        BLOCKED_RUNS.fetch_add(1, AtomicOrdering::SeqCst);
        while !RELEASE_BLOCKED.load(AtomicOrdering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_partition_holds_up_no_other_and_the_member_stays_in_the_group() {
    let s = Setup::new("batchisolation", 2).await;
    // Partition 0: a message whose handler blocks, then more than its buffer holds.
    s.send_orders(30, 0).await;
    let b_orders = s.send_orders(200, 1).await;
    // A buffer of 4 messages: partition 0 fills it and is paused; a poll interval of 6 s: a
    // member that stopped polling while the handler is blocked would be kicked out.
    let kafka = support::kafka(&s.broker.brokers, &s.topic)
        .partition_buffer(4)
        .set("max.poll.interval.ms", "6000");
    let mut c = Running::start(
        Consumer::builder("batch-isolation", s.store.clone(), kafka)
            .max_wait(Duration::ZERO)
            .max_batch(20),
    );

    // Partition 1 is processed while partition 0's handler is blocked, for longer than
    // max.poll.interval.ms.
    let started = Instant::now();
    let mut b_done = 0;
    while b_done < b_orders.len() {
        let r = c
            .next(Duration::from_secs(30))
            .await
            .expect("partition 1 keeps flowing while partition 0 is blocked");
        assert_eq!(r.delivery.partition, 1, "partition 0 is blocked: {r:?}");
        b_done += 1;
    }
    let b_time = started.elapsed();
    tokio::time::sleep(Duration::from_secs(8)).await;
    RELEASE_BLOCKED.store(true, AtomicOrdering::SeqCst);
    let rest = c.take(30).await;
    c.stop().await;

    assert!(
        rest.iter()
            .all(|r| r.delivery.partition == 0 && matches!(r.outcome, Outcome::Processed { .. })),
        "{rest:#?}"
    );
    assert_eq!(
        BLOCKED_RUNS.load(AtomicOrdering::SeqCst),
        1,
        "the blocked message ran once: the member was not kicked out and its partition not \
         handed over and redelivered"
    );
    assert_eq!(s.db.invoices().await, 230);
    println!("partition 1: 200 messages in {b_time:?} while partition 0 was blocked");
}

// ---------------------------------------------------------------------------------------------
// Ordering::Key: per key, handler calls follow offset order; different keys run concurrently.

/// What one ordering test's handler saw: (key, offset) per call, and the most calls at once.
struct KeyRun {
    calls: Mutex<Vec<(String, i64)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl KeyRun {
    const fn new() -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        }
    }

    async fn record(
        &self,
        event: OrderCreated,
        tx: &mut PgTx<'_>,
        meta: &MessageMeta,
    ) -> Result<(), HandlerError> {
        let now = self.in_flight.fetch_add(1, AtomicOrdering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, AtomicOrdering::SeqCst);
        let key = String::from_utf8_lossy(meta.key.as_deref().unwrap_or_default()).into_owned();
        self.calls.lock().unwrap().push((key, meta.offset));
        // A random delay, so that lanes overtake each other.
        let delay = (event.order_id.as_u128() % 5) as u64;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        self.in_flight.fetch_sub(1, AtomicOrdering::SeqCst);
        insert_invoice(&event, tx).await
    }
}

static KEYS_EXPLICIT: KeyRun = KeyRun::new();
static KEYS_DEFAULT: KeyRun = KeyRun::new();
static KEYS_PARTITION: KeyRun = KeyRun::new();

#[inbox_handler(event = "OrderCreated", group = "batch-keys")]
async fn keyed(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    KEYS_EXPLICIT.record(event, tx, meta).await
}

#[inbox_handler(event = "OrderCreated", group = "batch-keys-default")]
async fn keyed_by_default(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    KEYS_DEFAULT.record(event, tx, meta).await
}

#[inbox_handler(event = "OrderCreated", group = "batch-partition-order")]
async fn in_partition_order(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    KEYS_PARTITION.record(event, tx, meta).await
}

/// 400 messages of 20 keys on one partition through `group`'s consumer as `configure` sets
/// it; checks that each key's calls follow offset order, every message ran once and the
/// committed offset reached the end. Returns every call's offset in call order.
async fn keyed_run(
    name: &str,
    group: &str,
    run: &KeyRun,
    configure: impl FnOnce(
        inoutbox::ConsumerBuilder<inoutbox::PgStore, inoutbox::KafkaConfig>,
    ) -> inoutbox::ConsumerBuilder<inoutbox::PgStore, inoutbox::KafkaConfig>,
) -> Vec<i64> {
    let s = Setup::new(name, 1).await;
    let keys: Vec<String> = (0..20).map(|k| format!("customer-{k}")).collect();
    let mut expected: HashMap<String, Vec<i64>> = HashMap::new();
    for i in 0..400i64 {
        let key = &keys[(i as usize * 7) % keys.len()];
        let mut msg = Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), i);
        msg.key = Some(key.clone());
        send(&s.producer, &s.topic, msg.on_partition(0)).await;
        expected.entry(key.clone()).or_default().push(i);
    }
    let mut c = Running::start(configure(s.consumer(group)));
    let reports = c.take(400).await;
    let committed = support::wait_committed(&s.broker.brokers, group, &s.topic, 0, 400).await;
    c.stop().await;

    assert!(reports
        .iter()
        .all(|r| matches!(r.outcome, Outcome::Processed { .. })));
    let calls = run.calls.lock().unwrap().clone();
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for (key, offset) in &calls {
        seen.entry(key.clone()).or_default().push(*offset);
    }
    for (key, offsets) in &seen {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "key {key}: handler calls out of offset order: {offsets:?}"
        );
        assert_eq!(
            offsets.len(),
            expected[key].len(),
            "key {key}: every message once"
        );
    }
    assert_eq!(committed, Some(400), "the committed offset reached the end");
    assert_eq!(s.db.invoices().await, 400);
    calls.into_iter().map(|(_, offset)| offset).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_ordering_keeps_each_keys_offset_order_and_runs_keys_concurrently() {
    keyed_run("batchkeys", "batch-keys", &KEYS_EXPLICIT, |c| {
        c.ordering(Ordering::Key)
            .key_lanes(8)
            .max_batch(10)
            .max_wait(Duration::ZERO)
    })
    .await;
    assert!(
        KEYS_EXPLICIT.max_in_flight.load(AtomicOrdering::SeqCst) > 1,
        "different keys ran concurrently"
    );
}

/// The default order (`Ordering::Key`, nothing set): transactions sized from the pool (the test
/// store's 10 connections), each key in offset order, different keys at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_order_sized_from_the_pool_runs_the_keys_of_a_partition_concurrently_each_in_offset_order(
) {
    keyed_run("batchkeysdef", "batch-keys-default", &KEYS_DEFAULT, |c| {
        c.max_batch(10).max_wait(Duration::ZERO)
    })
    .await;
    assert!(
        KEYS_DEFAULT.max_in_flight.load(AtomicOrdering::SeqCst) > 1,
        "with Ordering::Key and lanes from the pool, different keys of one partition run concurrently"
    );
}

/// `Ordering::Partition`, one setting away from the default: every message of the partition in
/// offset order, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_order_keeps_the_whole_partitions_order() {
    let offsets = keyed_run("batchpart", "batch-partition-order", &KEYS_PARTITION, |c| {
        c.ordering(Ordering::Partition)
            .max_batch(10)
            .max_wait(Duration::ZERO)
    })
    .await;
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "Ordering::Partition: calls in the partition's offset order: {offsets:?}"
    );
    assert_eq!(
        KEYS_PARTITION.max_in_flight.load(AtomicOrdering::SeqCst),
        1,
        "Ordering::Partition: one message at a time"
    );
}

// ---------------------------------------------------------------------------------------------
// Revocation while a message of the revoked partition is failing and retrying: the old owner
// stops at once; it neither dead-letters nor commits it, and the new owner applies it.

static OLD_OWNER_RUNS: AtomicUsize = AtomicUsize::new(0);
static OLD_OWNER_FAILED: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[inbox_handler(event = "OrderCreated", group = "batch-revoke")]
async fn fails_on_the_old_owner(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    let owner: String = sqlx::query_scalar("SELECT current_setting('application_name')")
        .fetch_one(&mut **tx)
        .await?;
    if owner == "old-owner" {
        OLD_OWNER_RUNS.fetch_add(1, AtomicOrdering::SeqCst);
        OLD_OWNER_FAILED.notify_one();
        return Err(HandlerError::transient("the old owner cannot apply it"));
    }
    insert_invoice(&event, tx).await
}

/// A store whose sessions are named `name` (the handler tells the two owners apart by it).
async fn named_store(db: &TestDb, name: &str) -> inoutbox::PgStore {
    let options: sqlx::postgres::PgConnectOptions = db.url().parse().expect("database url");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.application_name(name))
        .await
        .expect("connect");
    inoutbox::PgStore::with_tables(pool, db.tables.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_stops_retrying_at_once_and_is_neither_dead_lettered_nor_committed() {
    let s = Setup::new("batchrevoke", 2).await;
    let orders = [s.send_orders(1, 0).await, s.send_orders(1, 1).await].concat();
    // Retries far apart: left alone, the old owner would dead-letter after its third run.
    let retry = RetryPolicy::default()
        .max_attempts(3)
        .backoff(Backoff::new(Duration::from_secs(4), Duration::from_secs(4)));
    let consumer = |store: inoutbox::PgStore| {
        Consumer::builder(
            "batch-revoke",
            store,
            support::kafka(&s.broker.brokers, &s.topic),
        )
        .retry(retry.clone())
    };
    let old = Running::start(consumer(named_store(&s.db, "old-owner").await));
    tokio::time::timeout(Duration::from_secs(30), OLD_OWNER_FAILED.notified())
        .await
        .expect("the old owner fails its first run");
    // A second member joins: one of the two partitions is revoked from the old owner.
    let mut new = Running::start(consumer(named_store(&s.db, "new-owner").await));
    let taken = new.take(1).await.remove(0);
    assert!(
        matches!(taken.outcome, Outcome::Processed { .. }),
        "{taken:?}"
    );
    let moved = taken.delivery.partition;
    // Longer than the old owner's remaining retries would take.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut old_reports = old.stop().await;
    new.stop().await;

    while let Ok(r) = old_reports.try_recv() {
        assert!(
            r.delivery.partition != moved,
            "the old owner resolved the revoked partition's message: {r:?}"
        );
    }
    let dead_on_moved =
        s.db.count(&format!(
            "SELECT count(*) FROM {} WHERE \"partition\" = {moved}",
            s.db.tables.dead_letters
        ))
        .await;
    assert_eq!(
        dead_on_moved, 0,
        "the revoked message was not dead-lettered"
    );
    assert_eq!(
        s.invoices_of(orders[moved as usize]).await,
        1,
        "the new owner applied it once"
    );
    println!(
        "partition {moved} moved; the old owner ran its handler {} times in all",
        OLD_OWNER_RUNS.load(AtomicOrdering::SeqCst)
    );
}
