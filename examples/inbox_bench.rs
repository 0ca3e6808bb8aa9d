//! Inbox benchmark: the consumer's throughput and per-message cost, against a raw rdkafka
//! consumer doing a plain insert, measured in the same run on the same topic and database.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release --example inbox_bench -- [--events 20000] [--partitions 3]
//! ```
//!
//! `--events` `OrderCreated` messages (CloudEvents binary mode, a unique `ce_id` each) are
//! produced once onto a fresh topic of `--partitions` partitions: on librdkafka's in-process mock
//! cluster by default, on `KAFKA_BROKERS` if set. Then each run reads the whole topic with a
//! Kafka consumer group of its own and writes one `bench_invoices` row per message:
//!
//! * **A, raw consumer, plain insert** (baseline): an rdkafka `StreamConsumer` that decodes the
//!   JSON, runs one autocommit `INSERT` and commits the offset asynchronously; one lane, no
//!   inbox, no deduplication.
//! * **B, inbox (`ExactlyOnceInbox`)**: txbox's `Consumer` on `PgStore`: inbox row, handler and
//!   processed mark in one transaction, then the offset commit; one lane per partition.
//! * **C, at least once (`OnSuccess`)**: the same transaction without the inbox row, so B - C is
//!   the inbox row's own cost.
//! * **D, inbox on SQLite** (with the `sqlite` feature): B on `SqliteStore`, a temporary WAL file.
//!
//! Throughput is measured from the first processed message to the last (group joins excluded):
//! msgs/s = (messages - 1) / (last - first). `ms/msg/lane` is the mean gap between consecutive
//! completions on one lane (the partition task of a txbox run, the single loop of A); with the
//! backlog always waiting, that is the cost of handling one message. `wall` also counts start-up
//! and the group join. PostgreSQL rows live in a fresh schema, dropped at the end.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::Message as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use txbox::inbox::Report;
use txbox::kafka::{InProcessKafka, CONSUMER_SETTINGS};
use txbox::prelude::*;
use txbox::{AckStrategy, Outcome};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{
    create_topic, flag, order_created_headers, BoxError, OrderCreated, QUICK_GROUP_SETTINGS,
};

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
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    use txbox::prelude::*;
    use txbox::SqliteTx;

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
        pub store: txbox::SqliteStore,
    }

    impl Db {
        pub async fn open(max_connections: u32) -> Result<Self, BoxError> {
            let dir = std::env::temp_dir().join(format!(
                "txbox-inbox-bench-{}",
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
            let store = txbox::SqliteStore::new(pool);
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

/// Where the messages are: the in-process cluster (kept alive here) or `KAFKA_BROKERS`.
struct Broker {
    brokers: String,
    in_process: Option<InProcessKafka>,
}

impl Broker {
    /// Consumer settings for quick group joins on this broker.
    fn consumer_settings(&self) -> &'static [(&'static str, &'static str)] {
        if self.in_process.is_some() {
            CONSUMER_SETTINGS
        } else {
            QUICK_GROUP_SETTINGS
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
    let payload = serde_json::to_string(&event).expect("an OrderCreated serializes");
    let record = FutureRecord::to(topic)
        .key(key.as_str())
        .payload(payload.as_str())
        .headers(order_created_headers(&id, "inbox-bench"));
    producer.send_result(record).map_err(|(e, _)| e)
}

/// Produces `events` messages and waits for every acknowledgement.
async fn produce(brokers: &str, topic: &str, events: usize) -> Result<Duration, BoxError> {
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        // Brokers without idempotent producers (Tansu) refuse them; the mock does not care.
        .set("enable.idempotence", "false")
        .set("linger.ms", "5")
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

/// Baseline A: a plain rdkafka consumer, one autocommit insert per message, async offset commits.
async fn raw_consumer(
    broker: &Broker,
    topic: &str,
    pool: &PgPool,
    events: usize,
) -> Result<Measured, BoxError> {
    let started = Instant::now();
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &broker.brokers)
        .set("group.id", format!("inbox-bench-raw-{}", Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (k, v) in broker.consumer_settings() {
        config.set(*k, *v);
    }
    let consumer: StreamConsumer = config.create()?;
    consumer.subscribe(&[topic])?;
    let mut completions = Vec::with_capacity(events);
    while completions.len() < events {
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .map_err(|_| format!("raw consumer stalled after {}", completions.len()))??;
        let event: OrderCreated = serde_json::from_slice(m.payload().unwrap_or_default())?;
        sqlx::query(INSERT_INVOICE)
            .bind(event.order_id)
            .bind(event.total_cents)
            .execute(pool)
            .await?;
        consumer.commit_message(&m, CommitMode::Async)?;
        completions.push((0, Instant::now()));
    }
    consumer.unsubscribe();
    Ok(Measured::new(
        "A raw consumer, plain insert",
        started,
        &completions,
    ))
}

/// Runs B, C, D: txbox's consumer until every message is processed, then a graceful stop.
async fn inbox_consumer<S: txbox::store::InboxStore>(
    name: &str,
    broker: &Broker,
    topic: &str,
    store: S,
    ack: AckStrategy,
    events: usize,
) -> Result<Measured, BoxError> {
    let started = Instant::now();
    let kafka = broker.consumer_settings().iter().fold(
        txbox::KafkaConfig::new(broker.brokers.clone(), [topic])
            .group_id(format!("inbox-bench-{}", Uuid::new_v4())),
        |c, (k, v)| c.set(*k, *v),
    );
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    let consumer = txbox::Consumer::builder(GROUP, store, kafka)
        .ack(ack)
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
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

fn print_table(runs: &[Measured]) {
    let baseline = runs.first().map_or(1.0, Measured::rate);
    println!(
        "\n{:<34} {:>5} {:>8} {:>8} {:>9} {:>6} {:>12} {:>7}",
        "run", "lanes", "messages", "seconds", "msgs/s", "vs A", "ms/msg/lane", "wall s"
    );
    for r in runs {
        println!(
            "{:<34} {:>5} {:>8} {:>8.2} {:>9.0} {:>5.2}x {:>12.3} {:>7.2}",
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

/// PostgreSQL in `schema`: the invoices table and txbox's tables.
async fn open_postgres(
    database_url: &str,
    schema: &str,
    partitions: i32,
) -> Result<(PgPool, txbox::PgStore), BoxError> {
    let options: PgConnectOptions = database_url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(partitions.max(1) as u32 + 2)
        .connect_with(options.options([("search_path", schema)]))
        .await?;
    sqlx::raw_sql(INVOICES).execute(&pool).await?;
    let tables = txbox::Tables::with_schema(schema)?;
    let pg = txbox::PgStore::with_tables(pool.clone(), tables);
    pg.migrate().await?;
    Ok((pool, pg))
}

/// Runs B and C: txbox's consumer on PostgreSQL, with and without the inbox row.
async fn postgres_runs(
    broker: &Broker,
    topic: &str,
    pg: &txbox::PgStore,
    events: usize,
) -> Result<[Measured; 2], BoxError> {
    let b = inbox_consumer(
        "B inbox (ExactlyOnceInbox)",
        broker,
        topic,
        pg.clone(),
        AckStrategy::ExactlyOnceInbox,
        events,
    )
    .await?;
    let c = inbox_consumer(
        "C at least once (OnSuccess)",
        broker,
        topic,
        pg.clone(),
        AckStrategy::AT_LEAST_ONCE_ON_SUCCESS,
        events,
    )
    .await?;
    Ok([b, c])
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
        "D inbox on SQLite (WAL)",
        broker,
        topic,
        db.store.clone(),
        AckStrategy::ExactlyOnceInbox,
        events,
    )
    .await?;
    Ok((d, db.invoices().await?))
}

/// The PostgreSQL rows the runs left: one invoice per message and run, one inbox row per message.
async fn print_postgres_check(pool: &PgPool, events: usize) -> Result<(), BoxError> {
    let invoices = count(pool, "SELECT count(*) FROM bench_invoices").await?;
    let inbox_rows = count(
        pool,
        &format!("SELECT count(*) FROM {}", txbox::Tables::default().inbox),
    )
    .await?;
    println!(
        "\ncheck: PostgreSQL bench_invoices = {invoices} (A + B + C, expected {}), inbox rows = \
         {inbox_rows} (B only, expected {events})",
        3 * events
    );
    Ok(())
}

async fn bench(
    database_url: &str,
    schema: &str,
    events: usize,
    partitions: i32,
) -> Result<(), BoxError> {
    let (pool, pg) = open_postgres(database_url, schema, partitions).await?;
    let topic = format!(
        "txbox-inbox-bench-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let broker = start_broker(&topic, partitions).await?;
    let produced = produce(&broker.brokers, &topic, events).await?;
    println!(
        "inbox bench: {events} messages on {partitions} partitions ({}, topic {topic}), \
         produced in {:.2} s; PostgreSQL schema {schema}",
        broker.kind(),
        produced.as_secs_f64()
    );

    let mut runs = vec![raw_consumer(&broker, &topic, &pool, events).await?];
    runs.extend(postgres_runs(&broker, &topic, &pg, events).await?);
    #[cfg(feature = "sqlite")]
    let sqlite_invoices = {
        let (d, invoices) = sqlite_run(&broker, &topic, events, partitions).await?;
        runs.push(d);
        invoices
    };

    print_table(&runs);
    print_postgres_check(&pool, events).await?;
    #[cfg(feature = "sqlite")]
    println!("check: SQLite bench_invoices = {sqlite_invoices} (D, expected {events})");
    pool.close().await;
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
    if events == 0 || partitions < 1 {
        return Err("--events and --partitions must be at least 1".into());
    }
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());

    // A schema of this run's own, dropped whatever happens.
    let schema = format!(
        "txbox_inbox_bench_{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url)
        .await?;
    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&admin)
        .await?;
    let result = bench(&database_url, &schema, events, partitions).await;
    sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&admin)
        .await?;
    result
}
