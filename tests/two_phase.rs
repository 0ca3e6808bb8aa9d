//! The two-phase inbox and effects after commit, with real processes: the `two_phase_mailer`
//! example (a two-phase handler that takes seconds) runs as child consumers over Tansu and
//! PostgreSQL; tests SIGKILL them mid-handler and run two of them at once. The same guarantees
//! on SQLite and MariaDB are checked through the store's calls and in-process consumers (their
//! parts below), and the effects tests run on every store.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::child::ChildProcess;
use support::kit::{Kit, PgKit, SqliteKit};
use support::{send, Broker, Msg, TestDb};
use uuid::Uuid;

/// Polls `sql` (a count) until it reaches `target`; panics with `what` after `within`.
async fn wait_count(db: &TestDb, sql: &str, target: i64, within: Duration, what: &str) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        let n = db.count(sql).await;
        if n >= target {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: `{sql}` is {n}, expected {target} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A broker, a schema with inoutbox's tables, a topic with `partitions`, and `n` orders sent.
async fn setup(name: &str, partitions: i32, n: usize) -> (Broker, TestDb, String, Vec<Uuid>) {
    let broker = Broker::start();
    let db = TestDb::new(name).await;
    db.migrated_store().await;
    // The example's tables, created here too so that the test can count before it starts.
    sqlx::raw_sql(
        "CREATE TABLE receipts (id bigserial PRIMARY KEY, order_id uuid NOT NULL, pid integer NOT NULL); \
         CREATE TABLE handler_runs (id bigserial PRIMARY KEY, order_id uuid NOT NULL, \
           pid integer NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz)",
    )
    .execute(&db.pool)
    .await
    .expect("create the example's tables");
    let topic = support::unique(name);
    broker.create_topic(&topic, partitions).await;
    let producer = support::producer(&broker.brokers);
    let orders: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    for (i, order) in orders.iter().enumerate() {
        let msg = Msg::order(&Uuid::new_v4().to_string(), *order, i as i64);
        send(&producer, &topic, msg.on_partition(i as i32 % partitions)).await;
    }
    (broker, db, topic, orders)
}

fn mailer(db: &TestDb, broker: &Broker, topic: &str, args: &[&str]) -> ChildProcess {
    let mut all = vec!["--topic", topic];
    all.extend_from_slice(args);
    ChildProcess::start("two_phase_mailer", db, &broker.brokers, &all, None)
}

/// Each order's receipts: the handler's effect, applied once per order.
async fn receipts_per_order(db: &TestDb) -> BTreeMap<Uuid, i64> {
    sqlx::query_as::<_, (Uuid, i64)>("SELECT order_id, count(*) FROM receipts GROUP BY order_id")
        .fetch_all(&db.pool)
        .await
        .expect("receipts")
        .into_iter()
        .collect()
}

fn assert_each_once(receipts: &BTreeMap<Uuid, i64>, orders: &[Uuid]) {
    let doubled: Vec<_> = receipts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "orders applied more than once: {doubled:?}"
    );
    let missing: Vec<_> = orders
        .iter()
        .filter(|o| !receipts.contains_key(o))
        .collect();
    assert!(missing.is_empty(), "orders never applied: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_3_s_handler_with_8_workers_handles_200_events_well_under_the_serial_time() {
    let (broker, db, topic, orders) = setup("tp_speed", 3, 200).await;
    // The child programs are built first, so that the clock measures the run alone.
    support::child::example("two_phase_mailer");
    let started = Instant::now();
    let _child = mailer(
        &db,
        &broker,
        &topic,
        &["--handler-ms", "3000", "--workers", "8"],
    );
    let serial = Duration::from_secs(200 * 3);
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        200,
        serial / 4,
        "200 events of a 3 s handler with 8 workers",
    )
    .await;
    let took = started.elapsed();
    eprintln!(
        "two-phase timing: 200 events x 3 s handler, 8 workers: {:.1} s (serial {} s, ideal {} s)",
        took.as_secs_f64(),
        serial.as_secs(),
        200 * 3 / 8
    );
    assert!(
        took < serial / 4,
        "took {took:?}, not under a quarter of {serial:?}"
    );
    assert_each_once(&receipts_per_order(&db).await, &orders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_offset_is_committed_before_processing_and_a_crash_after_it_loses_nothing() {
    let (broker, db, topic, orders) = setup("tp_ack", 1, 10).await;
    // Handlers that take a minute: the offsets must be committed long before any finishes.
    let mut first = mailer(
        &db,
        &broker,
        &topic,
        &[
            "--handler-ms",
            "60000",
            "--workers",
            "2",
            "--lease-ms",
            "2000",
        ],
    );
    first.wait_for("mailer: handling order", Duration::from_secs(60));
    let committed = support::wait_committed(&broker.brokers, "mailing", &topic, 0, 10).await;
    assert_eq!(
        committed,
        Some(10),
        "the offset is committed after the receive step"
    );
    let received = db
        .count("SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL")
        .await;
    assert_eq!(received, 10, "every message is stored as received");
    assert_eq!(
        db.count("SELECT count(*) FROM receipts").await,
        0,
        "no handler has committed yet"
    );
    first.kill9();

    // The broker will not deliver them again (acknowledged): the table alone must bring them.
    let _second = mailer(
        &db,
        &broker,
        &topic,
        &["--handler-ms", "100", "--lease-ms", "2000"],
    );
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        10,
        Duration::from_secs(60),
        "received rows handled after the crash",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_each_once(&receipts_per_order(&db).await, &orders);
    let redelivered = db.count("SELECT count(*) FROM inoutbox_inbox").await;
    assert_eq!(redelivered, 10, "one inbox row per event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_a_worker_mid_handler_the_row_is_reclaimed_and_applied_exactly_once() {
    let (broker, db, topic, orders) = setup("tp_kill", 1, 4).await;
    let mut first = mailer(
        &db,
        &broker,
        &topic,
        &[
            "--handler-ms",
            "5000",
            "--workers",
            "4",
            "--lease-ms",
            "2000",
        ],
    );
    first.wait_for("mailer: handling order", Duration::from_secs(30));
    // Let the lease be renewed at least once while the handler runs, then kill it mid-handler.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    first.kill9();
    let killed = db
        .count("SELECT count(*) FROM handler_runs WHERE ended_at IS NULL")
        .await;
    assert!(
        killed >= 1,
        "a handler was running when the worker was killed"
    );
    assert_eq!(db.count("SELECT count(*) FROM receipts").await, 0);

    let _second = mailer(
        &db,
        &broker,
        &topic,
        &["--handler-ms", "200", "--lease-ms", "2000"],
    );
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        4,
        Duration::from_secs(60),
        "rows of the killed worker reclaimed",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_each_once(&receipts_per_order(&db).await, &orders);
    let reclaimed = db
        .count("SELECT count(*) FROM inoutbox_inbox WHERE claims >= 2")
        .await;
    assert!(
        reclaimed >= killed,
        "the killed worker's rows were claimed again"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NULL")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_worker_processes_never_run_the_same_row_at_once() {
    let (broker, db, topic, orders) = setup("tp_race", 3, 60).await;
    let args = [
        "--handler-ms",
        "700",
        "--workers",
        "4",
        "--lease-ms",
        "3000",
    ];
    let _a = mailer(&db, &broker, &topic, &args);
    let _b = mailer(&db, &broker, &topic, &args);
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        60,
        Duration::from_secs(120),
        "60 events over two worker processes",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let overlapping = db
        .count(
            "SELECT count(*) FROM handler_runs a JOIN handler_runs b ON a.order_id = b.order_id \
             AND a.id < b.id AND a.started_at < COALESCE(b.ended_at, 'infinity') \
             AND b.started_at < COALESCE(a.ended_at, 'infinity')",
        )
        .await;
    assert_eq!(overlapping, 0, "two runs of one row overlapped in time");
    let processes = db
        .count("SELECT count(DISTINCT pid) FROM handler_runs")
        .await;
    assert_eq!(processes, 2, "both processes ran handlers");
    assert_each_once(&receipts_per_order(&db).await, &orders);
}

/// A mail service stub: answers 503 while `failing`, else 200; records every key it answered
/// 200 for (duplicates included).
fn mail_stub(failing: Arc<AtomicBool>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("addr").to_string();
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let (mut key, mut length) = (String::new(), 0usize);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    match name.to_ascii_lowercase().as_str() {
                        "idempotency-key" => key = value.trim().to_owned(),
                        "content-length" => length = value.trim().parse().unwrap_or(0),
                        _ => {}
                    }
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let status = if failing.load(Ordering::SeqCst) {
                "503 Service Unavailable"
            } else {
                seen.lock().unwrap().push(key);
                "200 OK"
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    (address, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn effects_after_commit_survive_sigkill_and_reach_the_receiver_with_one_key_per_event() {
    let failing = Arc::new(AtomicBool::new(true));
    let (address, keys) = mail_stub(failing.clone());
    let (broker, db, topic, orders) = setup("tp_effects", 1, 20).await;
    let args = [
        "--handler-ms",
        "50",
        "--workers",
        "4",
        "--mail-url",
        address.as_str(),
    ];
    let mut first = mailer(&db, &broker, &topic, &args);
    // Every handler commits (with its effect row); the mail service is down: none is sent.
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        20,
        Duration::from_secs(60),
        "receipts",
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM inoutbox_effects",
        20,
        Duration::from_secs(10),
        "one effect row per committed handler",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.kill9();
    assert!(
        keys.lock().unwrap().is_empty(),
        "nothing sent while the service fails"
    );
    let pending = db
        .count("SELECT count(*) FROM inoutbox_effects WHERE done_at IS NULL")
        .await;
    assert_eq!(
        pending, 20,
        "the effects outlive the process that scheduled them"
    );

    // A new process drains what the dead one left.
    failing.store(false, Ordering::SeqCst);
    let _second = mailer(&db, &broker, &topic, &args);
    wait_count(
        &db,
        "SELECT count(*) FROM inoutbox_effects WHERE done_at IS NOT NULL",
        20,
        Duration::from_secs(90),
        "effects left by the killed process sent after a restart",
    )
    .await;
    let sent: HashSet<String> = keys.lock().unwrap().iter().cloned().collect();
    let event_ids: Vec<String> = sqlx::query_scalar("SELECT event_id FROM inoutbox_inbox")
        .fetch_all(&db.pool)
        .await
        .expect("event ids");
    let expected: HashSet<String> = event_ids
        .iter()
        .map(|id| inoutbox::effects::idempotency_key("mailing", "", id, "send_receipt"))
        .collect();
    assert_eq!(expected.len(), orders.len());
    assert_eq!(
        sent, expected,
        "one key per event, derived from (group, event id), all sent"
    );
}

fn signal(child: &ChildProcess, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_that_lost_its_lease_rolls_back_and_the_event_is_applied_once() {
    let (broker, db, topic, orders) = setup("tp_lost", 1, 1).await;
    let first = mailer(
        &db,
        &broker,
        &topic,
        &[
            "--handler-ms",
            "4000",
            "--workers",
            "1",
            "--lease-ms",
            "1500",
        ],
    );
    first.wait_for("mailer: handling order", Duration::from_secs(60));
    // Frozen mid-handler (a long GC pause, a VM stall): it renews nothing, its lease expires,
    // and another process claims the row and applies it.
    signal(&first, "STOP");
    let _second = mailer(
        &db,
        &broker,
        &topic,
        &["--handler-ms", "200", "--lease-ms", "1500"],
    );
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        1,
        Duration::from_secs(60),
        "the row applied by the second process",
    )
    .await;
    // Thawed, the first finishes its handler; its transaction must not commit a second receipt.
    signal(&first, "CONT");
    first.wait_for("lease lost", Duration::from_secs(30));
    // The thawed first process either finishes its handler and its commit is refused, or finds
    // its connection closed by the server while it was frozen (a session timeout) and its retry
    // is refused at the lease check: "lease lost" either way, and no second receipt. Without
    // the lease check the refused run commits (or the retry runs) and a receipt is doubled.
    let runs: Vec<(i32, bool)> =
        sqlx::query_as("SELECT pid, ended_at IS NOT NULL FROM handler_runs ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .expect("handler_runs");
    assert!(
        runs.iter().any(|(pid, _)| *pid as u32 == first.pid()),
        "the first process ran the handler; runs (pid, ended): {runs:?}, its output:\n{}",
        first.lines().join("\n"),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_each_once(&receipts_per_order(&db).await, &orders);
}

/// Worker A holds a received row in its handler's transaction when its lease expires: worker
/// B's claim must skip the row (A's transaction locks it) instead of running the handler beside
/// A; A's processed mark, made while it still holds the lease, commits; B finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_in_a_workers_transaction_is_not_claimed_by_another_after_its_lease_expires() {
    use inoutbox::store::{ClaimRequest, InboxKey, InboxStore, LeaseRequest};
    let db = TestDb::new("tp_lock").await;
    let store = db.migrated_store().await;
    let key = InboxKey {
        group: "tp-lock".into(),
        source: String::new(),
        event_id: Uuid::new_v4().to_string(),
        business_key: None,
    };
    let delivery = inoutbox::inbox::Delivery {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(b"{}".to_vec()),
        headers: Vec::new(),
    };
    let mut tx = store.begin().await.unwrap();
    let request = ClaimRequest {
        key: &key,
        event_type: "Slow",
        delivery: &delivery,
    };
    assert_eq!(store.receive(&mut tx, &[request]).await.unwrap(), [true]);
    store.commit(tx).await.unwrap();
    let lease = |owner| LeaseRequest {
        group: "tp-lock",
        owner,
        lease: Duration::from_secs(30),
        event_types: &["Slow"],
        ordered: &[],
    };
    assert!(store.claim_received(&lease("A")).await.unwrap().is_some());
    // A's handler transaction begins: it checks its lease.
    let mut a = store.begin().await.unwrap();
    assert_eq!(store.check_lease(&mut a, &key, "A").await.unwrap(), Some(0));
    // A's lease expires while its handler runs (it could not renew it).
    db.exec(&format!(
        "UPDATE {} SET lease_until = now() - interval '1 second'",
        db.tables.inbox
    ))
    .await;
    let b = store.claim_received(&lease("B")).await.unwrap();
    assert!(
        b.is_none(),
        "B claimed the row while A's handler runs on it: two runs at once"
    );
    assert!(store.finish_leased(&mut a, &key, "A", false).await.unwrap());
    store.commit(a).await.unwrap();
    assert!(store.claim_received(&lease("B")).await.unwrap().is_none());
    let processed = db
        .count(&format!(
            "SELECT count(*) FROM {} WHERE processed_at IS NOT NULL",
            db.tables.inbox
        ))
        .await;
    assert_eq!(processed, 1);
}

// ---------------------------------------------------------------------------------------------
// `ordered = true`: per message key, one event at a time, in offset order, whatever the
// number of workers.

#[derive(Debug, serde::Serialize, serde::Deserialize, inoutbox::OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
struct OrderCreated {
    order_id: Uuid,
    total_cents: i64,
}

/// (key, offset) of each handler run, in the order they started.
static ORDERED_CALLS: Mutex<Vec<(String, i64)>> = Mutex::new(Vec::new());
/// The keys whose handler is running now (a key twice: two runs of one key at once).
static ORDERED_RUNNING: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[inoutbox::inbox_handler(
    event = "OrderCreated",
    group = "tp-ordered",
    mode = "two_phase",
    ordered = true
)]
async fn ordered_receipt(
    event: OrderCreated,
    tx: &mut inoutbox::PgTx<'_>,
    meta: &inoutbox::MessageMeta,
) -> Result<(), inoutbox::HandlerError> {
    let key = String::from_utf8_lossy(meta.key.as_deref().unwrap_or_default()).into_owned();
    ORDERED_RUNNING.lock().unwrap().push(key.clone());
    ORDERED_CALLS
        .lock()
        .unwrap()
        .push((key.clone(), meta.offset));
    // 10 to 40 ms, so that a later event of a key could overtake an earlier one.
    let delay = 10 + (event.order_id.as_u128() % 31) as u64;
    tokio::time::sleep(Duration::from_millis(delay)).await;
    sqlx::query("INSERT INTO receipts (order_id, pid) VALUES ($1, 0)")
        .bind(event.order_id)
        .execute(&mut **tx)
        .await?;
    // Off the list before the commit: the next event of the key can only be claimed after it.
    let mut running = ORDERED_RUNNING.lock().unwrap();
    if let Some(at) = running.iter().position(|k| *k == key) {
        running.remove(at);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordered_two_phase_runs_one_event_per_key_at_a_time_in_offset_order() {
    let (broker, db, topic, _) = setup("tp_ordered", 1, 0).await;
    let producer = support::producer(&broker.brokers);
    let (keys, per_key) = (4, 12);
    let mut orders = Vec::new();
    for i in 0..keys * per_key {
        let order = Uuid::new_v4();
        let mut msg = Msg::order(&Uuid::new_v4().to_string(), order, i as i64);
        msg.key = Some(format!("account-{}", i % keys));
        send(&producer, &topic, msg.on_partition(0)).await;
        orders.push(order);
    }
    let overlaps = Arc::new(Mutex::new(Vec::new()));
    let watch = {
        let overlaps = overlaps.clone();
        tokio::spawn(async move {
            loop {
                {
                    let running = ORDERED_RUNNING.lock().unwrap();
                    let distinct: HashSet<&String> = running.iter().collect();
                    if distinct.len() < running.len() {
                        overlaps.lock().unwrap().push(running.clone());
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let consumer = support::Running::start(
        inoutbox::Consumer::builder(
            "tp-ordered",
            db.store(),
            support::kafka(&broker.brokers, &topic),
        )
        .two_phase_workers(8)
        .two_phase_poll(Duration::from_millis(50)),
    );
    let all = (keys * per_key) as i64;
    wait_count(
        &db,
        "SELECT count(*) FROM receipts",
        all,
        Duration::from_secs(120),
        "ordered two-phase events",
    )
    .await;
    consumer.stop().await;
    watch.abort();

    let overlaps = overlaps.lock().unwrap().clone();
    assert!(
        overlaps.is_empty(),
        "two events of one key ran at once: {:?}",
        &overlaps[..overlaps.len().min(3)]
    );
    let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, offset) in ORDERED_CALLS.lock().unwrap().iter() {
        per.entry(key.clone()).or_default().push(*offset);
    }
    assert_eq!(per.len(), keys, "every key ran");
    for (key, offsets) in &per {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "{key}: runs out of offset order: {offsets:?}"
        );
        assert_eq!(offsets.len(), per_key, "{key}: each event once");
    }
    assert_each_once(&receipts_per_order(&db).await, &orders);
}

// ---------------------------------------------------------------------------------------------
// Effects after commit belong to their consumer group, and a panicking executor is a failed
// run, not the end of the drain.

#[inoutbox::inbox_handler(event = "OrderCreated", group = "tp-effects")]
async fn effects_group_handler(
    _event: OrderCreated,
    _tx: &mut inoutbox::PgTx<'_>,
) -> Result<(), inoutbox::HandlerError> {
    Ok(())
}

#[inoutbox::inbox_handler(event = "OrderCreated", group = "tp-effects")]
async fn effects_group_handler_sqlite(
    _event: OrderCreated,
    _tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), inoutbox::HandlerError> {
    Ok(())
}

#[cfg(feature = "mysql")]
#[inoutbox::inbox_handler(event = "OrderCreated", group = "tp-effects")]
async fn effects_group_handler_mysql(
    _event: OrderCreated,
    _tx: &mut inoutbox::MySqlTx<'_>,
) -> Result<(), inoutbox::HandlerError> {
    Ok(())
}

/// The effects tests run on every store: `name` on PostgreSQL, `name_sqlite` on SQLite and
/// `name_mysql` on MariaDB, one generic body `body::<K>()`.
macro_rules! on_every_store {
    ($($name:ident, $sqlite:ident, $mysql:ident => $body:ident;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $body::<PgKit>().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $sqlite() {
                $body::<SqliteKit>().await
            }

            #[cfg(feature = "mysql")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $mysql() {
                $body::<support::kit::MySqlKit>().await
            }
        )*
    };
}

on_every_store! {
    a_group_drains_only_its_own_effects_and_an_executor_panic_is_a_counted_retried_failure,
    a_group_drains_only_its_own_effects_and_an_executor_panic_is_a_counted_retried_failure_sqlite,
    a_group_drains_only_its_own_effects_and_an_executor_panic_is_a_counted_retried_failure_mysql
        => group_scope_and_panics;
    eight_slow_effects_run_at_once_each_exactly_once,
    eight_slow_effects_run_at_once_each_exactly_once_sqlite,
    eight_slow_effects_run_at_once_each_exactly_once_mysql => eight_slow_effects;
    effect_concurrency_bounds_the_effects_in_flight,
    effect_concurrency_bounds_the_effects_in_flight_sqlite,
    effect_concurrency_bounds_the_effects_in_flight_mysql => concurrency_bound;
    the_consumer_purges_old_done_effects_and_counts_those_not_done,
    the_consumer_purges_old_done_effects_and_counts_those_not_done_sqlite,
    the_consumer_purges_old_done_effects_and_counts_those_not_done_mysql => purge_and_counts;
    the_stop_starts_no_effect_and_is_bounded_by_the_grace_period,
    the_stop_starts_no_effect_and_is_bounded_by_the_grace_period_sqlite,
    the_stop_starts_no_effect_and_is_bounded_by_the_grace_period_mysql => stop_within_grace;
}

/// Polls `sql` (a count) on `kit` until it reaches `target`; panics with `what` after `within`.
async fn wait_count_in<K: Kit>(kit: &K, sql: &str, target: i64, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let n = kit.count(sql).await;
        if n >= target {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: `{sql}` is {n}, expected {target} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The store's current time, in its timestamp type.
fn now<K: Kit>() -> String {
    K::days_ago(0)
}

async fn group_scope_and_panics<K: Kit>() {
    use inoutbox::effects::Effect;
    use support::memory::{MemoryBroker, MemoryTransport};

    let db = K::new("tp_effects_scope").await;
    let store = db.store();
    // Oldest first: the panicking effect is claimed before the one that works.
    for (group, kind, key) in [
        ("tp-effects", "boom", "k-boom"),
        ("tp-effects", "mail", "k-mail"),
        ("another-service", "mail", "k-other"),
    ] {
        insert_effect(&db, group, kind, key).await;
    }
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    let broker = MemoryBroker::new();
    broker.create_topic("tp-effects", 1);
    let consumer = inoutbox::Consumer::builder(
        "tp-effects",
        store,
        MemoryTransport::new(&broker, ["tp-effects"]),
    )
    .effect("boom", |_effect: Effect| async move {
        if true {
            panic!("the mail service client panicked");
        }
        Ok(())
    })
    .effect("mail", move |effect: Effect| {
        let record = record.clone();
        async move {
            record.lock().unwrap().push(effect.idempotency_key);
            Ok(())
        }
    })
    .build()
    .expect("consumer");
    let health = consumer.health();
    let token = inoutbox::shutdown::CancellationToken::new();
    let run = tokio::spawn(consumer.run_until_cancelled(token.clone()));

    wait_count_in(
        &db,
        "SELECT count(*) FROM inoutbox_effects WHERE idempotency_key = 'k-mail' AND done_at IS NOT NULL",
        1,
        Duration::from_secs(30),
        "the group's working effect ran after the panicking one",
    )
    .await;
    wait_count_in(
        &db,
        &format!(
            "SELECT count(*) FROM inoutbox_effects WHERE idempotency_key = 'k-boom' AND attempts >= 1 \
               AND done_at IS NULL AND lease_until > {now} \
               AND last_error LIKE 'the executor panicked: the mail service client panicked%'",
            now = now::<K>()
        ),
        1,
        Duration::from_secs(30),
        "the panic is a failed run, counted and retried after a backoff",
    )
    .await;
    assert!(
        health.live(),
        "the drain lives on after an executor's panic"
    );
    token.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the consumer stopped")
        .expect("no panic")
        .expect("the consumer ran");

    assert_eq!(
        *sent.lock().unwrap(),
        ["k-mail"],
        "only the group's own effect was sent"
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM inoutbox_effects WHERE idempotency_key = 'k-other' \
               AND lease_owner IS NULL AND attempts = 0"
        )
        .await,
        1,
        "another group's effect is never claimed"
    );
}

// ---------------------------------------------------------------------------------------------
// Effects run several at once (bounded), are counted, and done ones are purged.

#[inoutbox::inbox_handler(event = "OrderCreated", group = "tp-reviews")]
async fn reviews_group_handler(
    _event: OrderCreated,
    _tx: &mut inoutbox::PgTx<'_>,
) -> Result<(), inoutbox::HandlerError> {
    Ok(())
}

#[inoutbox::inbox_handler(event = "OrderCreated", group = "tp-reviews")]
async fn reviews_group_handler_sqlite(
    _event: OrderCreated,
    _tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), inoutbox::HandlerError> {
    Ok(())
}

#[cfg(feature = "mysql")]
#[inoutbox::inbox_handler(event = "OrderCreated", group = "tp-reviews")]
async fn reviews_group_handler_mysql(
    _event: OrderCreated,
    _tx: &mut inoutbox::MySqlTx<'_>,
) -> Result<(), inoutbox::HandlerError> {
    Ok(())
}

/// Inserts an effect of `kind` for `group` with event id and idempotency key `key`.
async fn insert_effect<K: Kit>(db: &K, group: &str, kind: &str, key: &str) {
    db.exec(&format!(
        "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, payload) \
         VALUES ('{group}', '', '{key}', '{kind}', '{key}', '{{}}')"
    ))
    .await;
}

/// Inserts `n` effects of `kind` for `group`, with idempotency keys `k-0` to `k-{n-1}`.
async fn insert_effects<K: Kit>(db: &K, group: &str, kind: &str, n: usize) {
    for i in 0..n {
        insert_effect(db, group, kind, &format!("k-{i}")).await;
    }
}

/// What the executors of a test saw: the effects running now, the most at once, and every
/// idempotency key run.
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<std::sync::atomic::AtomicUsize>,
    max: Arc<std::sync::atomic::AtomicUsize>,
    ran: Arc<Mutex<Vec<String>>>,
}

impl InFlight {
    /// An executor that counts itself in flight for `takes` (a slow call).
    fn executor(
        &self,
        takes: Duration,
    ) -> impl Fn(
        inoutbox::effects::Effect,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), inoutbox::HandlerError>> + Send>,
    > + Send
           + Sync
           + 'static {
        let this = self.clone();
        move |effect| {
            let this = this.clone();
            Box::pin(async move {
                let running = this.now.fetch_add(1, Ordering::SeqCst) + 1;
                this.max.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(takes).await;
                this.now.fetch_sub(1, Ordering::SeqCst);
                this.ran.lock().unwrap().push(effect.idempotency_key);
                Ok(())
            })
        }
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    fn ran_sorted(&self) -> Vec<String> {
        let mut ran = self.ran.lock().unwrap().clone();
        ran.sort();
        ran
    }
}

/// Runs a consumer of `tp-reviews` built by `build` until `n` of its effects are done; returns
/// how long that took.
async fn drain_reviews<K: Kit>(
    db: &K,
    n: i64,
    build: impl FnOnce(
        inoutbox::ConsumerBuilder<K::Store, support::memory::MemoryTransport>,
    ) -> inoutbox::ConsumerBuilder<K::Store, support::memory::MemoryTransport>,
) -> Duration {
    use support::memory::{MemoryBroker, MemoryTransport};
    let broker = MemoryBroker::new();
    broker.create_topic("tp-reviews", 1);
    let builder = inoutbox::Consumer::builder(
        "tp-reviews",
        db.store(),
        MemoryTransport::new(&broker, ["tp-reviews"]),
    );
    let consumer = build(builder).build().expect("consumer");
    let token = inoutbox::shutdown::CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(consumer.run_until_cancelled(token.clone()));
    wait_count_in(
        db,
        "SELECT count(*) FROM inoutbox_effects WHERE done_at IS NOT NULL",
        n,
        Duration::from_secs(60),
        "every effect done",
    )
    .await;
    let took = started.elapsed();
    token.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the consumer stopped")
        .expect("no panic")
        .expect("the consumer ran");
    took
}

/// The payments case: eight fraud reviews of 3 s each, scheduled as effects. With the default
/// concurrency all eight are in flight at once (the executors count themselves), each runs
/// exactly once and is marked done with no failed attempt.
async fn eight_slow_effects<K: Kit>() {
    let db = K::new("tp_effects_parallel").await;
    insert_effects(&db, "tp-reviews", "fraud_review", 8).await;
    let seen = InFlight::default();
    let executor = seen.executor(Duration::from_secs(3));
    let took = drain_reviews(&db, 8, |b| b.effect("fraud_review", executor)).await;
    println!("eight effects of 3 s each done in {took:?} on {}", K::NAME);

    assert_eq!(seen.max(), 8, "all eight effects were in flight at once");
    let keys: Vec<String> = (0..8).map(|i| format!("k-{i}")).collect();
    assert_eq!(seen.ran_sorted(), keys, "each effect ran exactly once");
    assert_eq!(
        db.count(
            "SELECT count(*) FROM inoutbox_effects WHERE done_at IS NOT NULL AND attempts = 0"
        )
        .await,
        8,
        "every effect done at its first run"
    );
}

/// `effect_concurrency` bounds the effects in flight; 0 is refused at build.
async fn concurrency_bound<K: Kit>() {
    use support::memory::{MemoryBroker, MemoryTransport};
    let db = K::new("tp_effects_bound").await;
    let broker = MemoryBroker::new();
    let refused = inoutbox::Consumer::builder(
        "tp-reviews",
        db.store(),
        MemoryTransport::new(&broker, ["tp-reviews"]),
    )
    .effect_concurrency(0)
    .build()
    .err()
    .expect("a concurrency of 0 is refused");
    assert!(
        refused.to_string().contains("effect_concurrency is 0"),
        "{refused}"
    );

    insert_effects(&db, "tp-reviews", "fraud_review", 6).await;
    // The effects claimed (leased) at any time: no more than the free slots, so no claimed
    // effect waits for a slot while its lease runs out.
    let stop = AtomicBool::new(false);
    let leased_sql = format!(
        "SELECT count(*) FROM inoutbox_effects WHERE done_at IS NULL AND lease_until > {}",
        now::<K>()
    );
    let leased = async {
        let mut most = 0;
        while !stop.load(Ordering::SeqCst) {
            most = most.max(db.count(&leased_sql).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    };
    let seen = InFlight::default();
    let executor = seen.executor(Duration::from_millis(300));
    let drained = async {
        drain_reviews(&db, 6, |b| {
            b.effect("fraud_review", executor).effect_concurrency(2)
        })
        .await;
        stop.store(true, Ordering::SeqCst);
    };
    let (most_leased, ()) = tokio::join!(leased, drained);
    assert!(
        (1..=2).contains(&most_leased),
        "claimed only for free slots: {most_leased} leased at once"
    );
    assert_eq!(seen.max(), 2, "at most two at once, and two did overlap");
    assert_eq!(seen.ran_sorted().len(), 6, "each effect ran once");
}

/// The retention task deletes effects done before the window, in batches; effects done
/// within it, and effects not done however old, stay. The counts behind the gauges and
/// `inoutbox status` see the effects not done.
async fn purge_and_counts<K: Kit>() {
    use inoutbox::store::InboxStore;
    use support::memory::{MemoryBroker, MemoryTransport};
    let db = K::new("tp_effects_retention").await;
    let store = db.store();
    let insert = "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, payload";
    for (prefix, n, days) in [("old", 5, 8), ("new", 3, 6)] {
        for i in 1..=n {
            db.exec(&format!(
                "{insert}, done_at) VALUES ('tp-reviews', '', '{prefix}-{i}', 'mail', '{prefix}-{i}', '{{}}', {})",
                K::days_ago(days)
            ))
            .await;
        }
    }
    db.exec(&format!(
        "{insert}, created_at, attempts) \
         VALUES ('tp-reviews', '', 'failing', 'mail', 'failing', '{{}}', {}, 4), \
                ('tp-reviews', '', 'waiting', 'mail', 'waiting', '{{}}', {}, 0)",
        K::days_ago(9),
        now::<K>()
    ))
    .await;

    let counts = store.count_effects("tp-reviews").await.expect("counts");
    assert_eq!((counts.pending, counts.failed), (2, 1), "{counts:?}");
    let oldest = counts.oldest_pending_secs.expect("an age");
    assert!(oldest >= 9.0 * 86_400.0, "{oldest}");
    let none = store.count_effects("another-group").await.expect("counts");
    assert_eq!(
        (none.pending, none.failed, none.oldest_pending_secs),
        (0, 0, None)
    );

    let broker = MemoryBroker::new();
    broker.create_topic("tp-reviews", 1);
    // No executor: no drain, the effects not done stay as they are.
    let consumer = inoutbox::Consumer::builder(
        "tp-reviews",
        store,
        MemoryTransport::new(&broker, ["tp-reviews"]),
    )
    .retention(Some(
        inoutbox::outbox::Retention::default()
            .older_than(Duration::from_secs(7 * 86_400))
            .batch_size(2)
            .interval(Duration::from_millis(100)),
    ))
    .build()
    .expect("consumer");
    let token = inoutbox::shutdown::CancellationToken::new();
    let run = tokio::spawn(consumer.run_until_cancelled(token.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while db
        .count("SELECT count(*) FROM inoutbox_effects WHERE event_id LIKE 'old-%'")
        .await
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "old done effects were not purged within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    token.cancel();
    run.await.expect("join").expect("consumer");
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_effects WHERE event_id LIKE 'new-%'")
            .await,
        3,
        "effects done within the window stay"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_effects WHERE done_at IS NULL")
            .await,
        2,
        "effects not done stay, however old"
    );
}

/// At shutdown no further effect starts, and effects in flight that outlast the transport's
/// grace period are abandoned (aborted, left claimed, run again after their lease): the stop
/// takes the grace period, not the effects' time.
async fn stop_within_grace<K: Kit>() {
    let db = K::new("tp_effects_stop").await;
    insert_effects(&db, "tp-reviews", "fraud_review", 4).await;
    let kafka = inoutbox::kafka::InProcessKafka::start().expect("in-process Kafka");
    kafka.create_topic("tp-reviews", 1).expect("topic");
    let seen = InFlight::default();
    let consumer = inoutbox::Consumer::builder(
        "tp-reviews",
        db.store(),
        kafka
            .consumer_config(["tp-reviews"])
            .shutdown_grace(Duration::from_millis(500)),
    )
    .effect("fraud_review", seen.executor(Duration::from_secs(600)))
    .effect_concurrency(2)
    .build()
    .expect("consumer");
    let token = inoutbox::shutdown::CancellationToken::new();
    let run = tokio::spawn(consumer.run_until_cancelled(token.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.now.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "two effects started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token.cancel();
    // Well under the 30 s after which an executor's run is cut as an overrun of its lease.
    tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("the stop took the grace period, not the effects' 600 s")
        .expect("no panic")
        .expect("the consumer ran");
    assert_eq!(seen.max(), 2, "no effect started after the stop");
    assert!(
        seen.ran_sorted().is_empty(),
        "the two in flight were abandoned"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_effects WHERE done_at IS NULL AND attempts = 0")
            .await,
        4,
        "none marked done or failed: the abandoned ones run again after their lease"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM inoutbox_effects WHERE lease_until > {}",
            now::<K>()
        ))
        .await,
        2,
        "the two in flight stay claimed until their lease expires"
    );
}

// ---------------------------------------------------------------------------------------------
// Two-phase handlers on SQLite (inbox migration 8): one writer at a time, so a lease is a row's
// owner and expiry claimed by a write, and the handler's transaction holds the write lock from
// its lease check to its end.

/// A migrated SQLite store on a database file of its own, whose connections wait `busy` for
/// the write lock; the directory goes with the returned guard.
async fn sqlite_store(
    name: &str,
    busy: Duration,
) -> (support::kit::TempDir, inoutbox::SqliteStore) {
    let dir = support::kit::TempDir::new(name);
    let store = sqlite_store_at(&dir, busy).await;
    store.migrate().await.expect("migrate SQLite");
    sqlx::raw_sql("CREATE TABLE receipts (order_id text NOT NULL, worker text NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create receipts");
    (dir, store)
}

/// A second store on the database file of `dir` (another process's view of it).
async fn sqlite_store_at(dir: &support::kit::TempDir, busy: Duration) -> inoutbox::SqliteStore {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let options = SqliteConnectOptions::new()
        .filename(dir.0.join("inoutbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(busy);
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("open SQLite");
    inoutbox::SqliteStore::new(pool)
}

/// One received row of group `group` (event type `Slow`), committed; returns its key.
async fn received_row<S: inoutbox::store::InboxStore>(
    store: &S,
    group: &str,
) -> inoutbox::store::InboxKey {
    use inoutbox::store::{ClaimRequest, InboxKey};
    let key = InboxKey {
        group: group.into(),
        source: String::new(),
        event_id: Uuid::new_v4().to_string(),
        business_key: None,
    };
    let delivery = inoutbox::inbox::Delivery {
        topic: "t".into(),
        partition: 0,
        offset: 7,
        key: Some(b"account-1".to_vec()),
        payload: Some(b"{\"n\":1}".to_vec()),
        headers: vec![
            ("ce_type".into(), Some(b"Slow".to_vec())),
            ("none".into(), None),
        ],
    };
    let request = ClaimRequest {
        key: &key,
        event_type: "Slow",
        delivery: &delivery,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.receive(&mut tx, &[request]).await.unwrap(), [true]);
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.receive(&mut tx, &[request]).await.unwrap(),
        [false],
        "a redelivery of a received message is a duplicate"
    );
    store.commit(tx).await.unwrap();
    key
}

fn sqlite_lease<'a>(
    group: &'a str,
    owner: &'a str,
    lease: Duration,
) -> inoutbox::store::LeaseRequest<'a> {
    inoutbox::store::LeaseRequest {
        group,
        owner,
        lease,
        event_types: &["Slow"],
        ordered: &[],
    }
}

/// What a worker's run does in its transaction, as `Inbox::run` does it: check the lease,
/// run the handler (a receipt), mark the row processed if the lease still holds, commit; or
/// roll back. Returns whether it committed.
async fn leased_run<S: inoutbox::store::InboxStore>(
    store: &S,
    key: &inoutbox::store::InboxKey,
    owner: &str,
) -> bool
where
    S::Tx: inoutbox::db::Executes,
{
    let mut tx = store.begin().await.unwrap();
    if store
        .check_lease(&mut tx, key, owner)
        .await
        .unwrap()
        .is_none()
    {
        store.rollback(tx).await.unwrap();
        return false;
    }
    inoutbox::sql("INSERT INTO receipts (order_id, worker) VALUES ($1, $2)")
        .bind(key.event_id.as_str())
        .bind(owner)
        .execute(&mut tx)
        .await
        .unwrap();
    if !store
        .finish_leased(&mut tx, key, owner, false)
        .await
        .unwrap()
    {
        store.rollback(tx).await.unwrap();
        return false;
    }
    store.commit(tx).await.unwrap();
    true
}

async fn sqlite_count(store: &inoutbox::SqliteStore, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
        .fetch_one(store.pool())
        .await
        .expect(sql)
}

/// Worker A's lease expires before its transaction (a pause, a stop) and B, on `other`, takes
/// the row over: A's run must roll back and B's commit, the event applied once. `count` reads
/// one number from the store's database.
async fn a_lost_lease_rolls_back<S: inoutbox::store::InboxStore>(
    store: &S,
    other: &S,
    count: impl AsyncFn(&str) -> i64,
) where
    S::Tx: inoutbox::db::Executes,
{
    let key = received_row(store, "tp-lost").await;
    let a = store
        .claim_received(&sqlite_lease("tp-lost", "A", Duration::from_millis(200)))
        .await
        .unwrap()
        .expect("A claims the received row");
    assert_eq!(a.key, key);
    assert_eq!(a.delivery.offset, 7);
    assert_eq!(a.delivery.key.as_deref(), Some(&b"account-1"[..]));
    assert_eq!(a.delivery.payload.as_deref(), Some(&b"{\"n\":1}"[..]));
    assert_eq!(
        a.delivery.headers,
        [
            ("ce_type".to_owned(), Some(b"Slow".to_vec())),
            ("none".to_owned(), None)
        ],
        "the message is kept exactly"
    );
    assert!(
        other
            .claim_received(&sqlite_lease("tp-lost", "B", Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none(),
        "a live lease is not taken"
    );
    // A stalls (a pause, a stop) before its transaction: its lease expires and B takes over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = other
        .claim_received(&sqlite_lease("tp-lost", "B", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(b.is_some(), "B claims the row once A's lease expired");
    assert!(
        !store
            .renew_lease(&key, "A", Duration::from_secs(30))
            .await
            .unwrap(),
        "A no longer holds the lease: its renewal says so"
    );
    // A thaws and runs: its transaction must roll back; B's commits.
    assert!(
        !leased_run(store, &key, "A").await,
        "A's run committed without its lease"
    );
    assert!(leased_run(other, &key, "B").await, "B's run committed");
    assert_eq!(
        count("SELECT count(*) FROM receipts").await,
        1,
        "the event applied once"
    );
    assert_eq!(
        count("SELECT count(*) FROM receipts WHERE worker = 'B'").await,
        1
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL AND claims = 2 \
               AND lease_owner IS NULL"
        )
        .await,
        1,
        "the row is processed, claimed twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_that_lost_its_lease_rolls_back_and_the_event_is_applied_once() {
    let (_dir, store) = sqlite_store("tp_sqlite_lost", Duration::from_secs(30)).await;
    a_lost_lease_rolls_back(&store, &store, async |sql: &str| {
        sqlite_count(&store, sql).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_row_in_a_workers_transaction_is_not_claimed_by_another_after_its_lease_expires() {
    use inoutbox::store::InboxStore;
    let (dir, store) = sqlite_store("tp_sqlite_lock", Duration::from_secs(30)).await;
    // Another process, which waits little for the write lock.
    let other = sqlite_store_at(&dir, Duration::from_millis(300)).await;
    let key = received_row(&store, "tp-lock").await;
    let lease = Duration::from_millis(200);
    assert!(store
        .claim_received(&sqlite_lease("tp-lock", "A", lease))
        .await
        .unwrap()
        .is_some());
    // A's handler transaction begins: it checks its lease, and its handler runs past it.
    let mut a = store.begin().await.unwrap();
    assert_eq!(store.check_lease(&mut a, &key, "A").await.unwrap(), Some(0));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = other
        .claim_received(&sqlite_lease("tp-lock", "B", Duration::from_secs(30)))
        .await;
    assert!(
        !matches!(b, Ok(Some(_))),
        "B claimed the row while A's handler runs on it: two runs at once"
    );
    assert!(store.finish_leased(&mut a, &key, "A", false).await.unwrap());
    store.commit(a).await.unwrap();
    assert!(
        other
            .claim_received(&sqlite_lease("tp-lock", "B", Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none(),
        "a processed row is never claimed"
    );
    assert_eq!(
        sqlite_count(
            &store,
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_that_dies_mid_handler_leaves_nothing_and_its_row_is_run_again_once() {
    use inoutbox::store::InboxStore;
    let (dir, store) = sqlite_store("tp_sqlite_crash", Duration::from_secs(30)).await;
    let key = received_row(&store, "tp-crash").await;
    {
        // The worker's process: it claims, its handler writes, and it dies before the commit
        // (its connection closes: SQLite rolls the transaction back).
        let dying = sqlite_store_at(&dir, Duration::from_secs(30)).await;
        assert!(dying
            .claim_received(&sqlite_lease("tp-crash", "A", Duration::from_millis(300)))
            .await
            .unwrap()
            .is_some());
        let mut tx = dying.begin().await.unwrap();
        assert_eq!(
            dying.check_lease(&mut tx, &key, "A").await.unwrap(),
            Some(0)
        );
        sqlx::query("INSERT INTO receipts (order_id, worker) VALUES ($1, 'A')")
            .bind(&key.event_id)
            .execute(&mut *tx)
            .await
            .unwrap();
        drop(tx);
        dying.pool().close().await;
    }
    assert_eq!(
        sqlite_count(&store, "SELECT count(*) FROM receipts").await,
        0
    );
    let lease = sqlite_lease("tp-crash", "B", Duration::from_secs(30));
    assert!(
        store.claim_received(&lease).await.unwrap().is_none(),
        "the dead worker's lease holds until it expires"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        store.claim_received(&lease).await.unwrap().is_some(),
        "the row is claimed again once the dead worker's lease expired"
    );
    assert!(leased_run(&store, &key, "B").await);
    assert_eq!(
        sqlite_count(&store, "SELECT count(*) FROM receipts").await,
        1
    );
    assert_eq!(
        sqlite_count(
            &store,
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL AND claims = 2"
        )
        .await,
        1
    );
}

/// A payment review of the zero-setup test: a two-phase handler records it, and schedules the
/// notification as an effect after commit.
#[derive(Debug, serde::Serialize, serde::Deserialize, inoutbox::OutboxEvent)]
#[outbox(event_type = "ZeroReviewAsked", topic = "tp-zero-reviews", key = order_id)]
struct ZeroReviewAsked {
    order_id: Uuid,
}

#[inoutbox::inbox_handler(event = "ZeroReviewAsked", group = "tp-zero", mode = "two_phase")]
async fn zero_review(
    event: ZeroReviewAsked,
    tx: &mut inoutbox::SqliteTx<'_>,
    meta: &inoutbox::MessageMeta,
) -> Result<(), inoutbox::HandlerError> {
    sqlx::query("INSERT INTO zero_reviews (order_id) VALUES ($1)")
        .bind(event.order_id.to_string())
        .execute(&mut **tx)
        .await?;
    inoutbox::effects::after_commit(tx, meta, "notify", &event.order_id).await?;
    Ok(())
}

/// The zero-setup mode (a SQLite file, Kafka in the process) runs a two-phase handler and its
/// effect: each event received, claimed by a worker, handled once, and its effect run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_zero_setup_mode_runs_a_two_phase_handler_and_its_effect_after_commit() {
    use inoutbox::app::{ConsumerSpec, Store};
    use inoutbox::effects::Effect;

    let app = inoutbox::App::connect(None, None)
        .await
        .expect("zero-setup app");
    let Store::Sqlite(store) = app.store().clone() else {
        panic!("the zero-setup store is SQLite")
    };
    sqlx::raw_sql("CREATE TABLE zero_reviews (order_id text NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create zero_reviews");
    app.create_topic("tp-zero-reviews", 2).await.expect("topic");
    let notified = Arc::new(Mutex::new(Vec::new()));
    let record = notified.clone();
    let spec = ConsumerSpec::new("tp-zero", ["tp-zero-reviews"])
        .two_phase_workers(2)
        .two_phase_poll(Duration::from_millis(50))
        .effect("notify", move |effect: Effect| {
            let record = record.clone();
            async move {
                let order: Uuid = effect.payload_as()?;
                record.lock().unwrap().push((order, effect.idempotency_key));
                Ok(())
            }
        });
    let orders: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
    for order_id in &orders {
        let mut tx = store.pool().begin().await.expect("begin");
        inoutbox::outbox::enqueue(
            &mut tx,
            &ZeroReviewAsked {
                order_id: *order_id,
            },
        )
        .await
        .expect("enqueue");
        tx.commit().await.expect("commit");
    }
    let mut app = app.consumer_with(spec).relay();
    let stop = app.shutdown_token();
    let running = tokio::spawn(async move { app.run().await });
    let deadline = Instant::now() + Duration::from_secs(60);
    while notified.lock().unwrap().len() < orders.len() {
        if running.is_finished() {
            panic!("the app stopped: {:?}", running.await);
        }
        assert!(
            Instant::now() < deadline,
            "effects run: {:?}",
            notified.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the app stopped")
        .expect("no panic")
        .expect("the app ran");

    let notified = notified.lock().unwrap().clone();
    let mut once: Vec<Uuid> = notified.iter().map(|(o, _)| *o).collect();
    once.sort();
    let mut expected = orders.clone();
    expected.sort();
    assert_eq!(once, expected, "each order's effect ran once");
    let keys: HashSet<&String> = notified.iter().map(|(_, k)| k).collect();
    assert_eq!(keys.len(), orders.len(), "one idempotency key per event");
    assert_eq!(
        sqlite_count(&store, "SELECT count(*) FROM zero_reviews").await,
        5,
        "each handler applied once"
    );
    // Through the two-phase path: received rows, each claimed by a worker, then processed.
    assert_eq!(
        sqlite_count(
            &store,
            "SELECT count(*) FROM inoutbox_inbox WHERE consumer_group = 'tp-zero' \
               AND processed_at IS NOT NULL AND claims = 1 AND payload IS NOT NULL"
        )
        .await,
        5,
        "each event received, claimed once, and processed"
    );
}

// ---------------------------------------------------------------------------------------------
// Two-phase handlers on MariaDB (inbox migration 2): claims are short transactions of `SELECT
// .. FOR UPDATE SKIP LOCKED` and the lease's `UPDATE`; the handler's transaction locks its row
// (`FOR UPDATE`) from its lease check to its end, and handlers run in parallel.

/// A migrated MariaDB database of its own with a `receipts` table, and a second store on it
/// with a pool of its own (another process's view of it).
#[cfg(feature = "mysql")]
async fn mysql_stores(
    name: &str,
) -> (
    support::kit::MySqlKit,
    inoutbox::MySqlStore,
    inoutbox::MySqlStore,
) {
    use support::kit::Kit;
    let kit = support::kit::MySqlKit::new(name).await;
    kit.exec(
        "CREATE TABLE receipts (id bigint AUTO_INCREMENT PRIMARY KEY, order_id varchar(255) NOT NULL, \
         worker varchar(255) NOT NULL)",
    )
    .await;
    let store = kit.store();
    let options = (*store.pool().connect_options()).clone();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(10)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with(options)
        .await
        .expect("a second pool on MariaDB");
    (kit, store, inoutbox::MySqlStore::new(pool))
}

#[cfg(feature = "mysql")]
async fn mysql_count(kit: &support::kit::MySqlKit, sql: &str) -> i64 {
    support::kit::Kit::count(kit, sql).await
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_worker_that_lost_its_lease_rolls_back_and_the_event_is_applied_once() {
    let (kit, store, other) = mysql_stores("tp_my_lost").await;
    a_lost_lease_rolls_back(&store, &other, async |sql: &str| {
        mysql_count(&kit, sql).await
    })
    .await;
}

/// Worker A holds a received row in its handler's transaction when its lease expires: B's
/// claim (another pool: another process) skips the row instead of running it beside A, A's
/// renewal neither waits for A's own transaction nor says the lease is lost, and A's processed
/// mark commits.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_row_in_a_workers_transaction_is_not_claimed_by_another_after_its_lease_expires() {
    use inoutbox::store::InboxStore;
    let (kit, store, other) = mysql_stores("tp_my_lock").await;
    let key = received_row(&store, "tp-lock").await;
    let lease = Duration::from_millis(200);
    assert!(store
        .claim_received(&sqlite_lease("tp-lock", "A", lease))
        .await
        .unwrap()
        .is_some());
    // A's handler transaction begins: it checks its lease, and its handler runs past it.
    let mut a = store.begin().await.unwrap();
    assert_eq!(store.check_lease(&mut a, &key, "A").await.unwrap(), Some(0));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = other
        .claim_received(&sqlite_lease("tp-lock", "B", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        b.is_none(),
        "B claimed the row while A's handler runs on it: two runs at once"
    );
    let renewing = Instant::now();
    let renewed = tokio::time::timeout(
        Duration::from_secs(10),
        store.renew_lease(&key, "A", Duration::from_secs(30)),
    )
    .await
    .expect("the renewal waited for the handler's transaction")
    .unwrap();
    assert!(renewed, "A still holds its row: the renewal says so");
    assert!(renewing.elapsed() < Duration::from_secs(5));
    assert!(store.finish_leased(&mut a, &key, "A", false).await.unwrap());
    store.commit(a).await.unwrap();
    assert!(
        other
            .claim_received(&sqlite_lease("tp-lock", "B", Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none(),
        "a processed row is never claimed"
    );
    assert_eq!(
        mysql_count(
            &kit,
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL AND claims = 1"
        )
        .await,
        1
    );
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_worker_that_dies_mid_handler_leaves_nothing_and_its_row_is_run_again_once() {
    use inoutbox::store::InboxStore;
    let (kit, store, dying) = mysql_stores("tp_my_crash").await;
    let key = received_row(&store, "tp-crash").await;
    let lease = Duration::from_secs(1);
    // The worker's process: it claims, its handler writes, and it dies before the commit (its
    // connection is killed: the server rolls the transaction back).
    assert!(dying
        .claim_received(&sqlite_lease("tp-crash", "A", lease))
        .await
        .unwrap()
        .is_some());
    let mut tx = dying.begin().await.unwrap();
    assert_eq!(
        dying.check_lease(&mut tx, &key, "A").await.unwrap(),
        Some(0)
    );
    sqlx::query("INSERT INTO receipts (order_id, worker) VALUES (?, 'A')")
        .bind(&key.event_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    let connection: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    support::kit::Kit::exec(&kit, &format!("KILL {connection}")).await;
    drop(tx);
    dying.pool().close().await;
    assert_eq!(mysql_count(&kit, "SELECT count(*) FROM receipts").await, 0);
    let b = sqlite_lease("tp-crash", "B", Duration::from_secs(30));
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    assert!(
        store.claim_received(&b).await.unwrap().is_some(),
        "the row is claimed again once the dead worker's lease expired"
    );
    assert!(leased_run(&store, &key, "B").await);
    assert_eq!(mysql_count(&kit, "SELECT count(*) FROM receipts").await, 1);
    assert_eq!(
        mysql_count(
            &kit,
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL AND claims = 2"
        )
        .await,
        1
    );
}

/// Per-key order: while the earlier row of a key is in a worker's transaction (locked), a claim
/// of the ordered type takes neither it nor the later row of its key; once it is processed, the
/// later row is claimed.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_ordered_keeps_one_row_of_a_key_in_flight_while_it_is_locked() {
    use inoutbox::store::InboxStore;
    let (_kit, store, other) = mysql_stores("tp_my_ordered").await;
    let early = received_row(&store, "tp-ordered").await;
    let late = received_row(&store, "tp-ordered").await;
    let ordered = |owner| inoutbox::store::LeaseRequest {
        group: "tp-ordered",
        owner,
        lease: Duration::from_secs(30),
        event_types: &["Slow"],
        ordered: &["Slow"],
    };
    // Both rows have offset 7 in `received_row`: give the later one offset 8.
    support::kit::Kit::exec(
        &_kit,
        &format!(
            "UPDATE inoutbox_inbox SET \"offset\" = 8 WHERE event_id = '{}'",
            late.event_id
        ),
    )
    .await;
    let a = store.claim_received(&ordered("A")).await.unwrap();
    assert_eq!(
        a.map(|r| r.key),
        Some(early.clone()),
        "the earlier row first"
    );
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.check_lease(&mut tx, &early, "A").await.unwrap(),
        Some(0)
    );
    assert!(
        other.claim_received(&ordered("B")).await.unwrap().is_none(),
        "the later row of a key was claimed while the earlier one is in a worker's transaction"
    );
    assert!(store
        .finish_leased(&mut tx, &early, "A", false)
        .await
        .unwrap());
    store.commit(tx).await.unwrap();
    let b = other.claim_received(&ordered("B")).await.unwrap();
    assert_eq!(b.map(|r| r.key), Some(late), "then the later one");
}

/// A review that takes a while, by a two-phase handler on MariaDB (the parallel test's).
#[cfg(feature = "mysql")]
#[derive(Debug, serde::Serialize, serde::Deserialize, inoutbox::OutboxEvent)]
#[outbox(event_type = "MyReviewAsked", topic = "tp-my-reviews", key = id)]
struct MyReviewAsked {
    id: String,
}

/// The event ids whose handler runs now, and the most runs at once.
#[cfg(feature = "mysql")]
static MY_RUNNING: Mutex<(Vec<String>, usize)> = Mutex::new((Vec::new(), 0));
/// Event ids run twice at once (must stay empty).
#[cfg(feature = "mysql")]
static MY_OVERLAPS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[cfg(feature = "mysql")]
#[inoutbox::inbox_handler(event = "MyReviewAsked", group = "tp-my-parallel", mode = "two_phase")]
async fn my_review(
    event: MyReviewAsked,
    tx: &mut inoutbox::MySqlTx<'_>,
    meta: &inoutbox::MessageMeta,
) -> Result<(), inoutbox::HandlerError> {
    {
        let mut running = MY_RUNNING.lock().unwrap();
        if running.0.contains(&event.id) {
            MY_OVERLAPS.lock().unwrap().push(event.id.clone());
        }
        running.0.push(event.id.clone());
        running.1 = running.1.max(running.0.len());
    }
    inoutbox::sql("INSERT INTO receipts (order_id, worker) VALUES ($1, 'any')")
        .bind(event.id.as_str())
        .execute(&mut **tx)
        .await?;
    inoutbox::effects::after_commit(tx, meta, "notify", &event.id).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut running = MY_RUNNING.lock().unwrap();
    if let Some(at) = running.0.iter().position(|k| *k == event.id) {
        running.0.remove(at);
    }
    // Every third event fails its first run after scheduling its effect: the rollback must
    // take the effect with it.
    if meta.attempt == 1 && event.id.ends_with(['0', '3', '6', '9']) {
        return Err(inoutbox::HandlerError::transient(
            "the review service is busy",
        ));
    }
    Ok(())
}

/// Two consumers (two pools: two processes) of a group with a two-phase handler of 300 ms on
/// MariaDB: no row runs twice at once, several run at once, each event is applied once, and
/// its effect after commit runs once (the failed first runs left none).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_two_workers_never_run_the_same_row_at_once_and_effects_run_once_after_commit() {
    use support::memory::{MemoryBroker, MemoryTransport, Message, RunningConsumer};
    let (kit, store, other) = mysql_stores("tp_my_parallel").await;
    let broker = MemoryBroker::new();
    broker.create_topic("tp-my-reviews", 2);
    let n = 24;
    for i in 0..n {
        let id = format!("review-{i}");
        let payload = serde_json::json!({ "id": id }).to_string();
        broker.produce(
            "tp-my-reviews",
            None,
            Message::new(payload)
                .key(id.as_str())
                .header("ce_id", &id)
                .header("ce_type", "MyReviewAsked"),
        );
    }
    let notified = Arc::new(Mutex::new(Vec::new()));
    let consumer = |store: inoutbox::MySqlStore| {
        let record = notified.clone();
        inoutbox::Consumer::builder(
            "tp-my-parallel",
            store,
            MemoryTransport::new(&broker, ["tp-my-reviews"]),
        )
        .two_phase_workers(4)
        .two_phase_poll(Duration::from_millis(50))
        .effect("notify", move |effect: inoutbox::effects::Effect| {
            let record = record.clone();
            async move {
                let id: String = effect.payload_as()?;
                record.lock().unwrap().push((id, effect.idempotency_key));
                Ok(())
            }
        })
    };
    let started = Instant::now();
    let a = RunningConsumer::start(consumer(store.clone()));
    let b = RunningConsumer::start(consumer(other.clone()));
    wait_count_in(
        &kit,
        "SELECT count(*) FROM inoutbox_effects WHERE done_at IS NOT NULL",
        n,
        Duration::from_secs(120),
        "every review handled and its effect run",
    )
    .await;
    let took = started.elapsed();
    a.stop().await;
    b.stop().await;
    eprintln!("MariaDB two-phase: {n} handlers of 300 ms on 2 x 4 workers in {took:?}");

    let overlaps = MY_OVERLAPS.lock().unwrap().clone();
    assert!(overlaps.is_empty(), "rows run twice at once: {overlaps:?}");
    let most = MY_RUNNING.lock().unwrap().1;
    assert!(most > 1, "the two-phase handlers never ran in parallel");
    assert_eq!(
        mysql_count(&kit, "SELECT count(*) FROM receipts").await,
        n,
        "each event applied once (no receipt of a failed run, none twice)"
    );
    assert_eq!(
        mysql_count(&kit, "SELECT count(DISTINCT order_id) FROM receipts").await,
        n
    );
    let notified = notified.lock().unwrap().clone();
    let ids: HashSet<&String> = notified.iter().map(|(id, _)| id).collect();
    let keys: HashSet<&String> = notified.iter().map(|(_, k)| k).collect();
    assert_eq!(
        notified.len() as i64,
        n,
        "each effect ran once: {notified:?}"
    );
    assert_eq!((ids.len() as i64, keys.len() as i64), (n, n));
    assert_eq!(
        mysql_count(&kit, "SELECT count(*) FROM inoutbox_effects").await,
        n,
        "one effect per event: the failed runs' rolled back"
    );
    assert_eq!(
        mysql_count(
            &kit,
            "SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL AND payload IS NOT NULL"
        )
        .await,
        n,
        "through the two-phase path: received rows, processed"
    );
}
