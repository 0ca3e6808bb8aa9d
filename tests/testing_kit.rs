//! `inoutbox::testing`: the real inbox path without a broker, the in-memory SQLite store, the
//! relay's drain and `wait_idle`; and the `inoutbox::...` log targets a `inoutbox` filter catches.
//!
//! Everything here runs in process (SQLite in memory, librdkafka's in-process Kafka): no
//! service is needed.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inoutbox::inbox::{Backoff, InboxConfig};
use inoutbox::kafka::InProcessKafka;
use inoutbox::prelude::*;
use inoutbox::relay::RelayReport;
use inoutbox::testing::{delivery, sqlite_memory, wait_idle, NotIdle, TestInbox};
use inoutbox::{Outcome, Relay, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::read_topic;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "KitOrder", topic = "kit-orders", key = order_id)]
pub struct KitOrder {
    pub order_id: String,
    pub total_cents: i64,
}

/// Writes an invoice; a negative total is a permanent error, a zero total a transient one.
#[inbox_handler(event = "KitOrder", group = "kit")]
async fn kit_invoice(event: KitOrder, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    if event.total_cents < 0 {
        return Err(HandlerError::permanent("negative total"));
    }
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(&event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    if event.total_cents == 0 {
        return Err(HandlerError::transient("zero total, try later"));
    }
    Ok(())
}

async fn store_with_invoices() -> inoutbox::SqliteStore {
    let store = sqlite_memory().await.expect("in-memory store");
    sqlx::query("CREATE TABLE invoices (order_id TEXT NOT NULL, total_cents INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("invoices table");
    store
}

async fn invoices(store: &inoutbox::SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(store.pool())
        .await
        .expect("count")
}

fn order(id: &str, total_cents: i64) -> KitOrder {
    KitOrder {
        order_id: id.into(),
        total_cents,
    }
}

#[tokio::test]
async fn a_delivered_event_runs_the_handler_once_and_its_redelivery_is_a_duplicate() {
    let store = store_with_invoices().await;
    let kit = TestInbox::new(store.clone(), "kit").expect("inbox");
    let message = delivery(&order("o-1", 1200));
    assert_eq!(
        kit.deliver_raw(message.clone()).await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(kit.deliver_raw(message).await, Outcome::Duplicate);
    // a new event id is a new event
    assert_eq!(
        kit.deliver(&order("o-1", 1200)).await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(invoices(&store).await, 2);
    let inbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inoutbox_inbox")
        .fetch_one(store.pool())
        .await
        .expect("inbox rows");
    assert_eq!(
        inbox_rows, 2,
        "one inbox row per event id, written by the real path"
    );
}

#[tokio::test]
async fn failures_roll_back_retry_and_dead_letter_as_the_consumer_does() {
    let store = store_with_invoices().await;
    let fast = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
    let mut config = InboxConfig::default();
    config.retry = RetryPolicy::default().max_attempts(3).backoff(fast);
    let kit = TestInbox::with_config(store.clone(), "kit", config).expect("inbox");
    // transient: the write rolls back each time, three runs, then a dead letter
    let outcome = kit.deliver(&order("o-0", 0)).await;
    assert!(
        matches!(outcome, Outcome::DeadLettered { .. }),
        "{outcome:?}"
    );
    assert_eq!(invoices(&store).await, 0, "every failed run rolled back");
    // permanent: dead-lettered at once
    let outcome = kit.deliver(&order("o-neg", -1)).await;
    assert!(
        matches!(outcome, Outcome::DeadLettered { .. }),
        "{outcome:?}"
    );
    // raw bytes that are not JSON
    let mut bad = delivery(&order("o-bad", 1));
    bad.payload = Some(b"not json".to_vec());
    let outcome = kit.deliver_raw(bad).await;
    assert!(
        matches!(&outcome, Outcome::DeadLettered { reason, .. } if reason.contains("JSON") || reason.contains("json") || reason.contains("decode")),
        "{outcome:?}"
    );
    let letters: Vec<(String, i64)> =
        sqlx::query_as("SELECT error, attempts FROM inoutbox_dead_letters ORDER BY id")
            .fetch_all(store.pool())
            .await
            .expect("letters");
    assert_eq!(letters.len(), 3, "{letters:?}");
    assert_eq!(letters[0].1, 3, "the transient failure ran three times");
    assert!(letters[1].0.contains("negative total"), "{letters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_store_is_one_database_for_every_connection_of_its_pool() {
    let store = sqlite_memory().await.expect("store");
    let mut first = store.pool().acquire().await.expect("first");
    let mut second = store.pool().acquire().await.expect("second");
    sqlx::query("CREATE TABLE seen (n INTEGER)")
        .execute(&mut *first)
        .await
        .expect("create");
    sqlx::query("INSERT INTO seen VALUES (7)")
        .execute(&mut *first)
        .await
        .expect("insert");
    let n: i64 = sqlx::query_scalar("SELECT n FROM seen")
        .fetch_one(&mut *second)
        .await
        .expect("the other connection sees the table");
    assert_eq!(n, 7);
    drop((first, second));
    // idle connections are not retired with the database
    tokio::time::sleep(Duration::from_millis(50)).await;
    let migrated: i64 = sqlx::query_scalar("SELECT count(*) FROM inoutbox_migrations")
        .fetch_one(store.pool())
        .await
        .expect("migrations table");
    assert!(migrated >= 3, "migrated: {migrated}");
    // another call is another database
    let other = sqlite_memory().await.expect("other");
    assert!(sqlx::query("SELECT n FROM seen")
        .fetch_one(other.pool())
        .await
        .is_err());
}

async fn enqueue_orders(store: &inoutbox::SqliteStore, n: usize) {
    let mut tx = store.pool().begin().await.expect("begin");
    for i in 0..n {
        inoutbox::outbox::enqueue(&mut tx, &order(&format!("o-{i}"), i as i64 + 1))
            .await
            .expect("enqueue");
    }
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_publishes_every_row_and_returns_once_the_outbox_is_empty() {
    let kafka = InProcessKafka::start().expect("in-process kafka");
    kafka.create_topic("kit-orders", 1).expect("topic");
    let store = sqlite_memory().await.expect("store");
    enqueue_orders(&store, 40).await;
    let (reports, mut published) = tokio::sync::mpsc::unbounded_channel();
    let relay = Relay::builder(
        store.clone(),
        inoutbox::kafka::KafkaProducer::new(kafka.brokers()),
    )
    .reports(reports)
    .build()
    .expect("relay");
    tokio::time::timeout(Duration::from_secs(60), relay.drain())
        .await
        .expect("drain returns")
        .expect("drain");
    // when drain returns, every row is marked published and the broker acknowledged it
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL")
            .fetch_one(store.pool())
            .await
            .expect("count");
    assert_eq!(unpublished, 0);
    let mut acked = 0;
    while let Ok(report) = published.try_recv() {
        acked += usize::from(matches!(report, RelayReport::Published { .. }));
    }
    assert_eq!(acked, 40);
    let msgs = read_topic(
        kafka.brokers(),
        "kit-orders",
        1,
        40,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(msgs.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_idle_returns_when_a_running_relay_has_published_everything() {
    let kafka = InProcessKafka::start().expect("in-process kafka");
    kafka.create_topic("kit-orders", 1).expect("topic");
    let store = sqlite_memory().await.expect("store");
    enqueue_orders(&store, 25).await;
    // no relay yet: not idle
    match wait_idle(&store, Duration::from_millis(200)).await {
        Err(NotIdle::Unpublished { unpublished, .. }) => assert_eq!(unpublished, 25),
        other => panic!("expected 25 unpublished rows, got {other:?}"),
    }
    let relay = Relay::builder(
        store.clone(),
        inoutbox::kafka::KafkaProducer::new(kafka.brokers()),
    )
    .build()
    .expect("relay");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    wait_idle(&store, Duration::from_secs(60))
        .await
        .expect("the relay publishes everything");
    let published: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NOT NULL")
            .fetch_one(store.pool())
            .await
            .expect("count");
    assert_eq!(published, 25);
    let _ = stop.send(());
    task.await.expect("task").expect("relay");
}

/// The payload on the broker is the producer's JSON byte for byte (SQLite stores it as text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_relay_publishes_exactly_the_serialised_bytes() {
    #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
    #[outbox(event_type = "KitSigned", topic = "kit-signed", key = zz)]
    struct KitSigned {
        zz: String,
        a: i64,
        mmm: Box<serde_json::value::RawValue>,
    }
    let raw = r#"{"b" : 1,  "a":[1, 2], "b": 2}"#;
    let expected = r#"{"zz":"k","a":1,"mmm":{"b" : 1,  "a":[1, 2], "b": 2}}"#;
    let kafka = InProcessKafka::start().expect("in-process kafka");
    kafka.create_topic("kit-signed", 1).expect("topic");
    let store = sqlite_memory().await.expect("store");
    let event = KitSigned {
        zz: "k".into(),
        a: 1,
        mmm: serde_json::value::RawValue::from_string(raw.into()).expect("raw"),
    };
    let mut tx = store.pool().begin().await.expect("begin");
    inoutbox::outbox::enqueue(&mut tx, &event)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    Relay::builder(
        store.clone(),
        inoutbox::kafka::KafkaProducer::new(kafka.brokers()),
    )
    .build()
    .expect("relay")
    .drain()
    .await
    .expect("drain");
    let msg = read_topic(kafka.brokers(), "kit-signed", 1, 1, Duration::from_secs(30))
        .await
        .remove(0);
    assert_eq!(String::from_utf8_lossy(&msg.bytes), expected);
}

/// A `Write` into a shared buffer, for a subscriber's output.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged in this test binary under the filter `inoutbox=debug`, through a global
/// subscriber (a scoped one, `set_default`, can miss events: a callsite registered on another
/// test's thread at the same moment may keep the interest it had without it).
fn captured_inoutbox_logs() -> Captured {
    use tracing_subscriber::layer::SubscriberExt;
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let writer = captured.clone();
            let filter: tracing_subscriber::filter::Targets =
                "inoutbox=debug".parse().expect("filter");
            let subscriber = tracing_subscriber::registry()
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(false)
                        .with_writer(move || writer.clone()),
                )
                .with(filter);
            tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
            captured
        })
        .clone()
}

/// `RUST_LOG=inoutbox=debug` shows the engine's logs: every event is under a `inoutbox::...`
/// target (the filter here is the same directive, parsed by tracing-subscriber).
#[tokio::test]
async fn a_inoutbox_filter_catches_the_engine_logs() {
    let captured = captured_inoutbox_logs();
    let store = store_with_invoices().await;
    let kit = TestInbox::new(store.clone(), "kit").expect("inbox");
    let message = delivery(&order("o-log", 5));
    let id = String::from_utf8_lossy(message.header("ce_id").expect("ce_id")).into_owned();
    let outcome = kit.deliver_raw(message).await;
    assert_eq!(outcome, Outcome::Processed { attempt: 1 });
    let text = String::from_utf8(captured.0.lock().expect("buffer").clone()).expect("utf-8");
    let line = text
        .lines()
        .find(|l| l.contains(&id) && l.contains(" processed"));
    assert!(
        line.is_some_and(|l| l.contains("inoutbox::engine")),
        "the engine's `processed` line for {id} under a inoutbox::engine target: {line:?}"
    );
}

/// The database refuses every dead letter, even stripped of its headers and type: the message
/// is held, never acknowledged as skipped, until the consumer stops; it is then abandoned (and
/// delivered again).
#[tokio::test]
async fn a_dead_letter_refused_even_stripped_holds_its_message_until_the_stop() {
    let store = store_with_invoices().await;
    sqlx::raw_sql(
        "CREATE TRIGGER refuse_new_dead_letters BEFORE INSERT ON inoutbox_dead_letters \
         BEGIN SELECT RAISE(ABORT, 'dead letters refused'); END; \
         CREATE TRIGGER refuse_dead_letter_updates BEFORE UPDATE ON inoutbox_dead_letters \
         BEGIN SELECT RAISE(ABORT, 'dead letters refused'); END;",
    )
    .execute(store.pool())
    .await
    .expect("triggers");
    let mut config = InboxConfig::default();
    config.outage_backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(10));
    let kit = TestInbox::with_config(store, "kit", config).expect("inbox");
    let mut bad = delivery(&KitOrder {
        order_id: "o-1".into(),
        total_cents: 1,
    });
    bad.payload = Some(b"not json".to_vec());
    bad.offset = 0;
    let stop = inoutbox::shutdown::CancellationToken::new();
    let held = {
        let stop = stop.clone();
        tokio::spawn(async move { kit.inbox().process(&bad, &stop).await })
    };
    // Time for the three refusals and the stripped letter's (a few milliseconds each).
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let outcome = held.await.expect("task");
    assert!(
        matches!(outcome, Outcome::Abandoned),
        "the message must not be acknowledged: {outcome:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Effects after commit: a test runs the group's executors on what a delivery scheduled.

/// A fraud review after the payment's commit: a review for every order, a manual review
/// (which the test registers no executor for) for a negative total.
#[inbox_handler(event = "KitOrder", group = "kit-effects", stores(postgres, sqlite))]
async fn kit_review<D: Db + inoutbox::effects::EffectsDb>(
    event: KitOrder,
    tx: &mut Tx<'_, D>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    let kind = if event.total_cents < 0 {
        "manual_review"
    } else {
        "fraud_review"
    };
    inoutbox::effects::after_commit(tx, meta, kind, &event).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_effects_runs_the_executors_on_what_a_delivery_scheduled() {
    run_effects_on::<support::kit::PgKit>().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_effects_runs_the_executors_on_what_a_delivery_scheduled_sqlite() {
    run_effects_on::<support::kit::SqliteKit>().await
}

async fn run_effects_on<K: support::kit::Kit>() {
    use inoutbox::effects::Effect;
    let db = K::new("kit_effects").await;
    let reviewed = Arc::new(Mutex::new(Vec::new()));
    let record = reviewed.clone();
    let kit = TestInbox::new(db.store(), "kit-effects")
        .expect("inbox")
        .effect("fraud_review", move |effect: Effect| {
            let record = record.clone();
            async move {
                let order: KitOrder = effect.payload_as()?;
                record.lock().unwrap().push(order.order_id);
                Ok(())
            }
        });
    assert!(
        kit.run_effects().await.expect("run").is_empty(),
        "nothing scheduled yet"
    );

    let message = delivery(&order("o-1", 1200));
    assert_eq!(
        kit.deliver_raw(message.clone()).await,
        Outcome::Processed { attempt: 1 }
    );
    assert!(
        reviewed.lock().unwrap().is_empty(),
        "an effect runs only when asked to"
    );
    let runs = kit.run_effects().await.expect("run");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (effect, error) = (&runs[0].effect, &runs[0].error);
    assert_eq!(*error, None);
    assert_eq!((effect.kind.as_str(), effect.attempt), ("fraud_review", 1));
    assert_eq!(effect.group, "kit-effects");
    assert!(
        effect.idempotency_key.starts_with("inoutbox-"),
        "{effect:?}"
    );
    assert_eq!(*reviewed.lock().unwrap(), ["o-1"]);
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_effects WHERE done_at IS NOT NULL")
            .await,
        1,
        "marked done"
    );
    // Done: not run again; a redelivery is a duplicate and schedules nothing.
    assert_eq!(kit.deliver_raw(message).await, Outcome::Duplicate);
    assert!(kit.run_effects().await.expect("run").is_empty());

    // An effect of a kind without an executor is a failed run, left for its backoff.
    assert_eq!(
        kit.deliver(&order("o-2", -5)).await,
        Outcome::Processed { attempt: 1 }
    );
    let runs = kit.run_effects().await.expect("run");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].effect.kind, "manual_review");
    assert_eq!(
        runs[0].error.as_deref(),
        Some("no executor for effect kind `manual_review`")
    );
    assert!(
        kit.run_effects().await.expect("run").is_empty(),
        "retried after a backoff"
    );
    assert_eq!(*reviewed.lock().unwrap(), ["o-1"]);
}

#[tokio::test]
async fn an_effect_can_be_made_to_test_an_executor_alone() {
    use inoutbox::effects::{idempotency_key, Effect};
    let effect = Effect::new("kit-effects", "e-1", "fraud_review", &order("o-9", 10))
        .expect("effect")
        .with_attempt(2);
    assert_eq!(
        effect.idempotency_key,
        idempotency_key("kit-effects", "", "e-1", "fraud_review")
    );
    assert_eq!(effect.attempt, 2);
    let decoded: KitOrder = effect.payload_as().expect("payload");
    assert_eq!(decoded.order_id, "o-9");
}

/// An event this service only consumes: its event type, nothing of publishing.
#[derive(Debug, Serialize, Deserialize, InboxEvent)]
#[inbox(event_type = "KitRefundAsked")]
pub struct KitRefundAsked {
    pub order_id: String,
}

#[inbox_handler(event = "KitRefundAsked", group = "kit-refunds")]
async fn kit_refund(event: KitRefundAsked, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, -1)")
        .bind(&event.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_consumed_only_event_is_delivered_on_a_topic_and_deduplicated() {
    let store = store_with_invoices().await;
    let kit = TestInbox::new(store.clone(), "kit-refunds").expect("inbox");
    let asked = KitRefundAsked {
        order_id: "o-9".into(),
    };
    let message = inoutbox::testing::delivery_on("refunds", &asked);
    assert_eq!(&*message.topic, "refunds");
    assert_eq!(
        message.key, None,
        "a consumed-only event has no key of its own"
    );
    assert_eq!(
        kit.deliver_raw(message.clone()).await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(kit.deliver_raw(message).await, Outcome::Duplicate);
    assert_eq!(
        kit.deliver_on("refunds", &asked).await,
        Outcome::Processed { attempt: 1 },
        "a new event id is a new event"
    );
    assert_eq!(invoices(&store).await, 2);
}
