//! The outbox guarantees, against a real PostgreSQL and a real Kafka-protocol broker (Tansu).
//!
//! Each test has its own schema, topic and (where it publishes) broker process, so they run in
//! parallel. The crash test runs the relay example as a child process and SIGKILLs it.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inoutbox::inbox::{Backoff, UnknownEvent};
use inoutbox::outbox::{self, Retention};
use inoutbox::prelude::*;
use inoutbox::relay::RelayReport;
use inoutbox::{Consumer, Outcome, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::child::ChildProcess;
use support::{read_topic, relay_builder, Broker, Running, RunningRelay, TestDb};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

/// An event whose key carries a sequence number, on a topic chosen per test via `Outbox`.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Sequenced", topic = "sequenced", key = key)]
pub struct Sequenced {
    pub key: String,
    pub seq: i64,
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// ---------------------------------------------------------------------------------------------
// 1. Enqueue: the row commits or rolls back with the business rows.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_commits_and_rolls_back_with_the_business_transaction() {
    let db = TestDb::new("enqueue").await;
    db.migrated_store().await;
    sqlx::raw_sql("CREATE TABLE orders (id uuid PRIMARY KEY, total_cents bigint NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("orders");

    let rolled_back = Uuid::new_v4();
    let mut tx = db.pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders VALUES ($1, 100)")
        .bind(rolled_back)
        .execute(&mut *tx)
        .await
        .expect("order");
    outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id: rolled_back,
            total_cents: 100,
        },
    )
    .await
    .expect("enqueue");
    tx.rollback().await.expect("rollback");
    assert_eq!(db.count("SELECT count(*) FROM inoutbox_outbox").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM orders").await, 0);

    let order_id = Uuid::new_v4();
    let mut tx = db.pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders VALUES ($1, 1200)")
        .bind(order_id)
        .execute(&mut *tx)
        .await
        .expect("order");
    let id = outbox::with_traceparent(
        TRACEPARENT,
        outbox::enqueue(
            &mut tx,
            &OrderCreated {
                order_id,
                total_cents: 1200,
            },
        ),
    )
    .await
    .expect("enqueue");
    let ids = outbox::enqueue_all(
        &mut tx,
        &[
            OrderCreated {
                order_id,
                total_cents: 1,
            },
            OrderCreated {
                order_id,
                total_cents: 2,
            },
        ],
    )
    .await
    .expect("enqueue_all");
    tx.commit().await.expect("commit");

    assert_eq!(id.get_version_num(), 7, "UUID v7 ids");
    type Row = (
        String,
        String,
        Option<String>,
        Option<String>,
        serde_json::Value,
        serde_json::Value,
    );
    let row: Row = sqlx::query_as(
        "SELECT type, topic, message_key, aggregateid, payload, headers \
             FROM inoutbox_outbox WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("row");
    assert_eq!(row.0, "OrderCreated");
    assert_eq!(row.1, "orders");
    assert_eq!(row.2.as_deref(), Some(order_id.to_string().as_str()));
    assert_eq!(row.3.as_deref(), Some(order_id.to_string().as_str()));
    assert_eq!(row.4["total_cents"], 1200);
    assert_eq!(row.5["traceparent"], TRACEPARENT);
    let order: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM inoutbox_outbox WHERE published_at IS NULL ORDER BY seq",
    )
    .fetch_all(&db.pool)
    .await
    .expect("order");
    assert_eq!(order, [vec![id], ids].concat(), "seq follows enqueue order");
}

/// Per-key order is commit order because an enqueue holds its key until commit: a second
/// transaction enqueueing for the same key waits, one for another key does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_rows_take_their_seq_in_commit_order_and_no_enqueue_waits() {
    let db = TestDb::new("keylock").await;
    db.migrated_store().await;
    let k = Uuid::new_v4();
    let event = |order_id| OrderCreated {
        order_id,
        total_cents: 1,
    };
    // The first transaction enqueues first and commits last.
    let mut first = db.pool.begin().await.expect("begin");
    let first_id = outbox::enqueue(&mut first, &event(k))
        .await
        .expect("enqueue");
    let mut second = db.pool.begin().await.expect("begin");
    let second_id = tokio::time::timeout(
        Duration::from_secs(10),
        outbox::enqueue(&mut second, &event(k)),
    )
    .await
    .expect("an enqueue of the same key does not wait for the other transaction")
    .expect("enqueue");
    second.commit().await.expect("commit");
    first.commit().await.expect("commit");
    let order: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM inoutbox_outbox WHERE message_key = $1 ORDER BY seq")
            .bind(k.to_string())
            .fetch_all(&db.pool)
            .await
            .expect("rows");
    assert_eq!(order, [second_id, first_id], "seq order = commit order");
}

/// Two transactions enqueue keys A then B, and B then A, in separate calls, each call made
/// while the other transaction holds its first enqueue: both commit (no deadlock, no abort),
/// and per key the transaction that committed first has the smaller `seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_of_two_keys_in_opposite_orders_in_two_transactions_both_commit() {
    let db = TestDb::new("deadlock").await;
    db.migrated_store().await;
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let both_started = Arc::new(tokio::sync::Barrier::new(2));
    let writer = |first: Uuid, then: Uuid| {
        let pool = db.pool.clone();
        let both_started = both_started.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.expect("begin");
            let event = |order_id| OrderCreated {
                order_id,
                total_cents: 1,
            };
            let one = outbox::enqueue(&mut tx, &event(first))
                .await
                .map_err(|e| e.to_string())?;
            both_started.wait().await;
            let two = outbox::enqueue(&mut tx, &event(then))
                .await
                .map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((one, two))
        })
    };
    let ab = writer(a, b);
    let ba = writer(b, a);
    let within = Duration::from_secs(30);
    let ab = tokio::time::timeout(within, ab)
        .await
        .expect("A, B ends")
        .expect("task");
    let ba = tokio::time::timeout(within, ba)
        .await
        .expect("B, A ends")
        .expect("task");
    let (ab, ba) = (ab.expect("A, B commits"), ba.expect("B, A commits"));
    let seq = |id: Uuid| seq_of(&db.pool, id);
    // ab = (A of the first, B of the first); ba = (B of the second, A of the second).
    let a_first_ahead = seq(ab.0).await < seq(ba.1).await;
    let b_first_ahead = seq(ab.1).await < seq(ba.0).await;
    assert_eq!(
        a_first_ahead, b_first_ahead,
        "one transaction committed first: its rows are ahead on both keys"
    );
}

/// The lock of a key is held from the moment a committing transaction draws its row's `seq` to
/// the end of its commit: a second transaction of the key that commits meanwhile waits, so it
/// never becomes visible with a larger `seq` while the first row is still invisible. The first
/// transaction's commit is slowed down (a deferred trigger of the test's own that sleeps after
/// the outbox's); the second commits while the first sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_seq_of_a_key_never_becomes_visible_before_an_earlier_one() {
    let db = TestDb::new("commitlock").await;
    db.migrated_store().await;
    db.exec(
        "CREATE TABLE slow_commit (x int); \
         CREATE FUNCTION slow_commit_sleep() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit_sleep AFTER INSERT ON slow_commit \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_sleep()",
    )
    .await;
    let k = Uuid::new_v4();
    let event = OrderCreated {
        order_id: k,
        total_cents: 1,
    };
    let mut first = db.pool.begin().await.expect("begin");
    let first_id = outbox::enqueue(&mut first, &event).await.expect("enqueue");
    sqlx::query("INSERT INTO slow_commit VALUES (1)")
        .execute(&mut *first)
        .await
        .expect("slow");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *first)
        .await
        .expect("pid");
    let first_commit = tokio::spawn(async move { first.commit().await.expect("commit") });
    // The first transaction has drawn its seq and sleeps in its commit.
    loop {
        let sleeping: bool = sqlx::query_scalar(
            "SELECT coalesce(bool_or(wait_event = 'PgSleep'), false) FROM pg_stat_activity \
             WHERE pid = $1",
        )
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .expect("activity");
        if sleeping {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut second = db.pool.begin().await.expect("begin");
    let second_id = outbox::enqueue(&mut second, &event).await.expect("enqueue");
    second.commit().await.expect("commit");
    let first_visible = db
        .count(&format!(
            "SELECT count(*) FROM inoutbox_outbox WHERE id = '{first_id}'"
        ))
        .await;
    first_commit.await.expect("first commit");
    let seq = |id: Uuid| seq_of(&db.pool, id);
    let (first_seq, second_seq) = (seq(first_id).await, seq(second_id).await);
    assert!(
        first_visible == 1 || second_seq < first_seq,
        "the second row (seq {second_seq}) was visible while the first (seq {first_seq}) was not"
    );
    assert!(first_seq < second_seq, "seq order = commit order");
}

async fn enqueue_order(db: &TestDb, order_id: Uuid, total_cents: i64) -> Uuid {
    let mut tx = db.pool.begin().await.expect("begin");
    let id = outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id,
            total_cents,
        },
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    id
}

async fn unpublished(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL")
        .await
}

// ---------------------------------------------------------------------------------------------
// 2 and 5. The relay publishes the envelope: key, CloudEvents headers, traceparent.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_publishes_cloudevents_envelope_keyed_by_the_event_key() {
    let broker = Broker::start();
    broker.create_topic("orders", 2).await;
    let db = TestDb::new("envelope").await;
    db.migrated_store().await;
    let order_id = Uuid::new_v4();
    let mut tx = db.pool.begin().await.expect("begin");
    let id = outbox::with_traceparent(
        TRACEPARENT,
        outbox::enqueue(
            &mut tx,
            &OrderCreated {
                order_id,
                total_cents: 4200,
            },
        ),
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");

    let mut relay = RunningRelay::start(relay_builder(&db, &broker.brokers));
    assert_eq!(relay.published(1, Duration::from_secs(30)).await, [id]);
    relay.stop().await;

    let msg = read_topic(&broker.brokers, "orders", 2, 1, Duration::from_secs(30))
        .await
        .remove(0);
    assert_eq!(msg.key.as_deref(), Some(order_id.to_string().as_str()));
    assert_eq!(msg.header("ce_id"), Some(id.to_string().as_str()));
    assert_eq!(msg.header("ce_type"), Some("OrderCreated"));
    assert_eq!(msg.header("ce_source"), Some("inoutbox-tests"));
    assert_eq!(msg.header("ce_specversion"), Some("1.0"));
    assert_eq!(msg.header("content-type"), Some("application/json"));
    assert_eq!(msg.header("traceparent"), Some(TRACEPARENT));
    assert_eq!(
        msg.payload,
        serde_json::json!({"order_id": order_id, "total_cents": 4200})
    );
    assert_eq!(unpublished(&db).await, 0, "the row is marked published");
}

/// An event serialised with its keys out of sorted order and a raw JSON field with its own
/// spacing: what a signature or a byte-exact comparison depends on.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Signed", topic = "signed", key = zz)]
pub struct Signed {
    pub zz: String,
    pub a: i64,
    pub mmm: Box<serde_json::value::RawValue>,
}

/// The payload of `Signed { zz: "k-1", a: 1, mmm: RAW }` as serde_json writes it.
pub const SIGNED_RAW: &str = r#"{"b" : 1,  "a":[1, 2], "b": 2}"#;
pub const SIGNED_BYTES: &str = r#"{"zz":"k-1","a":1,"mmm":{"b" : 1,  "a":[1, 2], "b": 2}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_publishes_exactly_the_bytes_the_producer_serialised() {
    let broker = Broker::start();
    broker.create_topic("signed", 1).await;
    let db = TestDb::new("exact_bytes").await;
    db.migrated_store().await;
    let event = Signed {
        zz: "k-1".into(),
        a: 1,
        mmm: serde_json::value::RawValue::from_string(SIGNED_RAW.into()).expect("raw"),
    };
    assert_eq!(serde_json::to_string(&event).expect("json"), SIGNED_BYTES);
    let mut tx = db.pool.begin().await.expect("begin");
    let id = outbox::enqueue(&mut tx, &event).await.expect("enqueue");
    // and through the multi-row insert
    let ids = outbox::enqueue_all(&mut tx, [&event, &event])
        .await
        .expect("enqueue_all");
    tx.commit().await.expect("commit");

    let mut relay = RunningRelay::start(relay_builder(&db, &broker.brokers));
    relay.published(3, Duration::from_secs(30)).await;
    relay.stop().await;
    let msgs = read_topic(&broker.brokers, "signed", 1, 3, Duration::from_secs(30)).await;
    let mut seen = Vec::new();
    for msg in &msgs {
        seen.push(msg.header("ce_id").expect("ce_id").to_owned());
        assert_eq!(
            String::from_utf8_lossy(&msg.bytes),
            SIGNED_BYTES,
            "the payload on the broker is byte for byte what the producer serialised"
        );
    }
    seen.sort();
    let mut expected: Vec<String> = [id, ids[0], ids[1]].iter().map(Uuid::to_string).collect();
    expected.sort();
    assert_eq!(seen, expected);
}

// ---------------------------------------------------------------------------------------------
// 3. Several relays: nothing lost, nothing doubled, per-key commit order.

const EVENTS: usize = 10_000;
const KEYS: u128 = 50;
const WRITERS: usize = 8;

fn random_below(n: u128) -> u128 {
    Uuid::new_v4().as_u128() % n
}

/// One writer: transactions of 1 to 3 events over 1 to 3 keys; each key's sequence number is
/// taken from a counter row locked until commit, so sequence order is the commit order.
/// (These writers serialise same-key transactions themselves, so this test proves nothing
/// lost or doubled under several relays; `tests/relay.rs` proves the order with writers that
/// take no lock.)
async fn sequenced_writer(db: &TestDb, reserved: &std::sync::atomic::AtomicUsize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    loop {
        let want = 1 + random_below(3) as usize;
        let start = reserved.fetch_add(want, Ordering::SeqCst);
        if start >= EVENTS {
            return ids;
        }
        let n = want.min(EVENTS - start);
        let keys: Vec<String> = (0..n)
            .map(|_| format!("key-{:02}", random_below(KEYS)))
            .collect();
        let mut per_key: std::collections::BTreeMap<&str, i64> = Default::default();
        for k in &keys {
            *per_key.entry(k.as_str()).or_default() += 1;
        }
        let mut tx = db.pool.begin().await.expect("begin");
        let mut next: HashMap<&str, i64> = HashMap::new();
        for (k, c) in &per_key {
            // sorted keys: writers lock counter rows in one order, no deadlocks
            let end: i64 =
                sqlx::query_scalar("UPDATE key_seq SET n = n + $2 WHERE key = $1 RETURNING n")
                    .bind(*k)
                    .bind(*c)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("counter");
            next.insert(k, end - c + 1);
        }
        let events: Vec<Sequenced> = keys
            .iter()
            .map(|k| {
                let seq = next.get_mut(k.as_str()).expect("key");
                *seq += 1;
                Sequenced {
                    key: k.clone(),
                    seq: *seq - 1,
                }
            })
            .collect();
        ids.extend(
            outbox::enqueue_all(&mut tx, &events)
                .await
                .expect("enqueue_all"),
        );
        tx.commit().await.expect("commit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_publish_10000_events_over_50_keys_in_per_key_commit_order() {
    let broker = Broker::start();
    broker.create_topic("sequenced", 4).await;
    let db = TestDb::new("relays").await;
    db.migrated_store().await;
    sqlx::raw_sql(
        "CREATE TABLE key_seq (key text PRIMARY KEY, n bigint NOT NULL); \
         INSERT INTO key_seq SELECT format('key-%s', lpad(i::text, 2, '0')), 0 \
         FROM generate_series(0, 49) AS i",
    )
    .execute(&db.pool)
    .await
    .expect("key_seq");

    let relays: Vec<RunningRelay> = (0..3)
        .map(|_| RunningRelay::start(relay_builder(&db, &broker.brokers).batch_size(200)))
        .collect();

    let db = std::sync::Arc::new(db);
    let reserved = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (db, reserved) = (db.clone(), reserved.clone());
            tokio::spawn(async move { sequenced_writer(&db, &reserved).await })
        })
        .collect();
    let mut enqueued = HashSet::new();
    for w in writers {
        enqueued.extend(w.await.expect("writer"));
    }
    assert_eq!(enqueued.len(), EVENTS);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while unpublished(&db).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} rows still unpublished after 180 s",
            unpublished(&db).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut acked = 0;
    let mut per_relay = Vec::new();
    for relay in relays {
        let mut reports = relay;
        let mut mine = 0;
        while let Ok(r) = reports.reports.try_recv() {
            if matches!(r, RelayReport::Published { .. }) {
                mine += 1;
            }
        }
        reports.stop().await;
        per_relay.push(mine);
        acked += mine;
    }
    println!("rows published per relay: {per_relay:?}");
    assert_eq!(
        acked, EVENTS,
        "every row published exactly once (no relay crashed)"
    );
    assert!(
        per_relay.iter().filter(|&&n| n > 0).count() >= 2,
        "the relays shared the work: {per_relay:?}"
    );

    // Read until the topic is quiet, not up to a count: a late duplicate would be seen.
    let mut messages = support::read_topic_until_quiet(
        &broker.brokers,
        "sequenced",
        4,
        Duration::from_secs(3),
        Duration::from_secs(120),
    )
    .await;
    messages.sort_by_key(|m| (m.partition, m.offset));
    let mut seen = HashSet::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    for m in &messages {
        let id: Uuid = m.header("ce_id").expect("ce_id").parse().expect("uuid");
        assert!(seen.insert(id), "event {id} published twice");
        let key = m.payload["key"].as_str().expect("key").to_owned();
        assert_eq!(
            m.key.as_deref(),
            Some(key.as_str()),
            "Kafka key = event key"
        );
        let seq = m.payload["seq"].as_i64().expect("seq");
        if let Some(prev) = last.insert(key.clone(), seq) {
            assert!(
                seq > prev,
                "key {key}: seq {seq} published after {prev} (partition {}, offset {})",
                m.partition,
                m.offset
            );
        }
    }
    assert_eq!(seen, enqueued, "every enqueued event arrived");
    let totals: i64 = last.values().sum::<i64>();
    let counters: i64 = db.count("SELECT sum(n)::bigint FROM key_seq").await;
    assert_eq!(
        totals, counters,
        "each key's last event carries its final count"
    );
    assert_eq!(counters as usize, EVENTS);
}

// ---------------------------------------------------------------------------------------------
// 4. Wake-up: NOTIFY wakes the relay; polling covers a missed notification.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_wakes_on_notify_and_polls_when_no_notification_comes() {
    let broker = Broker::start();
    broker.create_topic("orders", 1).await;
    let db = TestDb::new("wakeup").await;
    db.migrated_store().await;

    // A 60 s poll interval: only the notification can make this quick.
    let mut relay = RunningRelay::start(
        relay_builder(&db, &broker.brokers).poll_interval(Duration::from_secs(60)),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let id = enqueue_order(&db, Uuid::new_v4(), 1).await;
    assert_eq!(relay.published(1, Duration::from_secs(10)).await, [id]);
    let woke_in = started.elapsed();
    assert!(
        woke_in < Duration::from_secs(3),
        "published {woke_in:?} after commit"
    );
    relay.stop().await;

    // A row committed without a notification (inserted by hand): the poll finds it.
    let mut relay = RunningRelay::start(
        relay_builder(&db, &broker.brokers).poll_interval(Duration::from_millis(300)),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let silent = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload) \
         VALUES ($1, 'OrderCreated', 'orders', 'k', '{\"order_id\": \"00000000-0000-0000-0000-000000000000\", \"total_cents\": 0}')",
    )
    .bind(silent)
    .execute(&db.pool)
    .await
    .expect("insert");
    assert_eq!(relay.published(1, Duration::from_secs(5)).await, [silent]);
    relay.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 2. A row that cannot be published is parked; other keys, and later rows, flow.

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Blob", topic = "orders", key = key)]
pub struct Blob {
    pub key: String,
    pub n: i64,
    pub blob: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_message_is_parked_holds_its_key_and_other_keys_flow() {
    let broker = Broker::start();
    broker.create_topic("orders", 1).await;
    let db = TestDb::new("parking").await;
    db.migrated_store().await;
    let blob = |key: &str, n: i64, size: usize| Blob {
        key: key.to_owned(),
        n,
        blob: "x".repeat(size),
    };
    let mut tx = db.pool.begin().await.expect("begin");
    let ids = outbox::enqueue_all(
        &mut tx,
        &[
            blob("a", 1, 5000),
            blob("b", 1, 10),
            blob("a", 2, 10),
            blob("b", 2, 10),
        ],
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");

    let mut relay = RunningRelay::start(
        relay_builder(&db, &broker.brokers)
            .set("message.max.bytes", "2000")
            .max_attempts(3)
            .backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(100),
            )),
    );
    let mut published = Vec::new();
    let mut failures = Vec::new();
    while published.len() < 2 || failures.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(30), relay.reports.recv()).await {
            Ok(Some(RelayReport::Published { id, .. })) => published.push(id),
            Ok(Some(RelayReport::Failed { id, parked, .. })) => failures.push((id, parked)),
            other => panic!("relay stalled: {other:?}; published {published:?}"),
        }
    }
    relay.stop().await;
    assert_eq!(
        failures,
        [(ids[0], false), (ids[0], false), (ids[0], true)],
        "three attempts, then parked"
    );
    // b flowed regardless; a's second row waits behind a's parked first row.
    assert!(!published.contains(&ids[2]), "{published:?}");
    assert!(published.contains(&ids[1]) && published.contains(&ids[3]));
    let (attempts, error, parked): (i32, Option<String>, bool) = sqlx::query_as(
        "SELECT attempts, last_error, parked_at IS NOT NULL FROM inoutbox_outbox WHERE id = $1",
    )
    .bind(ids[0])
    .fetch_one(&db.pool)
    .await
    .expect("row");
    assert_eq!((attempts, parked), (3, true));
    let error = error.expect("last_error");
    println!("parked with: {error}");
    assert!(error.contains(&ids[0].to_string()), "{error}");
    let held: (bool, bool) = sqlx::query_as(
        "SELECT published_at IS NULL, parked_at IS NULL FROM inoutbox_outbox WHERE id = $1",
    )
    .bind(ids[2])
    .fetch_one(&db.pool)
    .await
    .expect("row");
    assert_eq!(held, (true, true), "a's second row is held, unpublished");
    let msgs = read_topic(&broker.brokers, "orders", 1, 2, Duration::from_secs(30)).await;
    let order: Vec<(String, i64)> = msgs
        .iter()
        .map(|m| {
            (
                m.payload["key"].as_str().expect("key").to_owned(),
                m.payload["n"].as_i64().expect("n"),
            )
        })
        .collect();
    assert_eq!(order, [("b".to_owned(), 1), ("b".to_owned(), 2)]);
}

// ---------------------------------------------------------------------------------------------
// 6. Chaining: an inbox handler enqueues through its transaction.

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "InvoiceRequested", topic = "invoice-requests", key = order_id)]
pub struct InvoiceRequested {
    pub order_id: Uuid,
}

static CHAIN_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "outbox-chain")]
async fn request_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    outbox::enqueue(
        tx,
        &InvoiceRequested {
            order_id: event.order_id,
        },
    )
    .await?;
    if CHAIN_RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(HandlerError::transient(
            "simulated failure after the event was enqueued",
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_that_enqueues_then_fails_leaves_no_row_and_its_retry_leaves_one() {
    let broker = Broker::start();
    broker.create_topic("orders", 1).await;
    let db = TestDb::new("chain").await;
    let store = db.migrated_store().await;
    let order_id = Uuid::new_v4();
    let producer = support::producer(&broker.brokers);
    support::send(
        &producer,
        "orders",
        support::Msg::order(&Uuid::new_v4().to_string(), order_id, 700),
    )
    .await;

    let mut consumer = Running::start(
        Consumer::builder(
            "outbox-chain",
            store,
            support::kafka(&broker.brokers, "orders"),
        )
        .retry(RetryPolicy::default().max_attempts(3).backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(30),
        )))
        .unknown_event(UnknownEvent::Skip),
    );
    let report = consumer.take(1).await.remove(0);
    consumer.stop().await;
    assert!(
        matches!(report.outcome, Outcome::Processed { attempt: 2 }),
        "{:?}",
        report.outcome
    );
    assert_eq!(CHAIN_RUNS.load(Ordering::SeqCst), 2);
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox").await,
        1,
        "the failed run's row rolled back with its transaction"
    );
    let (event_type, key): (String, Option<String>) =
        sqlx::query_as("SELECT type, message_key FROM inoutbox_outbox")
            .fetch_one(&db.pool)
            .await
            .expect("row");
    assert_eq!(event_type, "InvoiceRequested");
    assert_eq!(key, Some(order_id.to_string()));
}

// ---------------------------------------------------------------------------------------------
// 7. SIGKILL of a relay process between the broker's acknowledgement and the marking.

static CRASH_INVOICES: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "outbox-crash-billing")]
async fn crash_billing(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    CRASH_INVOICES.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_between_publish_and_mark_publishes_again_and_inbox_applies_once() {
    const N: usize = 20;
    let broker = Broker::start();
    broker.create_topic("orders", 1).await;
    let db = TestDb::new("crash").await;
    let store = db.migrated_store().await;
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(enqueue_order(&db, Uuid::new_v4(), i as i64).await);
    }

    // The relay example as a real process, stopped by a failpoint after the broker acknowledged
    // the batch and before the rows were marked, then killed there.
    let mut child = ChildProcess::start(
        "relay",
        &db,
        &broker.brokers,
        // One worker: its one batch holds every row, and nothing else marks anything.
        &["--no-idempotence", "--poll-ms", "200", "--workers", "1"],
        Some("relay_after_publish:1"),
    );
    child.wait_for(
        "inoutbox failpoint relay_after_publish reached",
        Duration::from_secs(60),
    );
    let status = child.kill9();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "killed by SIGKILL"
    );

    // The broker has the batch; the database does not know.
    let first = read_topic(&broker.brokers, "orders", 1, N, Duration::from_secs(30)).await;
    assert_eq!(first.len(), N);
    assert_eq!(unpublished(&db).await, N as i64, "nothing was marked");

    // Restart: the rows are published again.
    let mut relay = RunningRelay::start(relay_builder(&db, &broker.brokers));
    let mut again = relay.published(N, Duration::from_secs(30)).await;
    relay.stop().await;
    // (Every row has a key of its own: across keys the relay promises no order.)
    again.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(again, expected, "every row republished once");
    assert_eq!(unpublished(&db).await, 0);
    let all = read_topic(&broker.brokers, "orders", 1, 2 * N, Duration::from_secs(30)).await;
    assert_eq!(all.len(), 2 * N, "each event is on the topic twice");

    // Downstream, the inbox applies each event once.
    let mut consumer = Running::start(
        Consumer::builder(
            "outbox-crash-billing",
            store,
            support::kafka(&broker.brokers, "orders"),
        )
        .unknown_event(UnknownEvent::Skip),
    );
    let reports = consumer.take(2 * N).await;
    consumer.stop().await;
    let processed = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Processed { .. }))
        .count();
    let duplicates = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Duplicate))
        .count();
    assert_eq!((processed, duplicates), (N, N));
    assert_eq!(db.invoices().await, N as i64, "one invoice per order");
}

// ---------------------------------------------------------------------------------------------
// 8. Retention.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_published_rows_in_batches_and_keeps_the_rest() {
    let db = TestDb::new("retention").await;
    db.migrated_store().await;
    for i in 0..28 {
        enqueue_order(&db, Uuid::new_v4(), i).await;
    }
    // 20 published 10 days ago, 3 published just now, 5 unpublished.
    sqlx::raw_sql(
        "UPDATE inoutbox_outbox SET published_at = now() - interval '10 days' \
           WHERE id IN (SELECT id FROM inoutbox_outbox ORDER BY seq LIMIT 20); \
         UPDATE inoutbox_outbox SET published_at = now() \
           WHERE id IN (SELECT id FROM inoutbox_outbox WHERE published_at IS NULL ORDER BY seq LIMIT 3)",
    )
    .execute(&db.pool)
    .await
    .expect("age rows");

    // An enqueue in flight (uncommitted) neither blocks the purge nor is blocked by it.
    let mut open = db.pool.begin().await.expect("begin");
    outbox::enqueue(
        &mut open,
        &OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents: 0,
        },
    )
    .await
    .expect("enqueue");

    let retention = Retention::default()
        .older_than(Duration::from_secs(7 * 24 * 3600))
        .batch_size(7);
    let deleted = tokio::time::timeout(
        Duration::from_secs(10),
        inoutbox::relay::RelayStore::purge(
            &inoutbox::relay::PgRelayStore::new(db.pool.clone(), db.tables.clone()),
            &retention,
        ),
    )
    .await
    .expect("the purge does not wait for the open transaction")
    .expect("purge");
    open.commit().await.expect("commit");

    assert_eq!(deleted, 20);
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL")
            .await,
        6
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NOT NULL")
            .await,
        3
    );
}

/// The `seq` of the outbox row `id`.
async fn seq_of(pool: &sqlx::PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar::<_, i64>("SELECT seq FROM inoutbox_outbox WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("row")
}
