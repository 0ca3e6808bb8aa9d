//! The NATS JetStream transport against real `nats-server -js` processes (one per test, on a
//! free port with a store of its own) and PostgreSQL: the relay's envelope and `Nats-Msg-Id`, a
//! member whose lease was taken cannot acknowledge, a second member takes over a killed one's
//! partitions, a server killed and restarted on its store loses and doubles nothing, and
//! hostile messages (a header of raw bytes too) are dead-lettered while the partition goes on.
//! (The contract suite, tests/contract.rs, runs on NATS too: duplicates, seed 003's table,
//! racing consumers, a rebalance, a graceful stop, the relay's order, on every store.)

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use inoutbox::nats::{partition_for, subject, NatsPublisher};
use inoutbox::outbox;
use inoutbox::prelude::*;
use inoutbox::{Consumer, Outcome, RetryPolicy};
use nats_support::{ack_floor, config, publish, publish_order, NatsServer, Setup};
use serde::{Deserialize, Serialize};
use support::nats as nats_support;
use support::Running;
use support::TestDb;
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

async fn distinct_invoices(db: &TestDb) -> i64 {
    db.count("SELECT count(DISTINCT order_id) FROM invoices")
        .await
}

/// Waits (at most `within`: a liveness bound, not a speed check) until `n` invoices exist.
async fn wait_for_invoices(db: &TestDb, n: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let have = db.invoices().await;
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{have} of {n} invoices after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The relay publishes with the CloudEvents envelope, the key, and `Nats-Msg-Id` = the event id.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_publishes_with_the_envelope_and_the_dedup_header() {
    let server = NatsServer::start();
    let js = server.js().await;
    let db = TestDb::new("nats_relay").await;
    db.migrated_store().await;
    let order = Uuid::new_v4();
    let mut tx = db.pool.begin().await.expect("begin");
    let id = outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id: order,
            total_cents: 7,
        },
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    let publisher = NatsPublisher::connect(&server.url, 3)
        .await
        .expect("publisher");
    let store = inoutbox::PgStore::with_tables(db.pool.clone(), db.tables.clone());
    let relay = support::RunningRelay::spawn(
        inoutbox::Relay::builder(store, publisher)
            .build()
            .expect("relay"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while db
        .count("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL")
        .await
        > 0
    {
        assert!(Instant::now() < deadline, "the row was not published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.stop().await;
    let messages = nats_support::read_stream(&js, "orders", Duration::from_secs(2)).await;
    assert_eq!(messages.len(), 1, "one message");
    let m = &messages[0];
    let key = order.to_string();
    assert_eq!(
        m.subject.as_str(),
        subject("orders", partition_for(key.as_bytes(), 3))
    );
    let headers = m.headers.as_ref().expect("headers");
    let header = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    let id = id.to_string();
    assert_eq!(header("Nats-Msg-Id").as_deref(), Some(id.as_str()));
    assert_eq!(header("ce_id").as_deref(), Some(id.as_str()));
    assert_eq!(header("ce_type").as_deref(), Some("OrderCreated"));
    assert_eq!(header("ce_specversion").as_deref(), Some("1.0"));
    assert_eq!(header("ce_partitionkey").as_deref(), Some(key.as_str()));
    let payload: serde_json::Value = serde_json::from_slice(&m.payload).expect("json");
    assert_eq!(payload["total_cents"], 7);

    // A republish of the same event id inside the duplicate window is dropped by JetStream.
    let again = js
        .send_publish(
            m.subject.clone(),
            async_nats::jetstream::message::PublishMessage::build()
                .payload(m.payload.clone())
                .message_id(&id),
        )
        .await
        .expect("publish")
        .await
        .expect("ack");
    assert!(again.duplicate, "JetStream dropped the republish");
    assert_eq!(
        nats_support::read_stream(&js, "orders", Duration::from_secs(1))
            .await
            .len(),
        1
    );
}

// ---------------------------------------------------------------------------------------------
// Ownership: leases. A member runs on a runtime of its own in a thread: dropping that runtime
// drops every task of the member at once, as a process dying (no lease given up, the
// connection gone), and a handler that blocks the thread pauses the whole member, as SIGSTOP.

struct Isolated {
    kill: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
    reports: tokio::sync::mpsc::UnboundedReceiver<inoutbox::inbox::Report>,
}

impl Isolated {
    fn start(schema: &str, config: inoutbox::nats::NatsConfig, group: &'static str) -> Self {
        support::init_logging();
        let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
        let (kill, killed) = std::sync::mpsc::channel::<()>();
        let schema = schema.to_owned();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let db = TestDb::attach(&schema).await;
                let consumer = Consumer::builder(group, db.store(), config)
                    .reports(reports_tx)
                    .build()
                    .expect("build consumer");
                tokio::spawn(async move {
                    let _ = consumer.run(std::future::pending::<()>()).await;
                });
                while matches!(killed.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            // Every task of the member is dropped here, mid-flight.
            runtime.shutdown_background();
        });
        Self {
            kill,
            thread: Some(thread),
            reports,
        }
    }

    async fn next(&mut self) -> inoutbox::inbox::Report {
        tokio::time::timeout(Duration::from_secs(60), self.reports.recv())
            .await
            .expect("a report within 60 s")
            .expect("reports open")
    }

    fn kill(mut self) {
        let _ = self.kill.send(());
        if let Some(thread) = self.thread.take() {
            thread.join().expect("member thread");
        }
    }
}

/// The lease key of one partition in the lease bucket.
fn lease_key(group: &str, topic: &str, partition: u32) -> String {
    let token = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("{}.{}.{partition}", token(group), token(topic))
}

static FENCE_RUNS: AtomicU32 = AtomicU32::new(0);
static FENCE_PAUSED: AtomicBool = AtomicBool::new(false);
static FENCE_RELEASE: AtomicBool = AtomicBool::new(false);

/// Its first run blocks its member's whole runtime (the member is paused) until released.
#[inbox_handler(event = "OrderCreated", group = "nats-fence")]
async fn pauses_the_first_run(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await?;
    if FENCE_RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
        FENCE_PAUSED.store(true, Ordering::SeqCst);
        while !FENCE_RELEASE.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// A member paused past its lease (its renewals stopped with it) finds, when it resumes, that
/// another member holds the partition: the message it finished is not acknowledged by it
/// (its report's `committed` is `None`); the new owner gets the message again, finds it a
/// duplicate, and acknowledges it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lease_was_taken_cannot_acknowledge() {
    let server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_fence", "fence").await;
    let seq = publish_order(
        &js,
        &topic,
        1,
        &Uuid::new_v4().to_string(),
        Uuid::new_v4(),
        5,
    )
    .await;
    let mut paused = Isolated::start(&db.schema, config(&server, &topic, 1), "nats-fence");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !FENCE_PAUSED.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the first member never ran the handler"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let paused_at = Instant::now();
    let leases = js
        .get_key_value("inoutbox_leases")
        .await
        .expect("lease bucket");
    let key = lease_key("nats-fence", &topic, 0);
    let first_owner = leases.get(&key).await.expect("lease").expect("held");
    let mut second = Running::start(Consumer::builder(
        "nats-fence",
        store,
        config(&server, &topic, 1),
    ));
    loop {
        match leases.get(&key).await {
            Ok(Some(owner)) if owner != first_owner => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the second member never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "lease taken over {:?} after the first member paused (TTL 2 s)",
        paused_at.elapsed()
    );
    FENCE_RELEASE.store(true, Ordering::SeqCst);
    let late = paused.next().await;
    assert!(
        matches!(late.outcome, Outcome::Processed { .. }),
        "{late:?}"
    );
    assert_eq!(
        late.committed, None,
        "the paused member acknowledged after losing its lease: {late:?}"
    );
    let again = second.take(1).await.remove(0);
    assert_eq!(again.outcome, Outcome::Duplicate, "{again:?}");
    assert!(again.committed.is_some(), "{again:?}");
    second.stop().await;
    paused.kill();
    assert_eq!(db.invoices().await, 1);
    assert!(ack_floor(&js, &topic, "nats-fence", 0).await >= seq);
}

#[inbox_handler(event = "OrderCreated", group = "nats-takeover")]
async fn takeover_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// A member killed mid-stream (no lease given up): a second member takes its three partitions
/// once their leases expire, and every event is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_member_takes_the_partitions_of_a_killed_one() {
    let server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_takeover", "takeover").await;
    for n in 0..30 {
        publish_order(
            &js,
            &topic,
            3,
            &Uuid::new_v4().to_string(),
            Uuid::new_v4(),
            n,
        )
        .await;
    }
    let mut first = Isolated::start(&db.schema, config(&server, &topic, 3), "nats-takeover");
    for _ in 0..5 {
        first.next().await;
    }
    let mut second = Running::start(Consumer::builder(
        "nats-takeover",
        store,
        config(&server, &topic, 3),
    ));
    first.kill();
    let killed_at = Instant::now();
    for n in 30..60 {
        publish_order(
            &js,
            &topic,
            3,
            &Uuid::new_v4().to_string(),
            Uuid::new_v4(),
            n,
        )
        .await;
    }
    second.take(1).await;
    println!(
        "first delivery to the second member {:?} after the kill (TTL 2 s, renewal every 667 ms)",
        killed_at.elapsed()
    );
    wait_for_invoices(&db, 60, Duration::from_secs(120)).await;
    second.stop().await;
    assert_eq!(distinct_invoices(&db).await, 60, "every event applied");
    assert_eq!(db.invoices().await, 60, "none applied twice");
}

#[inbox_handler(event = "OrderCreated", group = "nats-restart")]
async fn restart_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// nats-server SIGKILLed mid-stream and started again on its store: the consumer goes on, and
/// every event is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_killed_and_restarted_loses_and_doubles_nothing() {
    let mut server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_restart", "restart").await;
    for n in 0..20 {
        publish_order(
            &js,
            &topic,
            3,
            &Uuid::new_v4().to_string(),
            Uuid::new_v4(),
            n,
        )
        .await;
    }
    let mut consumer = Running::start(Consumer::builder(
        "nats-restart",
        store,
        config(&server, &topic, 3),
    ));
    consumer.take(5).await;
    server.restart();
    let js = server.js().await;
    for n in 20..40 {
        publish_order(
            &js,
            &topic,
            3,
            &Uuid::new_v4().to_string(),
            Uuid::new_v4(),
            n,
        )
        .await;
    }
    wait_for_invoices(&db, 40, Duration::from_secs(120)).await;
    consumer.stop().await;
    assert_eq!(distinct_invoices(&db).await, 40, "every event applied");
    assert_eq!(db.invoices().await, 40, "none applied twice");
}

#[inbox_handler(event = "OrderCreated", group = "nats-hostile")]
async fn hostile_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// Hostile messages between valid ones on one partition (bytes that are not JSON, with NUL
/// bytes; a payload of 900 kB; no event id; a header of non-ASCII text; a valid event after
/// them): each is processed or dead-lettered (to the table and to the dead-letter subject), and
/// the partition goes on to the valid message after them. A header of raw bytes (not UTF-8):
/// `a_header_of_raw_bytes_is_dead_lettered_and_the_partition_goes_on`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_messages_are_dead_lettered_and_the_partition_goes_on() {
    let server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_hostile", "hostile").await;
    let dlq = support::unique("dlq");
    let p0 = subject(&topic, 0);
    let attributes = |id: &'static str| {
        [
            ("ce_id", id),
            ("ce_type", "OrderCreated"),
            ("ce_source", "tests"),
        ]
    };
    publish_order(
        &js,
        &topic,
        1,
        &Uuid::new_v4().to_string(),
        Uuid::new_v4(),
        1,
    )
    .await;
    publish(
        &js,
        &p0,
        &attributes("nul"),
        b"\0{\"order_id\":\0\xff}".to_vec(),
    )
    .await;
    publish(&js, &p0, &attributes("huge"), vec![b'x'; 900_000]).await;
    publish(&js, &p0, &[("ce_type", "OrderCreated")], b"{}".to_vec()).await;
    let mut text = attributes("text-header").to_vec();
    text.push(("X-Text", "ümlaut ✓"));
    publish(&js, &p0, &text, b"not json".to_vec()).await;
    publish_order(
        &js,
        &topic,
        1,
        &Uuid::new_v4().to_string(),
        Uuid::new_v4(),
        2,
    )
    .await;
    let mut consumer = Running::start(
        Consumer::builder(
            "nats-hostile",
            store,
            config(&server, &topic, 1).dead_letter_subject(dlq.clone()),
        )
        .retry(RetryPolicy::no_retries()),
    );
    let mut reports = consumer.take(6).await;
    consumer.stop().await;
    // Reports come as the key lanes finish: read them in offset order.
    reports.sort_by_key(|r| r.delivery.offset);
    for r in &reports {
        println!("{} -> {:?}", r.delivery.offset, r.outcome);
    }
    assert!(matches!(reports[0].outcome, Outcome::Processed { .. }));
    assert!(matches!(reports[5].outcome, Outcome::Processed { .. }));
    for r in &reports[1..5] {
        assert!(
            matches!(
                r.outcome,
                Outcome::DeadLettered { .. } | Outcome::Processed { .. }
            ),
            "{:?}",
            r.outcome
        );
    }
    let dead = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::DeadLettered { .. }))
        .count();
    assert!(dead >= 3, "not JSON, huge, without id: {dead}");
    let copies = nats_support::read_stream(&js, &dlq, Duration::from_secs(2)).await;
    assert_eq!(copies.len(), dead, "one copy per dead letter");
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM {}", db.tables.dead_letters))
            .await,
        i64::try_from(dead).expect("count")
    );
}

#[inbox_handler(event = "OrderCreated", group = "nats-raw-header")]
async fn raw_header_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// Publishes to JetStream over a connection of its own (raw protocol lines: async-nats cannot
/// write a header that is not UTF-8) a message with the header block `headers` (`NATS/1.0` and
/// its lines, the empty line included) and returns its stream sequence, read from the publish
/// acknowledgement.
fn publish_raw_headers(server: &NatsServer, subject: &str, headers: &[u8], payload: &[u8]) -> u64 {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect to nats");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("INFO");
    assert!(line.starts_with("INFO"), "{line}");
    let mut frame = Vec::new();
    frame.extend_from_slice(
        b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\n",
    );
    frame.extend_from_slice(b"SUB raw_ack 1\r\n");
    let total = headers.len() + payload.len();
    frame.extend_from_slice(
        format!("HPUB {subject} raw_ack {} {total}\r\n", headers.len()).as_bytes(),
    );
    frame.extend_from_slice(headers);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\nPING\r\n");
    stream.write_all(&frame).expect("HPUB");
    loop {
        line.clear();
        reader
            .read_line(&mut line)
            .expect("publish acknowledgement");
        assert!(!line.starts_with("-ERR"), "{line}");
        if let Some(size) = line.strip_prefix("MSG raw_ack 1 ") {
            let size: usize = size.trim().parse().expect("size");
            let mut ack = vec![0; size + 2];
            reader.read_exact(&mut ack).expect("acknowledgement");
            let ack: serde_json::Value = serde_json::from_slice(&ack[..size]).expect("json");
            return ack["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("publish refused: {ack}"));
        }
    }
}

/// A header block whose event id is raw bytes (not UTF-8), and a payload that is an order.
fn raw_event_id(payload: &str) -> (&'static [u8], Vec<u8>) {
    (
        b"NATS/1.0\r\nce_id: raw-\xff\xfe\xc3\r\nce_source: tests\r\nce_type: OrderCreated\r\n\r\n",
        payload.as_bytes().to_vec(),
    )
}

/// The dead letters of `db`: offset, payload, reason, in offset order.
async fn dead_letters(db: &TestDb) -> Vec<(i64, Option<Vec<u8>>, String)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT \"offset\", payload, error FROM {} ORDER BY \"offset\"",
        db.tables.dead_letters
    )))
    .fetch_all(&db.pool)
    .await
    .expect("dead letters")
}

/// Messages with a header of raw bytes (not UTF-8, which only a hand-written client can
/// publish) on one partition: async-nats drops its connection when one arrives, so the reader
/// reads what it lost from the stream itself. First among valid orders published before the
/// consumer starts (found once idle after the reconnection); then one published while it runs
/// with an order right after it (found by the delivery sequence that skips); then two valid
/// orders whose header block holds a status (`NATS/1.0 408`, `NATS/1.0 503`: async-nats's pull
/// passes over the first and fails on the second, found after that error); then one as the
/// partition's last message (acknowledged by itself). Those whose event id holds the raw bytes
/// are dead-lettered with their payload and the reason; the one whose raw bytes are in another
/// header, and those with a status, are processed; every valid order is invoiced once; the
/// acknowledgement floor passes the last one. Without the reader's recovery the partition stalls (JetStream delivers the
/// message again only after its acknowledgement wait, with the same result) and the first
/// bounded wait fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_of_raw_bytes_is_dead_lettered_and_the_partition_goes_on() {
    let server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_raw_header", "rawheader").await;
    let p0 = subject(&topic, 0);
    let order = |n: i64| {
        let (js, topic) = (js.clone(), topic.clone());
        async move {
            let id = Uuid::new_v4().to_string();
            publish_order(&js, &topic, 1, &id, Uuid::new_v4(), n).await
        }
    };
    let payloads: Vec<String> = (0..3)
        .map(|n| {
            format!(
                "{{\"order_id\":\"{}\",\"total_cents\":{n}}}",
                Uuid::new_v4()
            )
        })
        .collect();
    let hostile = |n: usize| {
        let (headers, payload) = raw_event_id(&payloads[n]);
        publish_raw_headers(&server, &p0, headers, &payload)
    };
    order(1).await;
    let mut hostiles = vec![hostile(0)];
    let mut elsewhere = format!(
        "NATS/1.0\r\nce_id: {}\r\nce_source: tests\r\nce_type: OrderCreated\r\nx-raw: ",
        Uuid::new_v4()
    )
    .into_bytes();
    elsewhere.extend_from_slice(b"\x80\xff\r\n\r\n");
    let order3 = format!("{{\"order_id\":\"{}\",\"total_cents\":3}}", Uuid::new_v4());
    publish_raw_headers(&server, &p0, &elsewhere, order3.as_bytes());
    order(4).await;
    order(5).await;
    let consumer = Running::start(
        Consumer::builder("nats-raw-header", store, config(&server, &topic, 1))
            .retry(RetryPolicy::no_retries()),
    );
    // Liveness bounds: JetStream's acknowledgement wait (60 s) is beyond them.
    wait_for_invoices(&db, 4, Duration::from_secs(30)).await;
    hostiles.push(hostile(1));
    // Not a timed check: the order after the reconnection (rather than in the batch lost with
    // the message) steers the reader to the delivery sequence that skips; it would be found
    // once idle otherwise.
    tokio::time::sleep(Duration::from_millis(300)).await;
    order(6).await;
    wait_for_invoices(&db, 5, Duration::from_secs(30)).await;
    // Header blocks with a status, which async-nats's pull takes for the server's own (a
    // timeout it passes over, "no responders" an error): valid orders otherwise.
    for status in ["408 Request Timeout", "503"] {
        let headers = format!(
            "NATS/1.0 {status}\r\nce_id: {}\r\nce_source: tests\r\nce_type: OrderCreated\r\n\r\n",
            Uuid::new_v4()
        );
        let order = format!("{{\"order_id\":\"{}\",\"total_cents\":7}}", Uuid::new_v4());
        publish_raw_headers(&server, &p0, headers.as_bytes(), order.as_bytes());
    }
    wait_for_invoices(&db, 7, Duration::from_secs(30)).await;
    hostiles.push(hostile(2));
    let deadline = Instant::now() + Duration::from_secs(30);
    while dead_letters(&db).await.len() < 3 {
        assert!(Instant::now() < deadline, "{:?}", dead_letters(&db).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.stop().await;
    assert_eq!(distinct_invoices(&db).await, 7, "every valid order applied");
    assert_eq!(db.invoices().await, 7, "none applied twice");
    let dead = dead_letters(&db).await;
    assert_eq!(dead.len(), 3, "{dead:?}");
    for ((offset, payload, error), (sequence, sent)) in
        dead.iter().zip(hostiles.iter().zip(&payloads))
    {
        assert_eq!(*offset, i64::try_from(*sequence).expect("offset"));
        assert_eq!(payload.as_deref(), Some(sent.as_bytes()));
        assert!(error.contains("`ce_id` is not valid UTF-8"), "{error}");
    }
    assert!(
        ack_floor(&js, &topic, "nats-raw-header", 0).await >= hostiles[2],
        "acknowledged up to the last message, whose headers are raw bytes"
    );
}

#[inbox_handler(event = "OrderCreated", group = "nats-share")]
async fn share_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// Two live members of a group share its four partitions (the first gives two up to the
/// second, each handing over after its run finished), and every event is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_members_share_the_partitions() {
    let server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_share", "share").await;
    let builder = || Consumer::builder("nats-share", store.clone(), config(&server, &topic, 4));
    let mut first = Running::start(builder());
    let leases = loop {
        if let Ok(leases) = js.get_key_value("inoutbox_leases").await {
            break leases;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let owners = || async {
        let (mut owners, mut held) = (std::collections::HashSet::new(), 0);
        for p in 0..4 {
            if let Ok(Some(owner)) = leases.get(lease_key("nats-share", &topic, p)).await {
                owners.insert(owner);
                held += 1;
            }
        }
        (held, owners.len())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    // The first member alone holds all four before the second starts.
    while owners().await != (4, 1) {
        assert!(
            Instant::now() < deadline,
            "the first member did not take all four"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut second = Running::start(builder());
    while owners().await != (4, 2) {
        assert!(Instant::now() < deadline, "the partitions were not shared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in 0..40 {
        publish_order(
            &js,
            &topic,
            4,
            &Uuid::new_v4().to_string(),
            Uuid::new_v4(),
            n,
        )
        .await;
    }
    wait_for_invoices(&db, 40, Duration::from_secs(60)).await;
    let (mut by_first, mut by_second) = (0, 0);
    while first.reports.try_recv().is_ok() {
        by_first += 1;
    }
    while second.reports.try_recv().is_ok() {
        by_second += 1;
    }
    first.stop().await;
    second.stop().await;
    println!("first member: {by_first} messages, second: {by_second}");
    assert!(by_first > 0 && by_second > 0, "{by_first} / {by_second}");
    assert_eq!(distinct_invoices(&db).await, 40);
    assert_eq!(db.invoices().await, 40);
}

// ---------------------------------------------------------------------------------------------
// `App` on NATS (`DATABASE_URL` + `NATS_URL`): the relay and the registered handlers run on
// JetStream; a republish of the same `Nats-Msg-Id` after the duplicate window is applied once.

static APP_RUNS: AtomicU32 = AtomicU32::new(0);

#[inbox_handler(event = "OrderCreated", group = "nats-app")]
async fn app_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    APP_RUNS.fetch_add(1, Ordering::SeqCst);
    insert_invoice(&event, tx).await
}

/// The next report of `reports` within `within`.
async fn next_report(
    reports: &mut tokio::sync::mpsc::UnboundedReceiver<inoutbox::inbox::Report>,
    within: Duration,
) -> inoutbox::inbox::Report {
    tokio::time::timeout(within, reports.recv())
        .await
        .unwrap_or_else(|_| panic!("no report within {within:?}"))
        .expect("the consumer's reports ended")
}

#[inbox_handler(event = "OrderCreated", group = "nats-large")]
async fn large_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

/// A message as large as the server takes (here a server whose `max_payload` is 6 MiB, and a
/// 5 MiB message, not JSON) is delivered and dead-lettered, and the messages after it are
/// processed: a pull asks for at least the server's largest message. Asked for less, the
/// server answers every pull with `409 Message Size Exceeds MaxBytes` and the partition stalls
/// (checked: with the pull's bytes fixed at 4 MiB the test fails, no report after the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_as_large_as_the_server_takes_is_delivered_not_stalled() {
    let conf = std::env::temp_dir().join(format!("inoutbox-nats-{}.conf", Uuid::new_v4()));
    std::fs::write(&conf, "max_payload: 6291456\n").expect("server config");
    let server = NatsServer::start_with(&["-c", conf.to_str().expect("path")]);
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_large", "large").await;
    let _ = std::fs::remove_file(&conf);
    let p0 = subject(&topic, 0);
    let order = |n: i64| {
        let (js, topic) = (js.clone(), topic.clone());
        async move {
            let id = Uuid::new_v4().to_string();
            publish_order(&js, &topic, 1, &id, Uuid::new_v4(), n).await
        }
    };
    order(1).await;
    let attributes = [
        ("ce_id", "large"),
        ("ce_type", "OrderCreated"),
        ("ce_source", "tests"),
    ];
    let large = publish(&js, &p0, &attributes, vec![b'x'; 5 << 20]).await;
    order(2).await;
    let mut consumer = Running::start(
        Consumer::builder("nats-large", store, config(&server, &topic, 1))
            .retry(RetryPolicy::no_retries()),
    );
    let mut reports = consumer.take(3).await;
    consumer.stop().await;
    reports.sort_by_key(|r| r.delivery.offset);
    assert!(
        matches!(reports[0].outcome, Outcome::Processed { .. }),
        "{:?}",
        reports[0]
    );
    assert_eq!(
        reports[1].delivery.offset,
        i64::try_from(large).expect("offset")
    );
    assert_eq!(
        reports[1].delivery.payload.as_ref().map(Vec::len),
        Some(5 << 20)
    );
    assert!(
        matches!(reports[1].outcome, Outcome::DeadLettered { .. }),
        "{:?}",
        reports[1].outcome
    );
    assert!(
        matches!(reports[2].outcome, Outcome::Processed { .. }),
        "{:?}",
        reports[2]
    );
    assert_eq!(db.invoices().await, 2);
}

/// Processes that start at once race to create a topic's streams: every one of them gets them,
/// and each partition has one stream of its one subject. (It passes without the retry of
/// `get_or_create_stream` too: nats-server 2.9.10 answered these identical creates without the
/// "subjects overlap" error that retry is for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_starting_at_once_all_get_the_topics_streams() {
    let server = NatsServer::start();
    let js = server.js().await;
    let db = TestDb::new("nats_race").await;
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (url, db_url) = (server.url.clone(), db.url());
        starts.spawn(async move {
            let app = inoutbox::App::connect_nats(Some(&db_url), &url).await?;
            app.create_topic("raced", 6).await
        });
    }
    let mut failures = Vec::new();
    while let Some(started) = starts.join_next().await {
        if let Err(e) = started.expect("task") {
            failures.push(e.to_string());
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
    for partition in 0..6 {
        let stream = js
            .get_stream(inoutbox::nats::stream_name("raced", partition))
            .await
            .expect("the partition's stream");
        assert_eq!(
            stream.cached_info().config.subjects,
            vec![subject("raced", partition)]
        );
    }
}

/// A stream that takes a topic's partition subjects already (a stream of subjects `<topic>.*`)
/// stops the topic's streams from being made: the error names the subject and what to do, and
/// publishing never goes to the other stream by accident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holding_a_topics_subjects_is_refused_with_what_to_do() {
    let server = NatsServer::start();
    let js = server.js().await;
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: "legacy".to_owned(),
        subjects: vec!["legacy.*".to_owned()],
        ..Default::default()
    })
    .await
    .expect("stream");
    let db = TestDb::new("nats_overlap").await;
    let app = inoutbox::App::connect_nats(Some(&db.url()), &server.url)
        .await
        .expect("app");
    let refused = app
        .create_topic("legacy", 2)
        .await
        .expect_err("the subjects are another stream's");
    let text = refused.to_string();
    assert!(
        text.contains("`legacy.0`") && text.contains("`legacy.*` must be deleted first"),
        "{text}"
    );
    let publisher = NatsPublisher::connect(&server.url, 2)
        .await
        .expect("publisher");
    let message =
        inoutbox::transport::OutgoingMessage::new("legacy", b"{}", "id-1", "OrderCreated", "tests");
    let refused = match inoutbox::transport::Publisher::send(&publisher, &message) {
        Ok(receipt) => receipt.await.expect_err("refused"),
        Err(e) => e,
    };
    assert!(
        refused.to_string().contains("must be deleted first"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_on_nats_relays_the_outbox_and_handles_each_event_once() {
    let server = NatsServer::start();
    let js = server.js().await;
    // The topic's streams made beforehand with a short duplicate window, so that the test can
    // republish the same `Nats-Msg-Id` after it (JetStream then stores it again).
    let config = async_nats::jetstream::stream::Config {
        duplicate_window: Duration::from_secs(1),
        ..Default::default()
    };
    nats_support::create_streams_with(&js, "orders", 2, config).await;
    let db = TestDb::new("nats_app").await;
    // A password the server does not ask for: it must never be shown.
    let url = server
        .url
        .replacen("nats://", "nats://app:hunter2-nats@", 1);
    let app = inoutbox::App::connect_nats(Some(&db.url()), &url)
        .await
        .expect("app on NATS");
    assert_eq!(app.transport(), "nats");
    let describe = app.describe().to_owned();
    assert!(
        describe.starts_with("PostgreSQL (")
            && describe.contains("NATS JetStream at nats://app:***@"),
        "{describe}"
    );
    assert!(!describe.contains("hunter2"), "{describe}");
    app.create_topic("orders", 2).await.expect("topic");
    let (reports, mut reported) = tokio::sync::mpsc::unbounded_channel();
    let spec = inoutbox::app::ConsumerSpec::new("nats-app", ["orders"])
        .reports(reports)
        .sample_interval(Duration::from_millis(200));
    let ops = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut app = app.consumer_with(spec).relay().ops_endpoint(ops);
    let stop = app.shutdown_token();
    let running = tokio::spawn(async move { app.run().await });

    let order = Uuid::new_v4();
    let mut tx = db.pool.begin().await.expect("begin");
    let id = outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id: order,
            total_cents: 12,
        },
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    let first = next_report(&mut reported, Duration::from_secs(60)).await;
    assert!(
        matches!(first.outcome, Outcome::Processed { .. }),
        "{first:?}"
    );
    let first_id = first.delivery.header_str("ce_id").map(str::to_owned);
    assert_eq!(first_id, Some(id.to_string()), "{first:?}");

    // The relayed message, on the partition of its key (of the app's 2), republished with its
    // headers and the same `Nats-Msg-Id` after the duplicate window.
    let messages = nats_support::read_stream(&js, "orders", Duration::from_secs(2)).await;
    assert_eq!(messages.len(), 1, "one message relayed");
    let relayed = &messages[0];
    let key = order.to_string();
    assert_eq!(
        relayed.subject.as_str(),
        subject("orders", partition_for(key.as_bytes(), 2))
    );
    let headers = relayed.headers.clone().expect("headers");
    let msg_id = headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned());
    assert_eq!(msg_id.as_deref(), Some(id.to_string().as_str()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = js
        .publish_with_headers(relayed.subject.clone(), headers, relayed.payload.clone())
        .await
        .expect("republish")
        .await
        .expect("ack");
    assert!(!again.duplicate, "stored again after the duplicate window");
    let second = next_report(&mut reported, Duration::from_secs(60)).await;
    assert_eq!(second.outcome, Outcome::Duplicate, "{second:?}");
    // The app's metrics say their transport.
    let duplicates = r#"inoutbox_inbox_duplicates_total{transport="nats",group="nats-app",event_type="OrderCreated"} 1"#;
    let (status, scrape) = support::http_get(ops, "/metrics").await.expect("/metrics");
    assert_eq!(status, 200);
    assert!(scrape.contains(duplicates), "{scrape}");
    // Its lag gauge, sampled by the member for the partition it owns: all handled.
    let partition = partition_for(key.as_bytes(), 2);
    let lag = format!(
        "inoutbox_consumer_lag{{transport=\"nats\",group=\"nats-app\",topic=\"orders\",partition=\"{partition}\"}} 0"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, scrape) = support::http_get(ops, "/metrics").await.expect("/metrics");
        if scrape.contains(&lag) {
            break;
        }
        assert!(Instant::now() < deadline, "no `{lag}` in:\n{scrape}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the app stopped")
        .expect("the app's task");
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(APP_RUNS.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(db.invoices().await, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL")
            .await,
        0,
        "the outbox row was marked published"
    );
}

// ---------------------------------------------------------------------------------------------
// Lag: per group and partition, the current consumer's pending and unacknowledged messages.

#[inbox_handler(event = "OrderCreated", group = "nats-lag")]
async fn lag_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    insert_invoice(&event, tx).await
}

static LAG_RELEASE: AtomicBool = AtomicBool::new(false);

#[inbox_handler(event = "OrderCreated", group = "nats-lag-slow")]
async fn lag_slow(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    while !LAG_RELEASE.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    insert_invoice(&event, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_lag_counts_what_the_group_has_not_acknowledged_per_partition() {
    let server = NatsServer::start();
    let Setup {
        js,
        db,
        store,
        topic,
    } = Setup::new(&server, "nats_lag", "lag").await;
    let groups = ["nats-lag".to_owned(), "nats-lag-none".to_owned()];
    let lag = || inoutbox::nats::consumer_lag(&server.url, &groups, Duration::from_secs(10));
    assert!(lag().await.expect("lag").is_empty(), "no consumer yet");
    for n in 0..2 {
        publish_order_to(&js, &subject(&topic, 1), n).await;
    }
    let mut consumer = Running::start(Consumer::builder(
        "nats-lag",
        store,
        config(&server, &topic, 2),
    ));
    consumer.take(2).await;
    // Acknowledged (`commit` hands the acknowledgement to a task: wait for it).
    let deadline = Instant::now() + Duration::from_secs(20);
    while ack_floor(&js, &topic, "nats-lag", 1).await < 2 {
        assert!(Instant::now() < deadline, "not acknowledged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consumer.stop().await;
    assert_eq!(db.invoices().await, 2);
    // The member held both partitions: a consumer each (kept after a graceful stop: the
    // next owner starts from it), nothing behind; nothing for the group that never ran.
    let row = |l: &inoutbox::nats::ConsumerLag| {
        (
            l.group.clone(),
            l.topic.clone(),
            l.partition,
            l.pending,
            l.ack_pending,
            l.lag,
        )
    };
    let rows = |lags: Vec<inoutbox::nats::ConsumerLag>| {
        let mut rows: Vec<_> = lags.iter().map(row).collect();
        rows.sort();
        rows
    };
    let expected =
        |p: u32, pending: u64| ("nats-lag".to_owned(), topic.clone(), p, pending, 0, pending);
    assert_eq!(
        rows(lag().await.expect("lag")),
        vec![expected(0, 0), expected(1, 0)]
    );
    // Three more on partition 1, one on partition 0: behind by as many.
    for n in 0..3 {
        publish_order_to(&js, &subject(&topic, 1), n).await;
    }
    publish_order_to(&js, &subject(&topic, 0), 9).await;
    assert_eq!(
        rows(lag().await.expect("lag")),
        vec![expected(0, 1), expected(1, 3)]
    );

    // Another group whose handler holds the first message of each partition: what its
    // partitions' readers took is delivered, not acknowledged, and still its lag.
    let slow_group = ["nats-lag-slow".to_owned()];
    let slow = || inoutbox::nats::consumer_lag(&server.url, &slow_group, Duration::from_secs(10));
    let mut held = Running::start(Consumer::builder(
        "nats-lag-slow",
        db.store(),
        config(&server, &topic, 2),
    ));
    let delivered = |p: u32, n: u64| ("nats-lag-slow".to_owned(), topic.clone(), p, 0, n, n);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = rows(slow().await.expect("lag"));
        if now == vec![delivered(0, 1), delivered(1, 5)] {
            break;
        }
        assert!(Instant::now() < deadline, "{now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    LAG_RELEASE.store(true, Ordering::SeqCst);
    held.take(6).await;
    held.stop().await;
}

/// Publishes an `OrderCreated` of a fresh event id and order to `subject` (a partition's).
async fn publish_order_to(js: &async_nats::jetstream::Context, subject: &str, total_cents: i64) {
    let id = Uuid::new_v4().to_string();
    let headers = [
        ("ce_id", id.as_str()),
        ("ce_type", "OrderCreated"),
        ("ce_source", "tests"),
        ("ce_specversion", "1.0"),
        ("content-type", "application/json"),
    ];
    let payload = serde_json::json!({"order_id": Uuid::new_v4(), "total_cents": total_cents});
    let payload = serde_json::to_vec(&payload).expect("json");
    publish(js, subject, &headers, payload).await;
}

// ---------------------------------------------------------------------------------------------
// Credentials in a NATS URL: sent to the server (async-nats takes them from its options only)
// and never shown, in errors or in any log line (async-nats logs its server address at debug).

/// Log lines written into a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_url_with_credentials_authenticates_and_never_shows_them_nor_kafka_settings() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the only subscriber of this test binary");
    let server = NatsServer::start_with(&["--user", "app", "--pass", "hunter2-auth"]);
    let db = TestDb::new("nats_auth").await;
    let url = |password: &str| {
        server
            .url
            .replacen("nats://", &format!("nats://app:{password}@"), 1)
    };
    let app = inoutbox::App::connect_nats(Some(&db.url()), &url("hunter2-auth"))
        .await
        .expect("app");
    app.create_topic("auth-orders", 1)
        .await
        .expect("authenticated: the stream is created");
    let refused = inoutbox::App::connect_nats(Some(&db.url()), &url("hunter2-wrong"))
        .await
        .expect("app")
        .create_topic("auth-orders", 1)
        .await
        .expect_err("a wrong password is refused");
    assert!(refused.to_string().contains("nats://app:***@"), "{refused}");
    assert!(
        !format!("{refused} {refused:?}").contains("hunter2"),
        "{refused:?}"
    );
    // Kafka settings of a group on an app that runs on NATS: ignored, with a warning that
    // names them and the group, never their values (a setting may be a secret).
    let app = inoutbox::App::connect_nats(Some(&db.url()), &url("hunter2-auth"))
        .await
        .expect("app");
    let spec = inoutbox::app::ConsumerSpec::new("nats-app", ["auth-orders"])
        .set("sasl.password", "hunter2-setting")
        .group_id("a-kafka-group-id");
    let mut app = app.consumer_with(spec);
    let stop = app.shutdown_token();
    let running = tokio::spawn(async move { app.run().await });
    let warned = |logged: &str| {
        logged.lines().any(|line| {
            line.contains("Kafka settings of a consumer group ignored: the app runs on NATS")
                && line.contains("sasl.password")
                && line.contains("nats-app")
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !warned(&String::from_utf8_lossy(&logs.0.lock().expect("logs")))
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("join").expect("the app stops cleanly");
    let logged = String::from_utf8_lossy(&logs.0.lock().expect("logs")).into_owned();
    assert!(
        warned(&logged),
        "a warning naming the ignored Kafka setting and the group:\n{logged}"
    );
    assert!(
        logged.contains("async_nats"),
        "async-nats's debug lines were captured:\n{logged}"
    );
    assert!(
        !logged.contains("hunter2"),
        "a password or a setting's value in the log:\n{logged}"
    );
}
