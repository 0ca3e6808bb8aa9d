//! The relay's guarantees under load, against a real PostgreSQL and a real Kafka-protocol
//! broker (Tansu): per-key commit order across three relays with writers that take no lock of
//! their own; a stop within 2 s of SIGTERM under a backlog, with everything acknowledged
//! marked; parked rows that hold their key until unparked, and no other key; and a SIGKILL, or lost connections, in the middle of
//! publishing, losing nothing and keeping the first copies of each key in order.
//!
//! Topics are read until they go quiet, never up to a count, so duplicates and strays are seen.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use inoutbox::inbox::Backoff;
use inoutbox::outbox;
use inoutbox::prelude::*;
use inoutbox::relay::{RelayReport, RelaySession, RelayStore};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::child::ChildProcess;
use support::{read_topic_until_quiet, relay_builder, Broker, Received, RunningRelay, TestDb};
use uuid::Uuid;

/// An event whose payload carries its key and a number.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Sequenced", topic = "sequenced", key = key)]
pub struct Sequenced {
    pub key: String,
    pub seq: i64,
}

const TOPIC: &str = "sequenced";
const QUIET: Duration = Duration::from_secs(3);

fn random_below(n: u64) -> u64 {
    (Uuid::new_v4().as_u128() % u128::from(n)) as u64
}

async fn count(db: &TestDb, filter: &str) -> i64 {
    db.count(&format!("SELECT count(*) FROM inoutbox_outbox {filter}"))
        .await
}

async fn wait_until_published(db: &TestDb, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = count(db, "WHERE published_at IS NULL AND parked_at IS NULL").await;
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{left} rows still unpublished after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn event_id(m: &Received) -> Uuid {
    m.header("ce_id").expect("ce_id").parse().expect("uuid")
}

// ---------------------------------------------------------------------------------------------
// Per-key commit order across three relays, writers without locks of their own.

const ORDER_EVENTS: usize = 4000;
const ORDER_KEYS: u64 = 16;
const ORDER_WRITERS: usize = 12;

/// When one transaction's commit was sent and when it returned.
struct Commit {
    key: String,
    sent: Instant,
    done: Instant,
}

/// Transactions of one event each, on a few keys, that overlap on purpose: a random wait after
/// `begin` (an earlier transaction may enqueue later) and after the enqueue (and commit later
/// still). The writer takes no lock of its own: only inoutbox orders same-key transactions.
async fn unlocked_writer(pool: PgPool, next: Arc<AtomicUsize>) -> Vec<(Uuid, Commit)> {
    let mut out = Vec::new();
    loop {
        let n = next.fetch_add(1, Ordering::SeqCst);
        if n >= ORDER_EVENTS {
            return out;
        }
        let key = format!("key-{:02}", random_below(ORDER_KEYS));
        let mut tx = pool.begin().await.expect("begin");
        tokio::time::sleep(Duration::from_micros(random_below(2000))).await;
        let event = Sequenced {
            key: key.clone(),
            seq: n as i64,
        };
        let id = outbox::enqueue(&mut tx, &event).await.expect("enqueue");
        tokio::time::sleep(Duration::from_micros(random_below(3000))).await;
        let sent = Instant::now();
        tx.commit().await.expect("commit");
        let done = Instant::now();
        out.push((id, Commit { key, sent, done }));
    }
}

/// Per key, in topic order: a message whose transaction had committed before an earlier
/// message's transaction even sent its commit is out of commit order.
fn commit_order_violations(messages: &[Received], commits: &HashMap<Uuid, Commit>) -> Vec<String> {
    let mut latest_sent: HashMap<&str, (Instant, Uuid)> = HashMap::new();
    let mut violations = Vec::new();
    for m in messages {
        let id = event_id(m);
        let commit = &commits[&id];
        let key = commit.key.as_str();
        if let Some((sent, earlier)) = latest_sent.get(key) {
            if commit.done < *sent {
                violations.push(format!(
                    "key {key}: {id} (committed {:?} before) published after {earlier}",
                    *sent - commit.done
                ));
            }
        }
        let entry = latest_sent.entry(key).or_insert((commit.sent, id));
        if commit.sent > entry.0 {
            *entry = (commit.sent, id);
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_key_commit_order_holds_across_three_relays_with_writers_that_take_no_lock() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4).await;
    let db = TestDb::new("order").await;
    db.migrated_store().await;

    let mut relays: Vec<RunningRelay> = (0..3)
        .map(|_| {
            RunningRelay::start(
                relay_builder(&db, &broker.brokers)
                    .workers(2)
                    .batch_size(50)
                    .poll_interval(Duration::from_millis(100)),
            )
        })
        .collect();
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..ORDER_WRITERS)
        .map(|_| tokio::spawn(unlocked_writer(db.pool.clone(), next.clone())))
        .collect();
    let mut commits = HashMap::new();
    for w in writers {
        commits.extend(w.await.expect("writer"));
    }
    assert_eq!(commits.len(), ORDER_EVENTS);
    wait_until_published(&db, Duration::from_secs(120)).await;

    let mut per_relay = Vec::new();
    for relay in &mut relays {
        let mut published = 0;
        while let Ok(r) = relay.reports.try_recv() {
            published += usize::from(matches!(r, RelayReport::Published { .. }));
        }
        per_relay.push(published);
    }
    for relay in relays {
        relay.stop().await;
    }
    println!("rows published per relay: {per_relay:?}");
    assert!(
        per_relay.iter().filter(|&&n| n > 0).count() >= 2,
        "at least two relays published: {per_relay:?}"
    );

    let mut messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 4, QUIET, Duration::from_secs(120)).await;
    messages.sort_by_key(|m| (m.partition, m.offset));
    let ids: HashSet<Uuid> = messages.iter().map(event_id).collect();
    let duplicates = messages.len() - ids.len();
    println!("{} messages, {duplicates} duplicates", messages.len());
    assert_eq!(
        duplicates, 0,
        "no relay crashed: nothing is published twice"
    );
    assert_eq!(
        ids,
        commits.keys().copied().collect(),
        "every event arrived"
    );
    for m in &messages {
        assert_eq!(
            m.key.as_deref(),
            m.payload["key"].as_str(),
            "Kafka key = event key"
        );
    }
    let violations = commit_order_violations(&messages, &commits);
    assert!(
        violations.is_empty(),
        "{} events published out of commit order, e.g. {:#?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
}

// ---------------------------------------------------------------------------------------------
// Backlogs, first copies in order.

/// Commits `rows` rows on `keys` keys in one statement; per key, the payload's `seq` counts
/// 1, 2, 3, ... in commit order.
async fn backlog(db: &TestDb, rows: usize, keys: usize) {
    sqlx::query(
        "INSERT INTO inoutbox_outbox (id, aggregateid, type, topic, message_key, payload) \
         SELECT gen_random_uuid(), k, 'Sequenced', $3, k, jsonb_build_object('key', k, 'seq', n) \
         FROM (SELECT format('key-%s', i % $2) AS k, i / $2 + 1 AS n, i \
               FROM generate_series(0, $1 - 1) AS i) AS r ORDER BY i",
    )
    .bind(rows as i64)
    .bind(keys as i64)
    .bind(TOPIC)
    .execute(&db.pool)
    .await
    .expect("backlog");
}

/// Checks that every row is on the topic and that, per key, the first copies come in order
/// (1, 2, 3, ...); returns how many messages were duplicates.
fn first_copies_complete_and_in_order(messages: &[Received], rows: usize) -> usize {
    let mut seen = HashSet::new();
    let mut next: HashMap<String, i64> = HashMap::new();
    for m in messages {
        if !seen.insert(event_id(m)) {
            continue; // a duplicate: allowed after a crash; its first copy was checked
        }
        let key = m.payload["key"].as_str().expect("key").to_owned();
        let seq = m.payload["seq"].as_i64().expect("seq");
        let expected = next.entry(key.clone()).or_insert(1);
        assert_eq!(
            seq, *expected,
            "key {key}: first copy of #{seq} came when #{expected} was due (partition {}, offset {})",
            m.partition, m.offset
        );
        *expected += 1;
    }
    assert_eq!(seen.len(), rows, "every row is on the topic");
    messages.len() - seen.len()
}

/// A relay process publishing a 100 000-row backlog gets SIGTERM: it exits successfully within
/// 2 s, and the rows marked published are exactly the events the broker has.
async fn sigterm_under_a_backlog(name: &str, idle_first: bool) {
    const ROWS: usize = 100_000;
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4).await;
    let db = TestDb::new(name).await;
    db.migrated_store().await;
    if !idle_first {
        backlog(&db, ROWS, 1000).await;
    }
    let mut child = ChildProcess::start(
        "relay",
        &db,
        &broker.brokers,
        &["--no-idempotence", "--poll-ms", "200"],
        None,
    );
    if idle_first {
        // Idle first (it waits for a notification), then busy with a backlog.
        child.wait_for("relay started", Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(500)).await;
        backlog(&db, ROWS, 1000).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&db, "WHERE published_at IS NOT NULL").await < 2000 {
        assert!(Instant::now() < deadline, "the relay published nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let signalled = Instant::now();
    let status = child.terminate();
    let took = signalled.elapsed();
    println!("exited {took:?} after SIGTERM with {status}");
    assert!(status.success(), "a graceful exit: {status}");
    assert!(
        took < Duration::from_secs(2),
        "exited {took:?} after SIGTERM"
    );

    let marked: HashSet<Uuid> =
        sqlx::query_scalar("SELECT id FROM inoutbox_outbox WHERE published_at IS NOT NULL")
            .fetch_all(&db.pool)
            .await
            .expect("marked")
            .into_iter()
            .collect();
    assert!(
        marked.len() < ROWS,
        "stopped under a backlog ({} of {ROWS} marked)",
        marked.len()
    );
    let messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 4, QUIET, Duration::from_secs(120)).await;
    let on_topic: HashSet<Uuid> = messages.iter().map(event_id).collect();
    println!(
        "{} rows marked, {} events on the topic",
        marked.len(),
        on_topic.len()
    );
    assert_eq!(messages.len(), on_topic.len(), "nothing published twice");
    assert!(
        on_topic.is_subset(&marked),
        "{} events acknowledged by the broker were left unmarked",
        on_topic.difference(&marked).count()
    );
    assert!(
        marked.is_subset(&on_topic),
        "{} rows marked without being on the topic",
        marked.difference(&on_topic).count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_busy_from_its_start_stops_within_2s_of_sigterm_having_marked_what_was_acked() {
    sigterm_under_a_backlog("sigterm_busy", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_idle_then_busy_stops_within_2s_of_sigterm_having_marked_what_was_acked() {
    sigterm_under_a_backlog("sigterm_idle", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_relay_mid_pipeline_loses_nothing_and_first_copies_stay_in_order() {
    const ROWS: usize = 30_000;
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4).await;
    let db = TestDb::new("kill9").await;
    db.migrated_store().await;
    backlog(&db, ROWS, 100).await;

    // Four workers; the fifth batch to be acknowledged stops before it is marked (its worker
    // hangs there) while the other workers go on; then the process is killed.
    let mut child = ChildProcess::start(
        "relay",
        &db,
        &broker.brokers,
        &["--no-idempotence", "--workers", "4", "--batch", "200"],
        Some("relay_after_publish:5"),
    );
    child.wait_for(
        "inoutbox failpoint relay_after_publish reached",
        Duration::from_secs(60),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill9();
    let marked_at_kill = count(&db, "WHERE published_at IS NOT NULL").await;
    assert!(marked_at_kill < ROWS as i64, "killed mid-backlog");

    let relay = RunningRelay::start(relay_builder(&db, &broker.brokers).batch_size(200));
    wait_until_published(&db, Duration::from_secs(120)).await;
    relay.stop().await;
    let mut messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 4, QUIET, Duration::from_secs(120)).await;
    messages.sort_by_key(|m| (m.partition, m.offset));
    let duplicates = first_copies_complete_and_in_order(&messages, ROWS);
    println!("{marked_at_kill} rows marked at the kill; {duplicates} duplicates after it");
    assert!(
        duplicates > 0,
        "the batch acknowledged and not marked at the kill was published again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_connections_are_killed_mid_backlog_reconnects_and_loses_nothing() {
    const ROWS: usize = 20_000;
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4).await;
    let db = TestDb::new("connkill").await;
    db.migrated_store().await;
    backlog(&db, ROWS, 100).await;

    let relay = RunningRelay::start(
        relay_builder(&db, &broker.brokers)
            .workers(3)
            .batch_size(200)
            .backoff(inoutbox::inbox::Backoff::new(
                Duration::from_millis(50),
                Duration::from_millis(500),
            )),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&db, "WHERE published_at IS NOT NULL").await < 2000 {
        assert!(Instant::now() < deadline, "the relay published too little");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed = db.terminate_backends().await;
    println!("terminated {killed} connections (the relay's sessions among them)");
    wait_until_published(&db, Duration::from_secs(120)).await;
    relay.stop().await;
    let mut messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 4, QUIET, Duration::from_secs(120)).await;
    messages.sort_by_key(|m| (m.partition, m.offset));
    let duplicates = first_copies_complete_and_in_order(&messages, ROWS);
    println!("{duplicates} duplicates");
}

// ---------------------------------------------------------------------------------------------
// Parked rows hold their key, and starve no other.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_rows_beyond_the_batch_size_hold_their_key_until_unparked_and_starve_no_other() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2).await;
    let db = TestDb::new("parked").await;
    let store = db.migrated_store().await;
    let event = |key: &str, seq| Sequenced {
        key: key.to_owned(),
        seq,
    };
    // 30 rows of key a, parked (given up on), more than three batches of 10 ...
    let mut tx = db.pool.begin().await.expect("begin");
    let parked: Vec<Sequenced> = (-30..=-1).map(|n| event("a", n)).collect();
    outbox::enqueue_all(&mut tx, &parked)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    sqlx::raw_sql("UPDATE inoutbox_outbox SET parked_at = now(), attempts = 10")
        .execute(&db.pool)
        .await
        .expect("park");
    // ... then a's next rows and another key's.
    let mut tx = db.pool.begin().await.expect("begin");
    let fresh: Vec<Sequenced> = (1..=5)
        .flat_map(|n| [event("a", n), event("b", n)])
        .collect();
    outbox::enqueue_all(&mut tx, &fresh).await.expect("enqueue");
    tx.commit().await.expect("commit");

    let mut relay = RunningRelay::start(relay_builder(&db, &broker.brokers).batch_size(10));
    relay.published(5, Duration::from_secs(30)).await;
    relay.stop().await;
    assert_eq!(
        count(&db, "WHERE published_at IS NULL AND parked_at IS NULL").await,
        5,
        "a's later rows wait behind its parked rows"
    );
    assert_eq!(
        count(&db, "WHERE parked_at IS NOT NULL AND published_at IS NULL").await,
        30,
        "parked rows stay parked"
    );

    // Unparked, a's rows all go out, in order.
    let admin = inoutbox::admin::Admin::postgres(store);
    assert_eq!(admin.unpark(Some("a"), None).await.expect("unpark"), 30);
    let mut relay = RunningRelay::start(relay_builder(&db, &broker.brokers).batch_size(10));
    relay.published(35, Duration::from_secs(60)).await;
    relay.stop().await;

    let messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 2, QUIET, Duration::from_secs(60)).await;
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for m in &messages {
        per_key
            .entry(m.payload["key"].as_str().expect("key").to_owned())
            .or_default()
            .push(m.payload["seq"].as_i64().expect("seq"));
    }
    let a: Vec<i64> = (-30..=-1).chain(1..=5).collect();
    assert_eq!(per_key["a"], a, "a's rows, in order, after the unpark");
    assert_eq!(per_key["b"], [1, 2, 3, 4, 5], "b's rows, in order");
    assert_eq!(messages.len(), 40);
}

// ---------------------------------------------------------------------------------------------
// Slots: one per key, whoever inserts the row.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_inserted_by_hand_gets_the_slot_enqueue_gives_its_key() {
    let db = TestDb::new("slots").await;
    db.migrated_store().await;
    let mut tx = db.pool.begin().await.expect("begin");
    let events: Vec<Sequenced> = (0..50)
        .map(|n| Sequenced {
            key: format!("key-{n}"),
            seq: n,
        })
        .collect();
    outbox::enqueue_all(&mut tx, &events)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    // The same keys, inserted by hand (another service writing the table with plain SQL).
    sqlx::raw_sql(
        "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload) \
         SELECT gen_random_uuid(), 'Sequenced', 'sequenced', message_key, payload FROM inoutbox_outbox",
    )
    .execute(&db.pool)
    .await
    .expect("insert by hand");
    let per_key = db
        .count(
            "SELECT count(*) FROM (SELECT message_key FROM inoutbox_outbox \
             GROUP BY message_key HAVING count(DISTINCT slot) = 1 AND count(*) = 2 \
             AND min(slot) BETWEEN 0 AND 63) AS k",
        )
        .await;
    assert_eq!(
        per_key, 50,
        "each key has one slot, however its rows were written"
    );
    let slots = db
        .count("SELECT count(DISTINCT slot) FROM inoutbox_outbox")
        .await;
    assert!(
        slots > 20,
        "keys spread over the slots ({slots} of 64 used)"
    );
}

// ---------------------------------------------------------------------------------------------
// The lock connection is checked.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_does_not_hold_its_slots_is_refused() {
    let db = TestDb::new("session").await;
    db.migrated_store().await;
    let store = inoutbox::relay::PgRelayStore::new(db.pool.clone(), db.tables.clone());
    let mut first = store.open().await.expect("open");
    let mut second = store.open().await.expect("open");
    assert_eq!(first.members().await.expect("members").count, 2);
    assert_eq!(first.claim(&[0, 1, 2], 2).await.expect("claim"), [0, 1]);
    assert_eq!(
        second.claim(&[1, 2, 3], 2).await.expect("claim"),
        [2, 3],
        "a slot held by another session is skipped"
    );
    first.verify(&[0, 1]).await.expect("holds what it claimed");
    // A session that believes it holds a slot its backend does not (what a transaction pooler
    // such as PgBouncer does to session locks) is refused.
    let error = first
        .verify(&[0, 1, 2])
        .await
        .expect_err("slot 2 is not held by this backend")
        .to_string();
    assert!(error.contains("PgBouncer"), "{error}");
    first.close().await;
    // The server ends the closed session's backend (and drops its locks) just after the
    // client has closed the socket: wait for it, within a bound.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut members = second.members().await.expect("members").count;
    while members != 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        members = second.members().await.expect("members").count;
    }
    assert_eq!(members, 1, "the closed session left the members");
    assert_eq!(
        second.claim(&[0, 1], 2).await.expect("claim"),
        [0, 1],
        "a closed session's slots are free"
    );
    second.close().await;
}

// ---------------------------------------------------------------------------------------------
// Per-key order: a parked row holds its key until it is unparked, on both stores.

/// Keys `a` (two rows) and `b` (one row); `a`'s first row is parked (by `park`): the relay's read
/// leaves `a`'s second row behind it, status and the backlog show the held key, and `unpark`
/// lets both go, in order.
async fn a_parked_row_holds_its_key<S: RelayStore>(
    store: &S,
    admin: &inoutbox::admin::Admin,
    ids: &[Uuid],
    all_slots: &[u32],
) {
    let (a1, a2, b1) = (ids[0], ids[1], ids[2]);
    let mut session = store.open().await.expect("open");
    let held = session
        .claim(all_slots, all_slots.len())
        .await
        .expect("claim");
    assert_eq!(held.len(), all_slots.len());
    let read: Vec<Uuid> = session
        .read(&held, 0, 100)
        .await
        .expect("read")
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        read,
        [b1],
        "a's second row waits behind its parked first row"
    );

    let backlog = store.backlog().await.expect("backlog");
    assert_eq!((backlog.parked, backlog.held_keys), (1, 1), "{backlog:?}");
    let status = admin.status(Duration::from_secs(60)).await.expect("status");
    assert_eq!(status.outbox.held, 1, "{:?}", status.outbox);
    assert_eq!(status.outbox.parked_keys.len(), 1);
    assert_eq!(status.outbox.parked_keys[0].key.as_deref(), Some("a"));
    assert_eq!(status.outbox.parked_keys[0].held, 1);

    assert_eq!(admin.unpark(Some("a"), None).await.expect("unpark"), 1);
    let read: Vec<Uuid> = session
        .read(&held, 0, 100)
        .await
        .expect("read")
        .iter()
        .map(|r| r.id)
        .collect();
    let a_rows: Vec<Uuid> = read.iter().copied().filter(|id| *id != b1).collect();
    assert_eq!(a_rows, [a1, a2], "unparked: a's rows go out, in order");
    assert!(read.contains(&b1));
    assert_eq!(store.backlog().await.expect("backlog").held_keys, 0);
    session.close().await;
}

fn three_rows() -> [Sequenced; 3] {
    let event = |key: &str, seq| Sequenced {
        key: key.to_owned(),
        seq,
    };
    [event("a", 1), event("a", 2), event("b", 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_row_holds_its_key_until_unparked_on_postgres() {
    let db = TestDb::new("holds").await;
    let store = db.migrated_store().await;
    let mut tx = db.pool.begin().await.expect("begin");
    let ids = outbox::enqueue_all(&mut tx, &three_rows())
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    sqlx::query("UPDATE inoutbox_outbox SET parked_at = now(), attempts = 3 WHERE id = $1")
        .bind(ids[0])
        .execute(&db.pool)
        .await
        .expect("park");
    let relay_store = inoutbox::relay::PgRelayStore::new(db.pool.clone(), db.tables.clone());
    let admin = inoutbox::admin::Admin::postgres(store);
    let slots: Vec<u32> = (0..relay_store.slots()).collect();
    a_parked_row_holds_its_key(&relay_store, &admin, &ids, &slots).await;
}

/// A migrated SQLite store in a file of its own.
async fn sqlite_store(name: &str) -> inoutbox::SqliteStore {
    let dir = std::env::temp_dir().join(support::unique(&format!("inoutbox-{name}")));
    std::fs::create_dir_all(&dir).expect("dir");
    let url = format!("sqlite:{}", dir.join("relay.db").display());
    let store = inoutbox::SqliteStore::connect(&url).await.expect("sqlite");
    store.migrate().await.expect("migrate");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_row_holds_its_key_until_unparked_on_sqlite() {
    let store = sqlite_store("holds").await;
    let mut tx = store.pool().begin().await.expect("begin");
    let ids = outbox::enqueue_all(&mut tx, &three_rows())
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    sqlx::query(
        "UPDATE inoutbox_outbox SET parked_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), \
         attempts = 3 WHERE id = $1",
    )
    .bind(ids[0].to_string())
    .execute(store.pool())
    .await
    .expect("park");
    let relay_store = inoutbox::relay::SqliteRelayStore::new(store.pool().clone(), store.tables());
    let admin = inoutbox::admin::Admin::sqlite(store);
    a_parked_row_holds_its_key(&relay_store, &admin, &ids, &[0]).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_row_holds_its_key_until_unparked_on_mysql() {
    use support::kit::Kit;
    let kit = support::kit::MySqlKit::new("holds").await;
    let store = kit.store();
    let mut tx = store.pool().begin().await.expect("begin");
    let ids = outbox::enqueue_all(&mut tx, &three_rows())
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    sqlx::query("UPDATE inoutbox_outbox SET parked_at = NOW(6), attempts = 3 WHERE id = ?")
        .bind(ids[0].to_string())
        .execute(store.pool())
        .await
        .expect("park");
    let relay_store = kit.relay_store();
    let admin = inoutbox::admin::Admin::mysql(store);
    a_parked_row_holds_its_key(&relay_store, &admin, &ids, &[0]).await;
}

// ---------------------------------------------------------------------------------------------
// Per-key order: a failed delivery holds the rest of its key in its batch.

/// Acknowledges every message but the first copy of one event, whose delivery fails after it
/// was handed over (asynchronously), as a broker refusing one message of a batch does.
struct FailsOneDelivery {
    fail: std::sync::Mutex<Option<String>>,
}

impl inoutbox::transport::Publisher for FailsOneDelivery {
    fn send(
        &self,
        message: &inoutbox::transport::OutgoingMessage<'_>,
    ) -> Result<
        impl std::future::Future<
                Output = Result<inoutbox::transport::Receipt, inoutbox::transport::PublishError>,
            >
            + Send
            + 'static
            + use<>,
        inoutbox::transport::PublishError,
    > {
        let fail = {
            let mut fail = self.fail.lock().expect("lock");
            fail.take_if(|id| id == message.id).is_some()
        };
        Ok(async move {
            tokio::task::yield_now().await;
            if fail {
                Err(inoutbox::transport::PublishError::unavailable(
                    "the broker timed this message out",
                ))
            } else {
                Ok(inoutbox::transport::Receipt::new(0, 0))
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_holds_the_rest_of_its_key_in_its_batch() {
    let store = sqlite_store("failed-delivery").await;
    let event = |key: &str, seq| Sequenced {
        key: key.to_owned(),
        seq,
    };
    let mut tx = store.pool().begin().await.expect("begin");
    let ids = outbox::enqueue_all(
        &mut tx,
        &[event("a", 1), event("a", 2), event("b", 1), event("a", 3)],
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    let publisher = FailsOneDelivery {
        fail: std::sync::Mutex::new(Some(ids[0].to_string())),
    };
    let relay = inoutbox::Relay::builder(store.clone(), publisher)
        .batch_size(10)
        .poll_interval(Duration::from_millis(50))
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(50),
        ))
        .build()
        .expect("relay");
    let mut relay = RunningRelay::spawn(relay);
    let published = relay.published(4, Duration::from_secs(30)).await;
    relay.stop().await;
    let a: Vec<Uuid> = published
        .iter()
        .copied()
        .filter(|id| *id != ids[2])
        .collect();
    assert_eq!(
        a,
        [ids[0], ids[1], ids[3]],
        "a's later rows are marked published only after its first"
    );
}

// ---------------------------------------------------------------------------------------------
// SQLite: a row whose id is not a UUID is parked, never published for ever.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_row_whose_id_is_not_a_uuid_is_parked_with_the_reason() {
    let store = sqlite_store("bad-id").await;
    // Written by hand, by another service: an id that is not a UUID, then a row of its key and
    // one of another key.
    sqlx::raw_sql(
        "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload) \
         VALUES ('order-17', 'Sequenced', 'sequenced', 'a', '{}')",
    )
    .execute(store.pool())
    .await
    .expect("insert by hand");
    let mut tx = store.pool().begin().await.expect("begin");
    let ids = outbox::enqueue_all(&mut tx, &three_rows()[1..])
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let relay_store = inoutbox::relay::SqliteRelayStore::new(store.pool().clone(), store.tables());
    let mut session = relay_store.open().await.expect("open");
    let held = session.claim(&[0], 1).await.expect("claim");
    let read: Vec<Uuid> = session
        .read(&held, 0, 100)
        .await
        .expect("read")
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        read,
        [ids[1]],
        "neither the row with the bad id nor the later row of its key is read"
    );
    let (parked, error): (bool, Option<String>) = sqlx::query_as(
        "SELECT parked_at IS NOT NULL, last_error FROM inoutbox_outbox WHERE id = 'order-17'",
    )
    .fetch_one(store.pool())
    .await
    .expect("row");
    let error = error.unwrap_or_default();
    assert!(
        parked && error.contains("`order-17` is not a UUID"),
        "{error}"
    );
    session.close().await;
}

// ---------------------------------------------------------------------------------------------
// SQLite: the lease is renewed while a batch is in flight.

/// Hands each message over and acknowledges it only once `release` is notified.
struct SlowBroker {
    handed: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

impl inoutbox::transport::Publisher for SlowBroker {
    fn send(
        &self,
        _message: &inoutbox::transport::OutgoingMessage<'_>,
    ) -> Result<
        impl std::future::Future<
                Output = Result<inoutbox::transport::Receipt, inoutbox::transport::PublishError>,
            >
            + Send
            + 'static
            + use<>,
        inoutbox::transport::PublishError,
    > {
        self.handed.notify_one();
        let release = self.release.clone();
        Ok(async move {
            release.notified().await;
            Ok(inoutbox::transport::Receipt::new(0, 0))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_relay_keeps_its_lease_while_a_batch_waits_for_the_broker() {
    const LEASE: Duration = Duration::from_millis(1200);
    let store = sqlite_store("lease").await;
    let mut tx = store.pool().begin().await.expect("begin");
    outbox::enqueue_all(&mut tx, &three_rows()[..1])
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let handed = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let relay_store =
        inoutbox::relay::SqliteRelayStore::new(store.pool().clone(), store.tables()).lease(LEASE);
    let broker = SlowBroker {
        handed: handed.clone(),
        release: release.clone(),
    };
    let relay = inoutbox::Relay::builder(relay_store, broker)
        .poll_interval(Duration::from_millis(50))
        .build()
        .expect("relay");
    let mut relay = RunningRelay::spawn(relay);
    handed.notified().await;
    // The batch is in flight for three leases' time: another relay must not get the outbox.
    tokio::time::sleep(LEASE * 3).await;
    let other =
        inoutbox::relay::SqliteRelayStore::new(store.pool().clone(), store.tables()).lease(LEASE);
    let mut session = other.open().await.expect("open");
    assert_eq!(
        session.claim(&[0], 1).await.expect("claim"),
        Vec::<u32>::new(),
        "the lease lapsed while the batch was in flight"
    );
    session.close().await;
    release.notify_one();
    relay.published(1, Duration::from_secs(30)).await;
    relay.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Scheduled publishing: a row with a due time goes out when due, not before, and holds nothing.

/// A store under test: PostgreSQL (a schema of its own) or SQLite (a file of its own).
#[allow(clippy::large_enum_variant)] // a handful per test
enum Scheduling {
    /// The test's schema, and its tables: the outbox under the default name, or a name of its
    /// own (a NOTIFY channel of its own: other tests' enqueues on the default channel do not
    /// wake its relay).
    Pg(TestDb, inoutbox::Tables),
    Lite(inoutbox::SqliteStore),
    /// MariaDB: a database of the test's own.
    #[cfg(feature = "mysql")]
    My(support::kit::MySqlKit),
}

/// How a row is enqueued: at once, or after a delay.
type Planned = (Sequenced, Option<Duration>);

impl Scheduling {
    async fn postgres(name: &str) -> Self {
        let db = TestDb::new(name).await;
        db.migrated_store().await;
        let tables = db.tables.clone();
        Self::Pg(db, tables)
    }

    /// PostgreSQL with an outbox table (and NOTIFY channel) of the test's own.
    async fn postgres_alone(name: &str) -> Self {
        let db = TestDb::new(name).await;
        let outbox = support::unique("outbox").replace('-', "_");
        let tables = db.tables.clone().outbox(&outbox).expect("outbox name");
        let store = inoutbox::PgStore::with_tables(db.pool.clone(), tables.clone());
        store.migrate().await.expect("migrate");
        Self::Pg(db, tables)
    }

    fn outbox_table(&self) -> String {
        match self {
            Self::Pg(_, tables) => tables.outbox.to_string(),
            Self::Lite(_) => "inoutbox_outbox".to_owned(),
            #[cfg(feature = "mysql")]
            Self::My(_) => "inoutbox_outbox".to_owned(),
        }
    }

    async fn sqlite(name: &str) -> Self {
        Self::Lite(sqlite_store(name).await)
    }

    #[cfg(feature = "mysql")]
    async fn mysql(name: &str) -> Self {
        Self::My(<support::kit::MySqlKit as support::kit::Kit>::new(name).await)
    }

    /// The MariaDB store of a `My`.
    #[cfg(feature = "mysql")]
    fn my_store(kit: &support::kit::MySqlKit) -> inoutbox::MySqlStore {
        support::kit::Kit::store(kit)
    }

    /// Enqueues `rows` in one transaction, in order; returns their ids.
    async fn enqueue(&self, rows: &[Planned]) -> Vec<Uuid> {
        async fn each<T: outbox::OutboxTx + ?Sized>(tx: &mut T, rows: &[Planned]) -> Vec<Uuid> {
            let mut ids = Vec::new();
            for (event, delay) in rows {
                let id = match delay {
                    Some(delay) => outbox::enqueue_after(tx, event, *delay).await,
                    None => outbox::enqueue(tx, event).await,
                };
                ids.push(id.expect("enqueue"));
            }
            ids
        }
        match self {
            Self::Pg(db, tables) if *tables != db.tables => {
                // The API's functions write the default table; another goes through PgOutbox.
                let rows = rows
                    .iter()
                    .map(|(event, delay)| match delay {
                        Some(d) => outbox::NewRow::scheduled(event, SystemTime::now() + *d),
                        None => outbox::NewRow::from_event(event),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .expect("rows");
                let mut tx = db.pool.begin().await.expect("begin");
                let ids = outbox::PgOutbox::new(tables)
                    .insert_rows(&mut tx, rows)
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
                ids
            }
            Self::Pg(db, _) => {
                let mut tx = db.pool.begin().await.expect("begin");
                let ids = each(&mut tx, rows).await;
                tx.commit().await.expect("commit");
                ids
            }
            Self::Lite(store) => {
                let mut tx = store.pool().begin().await.expect("begin");
                let ids = each(&mut tx, rows).await;
                tx.commit().await.expect("commit");
                ids
            }
            #[cfg(feature = "mysql")]
            Self::My(kit) => {
                let mut tx = Self::my_store(kit).pool().begin().await.expect("begin");
                let ids = each(&mut tx, rows).await;
                tx.commit().await.expect("commit");
                ids
            }
        }
    }

    /// `SELECT count(*) FROM inoutbox_outbox <filter>`.
    async fn count(&self, filter: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {} {filter}", self.outbox_table());
        match self {
            Self::Pg(db, _) => db.count(&sql).await,
            Self::Lite(store) => sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
                .fetch_one(store.pool())
                .await
                .expect("count"),
            #[cfg(feature = "mysql")]
            Self::My(kit) => support::kit::Kit::count(kit, &sql).await,
        }
    }

    /// The store's backlog, as the relay's gauges sample it.
    async fn backlog(&self) -> inoutbox::relay::Backlog {
        match self {
            Self::Pg(db, tables) => {
                inoutbox::relay::PgRelayStore::new(db.pool.clone(), tables.clone())
                    .backlog()
                    .await
                    .expect("backlog")
            }
            Self::Lite(store) => {
                inoutbox::relay::SqliteRelayStore::new(store.pool().clone(), store.tables())
                    .backlog()
                    .await
                    .expect("backlog")
            }
            #[cfg(feature = "mysql")]
            Self::My(kit) => support::kit::Kit::relay_store(kit)
                .backlog()
                .await
                .expect("backlog"),
        }
    }

    /// What `inoutbox status` reads.
    fn admin(&self) -> inoutbox::admin::Admin {
        match self {
            Self::Pg(db, tables) => inoutbox::admin::Admin::postgres(
                inoutbox::PgStore::with_tables(db.pool.clone(), tables.clone()),
            ),
            Self::Lite(store) => inoutbox::admin::Admin::sqlite(store.clone()),
            #[cfg(feature = "mysql")]
            Self::My(kit) => inoutbox::admin::Admin::mysql(Self::my_store(kit)),
        }
    }

    /// A relay on Tansu with `batch_size`, polling (and rebalancing) every `poll`.
    fn relay(&self, brokers: &str, batch_size: usize, poll: Duration) -> RunningRelay {
        match self {
            Self::Pg(db, tables) => RunningRelay::start(
                inoutbox::Relay::builder(
                    inoutbox::PgStore::with_tables(db.pool.clone(), tables.clone()),
                    inoutbox::kafka::KafkaProducer::new(brokers),
                )
                .source("inoutbox-tests")
                .idempotence(false)
                .retention(None)
                .batch_size(batch_size)
                .poll_interval(poll)
                .rebalance_interval(poll),
            ),
            Self::Lite(store) => RunningRelay::start(
                inoutbox::Relay::builder(
                    store.clone(),
                    inoutbox::kafka::KafkaProducer::new(brokers),
                )
                .source("inoutbox-tests")
                .idempotence(false)
                .retention(None)
                .batch_size(batch_size)
                .poll_interval(poll)
                .rebalance_interval(poll),
            ),
            #[cfg(feature = "mysql")]
            Self::My(kit) => RunningRelay::start(
                inoutbox::Relay::builder(
                    Self::my_store(kit),
                    inoutbox::kafka::KafkaProducer::new(brokers),
                )
                .source("inoutbox-tests")
                .idempotence(false)
                .retention(None)
                .batch_size(batch_size)
                .poll_interval(poll)
                .rebalance_interval(poll),
            ),
        }
    }
}

fn planned(key: &str, seq: i64, delay: Option<Duration>) -> Planned {
    let event = Sequenced {
        key: key.to_owned(),
        seq,
    };
    (event, delay)
}

/// The `seq` numbers of each key's messages, in topic order.
fn seqs_per_key(messages: &[Received]) -> HashMap<String, Vec<i64>> {
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for m in messages {
        per_key
            .entry(m.payload["key"].as_str().expect("key").to_owned())
            .or_default()
            .push(m.payload["seq"].as_i64().expect("seq"));
    }
    per_key
}

/// Key `a`: a row, one scheduled 2 s ahead, a row. Key `z`: a row scheduled an hour ahead, then
/// a row. The relay publishes `a`'s two unscheduled rows in order and `z`'s second row (the
/// hour-ahead row holds nothing), the 2 s row once it is due and not before (its `published_at`,
/// by the database's clock, is not before its `due_at`), and the hour-ahead row not at all.
async fn a_scheduled_row_goes_out_when_due_and_not_before(store: Scheduling) {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2).await;
    let hour = Some(Duration::from_secs(3600));
    let rows = [
        planned("a", 1, None),
        planned("a", 2, Some(Duration::from_secs(2))),
        planned("a", 3, None),
        planned("z", 1, hour),
        planned("z", 2, None),
    ];
    let ids = store.enqueue(&rows).await;
    let mut relay = store.relay(&broker.brokers, 100, Duration::from_millis(200));
    let published = relay.published(4, Duration::from_secs(60)).await;
    assert!(
        published.contains(&ids[1]),
        "the 2 s row is published once due"
    );
    assert!(!published.contains(&ids[3]), "the hour-ahead row is not");
    relay.stop().await; // marks what was acknowledged
    assert_eq!(
        store
            .count(
                "WHERE due_at IS NOT NULL AND published_at IS NOT NULL AND published_at < due_at"
            )
            .await,
        0,
        "a scheduled row was published before its due time"
    );
    assert_eq!(
        store.count("WHERE published_at IS NULL").await,
        1,
        "only the hour-ahead row waits"
    );
    let messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 2, QUIET, Duration::from_secs(60)).await;
    let per_key = seqs_per_key(&messages);
    let a_unscheduled: Vec<i64> = per_key["a"].iter().copied().filter(|s| *s != 2).collect();
    assert_eq!(a_unscheduled, [1, 3], "a's due rows in order");
    assert!(per_key["a"].contains(&2));
    assert_eq!(
        per_key["z"],
        [2],
        "z's later row is not held by its scheduled row"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_row_goes_out_when_due_and_not_before_on_postgres() {
    a_scheduled_row_goes_out_when_due_and_not_before(Scheduling::postgres("sched").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_row_goes_out_when_due_and_not_before_on_sqlite() {
    a_scheduled_row_goes_out_when_due_and_not_before(Scheduling::sqlite("sched").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_row_goes_out_when_due_and_not_before_on_mysql() {
    a_scheduled_row_goes_out_when_due_and_not_before(Scheduling::mysql("sched").await).await;
}

/// Rows of key `b` alternate between scheduled (due in 1 s) and not, with key `c`'s rows
/// between them; the relay starts once all are due, reading 3 rows a batch: every key's rows
/// reach the topic in enqueue order (the scheduled and the unscheduled merged by `seq`).
async fn due_rows_keep_per_key_order_scheduled_or_not(store: Scheduling) {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2).await;
    let second = Some(Duration::from_secs(1));
    let rows: Vec<Planned> = (1..=10)
        .flat_map(|n| {
            let b = planned("b", n, if n % 2 == 1 { second } else { None });
            [b, planned("c", n, None)]
        })
        .collect();
    store.enqueue(&rows[..10]).await;
    store.enqueue(&rows[10..]).await;
    assert_eq!(
        store.count("WHERE due_at IS NOT NULL").await,
        5,
        "b's odd rows scheduled"
    );
    // All due before the relay reads (waiting for the schedule, not timing the relay).
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.backlog().await.scheduled > 0 {
        assert!(
            Instant::now() < deadline,
            "rows due in 1 s still scheduled after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut relay = store.relay(&broker.brokers, 3, Duration::from_millis(200));
    relay.published(20, Duration::from_secs(60)).await;
    relay.stop().await;
    let messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 2, QUIET, Duration::from_secs(60)).await;
    let per_key = seqs_per_key(&messages);
    let all: Vec<i64> = (1..=10).collect();
    assert_eq!(
        per_key["b"], all,
        "b's rows, scheduled or not, in enqueue order"
    );
    assert_eq!(per_key["c"], all, "c's rows in enqueue order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_rows_keep_per_key_order_scheduled_or_not_on_postgres() {
    due_rows_keep_per_key_order_scheduled_or_not(Scheduling::postgres("sched_order").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_rows_keep_per_key_order_scheduled_or_not_on_sqlite() {
    due_rows_keep_per_key_order_scheduled_or_not(Scheduling::sqlite("sched-order").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_rows_keep_per_key_order_scheduled_or_not_on_mysql() {
    due_rows_keep_per_key_order_scheduled_or_not(Scheduling::mysql("sched_order").await).await;
}

/// A row due in 4 s, enqueued before the relay starts; the relay polls (and rebalances) only
/// every 10 minutes and nothing is enqueued after it: it publishes the row once due all the
/// same, waking up at the due time it read.
async fn the_relay_wakes_up_for_a_due_row_without_a_new_enqueue(store: Scheduling) {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2).await;
    let ids = store
        .enqueue(&[planned("w", 1, Some(Duration::from_secs(4)))])
        .await;
    let mut relay = store.relay(&broker.brokers, 100, Duration::from_secs(600));
    // Well under the poll interval: only the due-time wake-up publishes it in this time.
    let published = relay.published(1, Duration::from_secs(60)).await;
    assert_eq!(published, ids);
    relay.stop().await;
    assert_eq!(
        store
            .count("WHERE published_at IS NOT NULL AND published_at >= due_at")
            .await,
        1,
        "published once due, not before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_wakes_up_for_a_due_row_without_a_new_enqueue_on_postgres() {
    let store = Scheduling::postgres_alone("sched_wake").await;
    the_relay_wakes_up_for_a_due_row_without_a_new_enqueue(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_wakes_up_for_a_due_row_without_a_new_enqueue_on_sqlite() {
    let store = Scheduling::sqlite("sched-wake").await;
    the_relay_wakes_up_for_a_due_row_without_a_new_enqueue(store).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_wakes_up_for_a_due_row_without_a_new_enqueue_on_mysql() {
    let store = Scheduling::mysql("sched_wake").await;
    the_relay_wakes_up_for_a_due_row_without_a_new_enqueue(store).await;
}

/// Three rows scheduled an hour ahead and two unscheduled: the backlog (what the relay's
/// `inoutbox_outbox_scheduled` and `inoutbox_outbox_unpublished` gauges show) and `inoutbox
/// status` count three scheduled and two unpublished.
async fn the_backlog_counts_scheduled_rows_apart(store: Scheduling) {
    let hour = Some(Duration::from_secs(3600));
    store
        .enqueue(&[
            planned("s", 1, hour),
            planned("s", 2, None),
            planned("t", 1, hour),
            planned("u", 1, hour),
            planned("u", 2, None),
        ])
        .await;
    let backlog = store.backlog().await;
    assert_eq!(
        (backlog.scheduled, backlog.unpublished),
        (3, 2),
        "{backlog:?}"
    );
    assert!(backlog.oldest_unpublished_age.is_some(), "{backlog:?}");
    let status = store.admin().status(Duration::from_secs(60)).await;
    let outbox = status.expect("status").outbox;
    assert_eq!((outbox.scheduled, outbox.unpublished), (3, 2), "{outbox:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_counts_scheduled_rows_apart_on_postgres() {
    the_backlog_counts_scheduled_rows_apart(Scheduling::postgres("sched_gauge").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_counts_scheduled_rows_apart_on_sqlite() {
    the_backlog_counts_scheduled_rows_apart(Scheduling::sqlite("sched-gauge").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_counts_scheduled_rows_apart_on_mysql() {
    the_backlog_counts_scheduled_rows_apart(Scheduling::mysql("sched_gauge").await).await;
}

/// A due time in the past is due at once (stored as an ordinary row); one beyond the year 9999
/// is refused with a clear error before anything is written, and the transaction goes on.
async fn past_and_impossible_due_times<T: outbox::OutboxTx + ?Sized>(tx: &mut T) {
    let event = planned("p", 1, None).0;
    let past = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    outbox::enqueue_at(tx, &event, past).await.expect("past");
    let beyond = SystemTime::UNIX_EPOCH + Duration::from_secs(300_000_000_000);
    let refused = outbox::enqueue_at(tx, &event, beyond).await.unwrap_err();
    assert!(
        matches!(refused, outbox::EnqueueError::DueTime { .. }),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(
        message.contains("cannot schedule event `Sequenced`") && message.contains("9999"),
        "{message}"
    );
    let refused = outbox::enqueue_after(tx, &event, Duration::MAX).await;
    assert!(matches!(refused, Err(outbox::EnqueueError::DueTime { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_past_due_time_is_due_at_once_and_an_impossible_one_is_refused() {
    for store in [
        Scheduling::postgres("sched_bad").await,
        Scheduling::sqlite("sched-bad").await,
        #[cfg(feature = "mysql")]
        Scheduling::mysql("sched_bad").await,
    ] {
        match &store {
            Scheduling::Pg(db, _) => {
                let mut tx = db.pool.begin().await.expect("begin");
                past_and_impossible_due_times(&mut tx).await;
                tx.commit().await.expect("commit");
            }
            Scheduling::Lite(lite) => {
                let mut tx = lite.pool().begin().await.expect("begin");
                past_and_impossible_due_times(&mut tx).await;
                tx.commit().await.expect("commit");
            }
            #[cfg(feature = "mysql")]
            Scheduling::My(kit) => {
                let store = Scheduling::my_store(kit);
                let mut tx = store.pool().begin().await.expect("begin");
                past_and_impossible_due_times(&mut tx).await;
                tx.commit().await.expect("commit");
            }
        }
        assert_eq!(store.count("").await, 1, "the past row only");
        assert_eq!(
            store.count("WHERE due_at IS NULL").await,
            1,
            "stored as due at once"
        );
        let backlog = store.backlog().await;
        assert_eq!((backlog.unpublished, backlog.scheduled), (1, 0));
    }
}

impl Scheduling {
    /// Parks the row `id`, as the relay does after its attempts.
    async fn park(&self, id: Uuid) {
        let table = self.outbox_table();
        match self {
            Self::Pg(db, _) => {
                let sql =
                    format!("UPDATE {table} SET parked_at = now(), attempts = 3 WHERE id = $1");
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(id)
                    .execute(&db.pool)
                    .await
                    .expect("park");
            }
            Self::Lite(store) => {
                let sql = format!(
                    "UPDATE {table} SET parked_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), \
                     attempts = 3 WHERE id = $1"
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(id.to_string())
                    .execute(store.pool())
                    .await
                    .expect("park");
            }
            #[cfg(feature = "mysql")]
            Self::My(kit) => {
                let sql = format!(
                    "UPDATE {table} SET parked_at = NOW(6), attempts = 3 WHERE id = '{id}'"
                );
                support::kit::Kit::exec(kit, &sql).await;
            }
        }
    }

    /// What a worker holding every slot reads as its next due time.
    async fn next_due(&self) -> Option<Duration> {
        async fn of<S: RelayStore>(store: S) -> Option<Duration> {
            let mut session = store.open().await.expect("open");
            let all: Vec<u32> = (0..store.slots()).collect();
            let held = session.claim(&all, all.len()).await.expect("claim");
            let due = session.next_due(&held).await.expect("next due");
            session.close().await;
            due
        }
        match self {
            Self::Pg(db, tables) => {
                of(inoutbox::relay::PgRelayStore::new(
                    db.pool.clone(),
                    tables.clone(),
                ))
                .await
            }
            Self::Lite(store) => {
                of(inoutbox::relay::SqliteRelayStore::new(
                    store.pool().clone(),
                    store.tables(),
                ))
                .await
            }
            #[cfg(feature = "mysql")]
            Self::My(kit) => of(support::kit::Kit::relay_store(kit)).await,
        }
    }
}

/// Key `k`: a parked row, then a row scheduled 1 s ahead; key `h`: a row an hour ahead. Once
/// `k`'s second row is due (and held behind the parked one), the next due time a worker reads is
/// the hour-ahead row's, not 0: a due row that is held never makes an idle worker spin.
async fn the_next_due_time_is_one_still_ahead(store: Scheduling) {
    let ids = store
        .enqueue(&[
            planned("k", 1, None),
            planned("k", 2, Some(Duration::from_secs(1))),
            planned("h", 1, Some(Duration::from_secs(3600))),
        ])
        .await;
    store.park(ids[0]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.backlog().await.scheduled > 1 {
        assert!(
            Instant::now() < deadline,
            "a row due in 1 s still scheduled after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let due = store.next_due().await.expect("the hour-ahead row");
    assert!(
        due > Duration::from_secs(3000) && due <= Duration::from_secs(3601),
        "{due:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_due_time_is_one_still_ahead_on_postgres() {
    the_next_due_time_is_one_still_ahead(Scheduling::postgres("sched_next").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_due_time_is_one_still_ahead_on_sqlite() {
    the_next_due_time_is_one_still_ahead(Scheduling::sqlite("sched-next").await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_due_time_is_one_still_ahead_on_mysql() {
    the_next_due_time_is_one_still_ahead(Scheduling::mysql("sched_next").await).await;
}

/// Three relays of two workers each on one PostgreSQL outbox: 300 rows over 10 keys, every
/// third scheduled 1 to 3 s ahead, enqueued while the relays run. Every row reaches the topic
/// exactly once (no two sessions ever publish a key's rows), no scheduled row before its due
/// time, and each key's unscheduled rows in enqueue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_publish_scheduled_and_unscheduled_rows_once_each_and_in_order() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4).await;
    let store = Scheduling::postgres("sched_three").await;
    let relays: Vec<RunningRelay> = (0..3)
        .map(|_| store.relay(&broker.brokers, 20, Duration::from_millis(200)))
        .collect();
    let mut scheduled = HashSet::new();
    for batch in 0..30 {
        let rows: Vec<Planned> = (0..10)
            .map(|n| {
                let seq = batch * 10 + n;
                let delay =
                    (seq % 3 == 0).then(|| Duration::from_millis(1000 + random_below(2000)));
                if delay.is_some() {
                    scheduled.insert(seq);
                }
                planned(&format!("key-{}", n % 10), seq, delay)
            })
            .collect();
        store.enqueue(&rows).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while store.count("WHERE published_at IS NULL").await > 0 {
        assert!(
            Instant::now() < deadline,
            "rows still unpublished after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for relay in relays {
        relay.stop().await;
    }
    assert_eq!(
        store
            .count("WHERE due_at IS NOT NULL AND published_at < due_at")
            .await,
        0,
        "a scheduled row was published before its due time"
    );
    assert_eq!(store.count("WHERE due_at IS NOT NULL").await, 100);
    let messages =
        read_topic_until_quiet(&broker.brokers, TOPIC, 4, QUIET, Duration::from_secs(60)).await;
    let mut seen = HashSet::new();
    for m in &messages {
        assert!(seen.insert(event_id(m)), "published twice: {:?}", m.payload);
    }
    assert_eq!(messages.len(), 300);
    for (key, seqs) in seqs_per_key(&messages) {
        let unscheduled: Vec<i64> = seqs
            .into_iter()
            .filter(|s| !scheduled.contains(s))
            .collect();
        let mut sorted = unscheduled.clone();
        sorted.sort_unstable();
        assert_eq!(unscheduled, sorted, "{key}: unscheduled rows out of order");
    }
}
