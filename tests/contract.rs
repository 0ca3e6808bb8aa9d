//! The inbox and outbox contract, against both brokers and every store: every test body is
//! generic over the store ([`Kit`]) and the broker ([`Bus`]), and runs on Kafka (a Tansu
//! process per test; the in-process mock cluster for the rebalance) as `postgres::<name>`,
//! `sqlite::<name>` and `mysql::<name>`, and on NATS JetStream (a `nats-server -js` process
//! per test, feature `nats`) as `nats::postgres::<name>`, `nats::sqlite::<name>` and
//! `nats::mysql::<name>`. Each test has its own broker, topic and database, so they run in
//! parallel. (tests/outbox.rs adds PostgreSQL-specific outbox tests: NOTIFY
//! wake-up, advisory-lock serialisation, a SIGKILLed relay process, 10 000 events over 3 relays.)

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use inoutbox::inbox::{Backoff, OnExhausted, UnknownEvent};
use inoutbox::prelude::*;
use inoutbox::{AckStrategy, Consumer, Outcome, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::bus::Bus;
use support::kit::Kit;
use support::{Msg, Running};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

broker_contract_tests!(
    acknowledgement_strategies_for_a_handler_that_writes_then_fails,
    duplicate_delivery_runs_handler_once,
    one_event_two_groups_each_handler_runs_once,
    racing_consumers_apply_one_event_once_and_keep_going,
    failed_message_is_not_skipped_by_a_later_success,
    rebalance_mid_stream_applies_each_event_once,
    graceful_stop_finishes_the_message_in_hand_and_commits_it,
    retention_deletes_old_processed_rows_in_batches_and_counts_stuck_ones,
    outbox_row_commits_and_rolls_back_with_the_business_write,
    relay_publishes_committed_events_with_the_cloudevents_envelope,
    three_relays_keep_per_key_commit_order_and_lose_nothing,
    handler_that_enqueues_then_fails_leaves_no_row_and_its_retry_leaves_one,
    outbox_retention_deletes_old_published_rows_only,
);

/// The same contract on an in-memory broker implemented outside the crate (`memory::*`).
#[path = "contract/memory.rs"]
mod memory;

/// The public conformance suite on both stores, and on a store written outside the crate.
#[cfg(all(feature = "testing", feature = "sqlite"))]
#[path = "contract/conformance.rs"]
mod conformance;

/// Per-test counters: `[postgres, sqlite, mysql]` on Kafka, then the same on NATS (a
/// handler's `store`, a test's [`slot`]).
type Counter = [AtomicU32; 6];

const fn counter() -> Counter {
    [const { AtomicU32::new(0) }; 6]
}

/// The index of this test's counters.
const fn slot<K: Kit, B: Bus>() -> usize {
    K::INDEX + B::SLOT
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

insert_then_fail_first_run!("ack-at-most-once", RUNS_AT_MOST_ONCE);
insert_then_fail_first_run!("ack-on-persist", RUNS_ON_PERSIST);
insert_then_fail_first_run!("ack-on-success", RUNS_ON_SUCCESS);
insert_then_fail_first_run!("ack-exactly-once", RUNS_EXACTLY_ONCE);

#[derive(Debug, PartialEq, Eq)]
struct StrategyRow {
    processed: bool,
    committed: bool,
    second_received: bool,
    handler_runs: u32,
    invoices: i64,
}

/// `m` with the key that every message of a test which needs their order shares: the default
/// order is per key (`Ordering::Key`), so messages of one key are handled, and reported, in
/// offset order.
fn one_key(mut m: Msg) -> Msg {
    m.key = Some("one-key".into());
    m
}

async fn strategy_scenario<K: Kit, B: Bus>(
    bus: &B,
    strategy: AckStrategy,
    group: &'static str,
    runs: &Counter,
) -> StrategyRow {
    let kit = K::new("ack").await;
    let topic = bus.topic(group);
    bus.create_topic(&topic, 1).await;
    bus.send(
        &topic,
        one_key(Msg::order(
            &Uuid::new_v4().to_string(),
            Uuid::new_v4(),
            1200,
        )),
    )
    .await;

    let builder = || {
        Consumer::builder(group, kit.store(), bus.consumer(&topic))
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
    let committed = bus
        .committed(group, &topic, 0)
        .await
        .is_some_and(|o| o >= 1);

    // Second consumer of the same group: does the message come again? A sentinel produced after
    // it (same partition, so read after it) tells when the answer is in.
    let mut sentinel = Msg::order("sentinel", Uuid::new_v4(), 0);
    sentinel.event_type = Some("Sentinel".into());
    bus.send(&topic, one_key(sentinel)).await;
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
    StrategyRow {
        processed,
        committed,
        second_received,
        handler_runs: runs[slot::<K, B>()].load(Ordering::SeqCst),
        invoices: kit.invoices().await,
    }
}

async fn acknowledgement_strategies_for_a_handler_that_writes_then_fails<K: Kit, B: Bus>() {
    let bus = B::start().await;
    let cases: [(&str, AckStrategy, &'static str, &'static Counter); 4] = [
        (
            "AT_MOST_ONCE",
            AckStrategy::AtMostOnce,
            "ack-at-most-once",
            &RUNS_AT_MOST_ONCE,
        ),
        (
            "AT_LEAST_ONCE, commit ON_PERSIST",
            AckStrategy::AT_LEAST_ONCE_ON_PERSIST,
            "ack-on-persist",
            &RUNS_ON_PERSIST,
        ),
        (
            "AT_LEAST_ONCE, commit ON_SUCCESS",
            AckStrategy::AT_LEAST_ONCE_ON_SUCCESS,
            "ack-on-success",
            &RUNS_ON_SUCCESS,
        ),
        (
            "EXACTLY_ONCE_INBOX (default)",
            AckStrategy::ExactlyOnceInbox,
            "ack-exactly-once",
            &RUNS_EXACTLY_ONCE,
        ),
    ];
    let mut rows = Vec::new();
    for (name, strategy, group, runs) in cases {
        rows.push((
            name,
            strategy_scenario::<K, B>(&bus, strategy, group, runs).await,
        ));
    }
    println!(
        "\nacknowledgement strategies on {} and {}, a handler that writes an invoice and then fails on its first run:",
        B::NAME,
        K::NAME
    );
    for (name, r) in &rows {
        println!(
            "{name:<34} first: processed={} committed={} second consumer: {} handler ran={} invoices={}",
            yes_no(r.processed),
            yes_no(r.committed),
            if r.second_received { "processed=yes" } else { "nothing delivered" },
            r.handler_runs,
            r.invoices
        );
    }
    let expected = [
        StrategyRow {
            processed: false,
            committed: true,
            second_received: false,
            handler_runs: 1,
            invoices: 0,
        },
        StrategyRow {
            processed: false,
            committed: true,
            second_received: false,
            handler_runs: 1,
            invoices: 0,
        },
        StrategyRow {
            processed: false,
            committed: false,
            second_received: true,
            handler_runs: 2,
            invoices: 1,
        },
        StrategyRow {
            processed: false,
            committed: false,
            second_received: true,
            handler_runs: 2,
            invoices: 1,
        },
    ];
    for ((name, got), want) in rows.iter().zip(expected) {
        assert_eq!(*got, want, "{name} on {} and {}", B::NAME, K::NAME);
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
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

async fn duplicate_delivery_runs_handler_once<K: Kit, B: Bus>() {
    let bus = B::start().await;
    let kit = K::new("dup").await;
    let topic = bus.topic("dup");
    bus.create_topic(&topic, 1).await;
    let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
    bus.send(&topic, Msg::order(&id, order, 500)).await;
    bus.send(&topic, Msg::order(&id, order, 500)).await;

    let mut consumer = Running::start(Consumer::builder(
        "duplicate",
        kit.store(),
        bus.consumer(&topic),
    ));
    let reports = consumer.take(2).await;
    let committed = bus.wait_committed("duplicate", &topic, 0, 2).await;
    consumer.stop().await;

    println!(
        "{} and {}: delivery 1: {:?}\ndelivery 2: {:?}",
        B::NAME,
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
        Some(bus.position(&topic, 0, 2)),
        "the duplicate's offset is committed"
    );
    assert_eq!(committed, Some(2));
    assert_eq!(RUNS_DUPLICATE[slot::<K, B>()].load(Ordering::SeqCst), 1);
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

async fn one_event_two_groups_each_handler_runs_once<K: Kit, B: Bus>() {
    let bus = B::start().await;
    let kit = K::new("groups").await;
    let topic = bus.topic("groups");
    bus.create_topic(&topic, 1).await;
    let id = Uuid::new_v4().to_string();
    bus.send(&topic, one_key(Msg::order(&id, Uuid::new_v4(), 700)))
        .await;
    bus.send(&topic, one_key(Msg::order(&id, Uuid::new_v4(), 700)))
        .await;

    let mut a = Running::start(Consumer::builder(
        "two-groups-a",
        kit.store(),
        bus.consumer(&topic),
    ));
    let mut b = Running::start(Consumer::builder(
        "two-groups-b",
        kit.store(),
        bus.consumer(&topic),
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
    assert_eq!(RUNS_GROUP_A[slot::<K, B>()].load(Ordering::SeqCst), 1);
    assert_eq!(RUNS_GROUP_B[slot::<K, B>()].load(Ordering::SeqCst), 1);
    assert_eq!(kit.invoices().await, 2, "one invoice per group");
    assert_eq!(
        kit.count(&format!("SELECT count(*) FROM {}", kit.tables().inbox))
            .await,
        2
    );
}

// ---------------------------------------------------------------------------------------------
// d. Racing: one event id in flight in two consumers at once (on Kafka, two Kafka groups
// feeding one inbox group, each reading both partitions of a topic that holds a copy of the
// event on each; on NATS, two members of the one group, each holding two of the four partitions
// of a topic that holds a copy on each; the handler is slow), so four transactions claim it
// concurrently. The store is observed: the four
// claims of an event meet before any goes on, and their recorded times show that every one of
// them ran while the winner's transaction, holding the uncommitted inbox row, was open.

static RUNS_RACE: Counter = counter();

handlers!("race", |event, tx, meta, store| {
    RUNS_RACE[store].fetch_add(1, Ordering::SeqCst);
    insert_invoice!(event, tx)?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(())
});

async fn racing_consumers_apply_one_event_once_and_keep_going<K: Kit, B: Bus>() {
    use support::observe::Observed;
    let bus = B::start().await;
    let kit = K::new("race").await;
    let topic = bus.topic("race");
    bus.create_topic(&topic, B::RACE_PARTITIONS).await;
    let store = Observed::new(kit.store(), 4);
    let [config_a, config_b] = bus.racers(&topic, "race");
    let mut a = Running::start(Consumer::builder("race", store.clone(), config_a));
    let mut b = Running::start(Consumer::builder("race", store.clone(), config_b));
    bus.racers_ready(&topic, "race").await;
    for round in 0..2 {
        let (id, order) = (Uuid::new_v4().to_string(), Uuid::new_v4());
        for partition in 0..B::RACE_PARTITIONS {
            let partition = i32::try_from(partition).expect("partition");
            bus.send(
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

        // The claims overlapped: the winner's transaction was committed only after all four
        // claims had begun (a loser's claim waited for it, or lost a busy race and came back).
        let claims: Vec<_> = store
            .claims()
            .into_iter()
            .filter(|c| c.event_id == id)
            .collect();
        let winner = claims
            .iter()
            .find(|c| matches!(c.result, Ok(inoutbox::store::Claim::New { .. })))
            .unwrap_or_else(|| panic!("round {round}: no claim won: {claims:#?}"));
        let committed = store
            .commits()
            .into_iter()
            .find(|t| *t >= winner.ended)
            .expect("the winner committed");
        let in_flight = claims.iter().filter(|c| c.started < committed).count();
        let first = claims.iter().map(|c| c.started).min().expect("claims");
        let spread = claims
            .iter()
            .filter(|c| c.started < committed)
            .map(|c| c.started - first)
            .max()
            .unwrap_or_default();
        println!(
            "{} and {} round {round}: {} claims, {in_flight} begun before the winner committed \
             ({:?} after the first; the winner's claim took {:?}, its commit came {:?} after it)",
            B::NAME,
            K::NAME,
            claims.len(),
            spread,
            winner.ended - winner.started,
            committed - winner.ended
        );
        assert!(
            in_flight >= 4,
            "round {round}: only {in_flight} claims ran while the winner's transaction was open: {claims:#?}"
        );
    }
    a.stop().await;
    b.stop().await;
    assert_eq!(
        RUNS_RACE[slot::<K, B>()].load(Ordering::SeqCst),
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

async fn failed_message_is_not_skipped_by_a_later_success<K: Kit, B: Bus>() {
    let bus = B::start().await;
    let kit = K::new("order").await;
    let topic = bus.topic("order");
    bus.create_topic(&topic, 1).await;
    bus.send(
        &topic,
        one_key(Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 13)),
    )
    .await;
    bus.send(
        &topic,
        one_key(Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 14)),
    )
    .await;
    let builder = || {
        Consumer::builder("failure-order", kit.store(), bus.consumer(&topic))
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
        bus.committed("failure-order", &topic, 0).await.unwrap_or(0),
        0
    );
    assert_eq!(kit.invoices().await, 1);

    let mut second = Running::start(builder());
    let reports = second.take(2).await;
    let committed = bus.wait_committed("failure-order", &topic, 0, 2).await;
    second.stop().await;
    assert_eq!(
        reports[0].delivery.offset,
        bus.offset(&topic, 0, 0),
        "N is delivered again"
    );
    assert!(
        matches!(reports[0].outcome, Outcome::Processed { attempt: 2 }),
        "{reports:#?}"
    );
    assert_eq!(reports[1].outcome, Outcome::Duplicate);
    assert_eq!(committed, Some(2));
    assert_eq!(kit.invoices().await, 2, "each order invoiced once");
}

// ---------------------------------------------------------------------------------------------
// Rebalance mid-stream. A handler is blocked on one message (the gate) when a second member
// joins the group, so that the gated partition changes hands while its message is in hand.
// When the gate is released, its transaction commits but its old owner commits no position for
// it: the partition is no longer its own. The partition's next owner gets it again and skips it
// as a duplicate. Then the first member leaves; every event is applied once and every partition
// is committed to its end by whoever owns it last.
//
// On Kafka (the in-process mock cluster: Tansu's coordinator does not rebalance as Kafka's
// does), the join rebalances the group with the eager protocol, which revokes every partition
// of the first member while its message is in hand. On NATS there is no coordinator: the
// second member registers, the first finds itself over its fair share and gives up its highest
// partition (where the gate is): it stops that partition's run and no longer renews its lease.
// The message in hand outlasts the lease TTL, so the lease expires and the second member takes
// the partition (a new consumer, from the acknowledgement floor) while the first still holds the
// message; released, the first member's acknowledgement is refused by the lease's fence.

/// The gated message: the tenth of its partition; its handler blocks, on its first run, until
/// the test releases it.
const GATE_INDEX: usize = 9;
const GATE_CENTS: i64 = 4242;
static GATE_USED: [std::sync::atomic::AtomicBool; 6] =
    [const { std::sync::atomic::AtomicBool::new(false) }; 6];
static GATE_ENTERED: [tokio::sync::Notify; 6] = [const { tokio::sync::Notify::const_new() }; 6];
static GATE_RELEASED: [tokio::sync::Notify; 6] = [const { tokio::sync::Notify::const_new() }; 6];

handlers!("rebalance", |event, tx, meta, store| {
    insert_invoice!(event, tx)?;
    if event.total_cents == GATE_CENTS && !GATE_USED[store].swap(true, Ordering::SeqCst) {
        GATE_ENTERED[store].notify_one();
        GATE_RELEASED[store].notified().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
});

async fn rebalance_mid_stream_applies_each_event_once<K: Kit, B: Bus>() {
    let bus = B::start_for_rebalance().await;
    let topic = bus.topic("rebalance");
    bus.create_topic(&topic, 4).await;
    let kit = K::new("rebalance").await;
    // 50 per partition, fewer than a partition's buffer (64): the member never waits for a
    // partition task, so it keeps polling and takes part in the rebalance while one is blocked.
    let per_partition = 50;
    for partition in 0..4 {
        for i in 0..per_partition {
            let cents = if (partition, i) == (B::GATE_PARTITION, GATE_INDEX) {
                GATE_CENTS
            } else {
                i64::try_from(i).expect("cents")
            };
            let msg = Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), cents);
            let partition = i32::try_from(partition).expect("partition");
            bus.send(&topic, msg.on_partition(partition)).await;
        }
    }
    let gate = (
        i32::try_from(B::GATE_PARTITION).expect("partition"),
        bus.offset(&topic, B::GATE_PARTITION, GATE_INDEX),
    );
    let total = 4 * i64::try_from(per_partition).expect("count");
    let slot = slot::<K, B>();
    let mut a = Running::start(Consumer::builder(
        "rebalance",
        kit.store(),
        bus.consumer(&topic),
    ));
    tokio::time::timeout(Duration::from_secs(60), GATE_ENTERED[slot].notified())
        .await
        .expect("the first member's handler holds the gated message");
    let mut b = Running::start(Consumer::builder(
        "rebalance",
        kit.store(),
        bus.consumer(&topic),
    ));
    let handover = bus.handed_over("rebalance", &topic, &mut b).await;
    GATE_RELEASED[slot].notify_one();
    // The gated run's report is the first member's `Processed` one at the gate. On Kafka the
    // first member can be given the gated partition back in the new generation: that
    // generation reads the message again and, once the gated run commits, reports it a
    // `Duplicate`, which can come first. (Applied twice, the counts below would show it.)
    let mut a_reports = Vec::new();
    let gated = loop {
        let r = a
            .next(Duration::from_secs(60))
            .await
            .expect("the first member finishes the gated message");
        a_reports.push(r.clone());
        let redelivered = matches!(r.outcome, Outcome::Duplicate);
        if (r.delivery.partition, r.delivery.offset) == gate && !redelivered {
            break r;
        }
    };
    assert!(
        matches!(gated.outcome, Outcome::Processed { .. }),
        "{gated:?}"
    );
    assert_eq!(
        gated.committed,
        None,
        "{} and {}: the partition changed hands while its message was in hand ({handover}); \
         its old owner must not commit it",
        B::NAME,
        K::NAME,
    );

    let mut a_left = a.stop().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while kit.processed().await < total && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut positions = Vec::new();
    for partition in 0..4 {
        positions.push(
            bus.wait_committed(
                "rebalance",
                &topic,
                partition,
                i64::try_from(per_partition).expect("count"),
            )
            .await,
        );
    }
    let mut b_reports = b.stop().await;
    let mut later = Vec::new();
    while let Ok(r) = a_left.try_recv().or_else(|_| b_reports.try_recv()) {
        later.push(r);
    }
    let duplicates = a_reports
        .iter()
        .chain(&later)
        .filter(|r| r.outcome == Outcome::Duplicate)
        .count();
    // Every later delivery of the gated message, the first member's own new generation's
    // (reported before the gated run's) included.
    let before_gated = &a_reports[..a_reports.len() - 1];
    let gate_again: Vec<_> = before_gated
        .iter()
        .chain(&later)
        .filter(|r| (r.delivery.partition, r.delivery.offset) == gate)
        .map(|r| r.outcome.clone())
        .collect();
    println!(
        "rebalance on {} and {}: {handover}; gated message processed by its old owner, \
         committed {:?}, then delivered to its next owner: {gate_again:?}; {duplicates} \
         duplicate deliveries after handovers; committed {positions:?}",
        B::NAME,
        K::NAME,
        gated.committed
    );
    assert!(
        !gate_again.is_empty() && gate_again.iter().all(|o| *o == Outcome::Duplicate),
        "the partition's next owner got the uncommitted message and skipped it: {gate_again:?}"
    );
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
// Graceful shutdown: the stop arrives while a slow handler runs; the message in hand is
// finished and its offset committed, the buffered ones are left for the next member.

static SLOW_STARTED: [tokio::sync::Notify; 6] = [const { tokio::sync::Notify::const_new() }; 6];

handlers!("graceful", |event, tx, meta, store| {
    insert_invoice!(event, tx)?;
    SLOW_STARTED[store].notify_one();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(())
});

async fn graceful_stop_finishes_the_message_in_hand_and_commits_it<K: Kit, B: Bus>() {
    let bus = B::start().await;
    let kit = K::new("graceful").await;
    let topic = bus.topic("graceful");
    bus.create_topic(&topic, 1).await;
    for i in 0..3 {
        bus.send(
            &topic,
            one_key(Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), i)),
        )
        .await;
    }
    let c = Running::start(Consumer::builder(
        "graceful",
        kit.store(),
        bus.consumer(&topic),
    ));
    tokio::time::timeout(
        Duration::from_secs(30),
        SLOW_STARTED[slot::<K, B>()].notified(),
    )
    .await
    .expect("the handler starts");
    let mut reports = c.stop().await; // arrives while the first message is in the handler
    let first = reports.try_recv().expect("the message in hand is reported");
    assert!(
        matches!(first.outcome, Outcome::Processed { .. }),
        "{first:?}"
    );
    assert_eq!(first.committed, Some(bus.position(&topic, 0, 1)));
    assert!(
        reports.try_recv().is_err(),
        "nothing after the message in hand"
    );
    assert_eq!(kit.invoices().await, 1);
    assert_eq!(
        bus.committed("graceful", &topic, 0).await,
        Some(1),
        "its offset is committed before the consumer leaves the group"
    );
}

// ---------------------------------------------------------------------------------------------
// Retention: processed rows older than the window go, in batches; recent and unprocessed rows
// stay; rows received long ago and never processed are counted as stuck.

handlers!("retention", |event, tx, meta, store| {
    insert_invoice!(event, tx)?;
    Ok(())
});

/// (No broker: the same on both.)
async fn retention_deletes_old_processed_rows_in_batches_and_counts_stuck_ones<K: Kit, B: Bus>() {
    use inoutbox::inbox::Delivery;
    use inoutbox::store::{Claim, InboxKey, InboxStore};
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
            business_key: None,
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
    // A row received a day ago and never processed (what a crashed two-phase worker leaves).
    kit.exec(&format!(
        "UPDATE {inbox} SET received_at = {}, processed_at = NULL WHERE event_id = 'stuck'",
        K::days_ago(1)
    ))
    .await;

    let engine = inoutbox::inbox::Inbox::new(store, "retention", Default::default()).unwrap();
    assert_eq!(engine.stuck(Duration::from_secs(3600)).await.unwrap(), 1);
    assert_eq!(
        engine.stuck(Duration::from_secs(3 * 86400)).await.unwrap(),
        0
    );
    let deleted = engine
        .purge_processed(inoutbox::inbox::DEFAULT_RETENTION, 2)
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

// =============================================================================================
// The outbox contract.

use inoutbox::outbox;
use inoutbox::relay::{Relay, RelayStore};
use inoutbox::store::InboxStore;
use std::collections::HashMap;

/// An event whose key carries a per-key sequence number.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Sequenced", topic = "sequenced", key = key)]
pub struct Sequenced {
    pub key: String,
    pub seq: i64,
}

async fn outbox_rows<K: Kit>(kit: &K, filter: &str) -> i64 {
    kit.count(&format!(
        "SELECT count(*) FROM {} {filter}",
        kit.tables().outbox
    ))
    .await
}

/// (No broker: the same on both.)
async fn outbox_row_commits_and_rolls_back_with_the_business_write<K: Kit, B: Bus>() {
    let kit = K::new("enqueue").await;
    let store = kit.store();
    // Rolled back: neither the invoice nor the event.
    let mut tx = store.begin().await.unwrap();
    K::insert_invoice(&mut tx, Uuid::new_v4(), 1).await;
    outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents: 1,
        },
    )
    .await
    .unwrap();
    store.rollback(tx).await.unwrap();
    assert_eq!((kit.invoices().await, outbox_rows(&kit, "").await), (0, 0));
    // Committed: both, and the row says what the relay needs.
    let order_id = Uuid::new_v4();
    let mut tx = store.begin().await.unwrap();
    K::insert_invoice(&mut tx, order_id, 2).await;
    let id = outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id,
            total_cents: 2,
        },
    )
    .await
    .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!((kit.invoices().await, outbox_rows(&kit, "").await), (1, 1));
    assert_eq!(id.get_version_num(), 7, "time-ordered UUID v7 ids");
    let filter = format!(
        "WHERE type = 'OrderCreated' AND topic = 'orders' AND message_key = '{order_id}' AND published_at IS NULL"
    );
    assert_eq!(outbox_rows(&kit, &filter).await, 1, "{}", K::NAME);
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn relay_publishes_committed_events_with_the_cloudevents_envelope<K: Kit, B: Bus>() {
    let bus = B::start().await;
    bus.create_topic("orders", 2).await;
    let kit = K::new("envelope").await;
    let store = kit.store();
    let mut expected = HashMap::new();
    for i in 0..5 {
        let order_id = Uuid::new_v4();
        let mut tx = store.begin().await.unwrap();
        let id = outbox::with_traceparent(
            TRACEPARENT,
            outbox::enqueue(
                &mut tx,
                &OrderCreated {
                    order_id,
                    total_cents: i,
                },
            ),
        )
        .await
        .unwrap();
        store.commit(tx).await.unwrap();
        expected.insert(id.to_string(), (order_id, i));
    }
    // Rolled back: never published.
    let mut tx = store.begin().await.unwrap();
    outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents: -1,
        },
    )
    .await
    .unwrap();
    store.rollback(tx).await.unwrap();

    let relay = Relay::with_store(kit.relay_store(), bus.publisher(2).await, K::relay_config());
    let mut relay = support::RunningRelay::spawn(relay);
    relay.published(5, Duration::from_secs(30)).await;
    relay.stop().await;
    let received = bus
        .read_topic("orders", 2, 5, Duration::from_secs(30))
        .await;
    assert_eq!(received.len(), 5);
    for msg in &received {
        let id = msg.header("ce_id").expect("ce_id");
        let (order_id, cents) = expected
            .remove(id)
            .unwrap_or_else(|| panic!("unexpected or doubled event {id}"));
        assert_eq!(
            msg.key.as_deref(),
            Some(order_id.to_string().as_str()),
            "keyed by the event key"
        );
        assert_eq!(msg.header("ce_type"), Some("OrderCreated"));
        assert_eq!(msg.header("ce_source"), Some("inoutbox-tests"));
        assert_eq!(msg.header("ce_specversion"), Some("1.0"));
        assert_eq!(msg.header("content-type"), Some("application/json"));
        assert_eq!(msg.header("traceparent"), Some(TRACEPARENT));
        assert_eq!(
            msg.payload,
            serde_json::json!({"order_id": order_id, "total_cents": cents})
        );
    }
    assert_eq!(
        outbox_rows(&kit, "WHERE published_at IS NULL").await,
        0,
        "every committed row marked published"
    );
}

async fn three_relays_keep_per_key_commit_order_and_lose_nothing<K: Kit, B: Bus>() {
    const EVENTS: usize = 3000;
    const KEYS: usize = 30;
    const WRITERS: usize = 4;
    let bus = B::start().await;
    bus.create_topic("sequenced", 3).await;
    let kit = K::new("order3").await;
    let mut relays = Vec::new();
    for _ in 0..3 {
        relays.push(support::RunningRelay::spawn(Relay::with_store(
            kit.relay_store(),
            bus.publisher(3).await,
            K::relay_config(),
        )));
    }
    // Concurrent writers; a key's sequence number comes from a counter row in the same
    // transaction, so per key, sequence order is commit order.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let writer = |w: usize| {
        let (store, next) = (kit.store(), &next);
        async move {
            let mut i = w;
            while next.fetch_add(1, Ordering::SeqCst) < EVENTS {
                let key = format!("key-{}", (i * 7919) % KEYS);
                i += WRITERS;
                loop {
                    let mut tx = store.begin().await.expect("begin");
                    let seq = K::next_seq(&mut tx, &key).await;
                    outbox::enqueue(
                        &mut tx,
                        &Sequenced {
                            key: key.clone(),
                            seq,
                        },
                    )
                    .await
                    .expect("enqueue");
                    if store.commit(tx).await.is_ok() {
                        break;
                    }
                }
            }
        }
    };
    // Four writers interleaving on one task: their transactions overlap at every await.
    tokio::join!(writer(0), writer(1), writer(2), writer(3));
    let received = bus
        .read_topic("sequenced", 3, EVENTS, Duration::from_secs(120))
        .await;
    for relay in relays {
        relay.stop().await;
    }
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut ids = std::collections::HashSet::new();
    for msg in &received {
        assert!(
            ids.insert(msg.header("ce_id").unwrap().to_owned()),
            "an event published twice"
        );
        let key = msg.payload["key"].as_str().unwrap().to_owned();
        let seq = msg.payload["seq"].as_i64().unwrap();
        assert_eq!(msg.key.as_deref(), Some(key.as_str()));
        let prev = last.insert(key.clone(), seq).unwrap_or(0);
        assert!(
            seq > prev,
            "{} and {}: key {key}: {seq} after {prev}",
            B::NAME,
            K::NAME
        );
    }
    assert_eq!(received.len(), EVENTS, "every event arrived");
    assert_eq!(
        outbox_rows(&kit, "WHERE published_at IS NULL").await,
        0,
        "no row stuck"
    );
    let total: i64 = last.values().sum();
    assert_eq!(total, EVENTS as i64, "each key's sequence has no gap");
}

// Chaining: an inbox handler enqueues an event and then fails; the retry succeeds.

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "InvoiceRequested", topic = "invoices", key = order_id)]
pub struct InvoiceRequested {
    pub order_id: Uuid,
}

static CHAIN_RUNS: Counter = counter();

handlers!("chain", |event, tx, meta, store| {
    CHAIN_RUNS[store].fetch_add(1, Ordering::SeqCst);
    inoutbox::outbox::enqueue(
        tx,
        &InvoiceRequested {
            order_id: event.order_id,
        },
    )
    .await?;
    if meta.attempt == 1 {
        return Err(HandlerError::transient(
            "fails after enqueueing, first time",
        ));
    }
    Ok(())
});

async fn handler_that_enqueues_then_fails_leaves_no_row_and_its_retry_leaves_one<K: Kit, B: Bus>() {
    let bus = B::start().await;
    let kit = K::new("chain").await;
    let topic = bus.topic("chain");
    bus.create_topic(&topic, 1).await;
    let order_id = Uuid::new_v4();
    bus.send(
        &topic,
        Msg::order(&Uuid::new_v4().to_string(), order_id, 10),
    )
    .await;
    let mut c = Running::start(
        Consumer::builder("chain", kit.store(), bus.consumer(&topic)).retry(
            RetryPolicy::default().max_attempts(3).backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_secs(30),
            )),
        ),
    );
    let report = c.take(1).await.remove(0);
    c.stop().await;
    assert_eq!(report.outcome, Outcome::Processed { attempt: 2 });
    assert_eq!(CHAIN_RUNS[slot::<K, B>()].load(Ordering::SeqCst), 2);
    assert_eq!(
        outbox_rows(&kit, "").await,
        1,
        "the failed run's row rolled back with it"
    );
    let filter = format!("WHERE type = 'InvoiceRequested' AND message_key = '{order_id}'");
    assert_eq!(outbox_rows(&kit, &filter).await, 1);
}

/// (No broker: the same on both.)
async fn outbox_retention_deletes_old_published_rows_only<K: Kit, B: Bus>() {
    let kit = K::new("oretention").await;
    let store = kit.store();
    for i in 0..12 {
        let mut tx = store.begin().await.unwrap();
        outbox::enqueue(
            &mut tx,
            &OrderCreated {
                order_id: Uuid::new_v4(),
                total_cents: i,
            },
        )
        .await
        .unwrap();
        store.commit(tx).await.unwrap();
    }
    let t = kit.tables().outbox.clone();
    // 7 published 10 days ago, 2 published now, 3 unpublished.
    kit.exec(&format!(
        "UPDATE {t} SET published_at = {} WHERE seq IN (SELECT seq FROM (SELECT seq FROM {t} ORDER BY seq LIMIT 7) AS s)",
        K::days_ago(10)
    ))
    .await;
    kit.exec(&format!(
        "UPDATE {t} SET published_at = {} WHERE seq IN (SELECT seq FROM (SELECT seq FROM {t} WHERE published_at IS NULL ORDER BY seq LIMIT 2) AS s)",
        K::days_ago(0)
    ))
    .await;
    let retention = inoutbox::outbox::Retention::default().batch_size(3);
    let deleted = kit.relay_store().purge(&retention).await.unwrap();
    assert_eq!(deleted, 7);
    assert_eq!(
        outbox_rows(&kit, "WHERE published_at IS NULL").await,
        3,
        "unpublished rows stay"
    );
    assert_eq!(
        outbox_rows(&kit, "").await,
        5,
        "recently published rows stay"
    );
}
