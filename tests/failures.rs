//! Failures: retries, panics, permanent errors, dead letters and their replay, bad messages,
//! database and broker outages. Each test has its own broker, topic and schema.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inoutbox::inbox::{Backoff, UnknownEvent};
use inoutbox::inbox::{Inbox, ReplayError};
use inoutbox::prelude::*;
use inoutbox::{Consumer, Outcome, RetryPolicy};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Headers, Message};
use serde::{Deserialize, Serialize};
use support::{send, Broker, Msg, Running, TestDb};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

async fn insert_invoice(event: &OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn fast_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(max_attempts)
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
        ))
}

struct Setup {
    broker: Broker,
    db: TestDb,
    store: inoutbox::PgStore,
    topic: String,
    producer: rdkafka::producer::FutureProducer,
}

async fn setup(name: &str, partitions: i32) -> Setup {
    let broker = Broker::start();
    let db = TestDb::new(name).await;
    let store = db.migrated_store().await;
    let topic = support::unique(name);
    broker.create_topic(&topic, partitions).await;
    let producer = support::producer(&broker.brokers);
    Setup {
        broker,
        db,
        store,
        topic,
        producer,
    }
}

impl Setup {
    fn consumer(
        &self,
        group: &str,
    ) -> inoutbox::ConsumerBuilder<inoutbox::PgStore, inoutbox::KafkaConfig> {
        Consumer::builder(
            group,
            self.store.clone(),
            support::kafka(&self.broker.brokers, &self.topic),
        )
    }

    /// Sends an order; every order of a test shares one key, so that the default order (per
    /// key) reports them in offset order, as these tests read their reports.
    async fn send_order(&self, total_cents: i64) -> Uuid {
        let order = Uuid::new_v4();
        let mut msg = Msg::order(&Uuid::new_v4().to_string(), order, total_cents);
        msg.key = Some(ONE_KEY.into());
        send(&self.producer, &self.topic, msg).await;
        order
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

// ---------------------------------------------------------------------------------------------
// Retries: the attempt count is stored outside the rolled-back transaction and seen by the
// handler; a panic is an error like any other.

/// Each run of the `retry` handler: the attempt it was told, and when it started.
static RETRY_ATTEMPTS_SEEN: Mutex<Vec<(u32, Instant)>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "retry")]
async fn fails_twice(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    RETRY_ATTEMPTS_SEEN
        .lock()
        .unwrap()
        .push((meta.attempt, Instant::now()));
    insert_invoice(&event, tx).await?;
    if meta.attempt < 3 {
        return Err(HandlerError::transient(format!(
            "transient failure on attempt {}",
            meta.attempt
        )));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_with_backoff_and_counted() {
    let s = setup("retry", 1).await;
    s.send_order(100).await;
    // Waits of 300 ms then 600 ms, each shortened by at most a quarter (the jitter).
    let (jitter, backoff) = (
        0.25,
        Backoff::new(Duration::from_millis(300), Duration::from_secs(5)),
    );
    let policy = RetryPolicy::default()
        .max_attempts(5)
        .backoff(backoff.jitter(jitter));
    let mut c = Running::start(s.consumer("retry").retry(policy));
    let report = c.take(1).await.remove(0);
    c.stop().await;
    assert_eq!(report.outcome, Outcome::Processed { attempt: 3 });
    let runs = RETRY_ATTEMPTS_SEEN.lock().unwrap().clone();
    let attempts: Vec<u32> = runs.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    for (failed, pair) in runs.windows(2).enumerate() {
        let gap = pair[1].1 - pair[0].1;
        let configured = backoff.delay(failed as u32 + 1);
        let shortest = configured.mul_f64(1.0 - jitter);
        println!("wait after failed run {}: {gap:?} (configured {configured:?}, jitter may shorten it to {shortest:?})", failed + 1);
        assert!(
            gap >= shortest,
            "run {} started {gap:?} after run {}: the backoff is {configured:?} less at most {jitter} jitter",
            failed + 2,
            failed + 1
        );
        assert!(
            gap < configured + Duration::from_secs(5),
            "a wait of {gap:?} for a backoff of {configured:?}"
        );
    }
    assert_eq!(
        s.db.invoices().await,
        1,
        "the two failed runs were rolled back"
    );
    assert_eq!(
        s.db.count(&format!("SELECT count(*) FROM {}", s.db.tables.attempts))
            .await,
        0,
        "cleared on success"
    );
}

static RESTART_ATTEMPTS_SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "restart-attempts")]
async fn fails_until_third(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    RESTART_ATTEMPTS_SEEN.lock().unwrap().push(meta.attempt);
    insert_invoice(&event, tx).await?;
    if meta.attempt < 3 {
        return Err(HandlerError::transient("not yet"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_count_survives_rollback_and_restart() {
    let s = setup("restart", 1).await;
    s.send_order(100).await;
    // Two consumer lifetimes, one run each, nothing kept in memory between them.
    for expected in 1..=2u32 {
        let mut c = Running::start(
            s.consumer("restart-attempts")
                .retry(RetryPolicy::no_retries())
                .on_exhausted(inoutbox::inbox::OnExhausted::LeaveUncommitted),
        );
        let report = c.take(1).await.remove(0);
        c.stop().await;
        assert!(
            matches!(report.outcome, Outcome::FailedUnacknowledged { attempts, .. } if attempts == expected),
            "{report:?}"
        );
    }
    let mut c = Running::start(s.consumer("restart-attempts"));
    let report = c.take(1).await.remove(0);
    c.stop().await;
    assert_eq!(report.outcome, Outcome::Processed { attempt: 3 });
    assert_eq!(*RESTART_ATTEMPTS_SEEN.lock().unwrap(), vec![1, 2, 3]);
    assert_eq!(s.db.invoices().await, 1);
}

static PANICKED: AtomicBool = AtomicBool::new(false);

#[inbox_handler(event = "OrderCreated", group = "panic")]
async fn panics_once(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    if !PANICKED.swap(true, Ordering::SeqCst) {
        panic!("handler bug");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_and_the_consumer_keeps_running() {
    let s = setup("panic", 1).await;
    s.send_order(100).await;
    s.send_order(200).await;
    let mut c = Running::start(s.consumer("panic").retry(fast_retries(3)));
    let reports = c.take(2).await;
    c.stop().await;
    assert_eq!(reports[0].outcome, Outcome::Processed { attempt: 2 });
    assert_eq!(reports[1].outcome, Outcome::Processed { attempt: 1 });
    assert_eq!(s.db.invoices().await, 2);
    let error: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT last_error FROM {} LIMIT 1",
        s.db.tables.attempts
    )))
    .fetch_optional(&s.db.pool)
    .await
    .unwrap()
    .unwrap_or_default();
    assert!(
        error.is_empty(),
        "attempts row cleared after success, found {error:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Permanent errors and exhausted retries: dead-lettered, the partition moves on; replayable.

static PERMANENT_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "permanent")]
async fn rejects_negative_totals(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    if event.total_cents < 0 {
        PERMANENT_RUNS.fetch_add(1, Ordering::SeqCst);
        return Err(HandlerError::permanent(format!(
            "negative total {}",
            event.total_cents
        )));
    }
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_dead_letters_at_once_and_the_partition_moves_on() {
    let s = setup("permanent", 1).await;
    s.send_order(-5).await;
    s.send_order(10).await;
    let mut c = Running::start(s.consumer("permanent").retry(fast_retries(5)));
    let reports = c.take(2).await;
    let committed = support::wait_committed(&s.broker.brokers, "permanent", &s.topic, 0, 2).await;
    c.stop().await;
    assert!(
        matches!(&reports[0].outcome, Outcome::DeadLettered { reason, .. } if reason.contains("negative total -5")),
        "{reports:#?}"
    );
    assert_eq!(
        PERMANENT_RUNS.load(Ordering::SeqCst),
        1,
        "no retry of a permanent error"
    );
    assert!(matches!(reports[1].outcome, Outcome::Processed { .. }));
    assert_eq!(committed, Some(2));
    let (attempts, error): (i32, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT attempts, error FROM {}",
        s.db.tables.dead_letters
    )))
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 1);
    assert!(error.contains("permanent: negative total -5"), "{error}");
}

static SLOW_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "statement-timeout")]
async fn outlives_its_statement_timeout(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    if event.total_cents == 777 {
        SLOW_RUNS.fetch_add(1, Ordering::SeqCst);
        sqlx::query("SET LOCAL statement_timeout = '50ms'")
            .execute(&mut **tx)
            .await?;
        sqlx::query("SELECT pg_sleep(5)").execute(&mut **tx).await?;
    }
    Ok(())
}

/// A statement timeout (SQLSTATE 57014) while the database answers is this message's doing:
/// its runs are counted, it is dead-lettered with the reason, and the partition moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_always_hits_statement_timeout_is_dead_lettered_and_later_ones_commit() {
    let s = setup("statement_timeout", 1).await;
    s.send_order(777).await;
    s.send_order(1).await;
    let mut c = Running::start(s.consumer("statement-timeout").busy_attempts(3));
    let reports = c.take(2).await;
    let committed =
        support::wait_committed(&s.broker.brokers, "statement-timeout", &s.topic, 0, 2).await;
    c.stop().await;
    assert!(
        matches!(&reports[0].outcome, Outcome::DeadLettered { reason, .. }
            if reason.contains("on 3 runs") && reason.contains("statement timeout")),
        "{reports:#?}"
    );
    assert_eq!(SLOW_RUNS.load(Ordering::SeqCst), 3, "three runs, counted");
    assert!(matches!(reports[1].outcome, Outcome::Processed { .. }));
    assert_eq!(committed, Some(2));
    let attempts: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT attempts FROM {}",
        s.db.tables.dead_letters
    )))
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 3);
    assert_eq!(
        s.db.count(&format!("SELECT count(*) FROM {}", s.db.tables.inbox))
            .await,
        1,
        "only the later message's row committed"
    );
}

static FIXED: AtomicBool = AtomicBool::new(false);
static EXHAUST_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "exhaust")]
async fn fails_until_fixed(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    EXHAUST_RUNS.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await?;
    if event.total_cents == 666 && !FIXED.load(Ordering::SeqCst) {
        return Err(HandlerError::transient("downstream rejected the order"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_dead_letter_to_table_and_topic_then_replay_applies_once() {
    let s = setup("exhaust", 1).await;
    let dlq_topic = format!("{}.dlq", s.topic);
    s.broker.create_topic(&dlq_topic, 1).await;
    let poison = s.send_order(666).await;
    s.send_order(1).await;
    let kafka = support::kafka(&s.broker.brokers, &s.topic)
        .dead_letter_topic(&dlq_topic)
        .set_producer("enable.idempotence", "false");
    let mut c =
        Running::start(Consumer::builder("exhaust", s.store.clone(), kafka).retry(fast_retries(3)));
    let reports = c.take(2).await;
    c.stop().await;
    let Outcome::DeadLettered { id, reason } = &reports[0].outcome else {
        panic!("{reports:#?}")
    };
    assert!(
        reason.contains("failed 3 times") && reason.contains("downstream rejected"),
        "{reason}"
    );
    assert_eq!(
        EXHAUST_RUNS.load(Ordering::SeqCst),
        4,
        "3 runs of the poison message, 1 of the next"
    );
    assert!(
        matches!(reports[1].outcome, Outcome::Processed { .. }),
        "the partition moved on"
    );
    assert_eq!(s.db.invoices().await, 1);

    // The table keeps the raw message; the topic has a copy with the reason.
    let (payload, names): (Vec<u8>, Vec<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT payload, header_names FROM {} WHERE id = $1",
        s.db.tables.dead_letters
    )))
    .bind(id)
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<OrderCreated>(&payload)
            .unwrap()
            .order_id,
        poison
    );
    assert!(names.contains(&"ce_id".to_owned()) && names.contains(&"ce_type".to_owned()));
    let dlq: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &s.broker.brokers)
        .set("group.id", "dlq-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    dlq.subscribe(&[dlq_topic.as_str()]).unwrap();
    let m = tokio::time::timeout(Duration::from_secs(30), dlq.recv())
        .await
        .expect("a dead letter on the topic")
        .unwrap();
    assert_eq!(m.payload(), Some(payload.as_slice()));
    let reason_header = m
        .headers()
        .and_then(|h| {
            h.iter()
                .find(|h| h.key == "inoutbox_dlq_reason")
                .and_then(|h| h.value.map(<[u8]>::to_vec))
        })
        .expect("reason header");
    assert!(String::from_utf8_lossy(&reason_header).contains("downstream rejected"));

    // Fix the bug, replay: the handler runs through the inbox, once.
    FIXED.store(true, Ordering::SeqCst);
    let inbox = Inbox::new(s.store.clone(), "exhaust", Default::default()).unwrap();
    let outcome = inbox.replay(*id).await.unwrap();
    assert_eq!(outcome, Outcome::Processed { attempt: 1 });
    assert_eq!(s.db.invoices().await, 2);
    assert!(matches!(
        inbox.replay(*id).await,
        Err(ReplayError::AlreadyReplayed { .. })
    ));
    assert!(matches!(
        inbox.replay(999_999).await,
        Err(ReplayError::NotFound { .. })
    ));
    assert_eq!(s.db.invoices().await, 2, "a second replay applies nothing");
}

// ---------------------------------------------------------------------------------------------
// Bad messages: each dead-lettered at once with a reason naming what was wrong, raw bytes kept.

static BAD_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "bad-messages")]
async fn counts_runs(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    BAD_RUNS.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await
}

/// The key of the messages of a test that reads its reports in offset order.
const ONE_KEY: &str = "one-key";

fn raw(id: Option<&str>, event_type: Option<&str>, payload: &[u8]) -> Msg {
    Msg {
        id: id.map(str::to_owned),
        event_type: event_type.map(str::to_owned),
        payload: payload.to_vec(),
        partition: None,
        key: Some(ONE_KEY.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_dead_lettered_with_reason_and_raw_bytes() {
    let s = setup("bad", 1).await;
    let good =
        serde_json::to_vec(&serde_json::json!({"order_id": Uuid::new_v4(), "total_cents": 1}))
            .unwrap();
    let cases: Vec<(&str, Msg, &str)> = vec![
        (
            "not json",
            raw(Some("b1"), Some("OrderCreated"), b"{not json"),
            "payload does not decode",
        ),
        (
            "missing field",
            raw(
                Some("b2"),
                Some("OrderCreated"),
                br#"{"order_id":"6f1c64c5-3d1c-4a55-9a5d-2a1f0b0c9e11"}"#,
            ),
            "missing field `total_cents`",
        ),
        (
            "wrong type",
            raw(
                Some("b3"),
                Some("OrderCreated"),
                br#"{"order_id":"x","total_cents":"lots"}"#,
            ),
            "invalid",
        ),
        (
            "no id",
            raw(None, Some("OrderCreated"), &good),
            "missing or empty event id header `ce_id`",
        ),
        (
            "empty id",
            raw(Some(""), Some("OrderCreated"), &good),
            "missing or empty event id header `ce_id`",
        ),
        (
            "no type",
            raw(Some("b6"), None, &good),
            "missing or empty event type header `ce_type`",
        ),
        (
            "unknown type",
            raw(Some("b7"), Some("OrderShipped"), &good),
            "no handler for event type `OrderShipped`",
        ),
        (
            "too large",
            raw(Some("b8"), Some("OrderCreated"), &[b' '; 5000]),
            "exceeds the limit of 4096 bytes",
        ),
    ];
    for (_, msg, _) in &cases {
        send(
            &s.producer,
            &s.topic,
            Msg {
                id: msg.id.clone(),
                event_type: msg.event_type.clone(),
                payload: msg.payload.clone(),
                partition: None,
                key: Some(ONE_KEY.into()),
            },
        )
        .await;
    }
    s.send_order(42).await;
    let mut c = Running::start(s.consumer("bad-messages").max_payload_bytes(4096));
    let reports = c.take(cases.len() + 1).await;
    let committed = support::wait_committed(
        &s.broker.brokers,
        "bad-messages",
        &s.topic,
        0,
        cases.len() as i64 + 1,
    )
    .await;
    c.stop().await;
    for ((name, msg, expected), report) in cases.iter().zip(&reports) {
        let Outcome::DeadLettered { reason, id } = &report.outcome else {
            panic!("{name}: expected a dead letter, got {:?}", report.outcome)
        };
        assert!(
            reason.contains(expected),
            "{name}: reason {reason:?} should contain {expected:?}"
        );
        let payload: Option<Vec<u8>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT payload FROM {} WHERE id = $1",
            s.db.tables.dead_letters
        )))
        .bind(id)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
        assert_eq!(
            payload.as_deref(),
            Some(msg.payload.as_slice()),
            "{name}: raw bytes kept"
        );
    }
    assert!(
        matches!(reports[cases.len()].outcome, Outcome::Processed { .. }),
        "the consumer went on"
    );
    assert_eq!(
        BAD_RUNS.load(Ordering::SeqCst),
        1,
        "the handler ran only for the good message"
    );
    assert_eq!(committed, Some(cases.len() as i64 + 1));
    assert_eq!(s.dead_letters().await, cases.len() as i64);
}

#[inbox_handler(event = "OrderCreated", group = "skip-unknown")]
async fn skip_unknown_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_event_types_can_be_skipped_and_acknowledged() {
    let s = setup("skip", 1).await;
    let payload = serde_json::to_vec(&serde_json::json!({"anything": 1})).unwrap();
    send(
        &s.producer,
        &s.topic,
        raw(Some("s1"), Some("InventoryReserved"), &payload),
    )
    .await;
    s.send_order(5).await;
    let mut c = Running::start(s.consumer("skip-unknown").unknown_event(UnknownEvent::Skip));
    let reports = c.take(2).await;
    let committed =
        support::wait_committed(&s.broker.brokers, "skip-unknown", &s.topic, 0, 2).await;
    c.stop().await;
    assert!(
        matches!(&reports[0].outcome, Outcome::Skipped { reason } if reason.contains("InventoryReserved"))
    );
    assert!(matches!(reports[1].outcome, Outcome::Processed { .. }));
    assert_eq!(committed, Some(2));
    assert_eq!(s.dead_letters().await, 0);
}

// ---------------------------------------------------------------------------------------------
// Outages: the database's connections are killed mid-stream; the broker is killed and restarted.

#[inbox_handler(event = "OrderCreated", group = "db-outage")]
async fn slow_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_mid_stream_loses_and_doubles_nothing() {
    let s = setup("dbout", 3).await;
    let total = 300;
    let mut ids = Vec::new();
    for i in 0..total {
        let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
        send(&s.producer, &s.topic, Msg::order(&id, order, i)).await;
        if i % 10 == 0 {
            // a few duplicate deliveries as well
            send(&s.producer, &s.topic, Msg::order(&id, order, i)).await;
        }
        ids.push(order);
    }
    let mut c = Running::start(s.consumer("db-outage").retry(fast_retries(5)));
    let mut seen = 0;
    let mut killed = 0;
    while seen < total + total / 10 {
        c.next(Duration::from_secs(60))
            .await
            .expect("the consumer keeps going through the outage");
        seen += 1;
        if seen % 80 == 0 {
            killed += s.db.terminate_backends().await;
        }
    }
    c.stop().await;
    assert!(killed > 0, "the outage must have hit live connections");
    let distinct =
        s.db.count("SELECT count(DISTINCT order_id) FROM invoices")
            .await;
    println!(
        "terminated {killed} backends; invoices {} for {distinct} orders",
        s.db.invoices().await
    );
    assert_eq!(distinct, total);
    assert_eq!(s.db.invoices().await, total, "no event applied twice");
    assert_eq!(
        s.dead_letters().await,
        0,
        "an outage is not a failure of the message"
    );
}

#[inbox_handler(event = "OrderCreated", group = "broker-outage")]
async fn broker_outage_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_and_restarted_nothing_doubled() {
    let mut s = setup("brokerout", 1).await;
    let first: Vec<(String, Uuid)> = (0..20)
        .map(|_| (Uuid::new_v4().to_string(), Uuid::new_v4()))
        .collect();
    for (id, order) in &first {
        send(&s.producer, &s.topic, Msg::order(id, *order, 1)).await;
    }
    let mut c = Running::start(s.consumer("broker-outage"));
    for r in c.take(first.len()).await {
        assert!(matches!(r.outcome, Outcome::Processed { .. }), "{r:?}");
    }

    // Kill the broker; its memory storage is gone. Restart it on the same port and produce the
    // first events again, then new ones, then the first ones once more: offsets 0-19, 20-39,
    // 40-59. Whether the consumer resumes at its old position (20) or from the beginning (the
    // group's offsets were lost with the broker), it reads 40-59: at least 20 duplicates.
    let port = s.broker.port();
    s.broker.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.broker = Broker::start_on(port);
    s.broker.create_topic(&s.topic, 1).await;
    s.producer = support::producer(&s.broker.brokers);
    let second: Vec<(String, Uuid)> = (0..20)
        .map(|_| (Uuid::new_v4().to_string(), Uuid::new_v4()))
        .collect();
    let resent: Vec<_> = first.iter().chain(&second).chain(&first).collect();
    for (id, order) in &resent {
        send(&s.producer, &s.topic, Msg::order(id, *order, 2)).await;
    }
    let last = resent.len() as i64 - 1;
    let mut reports = Vec::new();
    loop {
        let r = c
            .next(Duration::from_secs(90))
            .await
            .expect("the consumer recovers after the broker restart");
        let done = r.delivery.offset == last;
        reports.push(r);
        if done {
            break;
        }
    }
    // Anything delivered again after that (a late rebalance) is accounted for too.
    while let Some(r) = c.next(Duration::from_secs(3)).await {
        reports.push(r);
    }
    c.stop().await;

    // Every delivery of an event already applied must be skipped by the inbox, every first
    // delivery of a new one applied: the duplicates are counted exactly.
    let mut applied: std::collections::HashSet<String> =
        first.iter().map(|(id, _)| id.clone()).collect();
    let (mut processed, mut duplicates, mut expected_duplicates) = (0, 0, 0);
    for r in &reports {
        let id = r.delivery.header_str("ce_id").expect("ce_id").to_owned();
        let already = applied.contains(&id);
        expected_duplicates += usize::from(already);
        match &r.outcome {
            Outcome::Duplicate if already => duplicates += 1,
            Outcome::Processed { .. } if !already => {
                processed += 1;
                applied.insert(id);
            }
            other => panic!(
                "offset {}: {other:?} for an event {} before",
                r.delivery.offset,
                if already { "applied" } else { "never applied" }
            ),
        }
    }
    let resumed_at = reports.first().map(|r| r.delivery.offset);
    println!(
        "after the broker restart: resumed at offset {resumed_at:?}; {} deliveries: {processed} processed, \
         {duplicates} duplicates skipped (expected {expected_duplicates})",
        reports.len()
    );
    assert_eq!(processed, second.len(), "each new event applied once");
    assert_eq!(duplicates, expected_duplicates);
    assert!(
        duplicates >= first.len(),
        "the events produced again after offset 40 were delivered and skipped"
    );
    assert_eq!(s.db.invoices().await, 40);
    assert_eq!(
        s.db.count("SELECT count(DISTINCT order_id) FROM invoices")
            .await,
        40,
        "nothing doubled"
    );
}

// ---------------------------------------------------------------------------------------------
// Migrations: one call, idempotent, safe from several processes at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_race_safely_and_apply_once() {
    let db = TestDb::new("migrate").await;
    // Four stores with pools of their own (four sessions), migrating a fresh schema at once.
    let mut stores = Vec::new();
    for _ in 0..4 {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&db.url())
            .await
            .expect("pool");
        stores.push(inoutbox::PgStore::with_tables(pool, db.tables.clone()));
    }
    let (a, b, c, d) = tokio::join!(
        stores[0].migrate(),
        stores[1].migrate(),
        stores[2].migrate(),
        stores[3].migrate()
    );
    for result in [a, b, c, d] {
        result.expect("concurrent migrate");
    }
    stores[0].migrate().await.expect("migrate again");
    let applied = db
        .count(&format!("SELECT count(*) FROM {}", db.tables.migrations))
        .await;
    let distinct = db
        .count(&format!(
            "SELECT count(DISTINCT (component, version)) FROM {}",
            db.tables.migrations
        ))
        .await;
    // inbox v1 to v7 and outbox v1 to v6: each recorded once
    assert_eq!(
        (applied, distinct),
        (13, 13),
        "every shipped migration, each recorded once"
    );
    let tables = db
        .count(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name LIKE 'inoutbox_%'",
            db.schema
        ))
        .await;
    assert_eq!(
        tables, 6,
        "inbox, attempts, dead letters, outbox, migrations, effects"
    );
}

#[test]
fn configured_table_names_are_validated_never_interpolated() {
    for bad in ["inbox; DROP TABLE invoices", "a\"b", "", "9lives", "tab le"] {
        assert!(
            inoutbox::Tables::default().inbox(bad).is_err(),
            "{bad:?} accepted"
        );
        assert!(
            inoutbox::Tables::with_schema(bad).is_err(),
            "{bad:?} accepted as a schema"
        );
    }
    let t = inoutbox::Tables::with_schema("billing")
        .unwrap()
        .inbox("billing_inbox")
        .unwrap();
    assert_eq!(t.inbox.to_string(), "\"billing\".\"billing_inbox\"");
}

// ---------------------------------------------------------------------------------------------
// Shutdown and start-up bounds: a handler that never finishes is abandoned after the grace
// period (rolled back, not committed, applied once by the next member); a consumer with no
// broker fails start-up with a clear error.

static GRACE_BLOCKED: AtomicBool = AtomicBool::new(false);
static GRACE_STARTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[inbox_handler(event = "OrderCreated", group = "grace")]
async fn blocks_the_first_time(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    if !GRACE_BLOCKED.swap(true, Ordering::SeqCst) {
        GRACE_STARTED.notify_one();
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_abandons_a_blocked_handler_rolls_it_back_and_a_restart_applies_it_once() {
    let s = setup("grace", 1).await;
    s.send_order(1).await;
    let grace = Duration::from_secs(2);
    let kafka = support::kafka(&s.broker.brokers, &s.topic).shutdown_grace(grace);
    let c = Running::start(Consumer::builder("grace", s.store.clone(), kafka));
    tokio::time::timeout(Duration::from_secs(30), GRACE_STARTED.notified())
        .await
        .expect("the handler starts");
    let stopping = Instant::now();
    let mut reports = c.stop().await; // the handler has 58 s left to sleep
    let took = stopping.elapsed();
    println!("stop with a {grace:?} grace and a handler blocked for 60 s: returned in {took:?}");
    assert!(
        took >= grace - Duration::from_millis(100) && took < grace + Duration::from_secs(4),
        "the stop took {took:?} for a grace of {grace:?}"
    );
    assert!(
        reports.try_recv().is_err(),
        "the abandoned message is not reported as resolved"
    );
    assert_eq!(s.db.invoices().await, 0, "its effect was rolled back");
    let inbox = format!("SELECT count(*) FROM {}", s.db.tables.inbox);
    assert_eq!(s.db.count(&inbox).await, 0, "no inbox row either");
    let committed = support::committed(&s.broker.brokers, "grace", &s.topic, 0);
    assert_eq!(committed, None, "its offset is not committed");

    let mut again = Running::start(s.consumer("grace"));
    let report = again.take(1).await.remove(0);
    let committed = support::wait_committed(&s.broker.brokers, "grace", &s.topic, 0, 1).await;
    again.stop().await;
    assert_eq!(report.delivery.offset, 0);
    assert_eq!(report.outcome, Outcome::Processed { attempt: 1 });
    assert_eq!(committed, Some(1));
    assert_eq!(s.db.invoices().await, 1, "applied once after the restart");
}

#[inbox_handler(event = "OrderCreated", group = "broker-gone")]
async fn broker_gone_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// The consumer runs in a runtime on a thread of its own: if its stop never returns, the test
/// fails after a bound instead of hanging with it.
#[test]
fn a_stop_with_the_broker_gone_returns_within_the_grace() {
    let grace = Duration::from_secs(1);
    let (tx, rx) = std::sync::mpsc::channel::<Result<Duration, String>>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut s = setup("brokergone", 1).await;
            s.send_order(1).await;
            let kafka = support::kafka(&s.broker.brokers, &s.topic).shutdown_grace(grace);
            let mut c = Running::start(Consumer::builder("broker-gone", s.store.clone(), kafka));
            let report = c.take(1).await.remove(0);
            let _ = tx.send(Err(format!("{:?}", report.outcome)));
            s.broker.kill();
            let stopping = Instant::now();
            c.stop().await;
            let _ = tx.send(Ok(stopping.elapsed()));
        });
    });
    let processed = rx.recv_timeout(Duration::from_secs(60));
    assert!(
        matches!(&processed, Ok(Err(outcome)) if outcome.starts_with("Processed")),
        "the consumer processed the message: {processed:?}"
    );
    // Leaving the group gets what is left of the grace, not a floor of its own (it had 5 s).
    let bound = grace + Duration::from_secs(3);
    match rx.recv_timeout(bound) {
        Ok(Ok(took)) => println!("stop with the broker gone returned after {took:?}"),
        other => panic!(
            "a graceful stop with the broker gone did not return within {bound:?} (grace {grace:?}): {other:?}"
        ),
    }
}

#[inbox_handler(event = "OrderCreated", group = "no-broker")]
async fn never_called(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_with_no_reachable_broker_fails_start_up_within_its_timeout() {
    let db = TestDb::new("nobroker").await;
    let store = db.migrated_store().await;
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let brokers = format!("127.0.0.1:{port}");
    let timeout = Duration::from_secs(2);
    let kafka = inoutbox::KafkaConfig::new(&brokers, ["orders"]).startup_timeout(timeout);
    let consumer = Consumer::builder("no-broker", store, kafka)
        .build()
        .expect("build");
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        consumer.run(std::future::pending()),
    )
    .await
    .expect("start-up gives up instead of waiting for a broker for ever");
    let took = started.elapsed();
    let error = result.expect_err("no broker answered");
    println!("after {took:?}: {error}");
    assert!(
        matches!(
            error,
            inoutbox::kafka::KafkaTransportError::Unreachable { .. }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&brokers) && message.contains("2s"),
        "the error names the brokers and the timeout: {message}"
    );
    assert!(
        took >= timeout - Duration::from_millis(100) && took < timeout + Duration::from_secs(5),
        "start-up failed after {took:?} with a timeout of {timeout:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Dead letters are one row per event: a redelivered poison message, or a replay that fails
// again, updates its row (`times`, attempts) instead of adding one.

static DEAD_DEDUP_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "dead-dedup")]
async fn rejects_everything(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    let _ = (event, tx);
    DEAD_DEDUP_RUNS.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::permanent("rejected for good"))
}

/// `(rows, times, attempts)` of the dead letters of the test's schema.
async fn letter_counts(s: &Setup) -> (i64, i64, i64) {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*), COALESCE(sum(times), 0)::bigint, COALESCE(sum(attempts), 0)::bigint FROM {}",
        s.db.tables.dead_letters
    )))
    .fetch_one(&s.db.pool)
    .await
    .expect("dead letters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_poison_event_delivered_twice_is_one_dead_letter_seen_twice() {
    let s = setup("deaddedup", 1).await;
    let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
    // The redelivery comes after the first copy was dead-lettered (in the same batch it would
    // be a duplicate of it, and never run).
    send(&s.producer, &s.topic, Msg::order(&id, order, 5)).await;
    let mut c = Running::start(s.consumer("dead-dedup"));
    let mut reports = c.take(1).await;
    send(&s.producer, &s.topic, Msg::order(&id, order, 5)).await;
    reports.extend(c.take(1).await);
    let committed = support::wait_committed(&s.broker.brokers, "dead-dedup", &s.topic, 0, 2).await;
    c.stop().await;
    let ids: Vec<i64> = reports
        .iter()
        .map(|r| match &r.outcome {
            Outcome::DeadLettered { id, .. } => *id,
            other => panic!("expected a dead letter, got {other:?}"),
        })
        .collect();
    assert_eq!(ids[0], ids[1], "both deliveries went to one letter");
    assert_eq!(DEAD_DEDUP_RUNS.load(Ordering::SeqCst), 2);
    assert_eq!(committed, Some(2), "the partition moved on");
    assert_eq!(
        letter_counts(&s).await,
        (1, 2, 2),
        "one row, dead-lettered twice, one run each time"
    );
}

static REPLAY_FIXED: AtomicBool = AtomicBool::new(false);

#[inbox_handler(event = "OrderCreated", group = "replay-failing")]
async fn broken_until_fixed(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    if !REPLAY_FIXED.load(Ordering::SeqCst) {
        return Err(HandlerError::permanent("still broken"));
    }
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_letter_that_still_fails_updates_the_same_row() {
    let s = setup("replayfail", 1).await;
    s.send_order(7).await;
    let mut c = Running::start(s.consumer("replay-failing"));
    let report = c.take(1).await.remove(0);
    c.stop().await;
    let Outcome::DeadLettered { id, .. } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(letter_counts(&s).await, (1, 1, 1));

    let inbox = Inbox::new(s.store.clone(), "replay-failing", Default::default()).unwrap();
    let outcome = inbox.replay(id).await.unwrap();
    assert!(
        matches!(&outcome, Outcome::DeadLettered { id: again, reason } if *again == id && reason.contains("still broken")),
        "{outcome:?}"
    );
    assert_eq!(
        letter_counts(&s).await,
        (1, 2, 2),
        "the failed replay updated the letter"
    );
    let replayed: Option<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT replayed_at IS NOT NULL FROM {} WHERE id = $1",
        s.db.tables.dead_letters
    )))
    .bind(id)
    .fetch_optional(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(replayed, Some(false), "not marked replayed");

    REPLAY_FIXED.store(true, Ordering::SeqCst);
    assert_eq!(
        inbox.replay(id).await.unwrap(),
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(s.db.invoices().await, 1);
    assert_eq!(letter_counts(&s).await, (1, 2, 2), "still one row");
}

// ---------------------------------------------------------------------------------------------
// Stopping a consumer whose broker is gone, again and again in one process: librdkafka's close
// must never run its leave-group path against a coordinator it no longer has.

#[inbox_handler(event = "OrderCreated", group = "stop-cycles")]
async fn stop_cycles_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// `INOUTBOX_STOP_CYCLES` cycles (default 200) of: a broker, a consumer that processes one
/// message, the broker killed, the consumer stopped. The process must outlive them all (a crash
/// in librdkafka's close kills the whole test binary, so reaching the end is the assertion).
#[test]
#[ignore = "long: 200 broker kills; run with --ignored"]
fn a_process_survives_many_stops_with_the_broker_gone() {
    let cycles: usize = std::env::var("INOUTBOX_STOP_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let db = TestDb::new("stopcycles").await;
        let store = db.migrated_store().await;
        let grace = Duration::from_millis(300);
        let started = Instant::now();
        for cycle in 0..cycles {
            let mut broker = Broker::start();
            let topic = support::unique("stopcycles");
            broker.create_topic(&topic, 1).await;
            let producer = support::producer(&broker.brokers);
            let order = Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 1);
            send(&producer, &topic, order).await;
            drop(producer);
            let kafka = support::kafka(&broker.brokers, &topic).shutdown_grace(grace);
            let mut c = Running::start(Consumer::builder("stop-cycles", store.clone(), kafka));
            let report = c.take(1).await.remove(0);
            assert!(
                matches!(report.outcome, Outcome::Processed { .. }),
                "{report:?}"
            );
            broker.kill();
            let stopping = Instant::now();
            c.stop().await;
            println!(
                "cycle {cycle}: stopped in {:?} ({:?} in all)",
                stopping.elapsed(),
                started.elapsed()
            );
        }
    });
    drop(rt);
    // Each close ran to its end on its thread (`kafka-close`), none is stuck for ever.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut closing = close_threads();
    while closing > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        closing = close_threads();
    }
    assert_eq!(
        closing, 0,
        "consumers still closing 120 s after the last stop"
    );
    println!("{cycles} stops with the broker gone, no crash, every close finished");
}

/// The threads of this process closing a Kafka consumer.
fn close_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.trim() == "kafka-close")
        })
        .count()
}

// ---------------------------------------------------------------------------------------------
// Fatal client errors and the last commit, on librdkafka's mock cluster (it can answer a
// request with any error).

/// A one-broker mock cluster with no initial rebalance delay, owned by a client of its own.
struct MockKafka {
    owner: rdkafka::producer::BaseProducer,
    brokers: String,
}

impl MockKafka {
    fn start() -> Self {
        use rdkafka::producer::Producer as _;
        let owner: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .create()
            .expect("mock cluster");
        // SAFETY: the handle belongs to `owner`, alive here; the call only sets a number.
        unsafe {
            let cluster =
                rdkafka::bindings::rd_kafka_handle_mock_cluster(owner.client().native_ptr());
            assert!(!cluster.is_null());
            rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, 0);
        }
        let brokers = Self::cluster_of(&owner).bootstrap_servers();
        Self { owner, brokers }
    }

    /// A mock cluster with a one-partition topic holding one order, and a migrated database,
    /// both named after `name`.
    async fn with_one_order(name: &str) -> (Self, String, TestDb, inoutbox::PgStore) {
        let mock = Self::start();
        let topic = support::unique(name);
        mock.cluster().create_topic(&topic, 1, 1).expect("topic");
        let db = TestDb::new(name).await;
        let store = db.migrated_store().await;
        let producer = support::producer(&mock.brokers);
        send(
            &producer,
            &topic,
            Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 1),
        )
        .await;
        (mock, topic, db, store)
    }

    fn cluster_of(
        owner: &rdkafka::producer::BaseProducer,
    ) -> rdkafka::mocking::MockCluster<'_, rdkafka::producer::DefaultProducerContext> {
        use rdkafka::producer::Producer as _;
        owner.client().mock_cluster().expect("a mock cluster")
    }

    fn cluster(
        &self,
    ) -> rdkafka::mocking::MockCluster<'_, rdkafka::producer::DefaultProducerContext> {
        Self::cluster_of(&self.owner)
    }

    fn kafka(&self, topic: &str) -> inoutbox::KafkaConfig {
        inoutbox::kafka::InProcessKafka::consumer_settings()
            .iter()
            .fold(
                inoutbox::KafkaConfig::new(&self.brokers, [topic]),
                |c, (k, v)| c.set(*k, *v),
            )
    }
}

#[inbox_handler(event = "OrderCreated", group = "fenced")]
async fn fenced_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// A member fenced by another with the same `group.instance.id` cannot go on: its run ends with
/// the fatal error and its health is no longer live (it used to retry for ever, live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_fenced_by_another_member_stops_with_the_error_and_is_not_live() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let (mock, topic, db, store) = MockKafka::with_one_order("fenced").await;
    let (reports, mut reported) = tokio::sync::mpsc::unbounded_channel();
    let kafka = mock.kafka(&topic).set("group.instance.id", "fenced-1");
    let consumer = Consumer::builder("fenced", store, kafka)
        .reports(reports)
        .build()
        .expect("build");
    let health = consumer.health();
    let run = tokio::spawn(consumer.run(std::future::pending()));
    let report = tokio::time::timeout(Duration::from_secs(30), reported.recv())
        .await
        .expect("the message is processed")
        .expect("a report");
    assert!(
        matches!(report.outcome, Outcome::Processed { .. }),
        "{report:?}"
    );
    assert!(health.live());

    // The group coordinator answers the member's next heartbeat: fenced.
    mock.cluster().request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID],
    );
    let result = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the fenced consumer stops instead of retrying for ever")
        .expect("the run does not panic");
    let error = result.expect_err("a fatal error ends the run with an error");
    println!("the fenced consumer stopped: {error}");
    assert!(
        matches!(error, inoutbox::kafka::KafkaTransportError::Fatal { .. }),
        "{error:?}"
    );
    assert!(!health.live(), "health shows the consumer is not live");
    assert_eq!(db.invoices().await, 1);
}

#[inbox_handler(event = "OrderCreated", group = "last-commit")]
async fn last_commit_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// The broker refuses the consumer's commits for a while: the position committed
/// asynchronously after the message is lost, and nothing would cover it after a stop. The
/// stop reads the committed offset back and commits again what is behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_last_commit_is_retried_when_the_consumer_stops() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let (mock, topic, _db, store) = MockKafka::with_one_order("lastcommit").await;
    // Refused: the commit after the message, and any the stop makes before it checks.
    mock.cluster().request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 3],
    );
    let kafka = mock.kafka(&topic).shutdown_grace(Duration::from_secs(10));
    let mut c = Running::start(Consumer::builder("last-commit", store, kafka));
    let report = c.take(1).await.remove(0);
    assert!(
        matches!(report.outcome, Outcome::Processed { .. }),
        "{report:?}"
    );
    c.stop().await;
    let brokers = mock.brokers.clone();
    let committed = tokio::task::spawn_blocking({
        let topic = topic.clone();
        move || support::committed(&brokers, "last-commit", &topic, 0)
    })
    .await
    .expect("join");
    assert_eq!(
        committed,
        Some(1),
        "the position after the message is committed by the time the consumer has stopped"
    );
}
