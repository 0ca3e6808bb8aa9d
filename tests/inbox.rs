//! The inbox contract, against a real Kafka-protocol broker (Tansu, one process per test) and
//! both stores: every test body is generic over [`Kit`] and runs as `postgres::<name>` and
//! `sqlite::<name>`. Each test has its own broker, topic and database, so they run in parallel.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use support::kit::Kit;
use support::{send, Broker, Msg, Running};
use txbox::prelude::*;
use txbox::{AckStrategy, Consumer, OnExhausted, Outcome, RetryPolicy, UnknownEvent};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

contract_tests!(
    seed_003_acknowledgement_strategies_table,
    duplicate_delivery_runs_handler_once,
    one_event_two_groups_each_handler_runs_once,
    racing_consumers_apply_one_event_once_and_keep_going,
    failed_message_is_not_skipped_by_a_later_success,
    rebalance_mid_stream_applies_each_event_once,
    retention_deletes_old_processed_rows_in_batches_and_counts_stuck_ones,
);

/// Per-store counters: `[postgres, sqlite]`.
type Counter = [AtomicU32; 2];

const fn counter() -> Counter {
    [AtomicU32::new(0), AtomicU32::new(0)]
}

// ---------------------------------------------------------------------------------------------
// a. Seed 003's table: four acknowledgement strategies, a handler that writes an invoice and
// then fails on its first run.

static RUNS_AT_MOST_ONCE: Counter = counter();
static RUNS_ON_PERSIST: Counter = counter();
static RUNS_ON_SUCCESS: Counter = counter();
static RUNS_EXACTLY_ONCE: Counter = counter();

macro_rules! insert_then_fail_first_run {
    ($group:tt, $runs:ident) => {
        handlers!($group, |event, tx, meta, store| {
            insert_invoice!(event, tx)?;
            if $runs[store].fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(HandlerError::transient(
                    "simulated failure after the invoice was written",
                ));
            }
            Ok(())
        });
    };
}

insert_then_fail_first_run!("seed-at-most-once", RUNS_AT_MOST_ONCE);
insert_then_fail_first_run!("seed-on-persist", RUNS_ON_PERSIST);
insert_then_fail_first_run!("seed-on-success", RUNS_ON_SUCCESS);
insert_then_fail_first_run!("seed-exactly-once", RUNS_EXACTLY_ONCE);

#[derive(Debug, PartialEq, Eq)]
struct SeedRow {
    processed: bool,
    committed: bool,
    second_received: bool,
    handler_runs: u32,
    invoices: i64,
}

async fn seed_scenario<K: Kit>(
    broker: &Broker,
    strategy: AckStrategy,
    group: &'static str,
    runs: &Counter,
) -> SeedRow {
    let kit = K::new("seed").await;
    let topic = support::unique(group);
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    send(
        &producer,
        &topic,
        Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 1200),
    )
    .await;

    let builder = || {
        Consumer::builder(group, kit.store(), support::kafka(&broker.brokers, &topic))
            .ack(strategy)
            .retry(RetryPolicy::no_retries())
            .on_exhausted(OnExhausted::LeaveUncommitted)
            .unknown_event(UnknownEvent::Skip)
    };
    // First consumer: the handler writes, then fails; the consumer stops.
    let mut first = Running::start(builder());
    let report = first.take(1).await.remove(0);
    first.stop().await;
    let processed = matches!(report.outcome, Outcome::Processed { .. });
    let committed = support::committed(&broker.brokers, group, &topic, 0).is_some_and(|o| o >= 1);

    // Second consumer of the same group: does the message come again? A sentinel produced after
    // it (same partition, so read after it) tells when the answer is in.
    let mut sentinel = Msg::order("sentinel", Uuid::new_v4(), 0);
    sentinel.event_type = Some("Sentinel".into());
    send(&producer, &topic, sentinel).await;
    let mut second = Running::start(builder());
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
        handler_runs: runs[K::INDEX].load(Ordering::SeqCst),
        invoices: kit.invoices().await,
    }
}

async fn seed_003_acknowledgement_strategies_table<K: Kit>() {
    let broker = Broker::start();
    let cases: [(&str, AckStrategy, &'static str, &'static Counter); 4] = [
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
        rows.push((
            name,
            seed_scenario::<K>(&broker, strategy, group, runs).await,
        ));
    }
    println!(
        "\nseed 003 on {}, a handler that writes an invoice and then fails on its first run:",
        K::NAME
    );
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
        assert_eq!(*got, want, "{name} on {}", K::NAME);
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

static RUNS_DUPLICATE: Counter = counter();

handlers!("duplicate", |event, tx, meta, store| {
    RUNS_DUPLICATE[store].fetch_add(1, Ordering::SeqCst);
    insert_invoice!(event, tx)?;
    Ok(())
});

async fn duplicate_delivery_runs_handler_once<K: Kit>() {
    let broker = Broker::start();
    let kit = K::new("dup").await;
    let topic = support::unique("dup");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
    send(&producer, &topic, Msg::order(&id, order, 500)).await;
    send(&producer, &topic, Msg::order(&id, order, 500)).await;

    let mut consumer = Running::start(Consumer::builder(
        "duplicate",
        kit.store(),
        support::kafka(&broker.brokers, &topic),
    ));
    let reports = consumer.take(2).await;
    let committed = support::wait_committed(&broker.brokers, "duplicate", &topic, 0, 2).await;
    consumer.stop().await;

    println!(
        "{}: delivery 1: {:?}\ndelivery 2: {:?}",
        K::NAME,
        reports[0].outcome,
        reports[1].outcome
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
    assert_eq!(RUNS_DUPLICATE[K::INDEX].load(Ordering::SeqCst), 1);
    assert_eq!(kit.invoices().await, 1);
}

// ---------------------------------------------------------------------------------------------
// c. One event id, two groups: each group's handler runs once.

static RUNS_GROUP_A: Counter = counter();
static RUNS_GROUP_B: Counter = counter();

handlers!("two-groups-a", |event, tx, meta, store| {
    RUNS_GROUP_A[store].fetch_add(1, Ordering::SeqCst);
    insert_invoice!(event, tx)
});

handlers!("two-groups-b", |event, tx, meta, store| {
    RUNS_GROUP_B[store].fetch_add(1, Ordering::SeqCst);
    insert_invoice!(event, tx)
});

async fn one_event_two_groups_each_handler_runs_once<K: Kit>() {
    let broker = Broker::start();
    let kit = K::new("groups").await;
    let topic = support::unique("groups");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    let id = Uuid::new_v4().to_string();
    send(&producer, &topic, Msg::order(&id, Uuid::new_v4(), 700)).await;
    send(&producer, &topic, Msg::order(&id, Uuid::new_v4(), 700)).await;

    let mut a = Running::start(Consumer::builder(
        "two-groups-a",
        kit.store(),
        support::kafka(&broker.brokers, &topic),
    ));
    let mut b = Running::start(Consumer::builder(
        "two-groups-b",
        kit.store(),
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
    assert_eq!(RUNS_GROUP_A[K::INDEX].load(Ordering::SeqCst), 1);
    assert_eq!(RUNS_GROUP_B[K::INDEX].load(Ordering::SeqCst), 1);
    assert_eq!(kit.invoices().await, 2, "one invoice per group");
    assert_eq!(
        kit.count(&format!("SELECT count(*) FROM {}", kit.tables().inbox))
            .await,
        2
    );
}

// ---------------------------------------------------------------------------------------------
// d. Racing: one event id in flight in two consumers at once (each reads both partitions, the
// handler is slow), so four transactions try to claim it concurrently.

static RUNS_RACE: Counter = counter();

handlers!("race", |event, tx, meta, store| {
    RUNS_RACE[store].fetch_add(1, Ordering::SeqCst);
    insert_invoice!(event, tx)?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(())
});

async fn racing_consumers_apply_one_event_once_and_keep_going<K: Kit>() {
    let broker = Broker::start();
    let kit = K::new("race").await;
    let topic = support::unique("race");
    broker.create_topic(&topic, 2).await;
    let consumer = |kafka_group: &str| {
        Running::start(Consumer::builder(
            "race",
            kit.store(),
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
        assert_eq!(kit.invoices().await, round + 1);
    }
    a.stop().await;
    b.stop().await;
    assert_eq!(
        RUNS_RACE[K::INDEX].load(Ordering::SeqCst),
        2,
        "each event's handler committed once and ran once"
    );
}

// ---------------------------------------------------------------------------------------------
// e. Message N fails, N+1 succeeds: the committed offset stays at N; after a restart N is
// delivered again and processed; nothing is skipped.

static FAILED_ONCE: Counter = counter();

handlers!("failure-order", |event, tx, meta, store| {
    insert_invoice!(event, tx)?;
    if event.total_cents == 13 && FAILED_ONCE[store].fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(HandlerError::transient("unlucky order, first time"));
    }
    Ok(())
});

async fn failed_message_is_not_skipped_by_a_later_success<K: Kit>() {
    let broker = Broker::start();
    let kit = K::new("order").await;
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
    let builder = || {
        Consumer::builder(
            "failure-order",
            kit.store(),
            support::kafka(&broker.brokers, &topic),
        )
        .retry(RetryPolicy::no_retries())
        .on_exhausted(OnExhausted::LeaveUncommitted)
    };

    let mut first = Running::start(builder());
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
    assert_eq!(kit.invoices().await, 1);

    let mut second = Running::start(builder());
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
    assert_eq!(kit.invoices().await, 2, "each order invoiced once");
}

// ---------------------------------------------------------------------------------------------
// Rebalance (in-process Kafka: only Kafka semantics matter here): a second member joins and the
// first leaves mid-stream; every event is applied once and every partition is committed to its
// end by whoever owns it last.

handlers!("rebalance", |event, tx, meta, store| {
    insert_invoice!(event, tx)?;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
});

async fn rebalance_mid_stream_applies_each_event_once<K: Kit>() {
    use txbox::transport::in_process::{InProcessKafka, CONSUMER_SETTINGS};
    let kafka = InProcessKafka::start().expect("in-process kafka");
    let topic = "rebalance";
    kafka.create_topic(topic, 4).expect("topic");
    let kit = K::new("rebalance").await;
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
    let mut a = Running::start(Consumer::builder("rebalance", kit.store(), config()));
    a.take(50).await;
    let b = Running::start(Consumer::builder("rebalance", kit.store(), config()));
    a.take(50).await;
    let mut a_reports = a.stop().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while kit.processed().await < total && std::time::Instant::now() < deadline {
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
    println!("rebalance on {}: {duplicates} duplicate deliveries after handovers; committed {positions:?}", K::NAME);
    assert_eq!(kit.processed().await, total, "every event processed");
    assert_eq!(
        kit.invoices().await,
        total,
        "no event applied twice across the handovers"
    );
    let committed: i64 = positions.iter().map(|p| p.unwrap_or(0)).sum();
    assert_eq!(committed, total, "every partition committed to its end");
}

// ---------------------------------------------------------------------------------------------
// Retention: processed rows older than the window go, in batches; recent and unprocessed rows
// stay; rows received long ago and never processed are counted as stuck.

handlers!("retention", |event, tx, meta, store| {
    insert_invoice!(event, tx)?;
    Ok(())
});

async fn retention_deletes_old_processed_rows_in_batches_and_counts_stuck_ones<K: Kit>() {
    use txbox::store::{Claim, InboxKey, InboxStore};
    use txbox::transport::Delivery;
    let kit = K::new("retention").await;
    let store = kit.store();
    for (i, id) in ["old-1", "old-2", "old-3", "new-1", "new-2", "stuck"]
        .iter()
        .enumerate()
    {
        let key = InboxKey {
            group: "retention".into(),
            source: String::new(),
            event_id: (*id).into(),
        };
        let d = Delivery {
            topic: "t".into(),
            partition: 0,
            offset: i as i64,
            key: None,
            payload: Some(b"{}".to_vec()),
            headers: Vec::new(),
        };
        let mut tx = store.begin().await.unwrap();
        assert_eq!(
            store
                .claim(&mut tx, &key, "OrderCreated", &d)
                .await
                .unwrap(),
            Claim::New { attempts: 0 }
        );
        if *id != "stuck" {
            store.mark_processed(&mut tx, &key, false).await.unwrap();
        }
        store.commit(tx).await.unwrap();
    }
    let inbox = kit.tables().inbox.clone();
    kit.exec(&format!(
        "UPDATE {inbox} SET processed_at = {} WHERE event_id LIKE 'old-%'",
        K::days_ago(8)
    ))
    .await;
    kit.exec(&format!(
        "UPDATE {inbox} SET received_at = {} WHERE event_id = 'stuck'",
        K::days_ago(1)
    ))
    .await;

    let engine = txbox::engine::Inbox::new(store, "retention", Default::default()).unwrap();
    assert_eq!(engine.stuck(Duration::from_secs(3600)).await.unwrap(), 1);
    assert_eq!(
        engine.stuck(Duration::from_secs(3 * 86400)).await.unwrap(),
        0
    );
    let deleted = engine
        .purge_processed(txbox::engine::DEFAULT_RETENTION, 2)
        .await
        .unwrap();
    assert_eq!(deleted, 3, "the three rows processed 8 days ago");
    let left = kit
        .count(&format!(
            "SELECT count(*) FROM {inbox} WHERE event_id NOT LIKE 'old-%'"
        ))
        .await;
    assert_eq!(left, 3, "recent and unprocessed rows stay");
    assert_eq!(kit.count(&format!("SELECT count(*) FROM {inbox}")).await, 3);
}
