//! Shared fixtures of the integration tests: a PostgreSQL schema per test, a Tansu broker
//! process per test (a `nats-server` one in `nats`), and a producer/consumer toolbox. A
//! missing service fails the test with a message saying how to start it; nothing is skipped.

#![allow(dead_code)]

pub mod bus;
pub mod child;
pub mod kit;
pub mod memory;
#[cfg(feature = "nats")]
pub mod nats;
pub mod net;
pub mod observe;
pub mod raw;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inoutbox::inbox::Report;
use inoutbox::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::mpsc;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// A schema of its own for one test: every table (inoutbox's and the test's) lives in it.
pub struct TestDb {
    pub pool: PgPool,
    pub schema: String,
    pub tables: inoutbox::Tables,
}

impl TestDb {
    pub async fn new(name: &str) -> Self {
        let url = database_url();
        let admin = PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is not reachable at {url}: {e}\n\
                 start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
                 or set DATABASE_URL"
            )
        });
        let schema = format!(
            "t_{}_{}",
            name,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
            .execute(&admin)
            .await
            .expect("create schema");
        admin.close().await;
        let options: PgConnectOptions = url.parse().expect("DATABASE_URL");
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(
                options
                    .options([("search_path", schema.as_str())])
                    .application_name(&schema),
            )
            .await
            .expect("connect to PostgreSQL");
        let tables = inoutbox::Tables::with_schema(&schema).expect("valid schema name");
        sqlx::raw_sql(
            "CREATE TABLE invoices (id bigserial PRIMARY KEY, order_id uuid NOT NULL, \
             total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
        )
        .execute(&pool)
        .await
        .expect("create invoices");
        Self {
            pool,
            schema,
            tables,
        }
    }

    /// A connection URL whose sessions use this test's schema.
    pub fn url(&self) -> String {
        let base = database_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        format!("{base}{sep}options=-c%20search_path%3D{}", self.schema)
    }

    /// Terminates every backend of this test's pool (a database outage as the consumer sees it).
    pub async fn terminate_backends(&self) -> i64 {
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&database_url())
            .await
            .expect("admin");
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&self.schema)
        .fetch_one(&admin)
        .await
        .expect("terminate backends");
        admin.close().await;
        n
    }

    /// The schema of another process's `TestDb` (a child process of a crash test).
    pub async fn attach(schema: &str) -> Self {
        let options: PgConnectOptions = database_url().parse().expect("DATABASE_URL");
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options.options([("search_path", schema)]))
            .await
            .expect("connect to PostgreSQL");
        Self {
            pool,
            schema: schema.to_owned(),
            tables: inoutbox::Tables::with_schema(schema).expect("valid schema name"),
        }
    }

    pub fn store(&self) -> inoutbox::PgStore {
        inoutbox::PgStore::with_tables(self.pool.clone(), self.tables.clone())
    }

    pub async fn migrated_store(&self) -> inoutbox::PgStore {
        let store = self.store();
        store.migrate().await.expect("migrate");
        store
    }

    /// Runs a statement (or several) in the test's schema.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .expect(sql);
    }

    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    pub async fn invoices(&self) -> i64 {
        self.count("SELECT count(*) FROM invoices").await
    }
}

/// A Tansu broker process of its own, on a free port; killed when dropped.
pub struct Broker {
    child: Child,
    pub brokers: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Broker {
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Self {
        let url = format!("tcp://127.0.0.1:{port}");
        let bin = std::env::var("TANSU_BIN").unwrap_or_else(|_| "tansu".to_owned());
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start the Tansu broker (`{bin}`): {e}\ninstall it with: scripts/install-tansu")
            });
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "Tansu did not listen on {addr} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            brokers: addr,
        }
    }

    pub fn port(&self) -> u16 {
        self.brokers
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    }

    /// Kills the broker (its memory storage is lost).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        create_topic(&self.brokers, topic, partitions).await
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create topic");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
}

/// The relay's Kafka producer, set up for Tansu (which rejects the idempotent producer).
pub fn tansu_publisher(brokers: &str) -> inoutbox::kafka::KafkaPublisher {
    use inoutbox::transport::IntoPublisher;
    inoutbox::kafka::KafkaProducer::new(brokers)
        .idempotence(false)
        .into_publisher()
        .expect("kafka producer")
}

/// A producer suitable for Tansu (no idempotence handshake).
pub fn producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("message.timeout.ms", "10000")
        .create()
        .expect("producer")
}

/// A message in CloudEvents binary mode.
pub struct Msg {
    pub id: Option<String>,
    pub event_type: Option<String>,
    pub payload: Vec<u8>,
    pub partition: Option<i32>,
    pub key: Option<String>,
}

impl Msg {
    pub fn order(id: &str, order_id: uuid::Uuid, total_cents: i64) -> Self {
        Self {
            id: Some(id.to_owned()),
            event_type: Some("OrderCreated".to_owned()),
            payload: serde_json::to_vec(
                &serde_json::json!({"order_id": order_id, "total_cents": total_cents}),
            )
            .expect("json"),
            partition: None,
            key: Some(order_id.to_string()),
        }
    }

    pub fn on_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }
}

pub async fn send(producer: &FutureProducer, topic: &str, msg: Msg) {
    let mut headers = OwnedHeaders::new()
        .insert(Header {
            key: "ce_source",
            value: Some("tests"),
        })
        .insert(Header {
            key: "ce_specversion",
            value: Some("1.0"),
        })
        .insert(Header {
            key: "content-type",
            value: Some("application/json"),
        });
    if let Some(id) = &msg.id {
        headers = headers.insert(Header {
            key: "ce_id",
            value: Some(id.as_str()),
        });
    }
    if let Some(t) = &msg.event_type {
        headers = headers.insert(Header {
            key: "ce_type",
            value: Some(t.as_str()),
        });
    }
    let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic)
        .payload(msg.payload.as_slice())
        .headers(headers);
    if let Some(k) = &msg.key {
        record = record.key(k.as_str());
    }
    if let Some(p) = msg.partition {
        record = record.partition(p);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Consumer settings that make group joins and rebalances quick on a test broker.
pub fn kafka(brokers: &str, topic: &str) -> KafkaConfig {
    KafkaConfig::new(brokers, [topic])
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("topic.metadata.refresh.interval.ms", "1000")
}

/// The offset committed for `group` on `topic`/`partition` (`None` when nothing is committed).
pub fn committed(brokers: &str, group: &str, topic: &str, partition: i32) -> Option<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let offsets = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    let element = offsets
        .find_partition(topic, partition)
        .expect("partition in answer");
    match element.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Waits for the committed offset to reach `at_least`; returns what was last seen.
pub async fn wait_committed(
    brokers: &str,
    group: &str,
    topic: &str,
    partition: i32,
    at_least: i64,
) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (b, g, t) = (brokers.to_owned(), group.to_owned(), topic.to_owned());
        let seen = tokio::task::spawn_blocking(move || committed(&b, &g, &t, partition))
            .await
            .expect("join");
        if seen.is_some_and(|o| o >= at_least) || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A consumer running in a task, with its reports and a way to stop it gracefully.
pub struct Running {
    pub reports: mpsc::UnboundedReceiver<Report>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<()>,
}

/// `INOUTBOX_TEST_LOG=1` shows inoutbox's logs in the test output.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("INOUTBOX_TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt().with_test_writer().try_init();
        }
    });
}

impl Running {
    /// Runs the consumer `builder` makes, on any transport (Kafka, NATS, the in-memory broker).
    pub fn start<S: inoutbox::store::InboxStore, T: inoutbox::transport::Transport>(
        builder: inoutbox::ConsumerBuilder<S, T>,
    ) -> Self {
        init_logging();
        let (tx, reports) = mpsc::unbounded_channel();
        let consumer = builder.reports(tx).build().expect("build consumer");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            consumer
                .run(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("consumer run");
        });
        Self {
            reports,
            stop: Some(stop),
            handle,
        }
    }

    /// The next report, or `None` if none comes within `within`.
    pub async fn next(&mut self, within: Duration) -> Option<Report> {
        tokio::time::timeout(within, self.reports.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next `n` reports; panics if they do not come within 30 s.
    pub async fn take(&mut self, n: usize) -> Vec<Report> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next(Duration::from_secs(30)).await {
                Some(r) => out.push(r),
                None => panic!("expected {n} reports, got {}: {out:#?}", out.len()),
            }
        }
        out
    }

    /// Stops gracefully and waits for the consumer to leave the group.
    pub async fn stop(mut self) -> mpsc::UnboundedReceiver<Report> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.handle)
            .await
            .expect("consumer stops within 30 s")
            .expect("consumer task");
        std::mem::replace(&mut self.reports, mpsc::unbounded_channel().1)
    }
}

/// A consumer still running when its test ends early (a failed assertion) is stopped here,
/// before the test's broker goes away: a consumer closing against a dead broker can wait for
/// it for ever, which would turn the failure into a hang.
impl Drop for Running {
    fn drop(&mut self) {
        let Some(stop) = self.stop.take() else {
            return;
        };
        let _ = stop.send(());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return;
        }
        let handle = &mut self.handle;
        tokio::task::block_in_place(|| {
            let _ = runtime.block_on(tokio::time::timeout(Duration::from_secs(30), handle));
        });
    }
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

// ---------------------------------------------------------------------------------------------
// Outbox and relay fixtures.

/// A relay on the test's schema, set up for Tansu (no idempotent producer), no retention purge.
pub fn relay_builder(
    db: &TestDb,
    brokers: &str,
) -> inoutbox::relay::RelayBuilder<inoutbox::relay::PgRelayStore, inoutbox::kafka::KafkaProducer> {
    let store = inoutbox::PgStore::with_tables(db.pool.clone(), db.tables.clone());
    inoutbox::Relay::builder(store, inoutbox::kafka::KafkaProducer::new(brokers))
        .source("inoutbox-tests")
        .idempotence(false)
        .retention(None)
}

/// A relay running in a task, with its reports and a graceful stop.
pub struct RunningRelay {
    pub reports: mpsc::UnboundedReceiver<inoutbox::relay::RelayReport>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<()>,
}

impl RunningRelay {
    pub fn start<S: inoutbox::relay::RelayStore>(
        builder: inoutbox::relay::RelayBuilder<S, inoutbox::kafka::KafkaProducer>,
    ) -> Self {
        Self::spawn(builder.build().expect("build relay"))
    }

    /// Runs a relay on any store in a task.
    pub fn spawn<S: inoutbox::relay::RelayStore, P: inoutbox::transport::Publisher>(
        relay: inoutbox::relay::Relay<S, P>,
    ) -> Self {
        let (tx, reports) = mpsc::unbounded_channel();
        let relay = relay.reports(tx);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("relay run");
        });
        Self {
            reports,
            stop: Some(stop),
            handle,
        }
    }

    /// Waits until `n` rows were reported published; panics after `within`.
    pub async fn published(&mut self, n: usize, within: Duration) -> Vec<uuid::Uuid> {
        let deadline = tokio::time::Instant::now() + within;
        let mut ids = Vec::with_capacity(n);
        while ids.len() < n {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(inoutbox::relay::RelayReport::Published { id, .. })) => ids.push(id),
                Ok(Some(_)) => {}
                _ => panic!(
                    "expected {n} rows published within {within:?}, got {}",
                    ids.len()
                ),
            }
        }
        ids
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.handle)
            .await
            .expect("relay stops within 60 s")
            .expect("relay task");
    }
}

/// A message read back from a topic.
#[derive(Clone, Debug)]
pub struct Received {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: serde_json::Value,
    /// The payload's bytes as the broker holds them.
    pub bytes: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads `topic` (all `partitions`, from the beginning, no consumer group) until `n` messages
/// arrived; panics if they do not within `within`. Counts messages, never watermarks (Tansu's
/// are wrong).
pub async fn read_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    n: usize,
    within: Duration,
) -> Vec<Received> {
    use rdkafka::message::{Headers, Message};
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("topic.metadata.refresh.interval.ms", "1000")
            .create()
            .expect("reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .expect("offset");
        }
        consumer.assign(&tpl).expect("assign");
        let deadline = Instant::now() + within;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            assert!(
                Instant::now() < deadline,
                "expected {n} messages on {topic} within {within:?}, got {}",
                out.len()
            );
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    let headers = m
                        .headers()
                        .map(|hs| {
                            hs.iter()
                                .map(|h| {
                                    (
                                        h.key.to_owned(),
                                        String::from_utf8_lossy(h.value.unwrap_or_default())
                                            .into_owned(),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push(Received {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        payload: serde_json::from_slice(m.payload().unwrap_or_default())
                            .expect("JSON payload"),
                        bytes: m.payload().unwrap_or_default().to_vec(),
                        headers,
                    });
                }
                Some(Err(e)) => eprintln!("reader: {e}"),
                None => {}
            }
        }
        out
    })
    .await
    .expect("reader task")
}

/// Reads `topic` (all `partitions`, from the beginning, no consumer group) until no message
/// came for `quiet`, however many that is: duplicates and strays are seen, not cut off at a
/// count. Panics if the topic does not go quiet within `within`. Messages come per partition in
/// offset order.
pub async fn read_topic_until_quiet(
    brokers: &str,
    topic: &str,
    partitions: i32,
    quiet: Duration,
    within: Duration,
) -> Vec<Received> {
    use rdkafka::message::{Headers, Message};
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("topic.metadata.refresh.interval.ms", "1000")
            .create()
            .expect("reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .expect("offset");
        }
        consumer.assign(&tpl).expect("assign");
        let deadline = Instant::now() + within;
        let mut last = Instant::now();
        let mut out = Vec::new();
        while last.elapsed() < quiet {
            assert!(
                Instant::now() < deadline,
                "{topic} did not go quiet within {within:?} ({} messages read)",
                out.len()
            );
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    last = Instant::now();
                    let headers = m
                        .headers()
                        .map(|hs| {
                            hs.iter()
                                .map(|h| {
                                    (
                                        h.key.to_owned(),
                                        String::from_utf8_lossy(h.value.unwrap_or_default())
                                            .into_owned(),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push(Received {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        payload: serde_json::from_slice(m.payload().unwrap_or_default())
                            .expect("JSON payload"),
                        bytes: m.payload().unwrap_or_default().to_vec(),
                        headers,
                    });
                }
                Some(Err(e)) => eprintln!("reader: {e}"),
                None => {}
            }
        }
        out
    })
    .await
    .expect("reader task")
}

/// `GET path` on `addr` over HTTP/1.1 (`connection: close`): the status code and the body; an
/// error when nothing listens there.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}
