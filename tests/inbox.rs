//! The inbox guarantees, against a real PostgreSQL and a real Kafka-protocol broker (Tansu).
//!
//! Each test has its own broker process, topic and schema, so they run in parallel.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use support::{send, Broker, Msg, Running, TestDb};
use txbox::prelude::*;
use txbox::{AckStrategy, Consumer, OnExhausted, Outcome, RetryPolicy, UnknownEvent};
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

/// Inserts the invoice, then fails on the handler's first run: the seed article's scenario.
async fn insert_then_fail_first_run(
    event: &OrderCreated,
    tx: &mut PgTx<'_>,
    runs: &AtomicU32,
) -> Result<(), HandlerError> {
    insert_invoice(event, tx).await?;
    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(HandlerError::transient(
            "simulated failure after the invoice was written",
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// a. Seed 003's table: four acknowledgement strategies, a handler that writes and then fails.

static RUNS_AT_MOST_ONCE: AtomicU32 = AtomicU32::new(0);
static RUNS_ON_PERSIST: AtomicU32 = AtomicU32::new(0);
static RUNS_ON_SUCCESS: AtomicU32 = AtomicU32::new(0);
static RUNS_EXACTLY_ONCE: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "seed-at-most-once")]
async fn seed_at_most_once(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_then_fail_first_run(&event, tx, &RUNS_AT_MOST_ONCE).await
}

#[inbox_handler(event = "OrderCreated", group = "seed-on-persist")]
async fn seed_on_persist(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_then_fail_first_run(&event, tx, &RUNS_ON_PERSIST).await
}

#[inbox_handler(event = "OrderCreated", group = "seed-on-success")]
async fn seed_on_success(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_then_fail_first_run(&event, tx, &RUNS_ON_SUCCESS).await
}

#[inbox_handler(event = "OrderCreated", group = "seed-exactly-once")]
async fn seed_exactly_once(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_then_fail_first_run(&event, tx, &RUNS_EXACTLY_ONCE).await
}

#[derive(Debug, PartialEq, Eq)]
struct SeedRow {
    processed: bool,
    committed: bool,
    second_received: bool,
    handler_runs: u32,
    invoices: i64,
}

async fn seed_scenario(
    broker: &Broker,
    strategy: AckStrategy,
    group: &'static str,
    runs: &AtomicU32,
) -> SeedRow {
    let db = TestDb::new("seed").await;
    let store = db.migrated_store().await;
    let topic = support::unique(group);
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    send(
        &producer,
        &topic,
        Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 1200),
    )
    .await;

    // First consumer: the handler writes, then fails; the consumer stops.
    let builder = |store| {
        Consumer::builder(group, store, support::kafka(&broker.brokers, &topic))
            .ack(strategy)
            .retry(RetryPolicy::no_retries())
            .on_exhausted(OnExhausted::LeaveUncommitted)
            .unknown_event(UnknownEvent::Skip)
    };
    let mut first = Running::start(builder(store.clone()));
    let report = first.take(1).await.remove(0);
    first.stop().await;
    let processed = matches!(report.outcome, Outcome::Processed { .. });
    let committed = support::committed(&broker.brokers, group, &topic, 0).is_some_and(|o| o >= 1);

    // Second consumer of the same group: does the message come again? A sentinel produced after
    // it (same partition, so read after it) tells when the answer is in.
    let mut sentinel = Msg::order("sentinel", Uuid::new_v4(), 0);
    sentinel.event_type = Some("Sentinel".into());
    send(&producer, &topic, sentinel).await;
    let mut second = Running::start(builder(store));
    let mut second_received = false;
    loop {
        let r = second.take(1).await.remove(0);
        if matches!(r.outcome, Outcome::Skipped { .. }) {
            break;
        }
        second_received = true;
    }
    second.stop().await;
    SeedRow {
        processed,
        committed,
        second_received,
        handler_runs: runs.load(Ordering::SeqCst),
        invoices: db.invoices().await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_003_acknowledgement_strategies_table() {
    let broker = Broker::start();
    let cases: [(&str, AckStrategy, &'static str, &'static AtomicU32); 4] = [
        (
            "AT_MOST_ONCE",
            AckStrategy::AtMostOnce,
            "seed-at-most-once",
            &RUNS_AT_MOST_ONCE,
        ),
        (
            "AT_LEAST_ONCE, commit ON_PERSIST",
            AckStrategy::AT_LEAST_ONCE_ON_PERSIST,
            "seed-on-persist",
            &RUNS_ON_PERSIST,
        ),
        (
            "AT_LEAST_ONCE, commit ON_SUCCESS",
            AckStrategy::AT_LEAST_ONCE_ON_SUCCESS,
            "seed-on-success",
            &RUNS_ON_SUCCESS,
        ),
        (
            "EXACTLY_ONCE_INBOX (default)",
            AckStrategy::ExactlyOnceInbox,
            "seed-exactly-once",
            &RUNS_EXACTLY_ONCE,
        ),
    ];
    let mut rows = Vec::new();
    for (name, strategy, group, runs) in cases {
        rows.push((name, seed_scenario(&broker, strategy, group, runs).await));
    }
    println!("\nseed 003, a handler that writes an invoice and then fails on its first run:");
    for (name, r) in &rows {
        println!(
            "{name:<34} first: processed={} committed={} second consumer: {} handler ran={} invoices={}",
            py(r.processed),
            py(r.committed),
            if r.second_received { "processed=True" } else { "nothing delivered" },
            r.handler_runs,
            r.invoices
        );
    }
    let expected = [
        SeedRow {
            processed: false,
            committed: true,
            second_received: false,
            handler_runs: 1,
            invoices: 0,
        },
        SeedRow {
            processed: false,
            committed: true,
            second_received: false,
            handler_runs: 1,
            invoices: 0,
        },
        SeedRow {
            processed: false,
            committed: false,
            second_received: true,
            handler_runs: 2,
            invoices: 1,
        },
        SeedRow {
            processed: false,
            committed: false,
            second_received: true,
            handler_runs: 2,
            invoices: 1,
        },
    ];
    for ((name, got), want) in rows.iter().zip(expected) {
        assert_eq!(*got, want, "{name}");
    }
}

fn py(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

// ---------------------------------------------------------------------------------------------
// b. The same message twice: the handler runs once.

static RUNS_DUPLICATE: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "duplicate")]
async fn duplicate_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    RUNS_DUPLICATE.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_delivery_runs_handler_once() {
    let broker = Broker::start();
    let db = TestDb::new("dup").await;
    let topic = support::unique("dup");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
    send(&producer, &topic, Msg::order(&id, order, 500)).await;
    send(&producer, &topic, Msg::order(&id, order, 500)).await;

    let mut consumer = Running::start(Consumer::builder(
        "duplicate",
        db.migrated_store().await,
        support::kafka(&broker.brokers, &topic),
    ));
    let reports = consumer.take(2).await;
    let committed = support::wait_committed(&broker.brokers, "duplicate", &topic, 0, 2).await;
    consumer.stop().await;

    println!(
        "delivery 1: {:?}\ndelivery 2: {:?}",
        reports[0].outcome, reports[1].outcome
    );
    assert!(
        matches!(reports[0].outcome, Outcome::Processed { attempt: 1 }),
        "{reports:#?}"
    );
    assert_eq!(reports[1].outcome, Outcome::Duplicate);
    assert_eq!(
        reports[1].committed,
        Some(2),
        "the duplicate's offset is committed"
    );
    assert_eq!(committed, Some(2));
    assert_eq!(RUNS_DUPLICATE.load(Ordering::SeqCst), 1);
    assert_eq!(db.invoices().await, 1);
}

// ---------------------------------------------------------------------------------------------
// c. One event id, two groups: each group's handler runs once.

static RUNS_GROUP_A: AtomicU32 = AtomicU32::new(0);
static RUNS_GROUP_B: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "two-groups-a")]
async fn group_a(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    RUNS_GROUP_A.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await
}

#[inbox_handler(event = "OrderCreated", group = "two-groups-b")]
async fn group_b(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    RUNS_GROUP_B.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_two_groups_each_handler_runs_once() {
    let broker = Broker::start();
    let db = TestDb::new("groups").await;
    let store = db.migrated_store().await;
    let topic = support::unique("groups");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    let id = Uuid::new_v4().to_string();
    send(&producer, &topic, Msg::order(&id, Uuid::new_v4(), 700)).await;
    send(&producer, &topic, Msg::order(&id, Uuid::new_v4(), 700)).await;

    let mut a = Running::start(Consumer::builder(
        "two-groups-a",
        store.clone(),
        support::kafka(&broker.brokers, &topic),
    ));
    let mut b = Running::start(Consumer::builder(
        "two-groups-b",
        store,
        support::kafka(&broker.brokers, &topic),
    ));
    let (ra, rb) = (a.take(2).await, b.take(2).await);
    a.stop().await;
    b.stop().await;
    for reports in [&ra, &rb] {
        assert!(
            matches!(reports[0].outcome, Outcome::Processed { .. }),
            "{reports:#?}"
        );
        assert_eq!(reports[1].outcome, Outcome::Duplicate);
    }
    assert_eq!(RUNS_GROUP_A.load(Ordering::SeqCst), 1);
    assert_eq!(RUNS_GROUP_B.load(Ordering::SeqCst), 1);
    assert_eq!(db.invoices().await, 2, "one invoice per group");
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM {}", db.tables.inbox))
            .await,
        2
    );
}

// ---------------------------------------------------------------------------------------------
// d. Racing: one event id in flight in two consumers at once (each reads both partitions, the
// handler is slow), so four transactions try to claim it concurrently.

static RUNS_RACE: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "race")]
async fn race_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    RUNS_RACE.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_consumers_apply_one_event_once_and_keep_going() {
    let broker = Broker::start();
    let db = TestDb::new("race").await;
    let store = db.migrated_store().await;
    let topic = support::unique("race");
    broker.create_topic(&topic, 2).await;
    let consumer = |kafka_group: &str| {
        Running::start(Consumer::builder(
            "race",
            store.clone(),
            support::kafka(&broker.brokers, &topic).group_id(kafka_group),
        ))
    };
    // Two independent Kafka groups feeding the same inbox group: every message reaches both.
    let (mut a, mut b) = (consumer("race-kafka-a"), consumer("race-kafka-b"));
    let producer = support::producer(&broker.brokers);
    for round in 0..2 {
        let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
        for partition in 0..2 {
            send(
                &producer,
                &topic,
                Msg::order(&id, order, 900 + round).on_partition(partition),
            )
            .await;
        }
        let mut outcomes: Vec<Outcome> = a.take(2).await.into_iter().map(|r| r.outcome).collect();
        outcomes.extend(b.take(2).await.into_iter().map(|r| r.outcome));
        let processed = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Processed { .. }))
            .count();
        let duplicates = outcomes
            .iter()
            .filter(|o| **o == Outcome::Duplicate)
            .count();
        assert_eq!(
            (processed, duplicates),
            (1, 3),
            "round {round}: {outcomes:#?}"
        );
        assert_eq!(db.invoices().await, round + 1);
    }
    a.stop().await;
    b.stop().await;
    assert_eq!(
        RUNS_RACE.load(Ordering::SeqCst),
        2,
        "each event's handler committed once and ran once"
    );
}

// ---------------------------------------------------------------------------------------------
// e. Message N fails, N+1 succeeds: the committed offset stays at N; after a restart N is
// delivered again and processed; nothing is skipped.

static FAILED_ONCE: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "failure-order")]
async fn failure_order_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    if event.total_cents == 13 && FAILED_ONCE.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(HandlerError::transient("unlucky order, first time"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_message_is_not_skipped_by_a_later_success() {
    let broker = Broker::start();
    let db = TestDb::new("order").await;
    let store = db.migrated_store().await;
    let topic = support::unique("order");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    send(
        &producer,
        &topic,
        Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 13),
    )
    .await;
    send(
        &producer,
        &topic,
        Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 14),
    )
    .await;
    let builder = |store| {
        Consumer::builder(
            "failure-order",
            store,
            support::kafka(&broker.brokers, &topic),
        )
        .retry(RetryPolicy::no_retries())
        .on_exhausted(OnExhausted::LeaveUncommitted)
    };

    let mut first = Running::start(builder(store.clone()));
    let reports = first.take(2).await;
    first.stop().await;
    assert!(
        matches!(
            reports[0].outcome,
            Outcome::FailedUnacknowledged { attempts: 1, .. }
        ),
        "{reports:#?}"
    );
    assert!(
        matches!(reports[1].outcome, Outcome::Processed { .. }),
        "{reports:#?}"
    );
    assert_eq!(
        reports[1].committed, None,
        "N+1 must not commit past the failed N"
    );
    assert_eq!(
        support::committed(&broker.brokers, "failure-order", &topic, 0).unwrap_or(0),
        0
    );
    assert_eq!(db.invoices().await, 1);

    let mut second = Running::start(builder(store));
    let reports = second.take(2).await;
    let committed = support::wait_committed(&broker.brokers, "failure-order", &topic, 0, 2).await;
    second.stop().await;
    assert_eq!(reports[0].delivery.offset, 0, "N is delivered again");
    assert!(
        matches!(reports[0].outcome, Outcome::Processed { attempt: 2 }),
        "{reports:#?}"
    );
    assert_eq!(reports[1].outcome, Outcome::Duplicate);
    assert_eq!(committed, Some(2));
    assert_eq!(db.invoices().await, 2, "each order invoiced once");
}

// ---------------------------------------------------------------------------------------------
// Rebalance (in-process Kafka: only Kafka semantics matter here): a second member joins and the
// first leaves mid-stream; every event is applied once and every partition is committed to its
// end by whoever owns it last.

#[inbox_handler(event = "OrderCreated", group = "rebalance")]
async fn rebalance_handler(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rebalance_mid_stream_applies_each_event_once() {
    use txbox::transport::in_process::{InProcessKafka, CONSUMER_SETTINGS};
    let kafka = InProcessKafka::start().expect("in-process kafka");
    let topic = "rebalance";
    kafka.create_topic(topic, 4).expect("topic");
    let db = TestDb::new("rebalance").await;
    let store = db.migrated_store().await;
    let producer = support::producer(kafka.brokers());
    let total = 400;
    for i in 0..total {
        send(
            &producer,
            topic,
            Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), i),
        )
        .await;
    }
    let config = || {
        CONSUMER_SETTINGS.iter().fold(
            txbox::KafkaConfig::new(kafka.brokers(), [topic]),
            |c, (k, v)| c.set(*k, *v),
        )
    };
    let mut a = Running::start(Consumer::builder("rebalance", store.clone(), config()));
    a.take(50).await;
    let b = Running::start(Consumer::builder("rebalance", store.clone(), config()));
    a.take(50).await;
    let mut a_reports = a.stop().await;
    let processed_sql = format!(
        "SELECT count(*) FROM {} WHERE processed_at IS NOT NULL",
        db.tables.inbox
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while db.count(&processed_sql).await < total && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut positions = Vec::new();
    for partition in 0..4 {
        positions
            .push(support::wait_committed(kafka.brokers(), "rebalance", topic, partition, 1).await);
    }
    let mut b_reports = b.stop().await;
    let mut duplicates = 0;
    while let Ok(r) = a_reports.try_recv().or_else(|_| b_reports.try_recv()) {
        duplicates += usize::from(r.outcome == Outcome::Duplicate);
    }
    println!(
        "rebalance: {duplicates} duplicate deliveries after handovers; committed {positions:?}"
    );
    assert_eq!(
        db.count(&processed_sql).await,
        total,
        "every event processed"
    );
    assert_eq!(
        db.invoices().await,
        total,
        "no event applied twice across the handovers"
    );
    let committed: i64 = positions.iter().map(|p| p.unwrap_or(0)).sum();
    assert_eq!(committed, total, "every partition committed to its end");
}
