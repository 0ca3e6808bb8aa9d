//! Inbox benchmark: inoutbox's consumer against a hand-written consumer with one transaction per
//! message, measured in the same run on the same topic, database and number of lanes.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release --example inbox_bench -- [--events 20000] [--partitions 3] \
//!     [--backlog 200000] [--db-latency-ms 0] [--payload-bytes N] [--pool 16] [--big-table 0]
//! ```
//! `--db-latency-ms N` puts PostgreSQL behind the chaos proxy adding N ms each way (for
//! everything: the baseline too); `--pool N` is the size of the pool all runs share (K's key
//! lanes per partition are sized from it); `--big-table N` adds run B': B on an inbox that
//! already holds N processed rows (a tenth of them deleted again, as retention leaves it).
//! With `--payload-bytes N` it measures only the peak RSS of the `billing` example draining a
//! backlog of `--backlog` messages whose payloads are N bytes (over 1 MiB they are
//! dead-lettered), on 12 partitions.
//! (build the billing example too: `cargo build --release --examples`; the black-box runs start
//! it as a child process.)
//!
//! `--events` `OrderCreated` messages (CloudEvents binary mode, a unique `ce_id` each) are
//! produced once onto a fresh topic of `--partitions` partitions: on librdkafka's in-process mock
//! cluster by default, on `KAFKA_BROKERS` if set. The mock keeps only about 20 000 messages a
//! partition (past that every run would stall, so the bench refuses such a run before it
//! produces anything): for more, use `KAFKA_BROKERS`. Then each run reads the whole topic with a
//! Kafka consumer group of its own and writes one `bench_invoices` row per message:
//!
//! * **A, hand-written** (baseline): an rdkafka consumer whose lanes (one per partition, as
//!   inoutbox's) each run `BEGIN; INSERT; COMMIT` per message and then commit its offset.
//! * **B, inoutbox batched, partition order** (`ExactlyOnceInbox`, `Ordering::Partition`):
//!   micro-batches per partition, one claim statement, the handler per event, one commit and
//!   one offset commit per batch.
//! * **K, inoutbox batched, key order** (`Ordering::Key`, the default; transactions sized from
//!   the pool): B with the keys of each partition in concurrent transactions, each a batch of the
//!   waiting messages whose keys no other holds.
//! * **C, inoutbox unbatched** (`max_batch(1)`): one transaction per message, as before batching.
//! * **D, at least once** (`OnSuccess`, batched): B without the inbox row.
//! * **E, inbox on SQLite** (batched): B on `SqliteStore`, a temporary WAL file.
//! * **F, batch handler** (`#[inbox_handler(.., batch)]`): the handler gets the new events of a
//!   batch at once and writes them with one multi-row insert.
//!
//! Then, black-box, the unchanged `billing` example as a child process (`--pool` passed on: its
//! PostgreSQL pool is the runs'): its rate from the first to the last invoice row, on
//! `--partitions` and on 12 partitions; the end-to-end
//! latency (produce to handler commit) at a steady 1 000 msgs/s offered, beside a bare rdkafka
//! consumer's on the same broker (produce to receive, no database: the broker's own share);
//! and its peak RSS while draining a backlog of `--backlog` (200 000) messages.
//!
//! Throughput is measured from the first processed message to the last (group joins excluded):
//! msgs/s = (messages - 1) / (last - first). PostgreSQL rows live in a fresh schema, dropped at
//! the end. `--backlog 0` leaves out the backlog's drain.
//!
//! With `DATABASE_URL=mysql://root@127.0.0.1:3306/test` (feature `mysql`: `cargo run --release
//! --all-features --example inbox_bench`) the same runs go to MySQL/MariaDB, in a database of
//! the bench's own created on that server and dropped at the end (the `billing` runs in one more
//! of their own): A (`BEGIN`, an insert of the message's `ce_id` into a dedup table, the
//! invoice's insert, `COMMIT`, then the offset commit), B, K, C, D and the `billing` example
//! (which picks its MySQL handler from the URL), on the pool `MySqlStore::connect` makes (10
//! connections), shared by A and inoutbox alike. E, F, the latency part, `--db-latency-ms` and
//! `--payload-bytes` are PostgreSQL's only.
//!
//! With `NATS_URL=nats://127.0.0.1:4222` (feature `nats`: `cargo run --release --all-features
//! --example inbox_bench`; a `nats-server -js`) the runs read NATS JetStream instead of Kafka,
//! on PostgreSQL: the messages are published once, shaped as inoutbox's relay publishes them
//! (each to the subject of its key's partition, the key in `ce_partitionkey`, `Nats-Msg-Id` =
//! `ce_id`), onto a fresh stream, then
//!
//! * **A, hand-written** (baseline): async-nats and sqlx, one lane per partition, each a pull
//!   consumer of its partition's stream that, for each message, runs `BEGIN`, the insert of its
//!   `ce_id` into a dedup table, the invoice's insert, `COMMIT`, and acknowledges it;
//! * **B, inoutbox batched** (`NatsConfig`, in this process), as B above;
//! * **G**, the unchanged `billing` example as a child process with `NATS_URL` and
//!   `--partitions` (its `NatsConfig`), on `--partitions` and 12 partitions and on the
//!   `--backlog`, each on a stream of its own; ratios against A of the same run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use inoutbox::inbox::Report;
use inoutbox::kafka::InProcessKafka;
use inoutbox::prelude::*;
use inoutbox::{AckStrategy, Outcome};
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::Message as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{create_topic, flag, order_created_headers, BoxError, OrderCreated};

/// The inbox group of runs B, C and D; each run still has a Kafka group id of its own.
const GROUP: &str = "bench";

#[inbox_handler(event = "OrderCreated", group = "bench")]
async fn invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query(INSERT_INVOICE)
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

const INSERT_INVOICE: &str = "INSERT INTO bench_invoices (order_id, total_cents) VALUES ($1, $2)";

/// Run F's group: a batch handler writing a whole run of events with one statement.
const BATCH_GROUP: &str = "bench-batch";

#[inbox_handler(event = "OrderCreated", group = "bench-batch", batch)]
async fn invoices(events: Vec<OrderCreated>, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    let ids: Vec<Uuid> = events.iter().map(|e| e.order_id).collect();
    let totals: Vec<i64> = events.iter().map(|e| e.total_cents).collect();
    sqlx::query(
        "INSERT INTO bench_invoices (order_id, total_cents) \
         SELECT * FROM unnest($1::uuid[], $2::int8[])",
    )
    .bind(&ids)
    .bind(&totals)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Deliberately no unique constraint: every run adds one row per message.
const INVOICES: &str = "CREATE TABLE bench_invoices (
    id bigserial PRIMARY KEY,
    order_id uuid NOT NULL,
    total_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

/// Run D: the same handler on SQLite (one group's handlers are chosen per store by transaction
/// type, so this one shares the group `bench` with the PostgreSQL handler above).
#[cfg(feature = "sqlite")]
mod on_sqlite {
    use inoutbox::prelude::*;
    use inoutbox::SqliteTx;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    use super::{BoxError, OrderCreated, INSERT_INVOICE};

    #[inbox_handler(event = "OrderCreated", group = "bench")]
    async fn invoice(event: OrderCreated, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
        sqlx::query(INSERT_INVOICE)
            .bind(event.order_id)
            .bind(event.total_cents)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// A database file in a directory of its own, removed on drop.
    pub struct Db {
        dir: std::path::PathBuf,
        pub store: inoutbox::SqliteStore,
    }

    impl Db {
        pub async fn open(max_connections: u32) -> Result<Self, BoxError> {
            let dir = std::env::temp_dir().join(format!(
                "inoutbox-inbox-bench-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&dir)?;
            let options = SqliteConnectOptions::new()
                .filename(dir.join("bench.db"))
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(std::time::Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(max_connections)
                .connect_with(options)
                .await?;
            sqlx::raw_sql(
                "CREATE TABLE bench_invoices (id integer PRIMARY KEY AUTOINCREMENT, \
                 order_id blob NOT NULL, total_cents integer NOT NULL, \
                 created_at text NOT NULL DEFAULT CURRENT_TIMESTAMP)",
            )
            .execute(&pool)
            .await?;
            let store = inoutbox::SqliteStore::new(pool);
            store.migrate().await?;
            Ok(Self { dir, store })
        }

        pub async fn invoices(&self) -> Result<i64, BoxError> {
            Ok(sqlx::query_scalar("SELECT count(*) FROM bench_invoices")
                .fetch_one(self.store.pool())
                .await?)
        }
    }

    impl Drop for Db {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The runs on MySQL/MariaDB (`DATABASE_URL=mysql://...`, feature `mysql`): A, B, K, C, D and the
/// `billing` example, in a database of the bench's own (dropped at the end).
#[cfg(feature = "mysql")]
mod on_mysql {
    use inoutbox::prelude::*;
    use inoutbox::{AckStrategy, MySqlStore, MySqlTx};
    use uuid::Uuid;

    use super::common::MySqlDatabase;
    use super::{
        handwritten, inbox_consumer, print_billing, print_table, produce, run_billing, selected,
        start_broker, BoxError, Broker, Measured, OrderCreated, GROUP,
    };

    #[inbox_handler(event = "OrderCreated", group = "bench")]
    async fn invoice(event: OrderCreated, tx: &mut MySqlTx<'_>) -> Result<(), HandlerError> {
        sqlx::query(INSERT_INVOICE)
            .bind(event.order_id.to_string())
            .bind(event.total_cents)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    const INSERT_INVOICE: &str = "INSERT INTO bench_invoices (order_id, total_cents) VALUES (?, ?)";

    /// The invoices (no unique constraint: every run adds one row per message) and the
    /// hand-written consumer's dedup table.
    const TABLES: &str = "CREATE TABLE bench_invoices (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        order_id varchar(36) NOT NULL,
        total_cents bigint NOT NULL,
        created_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6));
        CREATE TABLE bench_seen (event_id varchar(255) PRIMARY KEY)";

    /// Every run on a database of its own, dropped whatever happens.
    pub async fn bench(
        url: &str,
        events: usize,
        partitions: i32,
        backlog: usize,
    ) -> Result<(), BoxError> {
        let db = MySqlDatabase::create(url, "inoutbox_inbox_bench").await?;
        let result = runs(url, &db, events, partitions, backlog).await;
        db.remove().await?;
        result
    }

    async fn runs(
        url: &str,
        db: &MySqlDatabase,
        events: usize,
        partitions: i32,
        backlog: usize,
    ) -> Result<(), BoxError> {
        let store = MySqlStore::connect(&db.url).await?;
        sqlx::raw_sql(TABLES).execute(store.pool()).await?;
        store.migrate().await?;
        let topic = format!(
            "inoutbox-inbox-bench-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let broker = start_broker(&topic, partitions).await?;
        let produced = produce(&broker.brokers, &topic, events).await?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(store.pool())
            .await?;
        println!(
            "inbox bench: {events} messages on {partitions} partitions ({}, topic {topic}), \
             produced in {:.2} s; MySQL/MariaDB {version}, database {}; {} cores",
            broker.kind(),
            produced.as_secs_f64(),
            db.name,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let mut runs = Vec::new();
        if selected("A") {
            runs.push(handwritten_mysql(&broker, &topic, &store, events, partitions).await?);
        }
        runs.extend(inbox_runs(&broker, &topic, &store, events).await?);
        print_table(&runs);
        print_check(&store, events, runs.len()).await?;
        if selected("G") {
            let baseline = runs.first().map_or(1.0, Measured::rate);
            let blackbox = async |n, parts| billing(url, &broker, n, parts).await;
            print_billing(blackbox, events, partitions, backlog, baseline).await?;
        }
        store.pool().close().await;
        Ok(())
    }

    /// Baseline A on MySQL: each message `BEGIN`, an insert of its event id into a dedup
    /// table, the invoice's insert, `COMMIT`.
    async fn handwritten_mysql(
        broker: &Broker,
        topic: &str,
        store: &MySqlStore,
        events: usize,
        lanes: i32,
    ) -> Result<Measured, BoxError> {
        let pool = store.pool().clone();
        let write = move |event_id: String, event: OrderCreated| {
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO bench_seen (event_id) VALUES (?)")
                    .bind(event_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(INSERT_INVOICE)
                    .bind(event.order_id.to_string())
                    .bind(event.total_cents)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }
        };
        handwritten(broker, topic, events, lanes, write).await
    }

    /// Runs B, K, C and D on MySQL: batched in partition and in key order, unbatched (on inbox
    /// tables of their own), without the inbox.
    async fn inbox_runs(
        broker: &Broker,
        topic: &str,
        store: &MySqlStore,
        events: usize,
    ) -> Result<Vec<Measured>, BoxError> {
        use inoutbox::inbox::Ordering::{Key, Partition};
        let runs_of = [
            (
                "B inoutbox batched, partition order",
                "",
                AckStrategy::ExactlyOnceInbox,
                500,
                Partition,
            ),
            (
                "K inoutbox batched, key order (the default)",
                "k",
                AckStrategy::ExactlyOnceInbox,
                500,
                Key,
            ),
            (
                "C inoutbox unbatched (inbox)",
                "c",
                AckStrategy::ExactlyOnceInbox,
                1,
                Partition,
            ),
            (
                "D inoutbox at least once (OnSuccess)",
                "",
                AckStrategy::AT_LEAST_ONCE_ON_SUCCESS,
                500,
                Partition,
            ),
        ];
        let mut runs = Vec::new();
        for (name, prefix, ack, max_batch, ordering) in runs_of {
            if !selected(&name[..1]) {
                continue;
            }
            let store = match prefix {
                "" => store.clone(),
                prefix => {
                    let tables = store
                        .tables()
                        .clone()
                        .inbox(&format!("{prefix}_inbox"))?
                        .attempts(&format!("{prefix}_attempts"))?
                        .dead_letters(&format!("{prefix}_dead_letters"))?
                        .outbox(&format!("{prefix}_outbox"))?
                        .migrations(&format!("{prefix}_migrations"))?;
                    let apart = MySqlStore::with_tables(store.pool().clone(), tables);
                    apart.migrate().await?;
                    apart
                }
            };
            let run = inbox_consumer(
                GROUP, name, broker, topic, store, ack, max_batch, ordering, events,
            );
            runs.push(run.await?);
        }
        Ok(runs)
    }

    /// The rows the runs left: one invoice per message and run, one inbox row per message
    /// (B's), one dedup row per message (A's).
    async fn print_check(store: &MySqlStore, events: usize, runs: usize) -> Result<(), BoxError> {
        let count = async |sql: &str| -> Result<i64, BoxError> {
            Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(store.pool())
                .await?)
        };
        let invoices = count("SELECT count(*) FROM bench_invoices").await?;
        let seen = count("SELECT count(*) FROM bench_seen").await?;
        let inbox = count("SELECT count(*) FROM inoutbox_inbox").await?;
        println!(
            "\ncheck: MySQL bench_invoices = {invoices} (expected {}: {runs} runs), \
             bench_seen = {seen} (A, expected {events}), inbox rows = {inbox} (B, expected {events})",
            runs * events
        );
        Ok(())
    }

    /// The `billing` example on a database of its own (see [`run_billing`]).
    async fn billing(
        url: &str,
        broker: &Broker,
        events: usize,
        partitions: i32,
    ) -> Result<(f64, u64), BoxError> {
        let db = MySqlDatabase::create(url, "inoutbox_billing_bench").await?;
        let exact_sql = format!("SELECT count(*) FROM `{}`.invoices", db.name);
        let progress_sql = format!("SELECT coalesce(max(id), 0) FROM `{}`.invoices", db.name);
        let count = async |exact: bool| -> i64 {
            let sql = if exact { &exact_sql } else { &progress_sql };
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()))
                .fetch_one(db.admin())
                .await
                .unwrap_or(0)
        };
        let result = run_billing(broker, events, partitions, &db.url, count).await;
        db.remove().await?;
        result
    }
}

/// Where the messages are: the in-process cluster (kept alive here) or `KAFKA_BROKERS`.
struct Broker {
    brokers: String,
    in_process: Option<InProcessKafka>,
}

/// The fetch wait of every run on `KAFKA_BROKERS` (the baseline too), besides
/// [`QUICK_JOIN`](inoutbox::kafka::QUICK_JOIN): Tansu holds a fetch for its whole wait even when it has messages
/// to return, so a consumer's rate on it is bounded by what one fetch returns per wait. Kafka
/// answers at once when it has messages, where the wait changes nothing.
const BROKER_FETCH_WAIT: (&str, &str) = ("fetch.wait.max.ms", "20");

impl Broker {
    /// Consumer settings for quick group joins on this broker (and, on a broker of
    /// `KAFKA_BROKERS`, [`BROKER_FETCH_WAIT`]).
    fn consumer_settings(&self) -> Vec<(&'static str, &'static str)> {
        if self.in_process.is_some() {
            InProcessKafka::consumer_settings().to_vec()
        } else {
            [inoutbox::kafka::QUICK_JOIN, &[BROKER_FETCH_WAIT]].concat()
        }
    }

    fn kind(&self) -> &'static str {
        if self.in_process.is_some() {
            "in-process mock cluster"
        } else {
            "KAFKA_BROKERS"
        }
    }
}

async fn start_broker(topic: &str, partitions: i32) -> Result<Broker, BoxError> {
    match std::env::var("KAFKA_BROKERS") {
        Ok(brokers) => {
            create_topic(&brokers, topic, partitions).await?;
            Ok(Broker {
                brokers,
                in_process: None,
            })
        }
        Err(_) => {
            let kafka = InProcessKafka::start()?;
            kafka.create_topic(topic, partitions)?;
            Ok(Broker {
                brokers: kafka.brokers().to_owned(),
                in_process: Some(kafka),
            })
        }
    }
}

fn send(producer: &FutureProducer, topic: &str) -> Result<DeliveryFuture, KafkaError> {
    let event = OrderCreated {
        order_id: Uuid::new_v4(),
        total_cents: 1200,
    };
    let id = Uuid::now_v7().to_string();
    let key = event.order_id.to_string();
    let mut payload = serde_json::to_string(&event).expect("an OrderCreated serializes");
    let pad = PAYLOAD_BYTES.load(std::sync::atomic::Ordering::Relaxed);
    if pad > payload.len() + 10 {
        // An unknown field the handler's serde ignores, up to `--payload-bytes` in all.
        payload.pop();
        payload.push_str(",\"pad\":\"");
        payload.extend(std::iter::repeat_n('x', pad - payload.len() - 2));
        payload.push_str("\"}");
    }
    let record = FutureRecord::to(topic)
        .key(key.as_str())
        .payload(payload.as_str())
        .headers(order_created_headers(&id, "inbox-bench"));
    producer.send_result(record).map_err(|(e, _)| e)
}

/// `--payload-bytes`: the size of each produced payload (0: an `OrderCreated` as it is).
static PAYLOAD_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Produces `events` messages and waits for every acknowledgement.
async fn produce(brokers: &str, topic: &str, events: usize) -> Result<Duration, BoxError> {
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        // Brokers without idempotent producers (Tansu) refuse them; the mock does not care.
        .set("enable.idempotence", "false")
        .set("linger.ms", "5")
        .set(
            "message.max.bytes",
            (PAYLOAD_BYTES.load(std::sync::atomic::Ordering::Relaxed) + (1 << 20)).to_string(),
        )
        // Large messages one per batch: a consumer's partition fetch (1 MiB) then always
        // holds whole batches.
        .set(
            "batch.num.messages",
            if PAYLOAD_BYTES.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                "1"
            } else {
                "10000"
            },
        )
        .create()?;
    let started = Instant::now();
    let mut pending = Vec::with_capacity(events.min(50_000));
    let mut sent = 0;
    while sent < events {
        match send(&producer, topic) {
            Ok(d) => {
                pending.push(d);
                sent += 1;
            }
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => {
                for d in pending.drain(..) {
                    d.await?.map_err(|(e, _)| e)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    for d in pending {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(started.elapsed())
}

/// One run's figures.
struct Measured {
    name: String,
    lanes: usize,
    messages: usize,
    /// First processed message to last.
    span: Duration,
    /// Start to last processed message.
    wall: Duration,
    /// Mean gap between consecutive completions on one lane.
    per_message: Duration,
}

impl Measured {
    /// `completions`: (lane, when) for every message.
    fn new(name: &str, started: Instant, completions: &[(i32, Instant)]) -> Self {
        let first = completions.iter().map(|c| c.1).min().unwrap_or(started);
        let last = completions.iter().map(|c| c.1).max().unwrap_or(started);
        let mut lanes: HashMap<i32, (Instant, Instant, u32)> = HashMap::new();
        for &(lane, at) in completions {
            let e = lanes.entry(lane).or_insert((at, at, 0));
            e.0 = e.0.min(at);
            e.1 = e.1.max(at);
            e.2 += 1;
        }
        let busy: Duration = lanes.values().map(|(f, l, _)| *l - *f).sum();
        let gaps: u32 = lanes.values().map(|(_, _, n)| n.saturating_sub(1)).sum();
        Self {
            name: name.to_owned(),
            lanes: lanes.len(),
            messages: completions.len(),
            span: last - first,
            wall: last - started,
            per_message: busy.checked_div(gaps).unwrap_or_default(),
        }
    }

    fn rate(&self) -> f64 {
        self.messages.saturating_sub(1) as f64 / self.span.as_secs_f64().max(1e-9)
    }
}

/// Baseline A on PostgreSQL: each message `BEGIN; INSERT; COMMIT`, see [`handwritten`].
async fn handwritten_postgres(
    broker: &Broker,
    topic: &str,
    pool: &PgPool,
    events: usize,
    lanes: i32,
) -> Result<Measured, BoxError> {
    let pool = pool.clone();
    let write = move |_event_id: String, event: OrderCreated| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            sqlx::query(INSERT_INVOICE)
                .bind(event.order_id)
                .bind(event.total_cents)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
    };
    handwritten(broker, topic, events, lanes, write).await
}

/// Baseline A: a hand-written consumer, one lane per partition, each message written by `write`
/// (its `ce_id` and event: one transaction) and then its offset committed (asynchronously),
/// the way one writes it by hand.
async fn handwritten<W, F>(
    broker: &Broker,
    topic: &str,
    events: usize,
    lanes: i32,
    write: W,
) -> Result<Measured, BoxError>
where
    W: Fn(String, OrderCreated) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    use rdkafka::message::Headers as _;
    let started = Instant::now();
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &broker.brokers)
        .set("group.id", format!("inbox-bench-raw-{}", Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (k, v) in broker.consumer_settings() {
        config.set(k, v);
    }
    let consumer: std::sync::Arc<StreamConsumer> = std::sync::Arc::new(config.create()?);
    consumer.subscribe(&[topic])?;
    let (done_tx, mut done) = mpsc::unbounded_channel::<(i32, Instant)>();
    let mut lane_tx = HashMap::new();
    for lane in 0..lanes {
        let (tx, mut rx) = mpsc::channel::<(String, i32, i64, String, Vec<u8>)>(1000);
        lane_tx.insert(lane, tx);
        let (write, consumer, done_tx) = (write.clone(), consumer.clone(), done_tx.clone());
        tokio::spawn(async move {
            while let Some((topic, partition, offset, event_id, payload)) = rx.recv().await {
                let event: OrderCreated = serde_json::from_slice(&payload).expect("json");
                write(event_id, event).await.expect("write");
                let mut tpl = rdkafka::TopicPartitionList::new();
                let _ = tpl.add_partition_offset(
                    &topic,
                    partition,
                    rdkafka::Offset::Offset(offset + 1),
                );
                let _ = consumer.commit(&tpl, CommitMode::Async);
                let _ = done_tx.send((partition, Instant::now()));
            }
        });
    }
    let mut completions = Vec::with_capacity(events);
    let mut received = 0;
    while completions.len() < events {
        tokio::select! {
            m = consumer.recv(), if received < events => {
                let m = m?;
                let lane = m.partition() % lanes;
                let payload = m.payload().unwrap_or_default().to_vec();
                let event_id = m
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == "ce_id"))
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                let lane_message = (m.topic().to_owned(), m.partition(), m.offset(), event_id, payload);
                lane_tx[&lane].send(lane_message).await?;
                received += 1;
            }
            c = done.recv() => completions.push(c.ok_or("lanes ended")?),
            _ = tokio::time::sleep(Duration::from_secs(60)) => {
                return Err(format!("hand-written consumer stalled after {}", completions.len()).into());
            }
        }
    }
    consumer.unsubscribe();
    Ok(Measured::new(
        "A hand-written, 1 tx/msg",
        started,
        &completions,
    ))
}

/// Runs B to F: inoutbox's consumer until every message is processed, then a graceful stop.
#[allow(clippy::too_many_arguments)] // the settings of one run, named at each call
async fn inbox_consumer<S: inoutbox::store::InboxStore>(
    group: &str,
    name: &str,
    broker: &Broker,
    topic: &str,
    store: S,
    ack: AckStrategy,
    max_batch: usize,
    ordering: inoutbox::inbox::Ordering,
    events: usize,
) -> Result<Measured, BoxError> {
    let started = Instant::now();
    let kafka = broker.consumer_settings().iter().fold(
        inoutbox::KafkaConfig::new(broker.brokers.clone(), [topic])
            .group_id(format!("inbox-bench-{}", Uuid::new_v4())),
        |c, (k, v)| c.set(*k, *v),
    );
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    let consumer = inoutbox::Consumer::builder(group, store, kafka)
        .ack(ack)
        .max_batch(max_batch)
        .ordering(ordering)
        .reports(report_tx)
        .build()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let mut completions = Vec::with_capacity(events);
    while completions.len() < events {
        match tokio::time::timeout(Duration::from_secs(60), reports.recv()).await {
            Ok(Some(r)) => match r.outcome {
                Outcome::Processed { .. } => {
                    completions.push((r.delivery.partition, Instant::now()));
                }
                other => {
                    return Err(
                        format!("{name}: {} ended as {other:?}", r.delivery.coordinates()).into(),
                    )
                }
            },
            _ => return Err(format!("{name}: stalled after {}", completions.len()).into()),
        }
    }
    let measured = Measured::new(name, started, &completions);
    let _ = stop.send(());
    handle.await??;
    Ok(measured)
}

async fn count(pool: &PgPool, sql: &str) -> Result<i64, BoxError> {
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?)
}

fn print_table(runs: &[Measured]) {
    let baseline = runs.first().map_or(1.0, Measured::rate);
    let width = runs.iter().map(|r| r.name.len()).max().unwrap_or(0).max(3);
    println!(
        "\n{:<width$} {:>5} {:>8} {:>8} {:>9} {:>6} {:>12} {:>7}",
        "run", "lanes", "messages", "seconds", "msgs/s", "vs A", "ms/msg/lane", "wall s"
    );
    for r in runs {
        println!(
            "{:<width$} {:>5} {:>8} {:>8.2} {:>9.0} {:>5.2}x {:>12.3} {:>7.2}",
            r.name,
            r.lanes,
            r.messages,
            r.span.as_secs_f64(),
            r.rate(),
            r.rate() / baseline,
            r.per_message.as_secs_f64() * 1e3,
            r.wall.as_secs_f64(),
        );
    }
}

/// The most messages a partition of librdkafka's in-process mock cluster holds for these runs:
/// past about 20 000 it drops the oldest, and every run stalls waiting for them.
const MOCK_PARTITION_MESSAGES: usize = 20_000;

/// Refuses, before anything is produced, a run the in-process broker cannot hold: `events` on
/// `partitions`, and a `backlog` (0 when no run drains one) on 12 partitions.
fn fits_the_mock(events: usize, partitions: i32, backlog: usize) -> Result<(), BoxError> {
    let per_partition = events.div_ceil(usize::try_from(partitions)?);
    let most = per_partition.max(backlog.div_ceil(12));
    if most > MOCK_PARTITION_MESSAGES {
        return Err(format!(
            "the in-process broker holds about {MOCK_PARTITION_MESSAGES} messages a partition, and \
             this run puts {most} on one (--events {events} on {partitions} partitions, --backlog \
             {backlog} on 12): use fewer messages or more partitions, or a broker of your own \
             (KAFKA_BROKERS=127.0.0.1:9092 with scripts/install-tansu, or NATS_URL)"
        )
        .into());
    }
    Ok(())
}

/// Whether run `letter` is selected by `INBOX_BENCH_RUNS` (default: all of `ABKCDEFLG`; `L` is
/// the latency part, `G` the black-box `billing` runs).
fn selected(letter: &str) -> bool {
    std::env::var("INBOX_BENCH_RUNS").map_or(true, |runs| runs.contains(letter))
}

/// `--pool N`: the connections of the PostgreSQL pool every run shares (at least
/// `--partitions` + 2); K's key lanes per partition are sized from it.
static POOL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(16);

/// PostgreSQL in `schema`: the invoices table and inoutbox's tables.
async fn open_postgres(
    database_url: &str,
    schema: &str,
    partitions: i32,
) -> Result<(PgPool, inoutbox::PgStore), BoxError> {
    let options: PgConnectOptions = database_url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(
            POOL.load(std::sync::atomic::Ordering::Relaxed)
                .max(partitions.max(1) as u32 + 2),
        )
        // As `PgStore::connect` sets it: no test round trip on every acquire (every run).
        .test_before_acquire(false)
        .connect_with(options.options([("search_path", schema)]))
        .await?;
    sqlx::raw_sql(INVOICES).execute(&pool).await?;
    let tables = inoutbox::Tables::with_schema(schema)?;
    let pg = inoutbox::PgStore::with_tables(pool.clone(), tables);
    pg.migrate().await?;
    Ok((pool, pg))
}

/// A store on `pg`'s pool whose inbox tables are `prefix`ed (a run of its own: B's rows would
/// make every message a duplicate).
async fn store_apart(pg: &inoutbox::PgStore, prefix: &str) -> Result<inoutbox::PgStore, BoxError> {
    let tables = pg.tables().clone();
    let tables = tables
        .inbox(&format!("{prefix}_inbox"))?
        .attempts(&format!("{prefix}_attempts"))?
        .dead_letters(&format!("{prefix}_dead_letters"))?
        .outbox(&format!("{prefix}_outbox"))?
        .migrations(&format!("{prefix}_migrations"))?;
    let store = inoutbox::PgStore::with_tables(pg.pool().clone(), tables);
    store.migrate().await?;
    Ok(store)
}

/// Runs B, K, C, D and F: inoutbox's consumer on PostgreSQL, batched in partition order,
/// batched in key lanes (`Ordering::Key`), unbatched, without the inbox, and a batch handler.
async fn postgres_runs(
    broker: &Broker,
    topic: &str,
    pg: &inoutbox::PgStore,
    events: usize,
) -> Result<Vec<Measured>, BoxError> {
    use inoutbox::inbox::Ordering::{Key, Partition};
    let runs_of: [(
        &str,
        &str,
        &str,
        AckStrategy,
        usize,
        inoutbox::inbox::Ordering,
    ); 5] = [
        (
            "B inoutbox batched, partition order",
            "",
            GROUP,
            AckStrategy::ExactlyOnceInbox,
            500,
            Partition,
        ),
        (
            "K inoutbox batched, key order (the default)",
            "k",
            GROUP,
            AckStrategy::ExactlyOnceInbox,
            500,
            Key,
        ),
        (
            "C inoutbox unbatched (inbox)",
            "c",
            GROUP,
            AckStrategy::ExactlyOnceInbox,
            1,
            Partition,
        ),
        (
            "D inoutbox at least once (OnSuccess)",
            "",
            GROUP,
            AckStrategy::AT_LEAST_ONCE_ON_SUCCESS,
            500,
            Partition,
        ),
        (
            "F inoutbox batch handler (multi-row)",
            "f",
            BATCH_GROUP,
            AckStrategy::ExactlyOnceInbox,
            500,
            Partition,
        ),
    ];
    let mut runs = Vec::new();
    for (name, prefix, group, ack, max_batch, ordering) in runs_of {
        if !selected(&name[..1]) {
            continue;
        }
        let store = match prefix {
            "" => pg.clone(),
            prefix => store_apart(pg, prefix).await?,
        };
        let run = inbox_consumer(
            group, name, broker, topic, store, ack, max_batch, ordering, events,
        );
        runs.push(run.await?);
    }
    if BIG_ROWS.load(std::sync::atomic::Ordering::Relaxed) > 0 && selected("B") {
        runs.push(big_table_run(broker, topic, pg, events).await?);
    }
    Ok(runs)
}

/// `--big-table N`: B again, on an inbox that already holds N processed rows.
static BIG_ROWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// B on an inbox of its own pre-filled with [`BIG_ROWS`] processed rows (random event ids, as
/// CloudEvents ids are), a tenth of them deleted again (retention's bloat), then analyzed.
async fn big_table_run(
    broker: &Broker,
    topic: &str,
    pg: &inoutbox::PgStore,
    events: usize,
) -> Result<Measured, BoxError> {
    let rows = BIG_ROWS.load(std::sync::atomic::Ordering::Relaxed);
    let store = store_apart(pg, "big").await?;
    let inbox = store.tables().inbox.to_string();
    let started = Instant::now();
    // In slices of a million, so that no one statement holds everything.
    for from in (0..rows).step_by(1_000_000) {
        let to = (from + 1_000_000).min(rows);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \
             \"partition\", \"offset\", received_at, processed_at) \
             SELECT '{GROUP}', 'inbox-bench', gen_random_uuid()::text, 'OrderCreated', 'old', \
             (i % 12)::int, i, now() - interval '1 day', now() - interval '1 day' \
             FROM generate_series({from}, {to} - 1) AS i"
        )))
        .execute(pg.pool())
        .await?;
    }
    // Retention's bloat, then statistics (VACUUM runs outside a transaction: one statement).
    for sql in [
        format!("DELETE FROM {inbox} WHERE \"offset\" % 10 = 0"),
        format!("VACUUM ANALYZE {inbox}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(pg.pool())
            .await?;
    }
    println!(
        "big table: {rows} processed rows in {inbox} ({} of them deleted again), filled in {:.1} s",
        rows / 10,
        started.elapsed().as_secs_f64()
    );
    let name = format!("B' batched, partition order, {rows} rows already in the inbox");
    inbox_consumer(
        GROUP,
        &name,
        broker,
        topic,
        store,
        AckStrategy::ExactlyOnceInbox,
        500,
        inoutbox::inbox::Ordering::Partition,
        events,
    )
    .await
}

/// Run D: B on SQLite; returns its figures and the invoices it wrote.
#[cfg(feature = "sqlite")]
async fn sqlite_run(
    broker: &Broker,
    topic: &str,
    events: usize,
    partitions: i32,
) -> Result<(Measured, i64), BoxError> {
    let db = on_sqlite::Db::open(partitions.max(1) as u32 + 2).await?;
    let d = inbox_consumer(
        GROUP,
        "E inoutbox batched on SQLite (WAL)",
        broker,
        topic,
        db.store.clone(),
        AckStrategy::ExactlyOnceInbox,
        500,
        inoutbox::inbox::Ordering::Key,
        events,
    )
    .await?;
    Ok((d, db.invoices().await?))
}

/// The PostgreSQL rows the runs left: one invoice per message and PostgreSQL run, one inbox
/// row per message (B's).
async fn print_postgres_check(
    pool: &PgPool,
    events: usize,
    pg_runs: usize,
) -> Result<(), BoxError> {
    let invoices = count(pool, "SELECT count(*) FROM bench_invoices").await?;
    let inbox_rows = count(
        pool,
        &format!("SELECT count(*) FROM {}", inoutbox::Tables::default().inbox),
    )
    .await?;
    println!(
        "\ncheck: PostgreSQL bench_invoices = {invoices} (expected {}: {pg_runs} runs), \
         inbox rows = {inbox_rows} (B, expected {events})",
        pg_runs * events
    );
    Ok(())
}

/// Produces `events` messages at `rate` per second, each with its send time in `x-sent-us`.
async fn produce_at_rate(
    brokers: &str,
    topic: &str,
    events: usize,
    rate: u64,
) -> Result<(), BoxError> {
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "false")
        .set("linger.ms", "0")
        .create()?;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    let mut pending = Vec::new();
    for _ in 0..events {
        tick.tick().await;
        let event = OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents: 1,
        };
        let (id, key) = (Uuid::now_v7().to_string(), event.order_id.to_string());
        let sent = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
            .to_string();
        let headers = order_created_headers(&id, "inbox-bench").insert(rdkafka::message::Header {
            key: "x-sent-us",
            value: Some(sent.as_str()),
        });
        let payload = serde_json::to_string(&event)?;
        let record = FutureRecord::to(topic)
            .key(key.as_str())
            .payload(payload.as_str())
            .headers(headers);
        pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for d in pending {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Messages a latency run sends, and waits for, before it measures: the first ones after a
/// group join wait for the first fetches and the first database connections (up to 170 ms on
/// Tansu), which is start-up, not the steady latency measured.
const WARM_UP: usize = 200;

/// The latencies' median and 99th percentile.
fn percentiles(mut latencies: Vec<Duration>) -> (Duration, Duration) {
    latencies.sort();
    let pick = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    (pick(0.50), pick(0.99))
}

/// How long ago a message produced by [`produce_at_rate`] was sent.
fn age(headers: Option<&[u8]>) -> Result<Duration, BoxError> {
    let sent: u128 = headers
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .ok_or("no x-sent-us")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros();
    Ok(Duration::from_micros(now.saturating_sub(sent) as u64))
}

/// A fresh 3-partition topic for a latency run.
async fn latency_topic(broker: &Broker) -> Result<String, BoxError> {
    let topic = format!(
        "inoutbox-inbox-latency-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    match &broker.in_process {
        Some(kafka) => kafka.create_topic(&topic, 3)?,
        None => create_topic(&broker.brokers, &topic, 3).await?,
    }
    Ok(topic)
}

/// The broker's own share of the latency: a bare rdkafka consumer with the same settings,
/// produce to receive, no database, at the same offered rate.
async fn bare_latency(
    broker: &Broker,
    rate: u64,
    seconds: u64,
) -> Result<(Duration, Duration), BoxError> {
    use rdkafka::message::Headers as _;
    let topic = latency_topic(broker).await?;
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &broker.brokers)
        .set("group.id", format!("inbox-bench-bare-{}", Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    for (k, v) in broker.consumer_settings() {
        config.set(k, v);
    }
    let consumer: StreamConsumer = config.create()?;
    consumer.subscribe(&[topic.as_str()])?;
    measure(broker, &topic, rate, seconds, async || {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv()).await??;
        let sent = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "x-sent-us"))
            .and_then(|h| h.value);
        age(sent)
    })
    .await
}

/// Waits for the group join, produces [`WARM_UP`] messages at `rate` and takes them unmeasured,
/// then produces `rate * seconds` more while `next` takes each and says how old it is: their
/// median and 99th percentile.
async fn measure(
    broker: &Broker,
    topic: &str,
    rate: u64,
    seconds: u64,
    mut next: impl AsyncFnMut() -> Result<Duration, BoxError>,
) -> Result<(Duration, Duration), BoxError> {
    tokio::time::sleep(Duration::from_secs(3)).await; // the group join
    produce_at_rate(&broker.brokers, topic, WARM_UP, rate).await?;
    for _ in 0..WARM_UP {
        next().await?;
    }
    let events = (rate * seconds) as usize;
    let producing = tokio::spawn({
        let (brokers, topic) = (broker.brokers.clone(), topic.to_owned());
        async move {
            produce_at_rate(&brokers, &topic, events, rate)
                .await
                .map_err(|e| e.to_string())
        }
    });
    let mut latencies = Vec::with_capacity(events);
    while latencies.len() < events {
        latencies.push(next().await?);
    }
    producing.await?.map_err(|e| -> BoxError { e.into() })?;
    Ok(percentiles(latencies))
}

/// End-to-end latency, produce to handler commit, at a steady `rate` offered.
async fn latency(
    broker: &Broker,
    pg: &inoutbox::PgStore,
    rate: u64,
    seconds: u64,
) -> Result<(Duration, Duration), BoxError> {
    let topic = latency_topic(broker).await?;
    let kafka = broker.consumer_settings().iter().fold(
        inoutbox::KafkaConfig::new(broker.brokers.clone(), [topic.as_str()])
            .group_id(format!("inbox-bench-{}", Uuid::new_v4())),
        |c, (k, v)| c.set(*k, *v),
    );
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    let consumer = inoutbox::Consumer::builder(GROUP, pg.clone(), kafka)
        .reports(report_tx)
        .build()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let measured = measure(broker, &topic, rate, seconds, async || {
        let r = tokio::time::timeout(Duration::from_secs(30), reports.recv())
            .await?
            .ok_or("consumer ended")?;
        age(r.delivery.header("x-sent-us"))
    })
    .await?;
    let _ = stop.send(());
    handle.await??;
    Ok(measured)
}

/// The unchanged `billing` example, run as a child process on a fresh schema and topic with a
/// backlog of `events`: its rate (first to last invoice, polled every 20 ms) and peak RSS.
async fn billing_blackbox(
    database_url: &str,
    broker: &Broker,
    events: usize,
    partitions: i32,
) -> Result<(f64, u64), BoxError> {
    let schema = BillingSchema::create(database_url).await?;
    let count = async |exact| schema.invoices(exact).await;
    let result = run_billing(broker, events, partitions, &schema.url, count).await;
    schema.remove().await?;
    result
}

/// A PostgreSQL schema of a `billing` run's own: the URL that chooses it (`search_path`), and
/// its invoices.
struct BillingSchema {
    name: String,
    admin: PgPool,
    url: String,
}

impl BillingSchema {
    async fn create(database_url: &str) -> Result<Self, BoxError> {
        let name = format!(
            "inoutbox_billing_bench_{}",
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(database_url)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{name}\"")))
            .execute(&admin)
            .await?;
        let sep = if database_url.contains('?') { '&' } else { '?' };
        let url = format!("{database_url}{sep}options=-c%20search_path%3D{name}");
        Ok(Self { name, admin, url })
    }

    /// The invoices written so far (0 before `billing` created its table): `exact`, their
    /// count; else the highest invoice id (see [`run_billing`]'s progress).
    async fn invoices(&self, exact: bool) -> i64 {
        let sql = if exact {
            format!("SELECT count(*) FROM \"{}\".invoices", self.name)
        } else {
            format!(
                "SELECT coalesce(max(id), 0) FROM \"{}\".invoices",
                self.name
            )
        };
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.admin)
            .await
            .unwrap_or(0)
    }

    async fn remove(self) -> Result<(), BoxError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA \"{}\" CASCADE",
            self.name
        )))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }
}

/// The `billing` example's executable, built beside this bench.
fn billing_exe() -> Result<std::path::PathBuf, BoxError> {
    let exe = std::env::current_exe()?.with_file_name("billing");
    if !exe.exists() {
        return Err(format!(
            "{} is missing: run cargo build --release --examples",
            exe.display()
        )
        .into());
    }
    Ok(exe)
}

/// Produces a backlog of `events` onto a fresh topic of `partitions`, then runs the `billing`
/// example on it with `DATABASE_URL=url` until `count` (its invoices) reaches `events`: its
/// rate (first to last invoice, polled every 20 ms) and peak RSS. `count(false)` is the
/// progress, read cheaply (the highest invoice id: one index look-up, where a `count(*)` every
/// 20 ms would scan the table beside the run it measures); `count(true)` the exact count,
/// read once the progress says done (ids may have gaps).
async fn run_billing(
    broker: &Broker,
    events: usize,
    partitions: i32,
    url: &str,
    count: impl AsyncFnMut(bool) -> i64,
) -> Result<(f64, u64), BoxError> {
    let exe = billing_exe()?;
    let topic = format!(
        "inoutbox-billing-bench-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    match &broker.in_process {
        Some(kafka) => kafka.create_topic(&topic, partitions)?,
        None => create_topic(&broker.brokers, &topic, partitions).await?,
    }
    produce(&broker.brokers, &topic, events).await?;
    let pool = POOL.load(std::sync::atomic::Ordering::Relaxed).to_string();
    let child = std::process::Command::new(&exe)
        .args([
            // The group is billing's own (`--group` names its handlers' group); the topic is
            // new, so nothing is committed for it yet. Its PostgreSQL pool is the runs' `--pool`.
            "--topic", &topic, "--pool", &pool,
        ])
        .env("DATABASE_URL", url)
        .env("KAFKA_BROKERS", &broker.brokers)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    watch_child(child, count, events).await
}

/// Watches the `billing` process `child` until `count` (its invoices) reaches `events`, then
/// kills it: its rate (first to last invoice, polled every 20 ms) and peak RSS.
async fn watch_child(
    mut child: std::process::Child,
    count: impl AsyncFnMut(bool) -> i64,
    events: usize,
) -> Result<(f64, u64), BoxError> {
    let result = watch_billing(count, child.id(), events).await;
    let _ = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    result
}

async fn watch_billing(
    mut count: impl AsyncFnMut(bool) -> i64,
    pid: u32,
    events: usize,
) -> Result<(f64, u64), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut first = None;
    let mut exact = false;
    loop {
        let mut n = count(exact).await;
        if n > 0 && first.is_none() {
            first = Some((Instant::now(), n));
        }
        if n as usize >= events && !exact {
            exact = true;
            n = count(true).await;
        }
        if n as usize >= events {
            let (t0, n0) = first.unwrap_or((Instant::now(), 0));
            let rate = (n - n0) as f64 / t0.elapsed().as_secs_f64().max(1e-9);
            return Ok((rate, peak_rss_kb(pid)));
        }
        if Instant::now() > deadline {
            return Err(format!("billing processed {n} of {events} in 600 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The peak resident set (VmHWM) of process `pid`, in KiB.
fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn bench(
    database_url: &str,
    schema: &str,
    events: usize,
    partitions: i32,
    backlog: usize,
) -> Result<(), BoxError> {
    let (pool, pg) = open_postgres(database_url, schema, partitions).await?;
    let topic = format!(
        "inoutbox-inbox-bench-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let broker = start_broker(&topic, partitions).await?;
    let produced = produce(&broker.brokers, &topic, events).await?;
    println!(
        "inbox bench: {events} messages on {partitions} partitions ({}, topic {topic}), \
         produced in {:.2} s; PostgreSQL schema {schema}; {} cores",
        broker.kind(),
        produced.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let mut runs = Vec::new();
    if selected("A") {
        runs.push(handwritten_postgres(&broker, &topic, &pool, events, partitions).await?);
    }
    runs.extend(postgres_runs(&broker, &topic, &pg, events).await?);
    #[cfg(feature = "sqlite")]
    if selected("E") {
        let (d, invoices) = sqlite_run(&broker, &topic, events, partitions).await?;
        runs.push(d);
        println!("check: SQLite bench_invoices = {invoices} (E, expected {events})");
    }
    print_table(&runs);
    let pg_runs = runs.iter().filter(|r| !r.name.starts_with('E')).count();
    print_postgres_check(&pool, events, pg_runs).await?;
    if selected("L") {
        print_latency(&broker, &pg).await?;
    }
    // Closed before the black-box runs: its idle connections (up to `--pool`) would count
    // against the server's `max_connections` beside the child's own pool of that size.
    pool.close().await;
    if selected("G") {
        let baseline = runs.first().map_or(1.0, Measured::rate);
        let blackbox = async |n, parts| billing_blackbox(database_url, &broker, n, parts).await;
        print_billing(blackbox, events, partitions, backlog, baseline).await?;
    }
    Ok(())
}

/// The latency part: inoutbox's and a bare consumer's, at 1 000 msgs/s offered for 10 s.
async fn print_latency(broker: &Broker, pg: &inoutbox::PgStore) -> Result<(), BoxError> {
    let (p50, p99) = latency(broker, pg, 1000, 10).await?;
    let (bare50, bare99) = bare_latency(broker, 1000, 10).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nlatency, 1 000 msgs/s offered for 10 s: inoutbox batched, produce -> handler commit: \
         p50 {:.1} ms, p99 {:.1} ms; a bare consumer, produce -> receive (no database): \
         p50 {:.1} ms, p99 {:.1} ms",
        ms(p50),
        ms(p99),
        ms(bare50),
        ms(bare99)
    );
    Ok(())
}

/// The black-box part: the `billing` example (run by `blackbox(messages, partitions)`) on
/// `partitions` and 12 partitions, then draining a backlog; `baseline` is A's rate.
async fn print_billing(
    blackbox: impl AsyncFn(usize, i32) -> Result<(f64, u64), BoxError>,
    events: usize,
    partitions: i32,
    backlog: usize,
    baseline: f64,
) -> Result<(), BoxError> {
    for parts in [partitions, 12] {
        let (rate, _) = blackbox(events, parts).await?;
        println!(
            "billing example (child process), {events} messages on {parts} partitions: {rate:.0} msgs/s ({:.1}x A)",
            rate / baseline
        );
    }
    if backlog == 0 {
        return Ok(());
    }
    let (rate, rss) = blackbox(backlog, 12).await?;
    println!(
        "billing example draining a {backlog}-message backlog on 12 partitions: {rate:.0} msgs/s, \
         peak RSS {:.1} MB",
        rss as f64 / 1024.0
    );
    Ok(())
}

/// `--payload-bytes N`: only the peak RSS of the `billing` example draining `backlog` messages
/// of N bytes each on 12 partitions (payloads over 1 MiB are dead-lettered, the rest handled).
async fn rss_with_large_messages(
    database_url: &str,
    backlog: usize,
    payload_bytes: usize,
) -> Result<(), BoxError> {
    let topic = format!(
        "inoutbox-inbox-bench-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let broker = start_broker(&topic, 1).await?;
    let (rate, rss) = billing_blackbox(database_url, &broker, backlog, 12).await?;
    println!(
        "billing example draining a {backlog}-message backlog of {payload_bytes}-byte payloads on \
         12 partitions ({}): {rate:.0} msgs/s, peak RSS {:.1} MB",
        broker.kind(),
        rss as f64 / 1024.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let events: usize = flag(&args, "--events", "20000")?.parse()?;
    let partitions: i32 = flag(&args, "--partitions", "3")?.parse()?;
    let backlog: usize = flag(&args, "--backlog", "200000")?.parse()?;
    let payload_bytes: usize = flag(&args, "--payload-bytes", "0")?.parse()?;
    PAYLOAD_BYTES.store(payload_bytes, std::sync::atomic::Ordering::Relaxed);
    POOL.store(
        flag(&args, "--pool", "16")?.parse()?,
        std::sync::atomic::Ordering::Relaxed,
    );
    BIG_ROWS.store(
        flag(&args, "--big-table", "0")?.parse()?,
        std::sync::atomic::Ordering::Relaxed,
    );
    if events == 0 || partitions < 1 {
        return Err("--events and --partitions must be at least 1".into());
    }
    let latency_ms: u64 = flag(&args, "--db-latency-ms", "0")?.parse()?;
    let nats_url = std::env::var("NATS_URL").ok().filter(|u| !u.is_empty());
    if nats_url.is_none() && std::env::var_os("KAFKA_BROKERS").is_none() {
        // The backlog goes onto 12 partitions, for `G` and for `--payload-bytes`.
        let drained = if selected("G") || payload_bytes > 0 {
            backlog
        } else {
            0
        };
        fits_the_mock(events, partitions, drained)?;
    }
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    if nats_url.is_some() && !cfg!(feature = "nats") {
        return Err("NATS_URL is set: build with `--features nats`".into());
    }
    if database_url.starts_with("mysql://") || database_url.starts_with("mariadb://") {
        if nats_url.is_some() {
            return Err("the NATS runs are PostgreSQL's only: unset NATS_URL".into());
        }
        if latency_ms > 0 || payload_bytes > 0 {
            return Err("--db-latency-ms and --payload-bytes are PostgreSQL's only".into());
        }
        #[cfg(feature = "mysql")]
        return on_mysql::bench(&database_url, events, partitions, backlog).await;
        #[cfg(not(feature = "mysql"))]
        return Err("DATABASE_URL names MySQL: build with `--features mysql`".into());
    }
    // `--db-latency-ms N`: every connection to PostgreSQL (the baseline's and inoutbox's alike)
    // goes through a proxy that adds N ms each way.
    let _proxy;
    let database_url = if latency_ms > 0 {
        let options: sqlx::postgres::PgConnectOptions = database_url.parse()?;
        let upstream = format!("{}:{}", options.get_host(), options.get_port());
        let proxy = inoutbox_chaos::Proxy::start(upstream.as_str())?;
        proxy.set_latency(Duration::from_millis(latency_ms), Duration::ZERO);
        let url = database_url.replacen(&upstream, &proxy.addr().to_string(), 1);
        if url == database_url {
            return Err(
                format!("--db-latency-ms: DATABASE_URL must name {upstream} literally").into(),
            );
        }
        println!(
            "PostgreSQL behind a proxy adding {latency_ms} ms each way ({})",
            proxy.addr()
        );
        _proxy = proxy;
        url
    } else {
        database_url
    };

    // A schema of this run's own, dropped whatever happens.
    let schema = format!(
        "inoutbox_inbox_bench_{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&admin)
        .await?;
    let result = if let Some(url) = nats_url {
        #[cfg(feature = "nats")]
        {
            on_nats::bench(&database_url, &schema, &url, events, partitions, backlog).await
        }
        #[cfg(not(feature = "nats"))]
        Err::<(), BoxError>(format!("NATS_URL={url}: build with `--features nats`").into())
    } else if payload_bytes > 0 {
        rss_with_large_messages(&database_url, backlog, payload_bytes).await
    } else {
        bench(&database_url, &schema, events, partitions, backlog).await
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(&admin)
    .await?;
    result
}

/// The runs on NATS JetStream (`NATS_URL`, feature `nats`): A hand-written (async-nats and
/// sqlx), B inoutbox in this process, and the `billing` example as a child process, each on a
/// stream of their own; PostgreSQL only.
#[cfg(feature = "nats")]
mod on_nats {
    use std::time::{Duration, Instant};

    use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy};
    use futures_util::StreamExt;
    use inoutbox::inbox::Report;
    use inoutbox::nats::{stream_name, NatsConfig};
    use inoutbox::{AckStrategy, Outcome};
    use sqlx::PgPool;
    use tokio::sync::{mpsc, oneshot};
    use uuid::Uuid;

    use super::common::nats::{fresh_stream, jetstream, publish_windows, remove_stream};
    use super::{
        count, open_postgres, print_billing, print_table, selected, watch_child, BillingSchema,
        BoxError, Measured, OrderCreated, GROUP, INSERT_INVOICE,
    };

    /// The window of the backlogs' publishing (acknowledgements awaited every this many).
    const WINDOW: usize = 1000;

    /// Where the runs read: the server of `NATS_URL`.
    pub struct Nats {
        pub url: String,
        js: jetstream::Context,
    }

    impl Nats {
        /// Fresh streams of `topic` holding `events` messages on `partitions` partitions.
        async fn backlog(
            &self,
            topic: &str,
            partitions: u32,
            events: usize,
        ) -> Result<Duration, BoxError> {
            fresh_stream(&self.js, topic, partitions).await?;
            publish_windows(&self.js, topic, partitions, events, WINDOW, 1).await
        }
    }

    fn new_topic(prefix: &str) -> String {
        format!("{prefix}-{}", &Uuid::new_v4().simple().to_string()[..8])
    }

    /// Every NATS run on PostgreSQL schema `schema`.
    pub async fn bench(
        database_url: &str,
        schema: &str,
        url: &str,
        events: usize,
        partitions: i32,
        backlog: usize,
    ) -> Result<(), BoxError> {
        let (pool, pg) = open_postgres(database_url, schema, partitions).await?;
        sqlx::raw_sql("CREATE TABLE bench_seen (event_id text PRIMARY KEY)")
            .execute(&pool)
            .await?;
        let nats = Nats {
            url: url.to_owned(),
            js: jetstream(url).await?,
        };
        let topic = new_topic("inoutbox-inbox-bench");
        let parts = u32::try_from(partitions)?;
        let produced = nats.backlog(&topic, parts, events).await?;
        println!(
            "inbox bench: {events} messages on {partitions} partitions (NATS JetStream at {url}, \
             streams {}..), published in {:.2} s; PostgreSQL schema {schema}; {} cores",
            stream_name(&topic, 0),
            produced.as_secs_f64(),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let mut runs = Vec::new();
        if selected("A") {
            runs.push(handwritten(&nats, &topic, &pool, events, parts).await?);
        }
        if selected("B") {
            runs.push(inbox_consumer(&nats, &topic, pg, events, parts).await?);
        }
        remove_stream(&nats.js, &topic, parts).await;
        print_table(&runs);
        let invoices = count(&pool, "SELECT count(*) FROM bench_invoices").await?;
        let seen = count(&pool, "SELECT count(*) FROM bench_seen").await?;
        println!(
            "\ncheck: bench_invoices = {invoices} (expected {}: {} runs), bench_seen = {seen} \
             (A, expected {events})",
            runs.len() * events,
            runs.len()
        );
        if selected("G") {
            let baseline = runs.first().map_or(1.0, Measured::rate);
            let blackbox = async |n, parts| {
                let schema = BillingSchema::create(database_url).await?;
                let count = async |exact| schema.invoices(exact).await;
                let result = billing(&nats, n, parts, &schema.url, count).await;
                schema.remove().await?;
                result
            };
            print_billing(blackbox, events, partitions, backlog, baseline).await?;
        }
        pool.close().await;
        Ok(())
    }

    /// Baseline A on NATS: one lane per partition, each a pull consumer of its partition's
    /// stream (explicit acknowledgement) that, for each message, runs `BEGIN`, the insert of
    /// its `ce_id` into a dedup table (`ON CONFLICT DO NOTHING`: a repeat writes nothing
    /// more), the invoice's insert, `COMMIT`, and then acknowledges it: the way one writes it
    /// by hand.
    async fn handwritten(
        nats: &Nats,
        topic: &str,
        pool: &PgPool,
        events: usize,
        lanes: u32,
    ) -> Result<Measured, BoxError> {
        let started = Instant::now();
        let (done_tx, mut done) = mpsc::unbounded_channel::<(i32, Instant)>();
        let mut tasks = Vec::new();
        for lane in 0..lanes {
            let stream = nats.js.get_stream(stream_name(topic, lane)).await?;
            let consumer = stream
                .create_consumer(pull::Config {
                    durable_name: Some(format!("handwritten-{lane}")),
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                })
                .await?;
            let (pool, done_tx) = (pool.clone(), done_tx.clone());
            tasks.push(tokio::spawn(async move {
                let mut messages = consumer.messages().await?;
                while let Some(message) = messages.next().await {
                    let message = message?;
                    let event_id = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("ce_id"))
                        .map(|v| v.as_str().to_owned())
                        .unwrap_or_default();
                    let event: OrderCreated = serde_json::from_slice(&message.payload)?;
                    let mut tx = pool.begin().await?;
                    let new = sqlx::query(
                        "INSERT INTO bench_seen (event_id) VALUES ($1) ON CONFLICT DO NOTHING",
                    )
                    .bind(event_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if new == 1 {
                        sqlx::query(INSERT_INVOICE)
                            .bind(event.order_id)
                            .bind(event.total_cents)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    message.ack().await?;
                    let _ = done_tx.send((i32::try_from(lane)?, Instant::now()));
                }
                Ok::<_, BoxError>(())
            }));
        }
        let mut completions = Vec::with_capacity(events);
        while completions.len() < events {
            match tokio::time::timeout(Duration::from_secs(60), done.recv()).await {
                Ok(Some(c)) => completions.push(c),
                _ => {
                    return Err(format!(
                        "hand-written consumer stalled after {}",
                        completions.len()
                    )
                    .into())
                }
            }
        }
        for task in tasks {
            task.abort();
        }
        Ok(Measured::new(
            "A hand-written, 1 tx + 1 ack/msg",
            started,
            &completions,
        ))
    }

    /// Run B on NATS: inoutbox's consumer (`NatsConfig`, batched, the `bench` group's handler)
    /// in this process until every message is processed, then a graceful stop.
    async fn inbox_consumer(
        nats: &Nats,
        topic: &str,
        store: inoutbox::PgStore,
        events: usize,
        partitions: u32,
    ) -> Result<Measured, BoxError> {
        let name = "B inoutbox batched (NatsConfig)";
        let started = Instant::now();
        let config = NatsConfig::new(nats.url.clone(), [topic]).partitions(partitions);
        let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
        let consumer = inoutbox::Consumer::builder(GROUP, store, config)
            .ack(AckStrategy::ExactlyOnceInbox)
            .reports(report_tx)
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(consumer.run(async move {
            let _ = stopped.await;
        }));
        let mut completions = Vec::with_capacity(events);
        while completions.len() < events {
            match tokio::time::timeout(Duration::from_secs(60), reports.recv()).await {
                Ok(Some(r)) => match r.outcome {
                    Outcome::Processed { .. } => {
                        completions.push((r.delivery.partition, Instant::now()));
                    }
                    other => {
                        return Err(format!(
                            "{name}: {} ended as {other:?}",
                            r.delivery.coordinates()
                        )
                        .into())
                    }
                },
                _ => return Err(format!("{name}: stalled after {}", completions.len()).into()),
            }
        }
        let measured = Measured::new(name, started, &completions);
        let _ = stop.send(());
        handle.await??;
        Ok(measured)
    }

    /// The `billing` example on a fresh stream holding `events` messages on `partitions`
    /// partitions, run with `NATS_URL` and `--partitions` (its `NatsConfig`) on
    /// `DATABASE_URL=url`, until `count` (its invoices) reaches `events`.
    async fn billing(
        nats: &Nats,
        events: usize,
        partitions: i32,
        url: &str,
        count: impl AsyncFnMut(bool) -> i64,
    ) -> Result<(f64, u64), BoxError> {
        let exe = super::billing_exe()?;
        let topic = new_topic("inoutbox-billing-bench");
        nats.backlog(&topic, u32::try_from(partitions)?, events)
            .await?;
        let child = std::process::Command::new(&exe)
            .args(["--topic", &topic, "--partitions", &partitions.to_string()])
            .env("DATABASE_URL", url)
            .env("NATS_URL", &nats.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let result = watch_child(child, count, events).await;
        remove_stream(&nats.js, &topic, u32::try_from(partitions)?).await;
        result
    }
}
