//! The transport contract implemented outside the crate: the relay publishes through
//! `MemoryPublisher` and the consumer reads through `MemoryTransport` (tests/support/memory.rs),
//! both written with the facade's public API only. On both stores: each event's effect once in
//! key order, at-least-once re-deliveries, a member joining mid-stream, malformed messages, and
//! a publisher that refuses a topic or is unavailable for a while.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use inoutbox::inbox::{Backoff, Report};
use inoutbox::relay::{IntoRelayStore, RelayBuilder, RelayReport};
use inoutbox::store::InboxStore;
use inoutbox::{Consumer, Outcome, Relay};
use uuid::Uuid;

use super::{counter, Counter, InvoiceRequested, OrderCreated};
use crate::support::kit::Kit;
use crate::support::memory::{
    partition_for, Event, MemoryBroker, MemoryPublisher, MemoryTransport, Message, RunningConsumer,
    UNAVAILABLE,
};
use crate::support::RunningRelay;

crate::contract_tests!(
    relay_to_consumer_applies_each_event_once_in_key_order,
    redelivered_messages_are_duplicates_and_apply_once,
    member_joining_mid_stream_takes_partitions_and_no_revoked_run_commits,
    malformed_messages_are_dead_lettered_through_the_link_and_the_rest_flows,
    rejected_topic_is_parked_after_max_attempts_and_unavailable_sends_are_retried,
);

/// How long anything in these tests may take.
const WITHIN: Duration = Duration::from_secs(60);

static RUNS_FLOW: Counter = counter();
static RUNS_REDELIVERY: Counter = counter();

crate::handlers!("memory-flow", |event, tx, meta, store| {
    RUNS_FLOW[store].fetch_add(1, Ordering::SeqCst);
    crate::insert_invoice!(event, tx)
});

crate::handlers!("memory-redelivery", |event, tx, meta, store| {
    RUNS_REDELIVERY[store].fetch_add(1, Ordering::SeqCst);
    crate::insert_invoice!(event, tx)
});

crate::handlers!("memory-rebalance", |event, tx, meta, store| {
    crate::insert_invoice!(event, tx)?;
    // Slow enough that a rebalance finds messages in hand.
    tokio::time::sleep(Duration::from_millis(3)).await;
    Ok(())
});

crate::handlers!("memory-malformed", |event, tx, meta, store| {
    crate::insert_invoice!(event, tx)
});

// ---------------------------------------------------------------------------------------------
// Fixtures.

/// `per_partition` order ids on each partition of a topic of `partitions` (by the broker's
/// hash), so that every partition has events.
fn keys_on_every_partition(per_partition: usize, partitions: i32) -> Vec<Uuid> {
    let mut by_partition: HashMap<i32, Vec<Uuid>> = HashMap::new();
    while by_partition.len() < usize::try_from(partitions).expect("partitions")
        || by_partition.values().any(|keys| keys.len() < per_partition)
    {
        let key = Uuid::new_v4();
        let keys = by_partition
            .entry(partition_for(Some(key.to_string().as_bytes()), partitions))
            .or_default();
        if keys.len() < per_partition {
            keys.push(key);
        }
    }
    by_partition.into_values().flatten().collect()
}

/// Events `1..=per_key` of every key (`total_cents` is the sequence number), interleaved:
/// every key's first event, then every key's second, and so on.
fn keyed_events(keys: &[Uuid], per_key: i64) -> Vec<(Uuid, i64)> {
    (1..=per_key)
        .flat_map(|seq| keys.iter().map(move |key| (*key, seq)))
        .collect()
}

/// Enqueues an `OrderCreated` for each `(order_id, seq)` through the outbox, one store
/// transaction each; the event ids.
async fn enqueue<K: Kit>(kit: &K, events: &[(Uuid, i64)]) -> Vec<Uuid> {
    let store = kit.store();
    let mut ids = Vec::with_capacity(events.len());
    for &(order_id, total_cents) in events {
        let mut tx = store.begin().await.expect("begin");
        let event = OrderCreated {
            order_id,
            total_cents,
        };
        ids.push(
            inoutbox::outbox::enqueue(&mut tx, &event)
                .await
                .expect("enqueue"),
        );
        store.commit(tx).await.expect("commit");
    }
    ids
}

/// A relay on the kit's outbox publishing through `publisher`, through the public builder.
/// A relay publishing `kit`'s outbox to `broker`, running in a task.
fn running_relay<K: Kit>(kit: &K, broker: &MemoryBroker) -> RunningRelay
where
    K::RelayStore: IntoRelayStore<Store = K::RelayStore>,
{
    RunningRelay::spawn(
        relay(kit, MemoryPublisher::new(broker))
            .build()
            .expect("relay"),
    )
}

fn relay<K: Kit>(
    kit: &K,
    publisher: MemoryPublisher,
) -> RelayBuilder<K::RelayStore, MemoryPublisher>
where
    K::RelayStore: IntoRelayStore<Store = K::RelayStore>,
{
    Relay::builder(kit.relay_store(), publisher)
        .source("inoutbox-tests")
        .poll_interval(Duration::from_millis(50))
        .retention(None)
}

fn event_id(report: &Report) -> String {
    report
        .delivery
        .header_str("ce_id")
        .unwrap_or_default()
        .to_owned()
}

fn processed(reports: &[Report]) -> usize {
    reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Processed { .. }))
        .count()
}

/// Every event's invoice exactly once, and each key's invoices in sequence order.
async fn assert_applied_once_in_key_order<K: Kit>(kit: &K, events: usize) {
    let events = i64::try_from(events).expect("count");
    assert_eq!(
        kit.invoices().await,
        events,
        "{}: one invoice per event",
        K::NAME
    );
    let distinct = kit
        .count("SELECT count(*) FROM (SELECT DISTINCT order_id, total_cents FROM invoices) d")
        .await;
    assert_eq!(distinct, events, "{}: every event invoiced", K::NAME);
    let out_of_order = kit
        .count(
            "SELECT count(*) FROM invoices a JOIN invoices b \
             ON a.order_id = b.order_id AND a.id < b.id AND a.total_cents > b.total_cents",
        )
        .await;
    assert_eq!(
        out_of_order,
        0,
        "{}: each key's events applied in sequence order",
        K::NAME
    );
}

/// The `OrderCreated` events on `topic`: each event id once, each key in one partition with
/// its sequence numbers increasing. Their count.
fn assert_published_once_in_key_order(broker: &MemoryBroker, topic: &str) -> usize {
    let messages = broker.messages(topic);
    let mut ids = HashSet::new();
    let mut last: HashMap<String, (i32, i64)> = HashMap::new();
    for stored in &messages {
        let m = &stored.message;
        let id = m.header_str("ce_id").expect("ce_id");
        assert!(ids.insert(id.to_owned()), "event {id} published twice");
        assert_eq!(m.header_str("ce_type"), Some("OrderCreated"));
        assert_eq!(m.header_str("ce_source"), Some("inoutbox-tests"));
        let payload: serde_json::Value =
            serde_json::from_slice(m.payload.as_deref().expect("payload")).expect("JSON");
        let key = payload["order_id"].as_str().expect("order_id").to_owned();
        let seq = payload["total_cents"].as_i64().expect("total_cents");
        assert_eq!(m.key.as_deref(), Some(key.as_bytes()), "keyed by the order");
        if let Some((partition, prev)) = last.insert(key.clone(), (stored.partition, seq)) {
            assert_eq!(partition, stored.partition, "key {key} in one partition");
            assert!(seq > prev, "key {key}: {seq} published after {prev}");
        }
    }
    messages.len()
}

// ---------------------------------------------------------------------------------------------
// 1. Outbox → relay → memory broker → consumer: each event once, per key in order.

async fn relay_to_consumer_applies_each_event_once_in_key_order<K: Kit>()
where
    K::RelayStore: IntoRelayStore<Store = K::RelayStore>,
{
    let group = "memory-flow";
    let kit = K::new("mem_flow").await;
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 3);
    let transport = MemoryTransport::new(&broker, ["orders"]);
    let mut consumer = RunningConsumer::start(Consumer::builder(group, kit.store(), transport));
    let mut relay = running_relay(&kit, &broker);

    let events = keyed_events(&keys_on_every_partition(2, 3), 8);
    let ids = enqueue(&kit, &events).await;
    relay.published(events.len(), WITHIN).await;
    consumer.until(WITHIN, |r| r.len() >= events.len()).await;
    let committed = broker.wait_settled(group, "orders", WITHIN).await;
    assert!(
        consumer.health.live() && consumer.health.joined(),
        "a consumer on an outside transport is live and joined: {:?}",
        consumer.health
    );
    let health = consumer.health.clone();
    relay.stop().await;
    let reports = consumer.stop().await;
    assert!(
        !health.live() && !health.joined(),
        "a stopped consumer is neither live nor joined: {health:?}"
    );

    assert_eq!(reports.len(), events.len(), "one delivery per event");
    for r in &reports {
        assert_eq!(r.outcome, Outcome::Processed { attempt: 1 }, "{r:#?}");
    }
    let delivered: HashSet<String> = reports.iter().map(event_id).collect();
    let enqueued: HashSet<String> = ids.iter().map(Uuid::to_string).collect();
    assert_eq!(
        delivered, enqueued,
        "the enqueued events, each delivered once"
    );
    assert_eq!(
        RUNS_FLOW[K::INDEX].load(Ordering::SeqCst) as usize,
        events.len(),
        "the handler ran once per event"
    );
    assert_applied_once_in_key_order(&kit, events.len()).await;
    assert_eq!(
        assert_published_once_in_key_order(&broker, "orders"),
        events.len()
    );
    assert_eq!(
        committed,
        broker.end_offsets("orders"),
        "every partition committed to its end"
    );
    assert!(committed.iter().all(|&c| c > 0), "{committed:?}");
    assert_eq!(broker.commits_after_revocation(), []);
}

// ---------------------------------------------------------------------------------------------
// 2. At least once: the transport hands runs messages they already resolved.

async fn redelivered_messages_are_duplicates_and_apply_once<K: Kit>()
where
    K::RelayStore: IntoRelayStore<Store = K::RelayStore>,
{
    let group = "memory-redelivery";
    let kit = K::new("mem_redeliver").await;
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 3);
    let transport = MemoryTransport::new(&broker, ["orders"]).redeliver(3);
    let mut consumer = RunningConsumer::start(Consumer::builder(group, kit.store(), transport));
    let mut relay = running_relay(&kit, &broker);

    let events = keyed_events(&keys_on_every_partition(2, 3), 8);
    let ids = enqueue(&kit, &events).await;
    relay.published(events.len(), WITHIN).await;
    consumer
        .until(WITHIN, |r| processed(r) >= events.len())
        .await;
    let committed = broker.wait_settled(group, "orders", WITHIN).await;
    relay.stop().await;
    let reports = consumer.stop().await;

    let mut processed_at = HashMap::new();
    let mut duplicates = Vec::new();
    for r in &reports {
        match r.outcome {
            Outcome::Processed { attempt: 1 } => {
                let first =
                    processed_at.insert(event_id(r), (r.delivery.partition, r.delivery.offset));
                assert_eq!(first, None, "{} processed twice", event_id(r));
            }
            Outcome::Duplicate => duplicates.push(r),
            _ => panic!("a delivery neither processed nor a duplicate: {r:#?}"),
        }
    }
    let enqueued: HashSet<String> = ids.iter().map(Uuid::to_string).collect();
    assert_eq!(
        processed_at.keys().cloned().collect::<HashSet<_>>(),
        enqueued,
        "every event processed once"
    );
    assert!(!duplicates.is_empty(), "messages were delivered again");
    for d in &duplicates {
        assert_eq!(
            processed_at.get(&event_id(d)),
            Some(&(d.delivery.partition, d.delivery.offset)),
            "a duplicate is a message processed before: {d:#?}"
        );
    }
    let restarts = broker.count_events(|e| matches!(e, Event::Released { .. }));
    println!(
        "{}: {} events, {} deliveries, {} duplicates, {restarts} runs restarted from an older position",
        K::NAME,
        events.len(),
        reports.len(),
        duplicates.len()
    );
    assert!(restarts > 0);
    assert_eq!(
        RUNS_REDELIVERY[K::INDEX].load(Ordering::SeqCst) as usize,
        events.len(),
        "the handler never ran for a duplicate"
    );
    assert_applied_once_in_key_order(&kit, events.len()).await;
    assert_eq!(committed, broker.end_offsets("orders"));
    assert_eq!(broker.commits_after_revocation(), []);
}

// ---------------------------------------------------------------------------------------------
// 3. A second member joins mid-stream and the first one leaves: the partitions that move are
// revoked from their run (its token cancelled, its link no longer owning them), the new owner
// starts from the committed position, and the broker stores no commit from a revoked run.

async fn member_joining_mid_stream_takes_partitions_and_no_revoked_run_commits<K: Kit>()
where
    K::RelayStore: IntoRelayStore<Store = K::RelayStore>,
{
    let group = "memory-rebalance";
    let partitions = 4;
    let kit = K::new("mem_rebalance").await;
    let broker = MemoryBroker::new();
    broker.create_topic("orders", partitions);
    let member = || {
        RunningConsumer::start(Consumer::builder(
            group,
            kit.store(),
            MemoryTransport::new(&broker, ["orders"]),
        ))
    };
    let mut relay = running_relay(&kit, &broker);
    let events = keyed_events(&keys_on_every_partition(3, partitions), 10);
    let phases: Vec<&[(Uuid, i64)]> = events.chunks(events.len() / 3 + 1).collect();
    assert_eq!(phases.len(), 3);

    // Phase 1: A alone, until it has resolved messages of every partition.
    let mut a = member();
    enqueue(&kit, phases[0]).await;
    let every_partition = |reports: &[Report]| {
        let seen: HashSet<i32> = reports.iter().map(|r| r.delivery.partition).collect();
        seen.len() == usize::try_from(partitions).expect("partitions")
    };
    a.until(WITHIN, every_partition).await;

    // Phase 2: B joins; half of A's partitions move to B while messages keep coming.
    let mut b = member();
    enqueue(&kit, phases[1]).await;
    b.until(WITHIN, |r| !r.is_empty()).await;
    let assignment = broker.assignment(group);
    assert_eq!(
        assignment.len(),
        2,
        "two members share the topic: {assignment:?}"
    );
    assert!(
        assignment.values().all(|keys| keys.len() == 2),
        "{assignment:?}"
    );

    // Phase 3: A leaves; B takes every partition.
    let a_reports = a.stop().await;
    enqueue(&kit, phases[2]).await;
    relay.published(events.len(), WITHIN).await;
    let committed = broker.wait_settled(group, "orders", WITHIN).await;
    relay.stop().await;
    let b_reports = b.stop().await;
    assert_eq!(broker.assignment(group).len(), 0, "both left");

    let reports: Vec<&Report> = a_reports.iter().chain(&b_reports).collect();
    let mut processed = HashSet::new();
    for r in &reports {
        match r.outcome {
            Outcome::Processed { .. } => {
                assert!(processed.insert(event_id(r)), "processed twice: {r:#?}");
            }
            Outcome::Duplicate | Outcome::Abandoned => {}
            _ => panic!("unexpected outcome: {r:#?}"),
        }
    }
    assert_eq!(processed.len(), events.len(), "every event processed once");
    let b_partitions: HashSet<i32> = b_reports.iter().map(|r| r.delivery.partition).collect();
    let revoked = broker.count_events(|e| matches!(e, Event::Revoked { .. }));
    let refused = broker.count_events(|e| matches!(e, Event::Refused { .. }));
    println!(
        "{}: A {} deliveries, B {} deliveries on partitions {b_partitions:?}; generation {}; \
         {revoked} runs revoked, {refused} commits refused after revocation",
        K::NAME,
        a_reports.len(),
        b_reports.len(),
        broker.generation(group),
    );
    assert_eq!(b_partitions.len(), 4, "B ended up with every partition");
    assert_eq!(
        broker.generation(group),
        4,
        "A joined, B joined, A left, B left"
    );
    assert_eq!(revoked, 2, "two of A's partitions moved to B");
    assert_eq!(
        broker.commits_after_revocation(),
        [],
        "no commit stored for a partition after its revocation"
    );
    assert!(
        refused > 0,
        "the revoked runs tried to commit what they had resolved"
    );
    assert_applied_once_in_key_order(&kit, events.len()).await;
    assert_eq!(committed, broker.end_offsets("orders"));
}

// ---------------------------------------------------------------------------------------------
// 4. Messages from a foreign producer: one without `ce_id`, one whose payload is not JSON. Both
// are dead-lettered, the link is told (a transport could copy them to a dead-letter topic),
// their offsets are committed, and later messages flow.

/// An `OrderCreated` in CloudEvents binary mode, with `id` as its `ce_id` (none if `None`).
fn order_message(id: Option<&str>, payload: &[u8]) -> Message {
    let mut m = Message::new(payload)
        .header("ce_type", "OrderCreated")
        .header("ce_source", "foreign")
        .header("ce_specversion", "1.0")
        .header("content-type", "application/json");
    if let Some(id) = id {
        m = m.header("ce_id", id);
    }
    m
}

fn order_payload(cents: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"order_id": Uuid::new_v4(), "total_cents": cents}))
        .expect("json")
}

async fn malformed_messages_are_dead_lettered_through_the_link_and_the_rest_flows<K: Kit>() {
    let group = "memory-malformed";
    let kit = K::new("mem_malformed").await;
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1);
    let id = || Some(Uuid::new_v4().to_string());
    broker.produce(
        "orders",
        None,
        order_message(id().as_deref(), &order_payload(1)),
    );
    broker.produce("orders", None, order_message(None, &order_payload(2)));
    broker.produce("orders", None, order_message(id().as_deref(), b"{not json"));
    broker.produce(
        "orders",
        None,
        order_message(id().as_deref(), &order_payload(4)),
    );
    let transport = MemoryTransport::new(&broker, ["orders"]);
    let mut consumer = RunningConsumer::start(Consumer::builder(group, kit.store(), transport));
    consumer.until(WITHIN, |r| r.len() >= 4).await;
    // A message after the dead letters, to a run that has already dead-lettered two.
    broker.produce(
        "orders",
        None,
        order_message(id().as_deref(), &order_payload(5)),
    );
    consumer.until(WITHIN, |r| r.len() >= 5).await;
    let committed = broker.wait_settled(group, "orders", WITHIN).await;
    let reports = consumer.stop().await;

    let outcomes: Vec<&Outcome> = reports.iter().map(|r| &r.outcome).collect();
    println!("{}: {outcomes:#?}", K::NAME);
    let offsets: Vec<i64> = reports.iter().map(|r| r.delivery.offset).collect();
    assert_eq!(offsets, [0, 1, 2, 3, 4], "in offset order");
    for n in [0, 3, 4] {
        assert_eq!(reports[n].outcome, Outcome::Processed { attempt: 1 }, "{n}");
    }
    let dead_letter_id = |n: usize| match &reports[n].outcome {
        Outcome::DeadLettered { reason, id } => (reason.clone(), *id),
        other => panic!("message {n} not dead-lettered: {other:?}"),
    };
    let (no_id, no_id_row) = dead_letter_id(1);
    let (not_json, not_json_row) = dead_letter_id(2);
    assert!(no_id.contains("ce_id"), "{no_id}");
    assert!(not_json.contains("decode"), "{not_json}");

    let told = broker.dead_letters();
    let told: Vec<(i64, &str, i64)> = told
        .iter()
        .map(|d| (d.delivery.offset, d.reason.as_str(), d.id))
        .collect();
    assert_eq!(
        told,
        [
            (1, no_id.as_str(), no_id_row),
            (2, not_json.as_str(), not_json_row)
        ],
        "the link was told of each dead letter, with its row id"
    );
    assert!(broker.dead_letters().iter().all(|d| d.group == group));
    assert_eq!(kit.dead_letters().await, 2);
    assert_eq!(kit.invoices().await, 3);
    assert_eq!(
        committed,
        [5],
        "the dead letters' offsets are committed too"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. The publisher's faults: a topic the broker refuses parks its rows after the relay's
// attempts; sends that fail because the broker is unavailable are retried until published.

async fn rejected_topic_is_parked_after_max_attempts_and_unavailable_sends_are_retried<K: Kit>()
where
    K::RelayStore: IntoRelayStore<Store = K::RelayStore>,
{
    let kit = K::new("mem_faults").await;
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 2);
    broker.create_topic("invoices", 1);
    let publisher = MemoryPublisher::new(&broker);
    publisher.reject_topic("invoices");
    publisher.fail_next(3);

    let orders = enqueue(&kit, &keyed_events(&keys_on_every_partition(1, 2), 3)).await;
    let store = kit.store();
    let mut refused = HashSet::new();
    for _ in 0..2 {
        let mut tx = store.begin().await.expect("begin");
        let event = InvoiceRequested {
            order_id: Uuid::new_v4(),
        };
        refused.insert(
            inoutbox::outbox::enqueue(&mut tx, &event)
                .await
                .expect("enqueue"),
        );
        store.commit(tx).await.expect("commit");
    }

    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let relay = relay(&kit, publisher.clone())
        .max_attempts(3)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .reports(tx)
        .build()
        .expect("relay");
    tokio::time::timeout(WITHIN, relay.drain())
        .await
        .expect("every row published or parked")
        .expect("relay");
    let mut published = HashMap::new();
    let mut failures: HashMap<Uuid, Vec<(String, bool)>> = HashMap::new();
    while let Ok(report) = reports.try_recv() {
        match report {
            RelayReport::Published { id, .. } => *published.entry(id).or_insert(0) += 1,
            RelayReport::Failed { id, error, parked } => {
                failures.entry(id).or_default().push((error, parked));
            }
        }
    }

    assert_eq!(publisher.failures_left(), 0);
    let unavailable: Vec<(&Uuid, &(String, bool))> = failures
        .iter()
        .flat_map(|(id, f)| f.iter().map(move |f| (id, f)))
        .filter(|(_, (error, _))| error.contains(UNAVAILABLE))
        .collect();
    assert_eq!(
        unavailable.len(),
        3,
        "each unavailable send failed its row once: {failures:#?}"
    );
    assert!(
        unavailable.iter().all(|(_, (_, parked))| !parked),
        "an unavailable broker never parks a row"
    );
    for id in &orders {
        assert_eq!(published.get(id), Some(&1), "order {id} published once");
    }
    for id in &refused {
        assert_eq!(published.get(id), None);
        let attempts = &failures[id];
        assert_eq!(
            attempts.iter().filter(|(_, parked)| *parked).count(),
            1,
            "parked once, at its last attempt: {attempts:#?}"
        );
        assert!(
            attempts.last().is_some_and(|(_, parked)| *parked),
            "{attempts:#?}"
        );
    }
    let outbox = &kit.tables().outbox;
    let parked = kit
        .count(&format!(
            "SELECT count(*) FROM {outbox} \
             WHERE parked_at IS NOT NULL AND published_at IS NULL \
               AND type = 'InvoiceRequested' AND attempts = 3"
        ))
        .await;
    assert_eq!(parked, 2, "the refused rows are parked after 3 attempts");
    let published_rows = kit
        .count(&format!(
            "SELECT count(*) FROM {outbox} WHERE published_at IS NOT NULL AND parked_at IS NULL"
        ))
        .await;
    assert_eq!(published_rows, i64::try_from(orders.len()).expect("count"));
    assert_eq!(
        assert_published_once_in_key_order(&broker, "orders"),
        orders.len(),
        "the retried rows once each, keys in order"
    );
    assert!(
        broker.messages("invoices").is_empty(),
        "nothing refused was stored"
    );
}
