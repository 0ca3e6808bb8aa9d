//! Crashes: the consumer runs as a real child process (the `billing` and `soak_consumer`
//! examples, built with the `failpoints` feature) and is killed with SIGKILL at each step
//! between receiving a message and committing its offset, then restarted. Every event's effect
//! must happen exactly once. The same on NATS JetStream (module `nats`: the billing example
//! killed at each step, and a group of three on six partitions with one member killed and one
//! paused past its lease), and relays killed while writers fill the outbox, on Kafka and on
//! NATS (module `mysql_relays`).

mod support;

#[cfg(feature = "nats")]
use support::nats as nats_support;

use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use support::child::ChildProcess as ChildConsumer;
use support::{send, Broker, Msg, TestDb};
use uuid::Uuid;

async fn wait_until(db: &TestDb, sql: &str, target: i64, within: Duration) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        let n = db.count(sql).await;
        if n >= target || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The broker of a crash test: Kafka (Tansu) or NATS JetStream, each a process of the test's
/// own, with the topic the billing example reads.
enum Bus {
    Kafka {
        broker: Broker,
        topic: String,
    },
    #[cfg(feature = "nats")]
    Nats {
        server: Box<nats_support::NatsServer>,
        js: async_nats::jetstream::Context,
        topic: String,
        /// The stream sequence of the last message sent.
        last: u64,
    },
}

impl Bus {
    async fn kafka(prefix: &str) -> Self {
        let broker = Broker::start();
        let topic = support::unique(prefix);
        broker.create_topic(&topic, 1).await;
        Self::Kafka { broker, topic }
    }

    #[cfg(feature = "nats")]
    async fn nats(prefix: &str) -> Self {
        let server = nats_support::NatsServer::start();
        let js = server.js().await;
        let topic = support::unique(prefix);
        nats_support::create_stream(&js, &topic).await;
        Self::Nats {
            server: Box::new(server),
            js,
            topic,
            last: 0,
        }
    }

    /// Sends one `OrderCreated` per order, all under one key (one partition): in the default
    /// order (per key) they stay one lane's batch.
    async fn send_one_key(&mut self, orders: &[Uuid]) {
        match self {
            Self::Kafka { broker, topic } => {
                let producer = support::producer(&broker.brokers);
                for (i, order) in orders.iter().enumerate() {
                    let mut msg = Msg::order(&Uuid::new_v4().to_string(), *order, i as i64);
                    msg.key = Some("one-key".into());
                    send(&producer, topic, msg).await;
                }
            }
            #[cfg(feature = "nats")]
            Self::Nats {
                js, topic, last, ..
            } => {
                for (i, order) in orders.iter().enumerate() {
                    let payload = serde_json::to_vec(
                        &serde_json::json!({"order_id": order, "total_cents": i}),
                    )
                    .expect("json");
                    let id = Uuid::new_v4().to_string();
                    let headers = [
                        ("ce_id", id.as_str()),
                        ("ce_type", "OrderCreated"),
                        ("ce_source", "tests"),
                        ("ce_specversion", "1.0"),
                        ("content-type", "application/json"),
                        ("ce_partitionkey", "one-key"),
                    ];
                    let subject = inoutbox::nats::subject(topic, 0);
                    *last = nats_support::publish(js, &subject, &headers, payload).await;
                }
            }
        }
    }

    /// The billing example on this broker (on NATS: one partition, a 2 s lease, its leases and
    /// consumers logged), with `failpoint` armed if given.
    fn billing(&self, db: &TestDb, failpoint: Option<&str>) -> ChildConsumer {
        match self {
            Self::Kafka { broker, topic } => ChildConsumer::start(
                "billing",
                db,
                &broker.brokers,
                &["--topic", topic],
                failpoint,
            ),
            #[cfg(feature = "nats")]
            Self::Nats { server, topic, .. } => ChildConsumer::start_with_env(
                "billing",
                db,
                "",
                &[
                    "--topic",
                    topic,
                    "--partitions",
                    "1",
                    "--lease-ttl-ms",
                    "2000",
                ],
                failpoint,
                &[
                    ("NATS_URL", server.url.as_str()),
                    (
                        "RUST_LOG",
                        "info,inoutbox::engine=debug,inoutbox::nats=debug",
                    ),
                ],
            ),
        }
    }

    /// Waits until the group `billing` has committed (Kafka) or acknowledged (NATS) the `n`
    /// messages sent, and says whether it has.
    async fn wait_acknowledged(&self, n: usize) -> bool {
        match self {
            Self::Kafka { broker, topic } => {
                support::wait_committed(&broker.brokers, "billing", topic, 0, n as i64).await
                    == Some(n as i64)
            }
            #[cfg(feature = "nats")]
            Self::Nats {
                js, topic, last, ..
            } => {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let floor = nats_support::acknowledged(js, topic, "billing", 0).await;
                    if floor >= *last || Instant::now() > deadline {
                        return floor >= *last;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Five messages wait in the topic, so the consumer takes them as one batch (one transaction).
/// The failpoint counts per message for `after_handler` (the third handler of the batch) and
/// per transaction for the others: the batch is killed after its inbox rows were written,
/// after its third handler, or after its commit and before the offset commit (on NATS, the
/// acknowledgement).
async fn crash_at(mut bus: Bus, failpoint: &str) {
    let db = TestDb::new("crash").await;
    db.migrated_store().await;
    let orders: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
    bus.send_one_key(&orders).await;

    // The process is killed right at the failpoint.
    let hit = if failpoint == "after_handler" { 3 } else { 1 };
    let spec = format!("{failpoint}:{hit}");
    let mut first = bus.billing(&db, Some(&spec));
    first.wait_for(
        &format!("inoutbox failpoint {failpoint} reached"),
        Duration::from_secs(60),
    );
    first.kill9();
    let committed_before_restart = db
        .count("SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL")
        .await;

    let mut second = bus.billing(&db, None);
    let processed = wait_until(
        &db,
        "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL",
        orders.len() as i64,
        Duration::from_secs(90),
    )
    .await;
    // Let the restarted consumer read everything it will be given before stopping it.
    let acknowledged = bus.wait_acknowledged(orders.len()).await;
    let status = second.terminate();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");

    println!(
        "{failpoint}: {committed_before_restart} committed before the kill; after restart {} processed lines, {} duplicates",
        second.count(" processed "),
        second.count(" duplicate ")
    );
    assert_eq!(
        processed,
        orders.len() as i64,
        "every event processed after the restart"
    );
    for order in &orders {
        let n = db
            .count(&format!(
                "SELECT count(*) FROM invoices WHERE order_id = '{order}'"
            ))
            .await;
        assert_eq!(
            n, 1,
            "order {order} invoiced exactly once after a SIGKILL at {failpoint}"
        );
    }
    assert!(
        acknowledged,
        "the restarted consumer committed (acknowledged) past every message"
    );
    if failpoint == "after_db_commit" {
        assert!(
            committed_before_restart >= 3,
            "the transaction holding the third message committed before the kill \
             ({committed_before_restart} committed)"
        );
        assert!(
            second.count(" duplicate ") >= 1,
            "the committed but unacknowledged messages came back as duplicates"
        );
    } else {
        assert!(
            committed_before_restart < 3,
            "the transaction holding the third message died with the process \
             ({committed_before_restart} committed)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_inbox_insert_applies_each_event_once() {
    crash_at(Bus::kafka("crash").await, "after_inbox_insert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_handler_applies_each_event_once() {
    crash_at(Bus::kafka("crash").await, "after_handler").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_db_commit_before_offset_commit_applies_each_event_once() {
    crash_at(Bus::kafka("crash").await, "after_db_commit").await;
}

/// [`crash_at`] on MariaDB: the billing example on `mysql://`, killed at `failpoint` in its
/// batch's transaction, restarted; every order invoiced exactly once.
#[cfg(feature = "mysql")]
async fn mysql_crash_at(failpoint: &str) {
    let broker = Broker::start();
    let (_db, url) = support::kit::mysql_database("crash").await;
    let pool = sqlx::MySqlPool::connect(&url)
        .await
        .expect("connect to MariaDB");
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap_or(0)
        }
    };
    let topic = support::unique("mycrash");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    let orders: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
    for (i, order) in orders.iter().enumerate() {
        let msg = Msg::order(&Uuid::new_v4().to_string(), *order, i as i64);
        send(&producer, &topic, msg).await;
    }
    let hit = if failpoint == "after_handler" { 3 } else { 1 };
    let spec = format!("{failpoint}:{hit}");
    let args = ["--topic", topic.as_str()];
    let mut first = ChildConsumer::start_on("billing", &url, &broker.brokers, &args, Some(&spec));
    first.wait_for(
        &format!("inoutbox failpoint {failpoint} reached"),
        Duration::from_secs(60),
    );
    first.kill9();
    const PROCESSED: &str = "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL";
    let committed_before_restart = count(PROCESSED).await;
    let mut second = ChildConsumer::start_on("billing", &url, &broker.brokers, &args, None);
    let deadline = Instant::now() + Duration::from_secs(90);
    while count(PROCESSED).await < orders.len() as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    support::wait_committed(&broker.brokers, "billing", &topic, 0, orders.len() as i64).await;
    let status = second.terminate();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    assert_eq!(
        count(PROCESSED).await,
        orders.len() as i64,
        "every event processed"
    );
    for order in &orders {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices WHERE order_id = ?")
            .bind(order.to_string())
            .fetch_one(&pool)
            .await
            .expect("count invoices");
        assert_eq!(
            n, 1,
            "order {order} invoiced once after a SIGKILL at {failpoint} on MariaDB"
        );
    }
    match failpoint {
        "after_db_commit" => assert!(
            committed_before_restart >= 3 && second.count(" duplicate ") >= 1,
            "committed before the kill ({committed_before_restart}), then seen as duplicates"
        ),
        _ => assert!(
            committed_before_restart < 3,
            "the batch's transaction died with the process ({committed_before_restart} committed)"
        ),
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sigkill_after_inbox_insert_applies_each_event_once() {
    mysql_crash_at("after_inbox_insert").await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sigkill_after_handler_applies_each_event_once() {
    mysql_crash_at("after_handler").await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sigkill_after_db_commit_before_offset_commit_applies_each_event_once() {
    mysql_crash_at("after_db_commit").await;
}

/// A real SIGTERM while a message is in the handler: the billing example (its handler made to
/// finish slowly) finishes that message, commits its offset, handles nothing more and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_message_in_hand_and_commits_it() {
    let broker = Broker::start();
    let db = TestDb::new("sigterm").await;
    db.migrated_store().await;
    let topic = support::unique("sigterm");
    broker.create_topic(&topic, 1).await;
    let producer = support::producer(&broker.brokers);
    let orders: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    for (i, order) in orders.iter().enumerate() {
        // One key: in the default order (per key) one message is in hand at a time.
        let mut msg = Msg::order(&Uuid::new_v4().to_string(), *order, i as i64);
        msg.key = Some("one-key".into());
        send(&producer, &topic, msg).await;
    }
    let mut child = ChildConsumer::start(
        "billing",
        &db,
        &broker.brokers,
        &["--topic", &topic, "--finish-slowly-ms", "3000"],
        None,
    );
    child.wait_for(
        &format!("invoice written for order {}", orders[0]),
        Duration::from_secs(60),
    );
    let signalled = Instant::now();
    let status = child.terminate(); // the handler has about 3 s left
    let took = signalled.elapsed();
    println!("SIGTERM with a message in hand: exited {status} after {took:?}");
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    assert!(
        took >= Duration::from_secs(2),
        "the process waited for the message in hand ({took:?})"
    );
    assert_eq!(
        child.count(" processed "),
        1,
        "the message in hand, and only it"
    );
    assert_eq!(
        child.count("shutdown signal received"),
        1,
        "it stopped on the signal"
    );
    assert_eq!(db.invoices().await, 1);
    let invoiced = db
        .count(&format!(
            "SELECT count(*) FROM invoices WHERE order_id = '{}'",
            orders[0]
        ))
        .await;
    assert_eq!(invoiced, 1, "the message in hand was finished");
    assert_eq!(
        support::committed(&broker.brokers, "billing", &topic, 0),
        Some(1),
        "its offset was committed before the process left the group"
    );
}

/// What the soak makes of one event. Each event has exactly one fate, so the expected
/// numbers follow by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fate {
    Fine,
    /// Fails transiently on its first run.
    Transient,
    /// Fails permanently: dead-lettered.
    Permanent,
    /// Fine, delivered twice.
    Duplicated,
    /// Fails permanently and is delivered twice: one dead letter, seen twice.
    DuplicatedPoison,
}

impl Fate {
    fn of(i: usize) -> Self {
        match i % 200 {
            7 => Self::Permanent,
            107 => Self::DuplicatedPoison,
            50 | 150 => Self::Duplicated,
            r if r % 20 == 3 => Self::Transient,
            _ => Self::Fine,
        }
    }

    /// The last digit of `total_cents`, which tells `soak_consumer`'s handler what to do.
    fn digit(self) -> i64 {
        match self {
            Self::Fine | Self::Duplicated => 0,
            Self::Transient => 1,
            Self::Permanent | Self::DuplicatedPoison => 2,
        }
    }

    fn copies(self) -> usize {
        match self {
            Self::Duplicated | Self::DuplicatedPoison => 2,
            _ => 1,
        }
    }
}

/// The soak: 20 000 events on 3 partitions, 1 % delivered twice, 5 % failing transiently on the
/// first attempt, 1 % failing permanently (half of those delivered twice), and the consumer
/// SIGKILLed three times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_20k_events_with_duplicates_failures_and_sigkills() {
    const EVENTS: usize = 20_000;
    let broker = Broker::start();
    let db = TestDb::new("soak").await;
    db.migrated_store().await;
    let topic = support::unique("soak");
    broker.create_topic(&topic, 3).await;
    let producer = support::producer(&broker.brokers);

    let mut fates: std::collections::HashMap<Fate, i64> = std::collections::HashMap::new();
    let mut poison_twice = std::collections::HashSet::new();
    let mut pending = Vec::with_capacity(EVENTS + EVENTS / 100);
    let mut end_offsets = [0i64; 3];
    for i in 0..EVENTS {
        let fate = Fate::of(i);
        *fates.entry(fate).or_default() += 1;
        let (id, order) = (Uuid::now_v7().to_string(), Uuid::new_v4());
        if fate == Fate::DuplicatedPoison {
            poison_twice.insert(id.clone());
        }
        let payload = serde_json::to_vec(
            &serde_json::json!({"order_id": order, "total_cents": (i as i64) * 10 + fate.digit()}),
        )
        .expect("json");
        for _ in 0..fate.copies() {
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "ce_id",
                    value: Some(id.as_str()),
                })
                .insert(Header {
                    key: "ce_type",
                    value: Some("OrderCreated"),
                });
            let key = order.to_string();
            let record = FutureRecord::to(&topic)
                .key(&key)
                .payload(&payload)
                .headers(headers);
            pending.push(
                producer
                    .send_result(record)
                    .map_err(|(e, _)| e)
                    .expect("enqueue"),
            );
        }
    }
    for delivery in pending {
        let d = delivery
            .await
            .expect("delivered")
            .map_err(|(e, _)| e)
            .expect("acked");
        end_offsets[d.partition as usize] = end_offsets[d.partition as usize].max(d.offset + 1);
    }
    let count = |f: Fate| fates.get(&f).copied().unwrap_or(0);
    let permanent = count(Fate::Permanent) + count(Fate::DuplicatedPoison);
    let transient = count(Fate::Transient);
    let duplicates = count(Fate::Duplicated) + count(Fate::DuplicatedPoison);
    let unique = EVENTS as i64;
    let done_sql = "SELECT (SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL) \
                    + (SELECT count(*) FROM inoutbox_dead_letters)";
    let started = Instant::now();

    // Three SIGKILLs at about a quarter, half and three quarters of the way.
    let mut kills = 0;
    for quarter in 1..=3i64 {
        let mut child = ChildConsumer::start(
            "soak_consumer",
            &db,
            &broker.brokers,
            &["--topic", &topic],
            None,
        );
        let reached = wait_until(
            &db,
            done_sql,
            unique * quarter / 4,
            Duration::from_secs(600),
        )
        .await;
        assert!(
            reached >= unique * quarter / 4,
            "stalled at {reached} of {unique}"
        );
        child.kill9();
        kills += 1;
    }
    let mut last = ChildConsumer::start(
        "soak_consumer",
        &db,
        &broker.brokers,
        &["--topic", &topic],
        None,
    );
    let done = wait_until(&db, done_sql, unique, Duration::from_secs(600)).await;
    for (partition, end) in end_offsets.iter().enumerate() {
        let committed =
            support::wait_committed(&broker.brokers, "soak", &topic, partition as i32, *end).await;
        assert_eq!(
            committed,
            Some(*end),
            "partition {partition} not stalled: committed up to its end"
        );
    }
    assert!(last.terminate().success());
    let elapsed = started.elapsed();

    let invoices = db.invoices().await;
    let distinct = db
        .count("SELECT count(DISTINCT order_id) FROM invoices")
        .await;
    let dead = db.count("SELECT count(*) FROM inoutbox_dead_letters").await;
    let dead_wrong = db
        .count("SELECT count(*) FROM inoutbox_dead_letters WHERE error NOT LIKE '%injected permanent failure%'")
        .await;
    println!(
        "soak: {EVENTS} events (+{duplicates} duplicate deliveries) on 3 partitions, {transient} transient and \
         {permanent} permanent failures ({} of them delivered twice), {kills} SIGKILLs, {:.1} s\n\
         soak: resolved {done}, invoices {invoices} (distinct orders {distinct}), dead letters {dead}, \
         expected invoices {}",
        poison_twice.len(),
        elapsed.as_secs_f64(),
        unique - permanent
    );
    assert_eq!(done, unique, "every event resolved: no message lost");
    assert_eq!(
        invoices,
        unique - permanent,
        "invoices == unique events minus permanent failures"
    );
    assert_eq!(distinct, invoices, "no event applied twice");
    assert_eq!(dead, permanent, "dead letters == permanent failures");
    assert_eq!(dead_wrong, 0, "only permanent failures were dead-lettered");

    // One letter per event however often it came (twice by construction, more after a
    // SIGKILL before its offset commit); each time after one run (a permanent error is not
    // retried), so attempts >= times.
    let letters: Vec<(String, i32, i32)> =
        sqlx::query_as("SELECT event_id, times, attempts FROM inoutbox_dead_letters")
            .fetch_all(&db.pool)
            .await
            .expect("dead letters");
    let seen_twice = letters
        .iter()
        .filter(|(id, _, _)| poison_twice.contains(id))
        .count();
    let redelivered = letters.iter().filter(|(_, times, _)| *times > 1).count();
    println!(
        "soak: {} letters, {seen_twice} of events delivered twice, {redelivered} with times > 1",
        letters.len()
    );
    assert_eq!(
        seen_twice,
        poison_twice.len(),
        "each twice-delivered poison event has its letter"
    );
    // A copy delivered in the same batch as the first is a duplicate of it (the batch sees the
    // id once), so a twice-delivered poison event is dead-lettered once or twice: one letter
    // either way.
    for (id, times, attempts) in &letters {
        assert!(*times >= 1, "letter of {id}: dead-lettered {times} times");
        assert!(
            attempts >= times,
            "letter of {id}: {attempts} attempts for {times} times"
        );
    }
}

/// The quickstart, as a newcomer runs it: no DATABASE_URL, no KAFKA_BROKERS (SQLite in a temp
/// directory and the in-process Kafka). It exits 0 only if every order was invoiced once.
#[test]
fn quickstart_runs_the_whole_flow_with_zero_setup() {
    let output = std::process::Command::new(support::child::example("quickstart"))
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .output()
        .expect("run the quickstart");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the quickstart failed: {}",
        output.status
    );
    assert!(
        stdout.contains("SQLite") && stdout.contains("in-process Kafka"),
        "zero-setup mode"
    );
    assert!(stdout.contains("orders invoiced exactly once") && stdout.contains("20/20"));
    assert!(stdout.contains("duplicates skipped by the inbox"));
}

/// Relays killed on MariaDB: three relay processes (the `relay` example on `mysql://`) drain an
/// outbox that concurrent writers fill over many keys (some of their transactions rolled back);
/// the relays are SIGKILLed and restarted, one after another, while the writers run. At the end
/// every committed event is on the topic (Kafka) or the stream (NATS), nothing else is (no
/// rolled-back event), each key's events came first in their commit order, and the copies sent
/// twice are no more than the rows a killed relay can have had in flight.
#[cfg(feature = "mysql")]
mod mysql_relays {
    use std::collections::{HashMap, HashSet};

    use inoutbox::prelude::*;
    use serde::{Deserialize, Serialize};
    use sqlx::MySqlPool;
    use uuid::Uuid;

    use super::support::child::ChildProcess;
    use super::support::{read_topic_until_quiet, Broker};
    use super::{Duration, Instant};

    const TOPIC: &str = "relay-crash-steps";
    const PARTITIONS: i32 = 4;
    const KEYS: usize = 24;
    const WRITERS: usize = 4;
    const EVENTS_PER_WRITER: usize = 250;
    /// The relays' batch: a killed relay has at most two of them in flight.
    const BATCH: usize = 10;

    /// Step `n` of key `key`; `n` counts up per key in commit order (the writer's transaction
    /// locks the key's counter row).
    #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
    #[outbox(event_type = "KeyStep", topic = "relay-crash-steps", key = key)]
    pub struct KeyStep {
        pub key: String,
        pub n: i64,
    }

    /// Where the relays publish: Kafka (Tansu) or NATS JetStream, a process of the test's own.
    enum Target {
        Kafka(Broker),
        #[cfg(feature = "nats")]
        Nats(
            Box<super::nats_support::NatsServer>,
            async_nats::jetstream::Context,
        ),
    }

    /// One copy of an event as the broker holds it.
    struct Copy {
        id: Uuid,
        key: String,
        n: i64,
        /// Where it is (partition and offset, or the stream sequence).
        at: String,
    }

    impl Target {
        async fn kafka() -> Self {
            let broker = Broker::start();
            broker.create_topic(TOPIC, PARTITIONS).await;
            Self::Kafka(broker)
        }

        #[cfg(feature = "nats")]
        async fn nats() -> Self {
            let server = super::nats_support::NatsServer::start();
            let js = server.js().await;
            // JetStream's duplicate window (`Nats-Msg-Id`) would drop a relay's repeats and
            // hide them: its shortest window (100 ms) leaves the relays' own guarantees to be seen.
            let partitions = u32::try_from(PARTITIONS).expect("partitions");
            let config = async_nats::jetstream::stream::Config {
                duplicate_window: Duration::from_millis(100),
                ..Default::default()
            };
            super::nats_support::create_streams_with(&js, TOPIC, partitions, config).await;
            Self::Nats(Box::new(server), js)
        }

        fn start_relay(&self, url: &str) -> ChildProcess {
            let batch = BATCH.to_string();
            let mut args = vec![
                "--poll-ms",
                "100",
                "--workers",
                "1",
                "--batch",
                batch.as_str(),
                "--source",
                "relay-crash",
                "--print-published",
            ];
            match self {
                Self::Kafka(broker) => {
                    args.push("--no-idempotence");
                    ChildProcess::start_on("relay", url, &broker.brokers, &args, None)
                }
                #[cfg(feature = "nats")]
                Self::Nats(server, _) => {
                    let partitions = PARTITIONS.to_string();
                    args.extend(["--partitions", partitions.as_str()]);
                    let env = [("NATS_URL", server.url.as_str())];
                    ChildProcess::start_with("relay", url, "", &args, &env)
                }
            }
        }

        /// Every copy on the topic (its streams), in each partition's order.
        async fn read(&self) -> Vec<Copy> {
            match self {
                Self::Kafka(broker) => read_topic_until_quiet(
                    &broker.brokers,
                    TOPIC,
                    PARTITIONS,
                    Duration::from_secs(3),
                    Duration::from_secs(120),
                )
                .await
                .into_iter()
                .map(|m| Copy {
                    id: m
                        .header("ce_id")
                        .and_then(|v| v.parse().ok())
                        .expect("ce_id"),
                    key: m.payload["key"].as_str().expect("key").to_owned(),
                    n: m.payload["n"].as_i64().expect("n"),
                    at: format!("{}@{}", m.partition, m.offset),
                })
                .collect(),
                #[cfg(feature = "nats")]
                Self::Nats(_, js) => {
                    super::nats_support::read_stream(js, TOPIC, Duration::from_secs(3))
                        .await
                        .into_iter()
                        .map(|m| {
                            let id = m
                                .headers
                                .as_ref()
                                .and_then(|h| h.get("ce_id"))
                                .and_then(|v| v.as_str().parse().ok())
                                .expect("ce_id");
                            let payload: serde_json::Value =
                                serde_json::from_slice(&m.payload).expect("json");
                            let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
                            Copy {
                                id,
                                key: payload["key"].as_str().expect("key").to_owned(),
                                n: payload["n"].as_i64().expect("n"),
                                at: format!("{}#{seq}", m.subject),
                            }
                        })
                        .collect()
                }
            }
        }
    }

    /// `events` transactions, each the next step of a key drawn at random: the key's counter
    /// row, then the event; one in five is rolled back instead of committed. Returns the ids
    /// committed and the ids rolled back.
    async fn write_steps(
        pool: MySqlPool,
        keys: Vec<String>,
        events: usize,
        seed: u64,
    ) -> (Vec<Uuid>, Vec<Uuid>) {
        let mut rng = seed | 1;
        let (mut ids, mut rolled_back) = (Vec::with_capacity(events), Vec::new());
        while ids.len() < events {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = &keys[(rng % keys.len() as u64) as usize];
            let mut tx = pool.begin().await.expect("begin");
            sqlx::query("UPDATE step_counters SET n = n + 1 WHERE k = ?")
                .bind(key)
                .execute(&mut *tx)
                .await
                .expect("count the step");
            let n: i64 = sqlx::query_scalar("SELECT n FROM step_counters WHERE k = ?")
                .bind(key)
                .fetch_one(&mut *tx)
                .await
                .expect("read the step");
            let step = KeyStep {
                key: key.clone(),
                n,
            };
            let id = inoutbox::outbox::enqueue(&mut tx, &step)
                .await
                .expect("enqueue");
            if (rng >> 32).is_multiple_of(5) {
                tx.rollback().await.expect("rollback");
                rolled_back.push(id);
            } else {
                tx.commit().await.expect("commit");
                ids.push(id);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (ids, rolled_back)
    }

    /// Kills relay `turn % 3` and starts another in its place, every 300 to 700 ms, until the
    /// writers are done; returns how many were killed, and the lines the killed ones printed.
    async fn churn(
        relays: &mut [ChildProcess],
        writers: &[tokio::task::JoinHandle<(Vec<Uuid>, Vec<Uuid>)>],
        url: &str,
        target: &Target,
    ) -> (usize, Vec<String>) {
        let (mut kills, mut lines) = (0, Vec::new());
        while !writers.iter().all(|w| w.is_finished()) {
            tokio::time::sleep(Duration::from_millis(300 + (kills as u64 * 137) % 400)).await;
            let i = kills % relays.len();
            relays[i].kill9();
            lines.extend(relays[i].lines());
            relays[i] = target.start_relay(url);
            kills += 1;
        }
        (kills, lines)
    }

    /// How many rows the relays published more than once (by their `relay: published <id>`
    /// lines, whether or not the broker kept the copy).
    fn sent_again(lines: &[String]) -> usize {
        let mut sent = HashSet::new();
        lines
            .iter()
            .filter_map(|l| l.split("relay: published ").nth(1))
            .filter_map(|rest| rest.split(' ').next())
            .filter(|id| !sent.insert(id.to_owned()))
            .count()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relays_sigkilled_and_restarted_publish_every_event_in_per_key_order() {
        relays_sigkilled_and_restarted(Target::kafka().await).await;
    }

    #[cfg(feature = "nats")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relays_sigkilled_and_restarted_publish_every_event_in_per_key_order_on_nats() {
        relays_sigkilled_and_restarted(Target::nats().await).await;
    }

    async fn relays_sigkilled_and_restarted(target: Target) {
        let (_db, url) = super::support::kit::mysql_database("relays").await;
        let store = inoutbox::MySqlStore::connect(&url).await.expect("MariaDB");
        store.migrate().await.expect("migrate");
        let pool = store.pool().clone();
        sqlx::raw_sql("CREATE TABLE step_counters (k varchar(64) PRIMARY KEY, n bigint NOT NULL)")
            .execute(&pool)
            .await
            .expect("step_counters");
        let keys: Vec<String> = (0..KEYS).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            sqlx::query("INSERT INTO step_counters (k, n) VALUES (?, 0)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("a counter");
        }
        let mut relays: Vec<ChildProcess> = (0..3).map(|_| target.start_relay(&url)).collect();
        for r in &relays {
            r.wait_for("relay started", Duration::from_secs(60));
        }
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                tokio::spawn(write_steps(
                    pool.clone(),
                    keys.clone(),
                    EVENTS_PER_WRITER,
                    w as u64 + 7,
                ))
            })
            .collect();
        let (kills, mut lines) = churn(&mut relays, &writers, &url, &target).await;
        let (mut committed, mut rolled_back) = (HashSet::new(), HashSet::new());
        for w in writers {
            let (ids, undone) = w.await.expect("writer");
            committed.extend(ids);
            rolled_back.extend(undone);
        }
        assert!(
            kills >= 3,
            "only {kills} relays were killed while the writers ran"
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL",
            )
            .fetch_one(&pool)
            .await
            .expect("unpublished");
            if left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{left} rows still unpublished after 120 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let copies = target.read().await;
        for r in &mut relays {
            assert!(
                r.is_running(),
                "a relay died by itself:\n{}",
                r.lines().join("\n")
            );
        }
        let duplicates = check_steps(&copies, &committed, &rolled_back);
        for r in &relays {
            lines.extend(r.lines());
        }
        let repeats = sent_again(&lines);
        println!(
            "{} events committed, {} rolled back, {} copies, {kills} relays killed, {duplicates} \
             copies twice on the broker, {repeats} rows published again",
            committed.len(),
            rolled_back.len(),
            copies.len()
        );
        // On NATS the stream's duplicate window drops a repeat published within it: the
        // relays' own lines count what they sent.
        let bound = (kills + 1) * 2 * BATCH;
        assert!(
            duplicates.max(repeats) <= bound,
            "{duplicates} copies on the broker twice, {repeats} rows published again: more than \
             {kills} kills can explain ({bound}): did two relays publish at once?"
        );
    }

    /// Every committed event is on the topic and nothing else (no rolled-back one); per key,
    /// the first copy of each step comes in commit order (`n` = 1, 2, 3, ...). Returns how many
    /// copies were repeats.
    fn check_steps(
        copies: &[Copy],
        committed: &HashSet<Uuid>,
        rolled_back: &HashSet<Uuid>,
    ) -> usize {
        let mut seen = HashSet::new();
        let mut last: HashMap<&str, i64> = HashMap::new();
        let mut duplicates = 0;
        for c in copies {
            assert!(
                !rolled_back.contains(&c.id),
                "event {} at {} was rolled back, yet published",
                c.id,
                c.at
            );
            assert!(
                committed.contains(&c.id),
                "event {} at {} was never committed",
                c.id,
                c.at
            );
            if !seen.insert(c.id) {
                duplicates += 1;
                continue;
            }
            let previous = last.insert(&c.key, c.n);
            assert_eq!(
                previous.unwrap_or(0) + 1,
                c.n,
                "key {}: step {} at {} came after step {previous:?}",
                c.key,
                c.n,
                c.at
            );
        }
        let lost = committed.difference(&seen).count();
        assert_eq!(lost, 0, "{lost} committed events never reached the topic");
        duplicates
    }
}

/// The crash tests on NATS JetStream: the billing example on a `nats-server -js` of the test's
/// own (`NATS_URL`), killed at each failpoint and restarted; a partition handed on by an owner
/// killed before it acknowledged anything; and a group of three billing processes on six
/// partitions, one SIGKILLed and one SIGSTOPped past its lease, over a steady stream of orders.
#[cfg(feature = "nats")]
mod nats {
    use std::collections::HashMap;

    use uuid::Uuid;

    use super::nats_support::{acknowledged, create_stream, publish_order, NatsServer};
    use super::support::child::ChildProcess;
    use super::support::{unique, TestDb};
    use super::{crash_at, Bus, Duration, Instant};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigkill_after_inbox_insert_applies_each_event_once() {
        crash_at(Bus::nats("ncrash").await, "after_inbox_insert").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigkill_after_handler_applies_each_event_once() {
        crash_at(Bus::nats("ncrash").await, "after_handler").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigkill_after_db_commit_before_acknowledgement_applies_each_event_once() {
        crash_at(Bus::nats("ncrash").await, "after_db_commit").await;
    }

    /// Three owners of one partition, one after another: the first acknowledges five orders
    /// and is SIGKILLed; the second takes the lease when it expires, creates its consumer (to
    /// start after the five) and is SIGKILLed before it acknowledges anything (nothing new came);
    /// the third starts after the five too, not at the stream's beginning: it gets the next
    /// order and none of the five again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_owner_killed_before_acknowledging_hands_on_its_predecessors_position() {
        let mut bus = Bus::nats("nhandover").await;
        let db = TestDb::new("nhandover").await;
        db.migrated_store().await;
        let orders: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
        bus.send_one_key(&orders[..5]).await;
        let mut first = bus.billing(&db, None);
        assert!(
            bus.wait_acknowledged(5).await,
            "the first owner acknowledged the five orders"
        );
        first.kill9();
        let mut second = bus.billing(&db, None);
        second.wait_for("partition consumer created", Duration::from_secs(60));
        second.kill9();
        let mut third = bus.billing(&db, None);
        third.wait_for("partition consumer created", Duration::from_secs(60));
        bus.send_one_key(&orders[5..]).await;
        let invoiced = super::wait_until(
            &db,
            "SELECT count(*) FROM invoices",
            6,
            Duration::from_secs(60),
        )
        .await;
        let acknowledged = bus.wait_acknowledged(6).await;
        assert!(third.terminate().success(), "the third owner exits 0");
        let created: Vec<String> = [&second, &third]
            .iter()
            .flat_map(|c| c.lines())
            .filter(|l| l.contains("partition consumer created"))
            .collect();
        println!("{}", created.join("\n"));
        assert_eq!(invoiced, 6, "every order invoiced once");
        assert!(acknowledged, "the third owner acknowledged the sixth order");
        assert_eq!(
            third.count(" duplicate "),
            0,
            "the third owner read the partition again from its beginning: {created:?}"
        );
    }

    const PARTITIONS: u32 = 6;
    const KEYS: usize = 24;
    const EVENTS: usize = 360;
    /// The lease TTL of the group's members.
    const TTL_MS: u64 = 2000;

    /// A member of the group `billing`: the billing example on NATS, six partitions, a 2 s
    /// lease, its lease and acknowledgement decisions logged (`inoutbox::nats` at debug);
    /// its handler waits `slowly_ms` after each invoice.
    fn member(db: &TestDb, server: &NatsServer, topic: &str, slowly_ms: u64) -> ChildProcess {
        let (partitions, ttl, slowly) = (
            PARTITIONS.to_string(),
            TTL_MS.to_string(),
            slowly_ms.to_string(),
        );
        let args = [
            "--topic",
            topic,
            "--partitions",
            partitions.as_str(),
            "--lease-ttl-ms",
            ttl.as_str(),
            "--finish-slowly-ms",
            slowly.as_str(),
        ];
        let env = [
            ("NATS_URL", server.url.as_str()),
            (
                "RUST_LOG",
                "info,inoutbox::engine=debug,inoutbox::nats=debug",
            ),
        ];
        let child = ChildProcess::start_with_env("billing", db, "", &args, None, &env);
        child.wait_for("joined", Duration::from_secs(60));
        child
    }

    /// Publishes `EVENTS` orders' steps, ~20 ms apart: each the next step (`total_cents` =
    /// 1, 2, 3, ...) of one of `KEYS` orders drawn at random, keyed by its order. Returns the
    /// last stream sequence of each partition.
    async fn publish_steps(
        js: async_nats::jetstream::Context,
        topic: String,
        orders: Vec<Uuid>,
    ) -> HashMap<u32, u64> {
        let mut steps = vec![0i64; orders.len()];
        let mut last = HashMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..EVENTS {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = (rng % orders.len() as u64) as usize;
            steps[k] += 1;
            let id = Uuid::new_v4().to_string();
            let seq = publish_order(&js, &topic, PARTITIONS, &id, orders[k], steps[k]).await;
            let key = orders[k].to_string();
            let partition = inoutbox::nats::partition_for(key.as_bytes(), PARTITIONS);
            last.insert(partition, seq);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    }

    /// Three members on six partitions while orders keep coming: one is SIGKILLed (its leases
    /// expire and the others take its partitions), one is SIGSTOPped in the middle of a
    /// handler (its transaction open) for three lease TTLs and then SIGCONTed. It resumes with
    /// its leases taken: it refuses to acknowledge what it finishes (the local fence), and its
    /// transaction's event, whose inbox row the new owner waited on, counts once. At the end
    /// every event was applied exactly once, each order's steps in their order, and every
    /// partition acknowledged to its end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn members_sigkilled_and_sigstopped_apply_every_event_once_in_per_key_order() {
        let server = NatsServer::start();
        let js = server.js().await;
        let db = TestDb::new("ngroup").await;
        db.migrated_store().await;
        let topic = unique("ngroup");
        create_stream(&js, &topic).await;
        // One after another: each creates the invoices table if it is missing.
        let mut killed = member(&db, &server, &topic, 0);
        let mut survivor = member(&db, &server, &topic, 0);
        // Slow enough that the stop lands in a handler, its transaction open.
        let mut paused = member(&db, &server, &topic, 100);
        let orders: Vec<Uuid> = (0..KEYS).map(|_| Uuid::new_v4()).collect();
        let publisher = tokio::spawn(publish_steps(js.clone(), topic.clone(), orders.clone()));

        super::wait_until(
            &db,
            "SELECT count(*) FROM invoices",
            40,
            Duration::from_secs(60),
        )
        .await;
        killed.kill9();
        paused.wait_for_next("finishing in", Duration::from_secs(60));
        paused.pause();
        let stopped_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(3 * TTL_MS)).await;
        let resumed_from = paused.lines().len();
        paused.resume();
        println!("paused for {:?}", stopped_at.elapsed());

        let last = publisher.await.expect("publisher");
        let processed = super::wait_until(
            &db,
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL",
            EVENTS as i64,
            Duration::from_secs(60),
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut behind = Vec::new();
        for (partition, end) in &last {
            let floor = loop {
                let floor = acknowledged(&js, &topic, "billing", *partition).await;
                if floor >= *end || Instant::now() > deadline {
                    break floor;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            if floor < *end {
                behind.push(format!(
                    "partition {partition}: acknowledged {floor} of {end}"
                ));
            }
        }
        let late: Vec<String> = paused.lines()[resumed_from..].to_vec();
        assert!(survivor.terminate().success(), "the survivor exits 0");
        assert!(paused.terminate().success(), "the resumed member exits 0");

        let refused = late
            .iter()
            .filter(|l| l.contains("lease no longer held; not acknowledging"))
            .count();
        let revoked = late
            .iter()
            .filter(|l| l.contains("lease lost; partition revoked"))
            .count();
        println!(
            "{EVENTS} events on {PARTITIONS} partitions: {processed} processed; after resuming, the \
             paused member refused {refused} acknowledgements and lost {revoked} leases"
        );
        assert_eq!(processed, EVENTS as i64, "every event processed");
        assert!(
            behind.is_empty(),
            "partitions not acknowledged to their end: {behind:?}"
        );
        let rows: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT order_id, total_cents FROM invoices ORDER BY id")
                .fetch_all(&db.pool)
                .await
                .expect("invoices");
        assert_eq!(rows.len(), EVENTS, "one invoice per event");
        let mut applied: HashMap<Uuid, i64> = HashMap::new();
        for (order, step) in rows {
            let previous = applied.insert(order, step).unwrap_or(0);
            assert_eq!(
                previous + 1,
                step,
                "order {order}: step {step} applied after step {previous}"
            );
        }
        let unfenced = unfenced_late_work(&late);
        assert!(
            refused >= 1 && unfenced.is_empty(),
            "the member paused past its lease applied, after resuming, messages of a partition it \
             had lost that it did not refuse to acknowledge: {unfenced:?}; its lines since:\n{}",
            late.join("\n")
        );
    }

    /// The value of `name=` in a log line.
    fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..].split(' ').next()
    }

    /// The partition and offset of a line's message (`at=<topic>/<partition>@<offset>`).
    fn message_at(line: &str) -> Option<(String, i64)> {
        let (_, rest) = field(line, "at")?.rsplit_once('/')?;
        let (partition, offset) = rest.split_once('@')?;
        Some((partition.to_owned(), offset.parse().ok()?))
    }

    /// What a member applied after resuming on a partition before taking it again
    /// (`processed` at `<topic>/<partition>@<offset>`) that may have been acknowledged by it:
    /// neither refused (a `not acknowledging` line of that partition at a position past it) nor
    /// held back by a message before it left unresolved (`abandoned`: the position never
    /// passes one).
    fn unfenced_late_work(late: &[String]) -> Vec<String> {
        let mut retaken = std::collections::HashSet::new();
        let mut refused: HashMap<String, i64> = HashMap::new();
        let mut abandoned: HashMap<String, i64> = HashMap::new();
        let mut applied = Vec::new();
        for line in late {
            let partition = field(line, "partition").map(str::to_owned);
            if line.contains("lease taken; partition assigned") {
                retaken.extend(partition);
            } else if line.contains("not acknowledging") {
                let position = field(line, "position").and_then(|p| p.parse().ok());
                if let (Some(p), Some(position)) = (partition, position) {
                    let max = refused.entry(p).or_insert(position);
                    *max = (*max).max(position);
                }
            } else if let Some((partition, offset)) = message_at(line) {
                if retaken.contains(&partition) {
                    continue;
                }
                if line.contains(" abandoned ") {
                    let min = abandoned.entry(partition).or_insert(offset);
                    *min = (*min).min(offset);
                } else if line.contains(" processed ") {
                    applied.push((partition, offset, line.clone()));
                }
            }
        }
        applied
            .into_iter()
            .filter(|(p, offset, _)| {
                let refused = refused.get(p).is_some_and(|position| offset < position);
                let held = abandoned.get(p).is_some_and(|first| first < offset);
                !refused && !held
            })
            .map(|(_, _, line)| line)
            .collect()
    }
}
