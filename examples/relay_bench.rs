//! Relay benchmark: everything issue 11 asks for, in one run, against one PostgreSQL and one
//! broker, with raw rdkafka as the baseline.
//!
//! ```text
//! cargo build --release --example relay   # the SIGTERM measurement runs it as a process
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --release --example relay_bench -- --no-idempotence \
//!     [--sizes 20000,100000,500000] [--rate 200] [--writers 16] [--writer-secs 2] [--workers 2] \
//!     [--batch 1000] [--rounds 3] [--phases latency,drain,sigterm,writers] [--log] \
//!     [--db-latency-ms 0]
//! ```
//! `--db-latency-ms N` puts PostgreSQL behind the chaos proxy, adding N ms each way (the
//! SIGTERM phase's relay process connects through it too).
//!
//! * **Latency**: a writer commits one event per transaction at `--rate` events/s (10 s) while
//!   one relay (woken by NOTIFY, 1 s poll) publishes; latency = the broker's acknowledgement
//!   (delivery report) minus the commit's return. Baseline: the same messages produced with
//!   rdkafka at the same rate, latency = acknowledgement minus send.
//! * **Raw produce**: 100 000 messages with the relay's producer settings, as fast as
//!   possible: the rate the broker takes.
//! * **Drain**: for each `--sizes` backlog, the rows are committed first (generated in one
//!   statement, shaped like `enqueue`'s: one key per order), then one relay, or two relays, are
//!   started; rate = rows / time from start until no row is unpublished (acknowledged *and*
//!   marked). Each run starts from an empty table; one relay and two relays alternate, and the
//!   best of `--rounds` runs of each is reported (the machine is shared: the best run is the
//!   one least disturbed by others).
//! * **SIGTERM**: the relay example (`cargo build --release --example relay` first: it must sit
//!   beside this bench) publishes a 100 000-row backlog and gets SIGTERM once a tenth is
//!   marked; printed: time from the signal to its exit, and whether the rows marked published
//!   are exactly the events on the topic (read until quiet).
//! * **Writers**: `--writers` tasks each commit transactions of one business insert
//!   (`INSERT INTO orders`) for `--writer-secs`; then the same plus `enqueue` of an
//!   `OrderCreated` (one row, key lock, coalesced NOTIFY); then the same plus a `SELECT 1`
//!   instead (what one more statement costs, whatever it does); then the same plus an insert of
//!   a row of the same size into a plain table with the outbox's columns and indexes (no
//!   triggers, locks or NOTIFY: what the row itself costs); in 7 rounds of interleaved
//!   slices, medians reported. No relay runs, so the ratio is what the outbox costs the
//!   writers' own transactions.
//!
//! With `DATABASE_URL=mysql://root@127.0.0.1:3306/test` (feature `mysql`: `cargo run --release
//! --all-features --example relay_bench -- --phases drain ..`) the drain phase runs on
//! MySQL/MariaDB, in a database of the bench's own created on that server and dropped at the
//! end, against the same raw produce; the backlog is committed in multi-row inserts of 2 000
//! rows (one transaction). MySQL's relay store has one slot (`GET_LOCK`): the second relay is a
//! standby. The other phases are PostgreSQL's only.
//!
//! With `NATS_URL=nats://127.0.0.1:4222` (feature `nats`: `cargo run --release --all-features
//! --example relay_bench -- --phases drain`; a `nats-server -js`) the drain phase publishes to
//! NATS JetStream instead of Kafka, on PostgreSQL or MySQL/MariaDB: the raw rate is JetStream
//! publishing of 100 000 messages shaped as the relay's (headers, key header, `Nats-Msg-Id`), in
//! windows of `--batch` messages published without waiting and then their acknowledgements
//! awaited, from `--workers` tasks side by side on one connection (what the relays do with their
//! batches, without the database); each relay publishes through a `NatsPublisher` of its own.
//! The stream (`inoutbox-bench`, 4 partitions) is emptied before every run and deleted at the
//! end. The other phases are Kafka's only.
//!
//! Rows live in a fresh schema (dropped at the end); messages go to topic `inoutbox-bench`
//! (created with 4 partitions if missing). `--log` prints inoutbox's and sqlx's debug logs
//! (statements, rebalances).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use inoutbox::kafka::KafkaProducer;
use inoutbox::prelude::*;
use inoutbox::relay::{IntoRelayStore, Relay, RelayConfig, RelayReport};
use inoutbox::transport::IntoPublisher;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::mpsc;
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{create_topic, env, flag, order_created_headers, BoxError};

/// `OrderCreated` on the bench's own topic (the shared event goes to `orders`).
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "inoutbox-bench", key = order_id)]
pub struct BenchOrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

const TOPIC: &str = <BenchOrderCreated as inoutbox::OutboxEvent>::TOPIC;
const PARTITIONS: i32 = 4;
const RAW_EVENTS: usize = 100_000;
const LATENCY_SECS: f64 = 10.0;
/// The backlog the SIGTERM measurement stops a relay in.
const SIGTERM_ROWS: usize = 100_000;
/// Interleaved slices of each kind of writer.
const WRITER_ROUNDS: usize = 7;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(name: &str, mut latencies: Vec<Duration>) -> String {
    latencies.sort();
    format!(
        "{name:<36} n={:<6} p50={:>7.2} ms  p99={:>7.2} ms  max={:>7.2} ms",
        latencies.len(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    )
}

fn event() -> BenchOrderCreated {
    BenchOrderCreated {
        order_id: Uuid::new_v4(),
        total_cents: 1200,
    }
}

/// The record the relay would produce for `event`.
fn raw_send(
    producer: &FutureProducer,
    topic: &str,
    e: &BenchOrderCreated,
) -> rdkafka::producer::DeliveryFuture {
    let id = Uuid::now_v7().to_string();
    let key = e.order_id.to_string();
    let payload = serde_json::to_string(e).expect("json");
    let record = FutureRecord::to(topic)
        .key(key.as_str())
        .payload(payload.as_str())
        .headers(order_created_headers(&id, "bench"));
    producer
        .send_result(record)
        .map_err(|(e, _)| e)
        .expect("enqueue in librdkafka")
}

/// What to measure, from the command line and the environment.
struct Settings {
    sizes: Vec<usize>,
    rate: f64,
    writers: usize,
    writer_secs: f64,
    workers: usize,
    batch: usize,
    rounds: usize,
    phases: String,
    idempotence: bool,
    database_url: String,
    /// `KAFKA_BROKERS` (empty on NATS).
    brokers: String,
    /// The server of `NATS_URL`, when set: the drain phase publishes there.
    nats: Option<NatsSide>,
}

impl Settings {
    fn from_args() -> Result<Self, BoxError> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let sizes = flag(&args, "--sizes", "20000,100000,500000")?
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<usize>, _>>()?;
        Ok(Self {
            sizes,
            rate: flag(&args, "--rate", "200")?.parse()?,
            writers: flag(&args, "--writers", "16")?.parse()?,
            writer_secs: flag(&args, "--writer-secs", "2")?.parse()?,
            workers: flag(&args, "--workers", "2")?.parse()?,
            batch: flag(&args, "--batch", "1000")?.parse()?,
            rounds: flag(&args, "--rounds", "3")?.parse()?,
            phases: flag(&args, "--phases", "latency,drain,sigterm,writers")?,
            idempotence: !args.iter().any(|a| a == "--no-idempotence"),
            database_url: env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?,
            brokers: match std::env::var("NATS_URL") {
                Ok(url) if !url.is_empty() => String::new(),
                _ => env("KAFKA_BROKERS", "127.0.0.1:9092")?,
            },
            nats: None,
        })
    }

    fn latency_events(&self) -> usize {
        (self.rate * LATENCY_SECS).max(100.0) as usize
    }

    /// One commit (or send) per period at `--rate`.
    fn period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rate)
    }

    fn producer(&self) -> KafkaProducer {
        KafkaProducer::new(self.brokers.clone()).idempotence(self.idempotence)
    }

    fn relay_config(&self) -> RelayConfig {
        let mut config = RelayConfig::default();
        config.source = "bench".to_owned();
        config.workers = self.workers;
        config.batch_size = self.batch;
        config.retention = None;
        config
    }
}

/// A schema of this run's own, with inoutbox's tables and an `orders` table in it.
struct Schema {
    name: String,
    admin_pool: PgPool,
    pool: PgPool,
    tables: inoutbox::Tables,
}

impl Schema {
    async fn create(settings: &Settings) -> Result<Self, BoxError> {
        let suffix = &Uuid::new_v4().simple().to_string()[..8];
        let name = format!("inoutbox_bench_{suffix}");
        let admin_pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&settings.database_url)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{name}\"")))
            .execute(&admin_pool)
            .await?;
        let options: PgConnectOptions = settings.database_url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(settings.writers as u32 + 2)
            .connect_with(options.options([("search_path", name.as_str())]))
            .await?;
        let tables = inoutbox::Tables::with_schema(&name)?;
        inoutbox::PgStore::with_tables(pool.clone(), tables.clone())
            .migrate()
            .await?;
        sqlx::raw_sql(
            "CREATE TABLE orders (id uuid PRIMARY KEY, total_cents bigint NOT NULL, \
             created_at timestamptz NOT NULL DEFAULT now())",
        )
        .execute(&pool)
        .await?;
        Ok(Self {
            name,
            admin_pool,
            pool,
            tables,
        })
    }

    fn start_relay(
        &self,
        config: &RelayConfig,
        producer: KafkaProducer,
        reports: Option<mpsc::UnboundedSender<RelayReport>>,
    ) -> Running {
        let store = inoutbox::PgStore::with_tables(self.pool.clone(), self.tables.clone());
        spawn_relay(store, config, producer, reports)
    }

    async fn exec(&self, sql: &str) -> Result<(), BoxError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn remove(self) -> Result<(), BoxError> {
        self.pool.close().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA \"{}\" CASCADE",
            self.name
        )))
        .execute(&self.admin_pool)
        .await?;
        Ok(())
    }
}

/// A relay on `store` publishing with `producer`, running until stopped.
fn spawn_relay<S: IntoRelayStore, P: IntoPublisher>(
    store: S,
    config: &RelayConfig,
    producer: P,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
) -> Running
where
    S::Store: 'static,
    P::Publisher: 'static,
{
    let publisher = producer.into_publisher().expect("producer");
    let mut relay = Relay::with_store(store.into_relay_store(), publisher, config.clone());
    if let Some(reports) = reports {
        relay = relay.reports(reports);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stopped.await;
            })
            .await
            .expect("relay");
    });
    Running { stop, handle }
}

/// What the drain phase needs of a database: a backlog, whether rows are left unpublished,
/// relays.
trait Drained {
    /// Empties the outbox, then commits `rows` rows as `enqueue` writes them (one key per
    /// order).
    async fn backlog(&self, rows: usize) -> Result<(), BoxError>;
    /// Whether a row is not yet marked published.
    async fn unpublished(&self) -> Result<bool, BoxError>;
    /// A relay on the outbox, publishing with `producer`.
    fn relay<P: IntoPublisher>(&self, config: &RelayConfig, producer: P) -> Running
    where
        P::Publisher: 'static;
}

impl Drained for Schema {
    async fn backlog(&self, rows: usize) -> Result<(), BoxError> {
        backlog_on(self, rows, TOPIC).await
    }

    async fn unpublished(&self) -> Result<bool, BoxError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM inoutbox_outbox WHERE published_at IS NULL)",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    fn relay<P: IntoPublisher>(&self, config: &RelayConfig, producer: P) -> Running
    where
        P::Publisher: 'static,
    {
        let store = inoutbox::PgStore::with_tables(self.pool.clone(), self.tables.clone());
        spawn_relay(store, config, producer, None)
    }
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) -> Result<(), BoxError> {
        let _ = self.stop.send(());
        self.handle.await?;
        Ok(())
    }
}

/// Latency, raw rdkafka baseline: send at the bench's rate, latency = ack - send.
async fn raw_latency(producer: &FutureProducer, settings: &Settings) -> Vec<Duration> {
    let mut tick = tokio::time::interval(settings.period());
    let (lat_tx, mut lat_rx) = mpsc::unbounded_channel();
    for _ in 0..settings.latency_events() {
        tick.tick().await;
        let sent = Instant::now();
        let delivery = raw_send(producer, TOPIC, &event());
        let lat_tx = lat_tx.clone();
        tokio::spawn(async move {
            if let Ok(Ok(_)) = delivery.await {
                let _ = lat_tx.send(sent.elapsed());
            }
        });
    }
    drop(lat_tx);
    let mut latencies = Vec::new();
    while let Some(l) = lat_rx.recv().await {
        latencies.push(l);
    }
    latencies
}

/// Latency through the outbox: commit at the bench's rate with a relay running,
/// latency = ack - commit.
async fn relay_latency(schema: &Schema, settings: &Settings) -> Result<Vec<Duration>, BoxError> {
    let (tx, mut reports) = mpsc::unbounded_channel();
    let relay = schema.start_relay(&settings.relay_config(), settings.producer(), Some(tx));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (pool, period, n) = (
        schema.pool.clone(),
        settings.period(),
        settings.latency_events(),
    );
    let writer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        let mut commits = HashMap::with_capacity(n);
        for _ in 0..n {
            tick.tick().await;
            let mut tx = pool.begin().await.expect("begin");
            let id = inoutbox::outbox::enqueue(&mut tx, &event())
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
            commits.insert(id, SystemTime::now());
        }
        commits
    });
    let mut acks = Vec::with_capacity(n);
    while acks.len() < n {
        match tokio::time::timeout(Duration::from_secs(60), reports.recv()).await {
            Ok(Some(RelayReport::Published { id, acked_at, .. })) => acks.push((id, acked_at)),
            Ok(Some(RelayReport::Failed { error, .. })) => panic!("relay failed: {error}"),
            _ => panic!("relay stalled after {} of {n}", acks.len()),
        }
    }
    let commits = writer.await?;
    relay.stop().await?;
    Ok(acks
        .iter()
        .filter_map(|(id, acked)| {
            let commit = commits.get(id)?;
            Some(acked.duration_since(*commit).unwrap_or_default())
        })
        .collect())
}

/// Raw produce: `RAW_EVENTS` messages as fast as possible; events/s.
async fn raw_throughput(producer: &FutureProducer) -> Result<f64, BoxError> {
    let started = Instant::now();
    let deliveries: Vec<_> = (0..RAW_EVENTS)
        .map(|_| raw_send(producer, TOPIC, &event()))
        .collect();
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(RAW_EVENTS as f64 / started.elapsed().as_secs_f64())
}

/// Commits `rows` outbox rows as `enqueue` writes them (one key per order), in one statement.
async fn backlog_on(schema: &Schema, rows: usize, topic: &str) -> Result<(), BoxError> {
    schema.exec("TRUNCATE inoutbox_outbox").await?;
    sqlx::query(
        "INSERT INTO inoutbox_outbox (id, aggregateid, type, topic, message_key, payload) \
         SELECT gen_random_uuid(), k, 'OrderCreated', $2, k, \
                jsonb_build_object('order_id', k, 'total_cents', 1200) \
         FROM (SELECT gen_random_uuid()::text AS k FROM generate_series(1, $1)) AS keys",
    )
    .bind(rows as i64)
    .bind(topic)
    .execute(&schema.pool)
    .await?;
    schema.exec("ANALYZE inoutbox_outbox").await
}

/// Starts `relays` relays on a backlog of `rows`; events/s until every row is marked.
async fn drain(
    db: &impl Drained,
    settings: &Settings,
    rows: usize,
    relays: usize,
) -> Result<f64, BoxError> {
    db.backlog(rows).await?;
    if let Some(nats) = &settings.nats {
        nats.empty().await?;
    }
    let started = Instant::now();
    let running: Vec<Running> = match &settings.nats {
        Some(nats) => nats.relays(db, &settings.relay_config(), relays).await?,
        None => (0..relays)
            .map(|_| db.relay(&settings.relay_config(), settings.producer()))
            .collect(),
    };
    loop {
        if !db.unpublished().await? {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("{relays} relay(s) did not drain {rows} rows in 600 s").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    for r in running {
        r.stop().await?;
    }
    Ok(rows as f64 / elapsed.as_secs_f64())
}

/// What a writer's transaction does besides its business insert.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    /// Nothing: the baseline.
    Nothing,
    /// `enqueue` of one event.
    Enqueue,
    /// `SELECT 1`: the cost of any extra statement (one more round trip), for reference.
    EmptyStatement,
    /// An insert of a row of the same size (the same columns and values `enqueue` writes,
    /// slot included) into `plain_outbox`: a plain table with the outbox's columns and indexes
    /// but none of its triggers, key locks or NOTIFY. What a row costs.
    SameSizeRow,
}

/// The same-size insert: `plain_outbox` has the outbox's columns, defaults and indexes
/// (`LIKE .. INCLUDING DEFAULTS INCLUDING INDEXES`: `seq` from the outbox's sequence), no
/// trigger.
const SAME_SIZE_ROW: &str =
    "INSERT INTO plain_outbox (id, type, topic, message_key, payload, headers, slot) \
     VALUES ($1, 'OrderCreated', 'inoutbox-bench', $2, $3::text::json, $4, \
     (hashtextextended($2, 0) & 63)::int2)";

/// `writers` tasks committing for `secs`: one business insert plus `extra`; transactions per
/// second.
async fn writers(schema: &Schema, settings: &Settings, extra: Extra) -> Result<f64, BoxError> {
    let done = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..settings.writers)
        .map(|_| {
            let (pool, done, count) = (schema.pool.clone(), done.clone(), count.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    let e = event();
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
                        .bind(e.order_id)
                        .bind(e.total_cents)
                        .execute(&mut *tx)
                        .await
                        .expect("insert");
                    match extra {
                        Extra::Nothing => {}
                        Extra::Enqueue => {
                            inoutbox::outbox::enqueue(&mut tx, &e)
                                .await
                                .expect("enqueue");
                        }
                        Extra::EmptyStatement => {
                            sqlx::query("SELECT 1")
                                .execute(&mut *tx)
                                .await
                                .expect("select");
                        }
                        Extra::SameSizeRow => {
                            same_size_row(&mut tx, &e).await.expect("same-size insert");
                        }
                    }
                    tx.commit().await.expect("commit");
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    let before = count.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(settings.writer_secs)).await;
    let committed = count.load(Ordering::Relaxed) - before;
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    Ok(committed as f64 / elapsed.as_secs_f64())
}

/// The row `enqueue` would write for `e`, into the plain table (see [`SAME_SIZE_ROW`]).
async fn same_size_row(
    tx: &mut sqlx::PgConnection,
    e: &BenchOrderCreated,
) -> Result<(), sqlx::Error> {
    let id = Uuid::now_v7();
    let headers = serde_json::json!({
        "ce_id": id.to_string(), "ce_source": "bench", "ce_specversion": "1.0",
        "ce_type": "OrderCreated", "content-type": "application/json",
        "ce_time": "2026-01-01T00:00:00.000000Z",
    });
    sqlx::query(SAME_SIZE_ROW)
        .bind(id)
        .bind(e.order_id.to_string())
        .bind(serde_json::to_string(e).expect("json"))
        .bind(headers)
        .execute(tx)
        .await?;
    Ok(())
}

/// The kinds of writers in short interleaved slices (the order rotating each round, so
/// that a burst of other load on the shared machine hits them alike); the median transactions
/// per second of each.
async fn measure_writers(schema: &Schema, settings: &Settings) -> Result<[f64; 4], BoxError> {
    let kinds = [
        Extra::Nothing,
        Extra::Enqueue,
        Extra::EmptyStatement,
        Extra::SameSizeRow,
    ];
    let mut rates: [Vec<f64>; 4] = Default::default();
    for round in 0..WRITER_ROUNDS {
        for i in 0..kinds.len() {
            let k = (i + round) % kinds.len();
            rates[k].push(writers(schema, settings, kinds[k]).await?);
        }
    }
    Ok(rates.map(|mut r| {
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    }))
}

/// SIGTERM to the relay example (a process of its own, built next to this bench) while it
/// publishes a backlog of `SIGTERM_ROWS`: how long it takes to exit, and whether the rows it
/// marked are exactly the events the broker has.
async fn sigterm(schema: &Schema, settings: &Settings) -> Result<(), BoxError> {
    let topic = format!(
        "inoutbox-bench-sigterm-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    create_topic(&settings.brokers, &topic, PARTITIONS).await?;
    backlog_on(schema, SIGTERM_ROWS, &topic).await?;
    let exe = std::env::current_exe()?.with_file_name("relay");
    if !exe.exists() {
        return Err(format!("build the relay example too: {} is missing", exe.display()).into());
    }
    let url = format!(
        "{}{}options=-c%20search_path%3D{}",
        settings.database_url,
        if settings.database_url.contains('?') {
            '&'
        } else {
            '?'
        },
        schema.name
    );
    let mut child = std::process::Command::new(exe)
        .args(["--poll-ms", "200"])
        .args((!settings.idempotence).then_some("--no-idempotence"))
        .env("DATABASE_URL", url)
        .env("KAFKA_BROKERS", &settings.brokers)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    while marked(schema).await? < (SIGTERM_ROWS / 10) as i64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let signalled = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let took = signalled.elapsed();
    let marked_ids: std::collections::HashSet<Uuid> =
        sqlx::query_scalar("SELECT id FROM inoutbox_outbox WHERE published_at IS NOT NULL")
            .fetch_all(&schema.pool)
            .await?
            .into_iter()
            .collect();
    let on_topic = read_ids_until_quiet(&settings.brokers, &topic).await?;
    println!(
        "\nSIGTERM to the relay process publishing a {SIGTERM_ROWS}-row backlog \
         (at its exit {} rows marked, {} left):",
        marked_ids.len(),
        SIGTERM_ROWS - marked_ids.len()
    );
    println!(
        "  exited {:.0} ms after the signal ({status}); events on the topic {}, \
         acknowledged but not marked {}, marked but not on the topic {}",
        took.as_secs_f64() * 1e3,
        on_topic.len(),
        on_topic.difference(&marked_ids).count(),
        marked_ids.difference(&on_topic).count()
    );
    Ok(())
}

async fn marked(schema: &Schema) -> Result<i64, BoxError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NOT NULL")
            .fetch_one(&schema.pool)
            .await?,
    )
}

/// The `ce_id`s on `topic`, read from the beginning until nothing came for 3 s.
async fn read_ids_until_quiet(
    brokers: &str,
    topic: &str,
) -> Result<std::collections::HashSet<Uuid>, BoxError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bench-{}", Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut partitions = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        partitions.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&partitions)?;
    tokio::task::spawn_blocking(move || {
        let mut ids = std::collections::HashSet::new();
        let mut last = Instant::now();
        while last.elapsed() < Duration::from_secs(3) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                last = Instant::now();
                let id = m.headers().and_then(|hs| {
                    hs.iter()
                        .find(|h| h.key == "ce_id")
                        .and_then(|h| h.value)
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|v| v.parse::<Uuid>().ok())
                });
                ids.extend(id);
            }
        }
        ids
    })
    .await
    .map_err(Into::into)
}

/// The drain phase on MySQL/MariaDB (`DATABASE_URL=mysql://...`, feature `mysql`), in a database
/// of the bench's own (dropped at the end).
#[cfg(feature = "mysql")]
mod on_mysql {
    use inoutbox::relay::RelayConfig;
    use inoutbox::transport::IntoPublisher;
    use inoutbox::MySqlStore;
    use rdkafka::producer::FutureProducer;
    use uuid::Uuid;

    use super::common::MySqlDatabase;
    use super::{drains, spawn_relay, BoxError, Drained, Running, Settings, TOPIC};

    /// Rows of a backlog's multi-row insert.
    const CHUNK: usize = 2000;

    struct Db {
        store: MySqlStore,
    }

    impl Drained for Db {
        async fn backlog(&self, rows: usize) -> Result<(), BoxError> {
            let pool = self.store.pool();
            sqlx::raw_sql("TRUNCATE TABLE inoutbox_outbox")
                .execute(pool)
                .await?;
            let mut tx = pool.begin().await?;
            for from in (0..rows).step_by(CHUNK) {
                let n = CHUNK.min(rows - from);
                let values = vec!["(?, ?, 'OrderCreated', ?, ?, ?, '{}')"; n].join(", ");
                let insert = format!(
                    "INSERT INTO inoutbox_outbox \
                     (id, aggregateid, type, topic, message_key, payload, headers) VALUES {values}"
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(insert));
                for _ in 0..n {
                    let key = Uuid::new_v4().to_string();
                    let payload = format!(r#"{{"order_id": "{key}", "total_cents": 1200}}"#);
                    query = query
                        .bind(Uuid::new_v4().to_string())
                        .bind(key.clone())
                        .bind(TOPIC)
                        .bind(key)
                        .bind(payload);
                }
                query.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            sqlx::raw_sql("ANALYZE TABLE inoutbox_outbox")
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn unpublished(&self) -> Result<bool, BoxError> {
            let left: i64 = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM inoutbox_outbox WHERE published_at IS NULL)",
            )
            .fetch_one(self.store.pool())
            .await?;
            Ok(left != 0)
        }

        fn relay<P: IntoPublisher>(&self, config: &RelayConfig, producer: P) -> Running
        where
            P::Publisher: 'static,
        {
            spawn_relay(self.store.clone(), config, producer, None)
        }
    }

    /// The drain phase (raw produce, then the relay's drains) on a database of its own.
    pub async fn run(
        settings: &Settings,
        producer: Option<&FutureProducer>,
    ) -> Result<(), BoxError> {
        let db = MySqlDatabase::create(&settings.database_url, "inoutbox_relay_bench").await?;
        let result = async {
            let store = MySqlStore::connect(&db.url).await?;
            store.migrate().await?;
            let version: String = sqlx::query_scalar("SELECT VERSION()")
                .fetch_one(store.pool())
                .await?;
            println!("MySQL/MariaDB {version}, database {}", db.name);
            let drained = Db { store };
            drains(&drained, settings, producer).await?;
            drained.store.pool().close().await;
            Ok::<_, BoxError>(())
        }
        .await;
        db.remove().await?;
        result
    }
}

fn print_drains(raw: f64, raw_name: &str, drains: &[(usize, f64, f64)]) {
    println!(
        "\nthroughput (events/s; drain = rows / time until every row is marked published, best run):"
    );
    println!("  {raw_name} ({RAW_EVENTS} messages)    {raw:>9.0}");
    for (rows, one, two) in drains {
        println!(
            "  relay drain {rows:>7} rows: 1 relay {one:>9.0} ({:>4.1} % of raw)   2 relays {two:>9.0}   (2 vs 1: {:.2}x)",
            100.0 * one / raw,
            two / one
        );
    }
    if let (Some(small), Some(large)) = (drains.first(), drains.last()) {
        println!(
            "  flatness, 1 relay: {} rows vs {} rows: {:.2}x",
            small.0,
            large.0,
            small.1.max(large.1) / small.1.min(large.1)
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut settings = Settings::from_args()?;
    // `--db-latency-ms N`: every connection to PostgreSQL goes through the chaos proxy, which
    // adds N ms each way.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let latency_ms: u64 = flag(&args, "--db-latency-ms", "0")?.parse()?;
    let url = &settings.database_url;
    let mysql = url.starts_with("mysql://") || url.starts_with("mariadb://");
    if mysql && (latency_ms > 0 || settings.phases != "drain") {
        return Err("on MySQL the bench has the drain phase only: pass `--phases drain`".into());
    }
    if mysql && !cfg!(feature = "mysql") {
        return Err("DATABASE_URL names MySQL: build with `--features mysql`".into());
    }
    let _proxy = if latency_ms > 0 {
        let options: PgConnectOptions = settings.database_url.parse()?;
        let upstream = format!("{}:{}", options.get_host(), options.get_port());
        let proxy = inoutbox_chaos::Proxy::start(upstream.as_str())?;
        proxy.set_latency(Duration::from_millis(latency_ms), Duration::ZERO);
        let url = settings
            .database_url
            .replacen(&upstream, &proxy.addr().to_string(), 1);
        if url == settings.database_url {
            return Err(
                format!("--db-latency-ms: DATABASE_URL must name {upstream} literally").into(),
            );
        }
        println!("PostgreSQL behind a proxy adding {latency_ms} ms each way");
        settings.database_url = url;
        Some(proxy)
    } else {
        None
    };
    if std::env::args().any(|a| a == "--log") {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_target(false)
            .init();
    }
    if let Some(url) = std::env::var("NATS_URL").ok().filter(|u| !u.is_empty()) {
        return on_nats(settings, &url, mysql).await;
    }
    create_topic(&settings.brokers, TOPIC, PARTITIONS).await?;
    let producer: FutureProducer = settings.producer().client_config().create()?;
    println!(
        "relay bench: {PARTITIONS} partitions, idempotence={}, {} workers per relay, \
         batch {}, backlogs {:?}",
        settings.idempotence,
        settings.workers,
        settings.relay_config().batch_size,
        settings.sizes
    );
    raw_send(&producer, TOPIC, &event())
        .await?
        .map_err(|(e, _)| e)?; // warm-up: metadata and connections
    if mysql {
        #[cfg(feature = "mysql")]
        return on_mysql::run(&settings, Some(&producer)).await;
    }
    let schema = Schema::create(&settings).await?;
    if settings.phases.contains("latency") {
        let raw_lat = raw_latency(&producer, &settings).await;
        let relay_lat = relay_latency(&schema, &settings).await?;
        println!("\ncommit-to-broker latency (paced at {}/s):", settings.rate);
        println!("{}", summary("  raw rdkafka produce (baseline)", raw_lat));
        println!(
            "{}",
            summary("  outbox + relay (NOTIFY, 1 s poll)", relay_lat)
        );
    }
    if settings.phases.contains("drain") {
        drains(&schema, &settings, Some(&producer)).await?;
    }
    if settings.phases.contains("sigterm") {
        sigterm(&schema, &settings).await?;
    }
    if settings.phases.contains("writers") {
        schema.exec("TRUNCATE inoutbox_outbox").await?;
        schema
            .exec(
                "CREATE TABLE IF NOT EXISTS plain_outbox \
                 (LIKE inoutbox_outbox INCLUDING DEFAULTS INCLUDING INDEXES)",
            )
            .await?;
        let [plain, with_outbox, empty, same_size] = measure_writers(&schema, &settings).await?;
        println!(
            "\n{} writers, median of {WRITER_ROUNDS} interleaved {} s slices (transactions/s, no relay running):",
            settings.writers, settings.writer_secs
        );
        println!("  business insert only                  {plain:>9.0}");
        println!(
            "  business insert + enqueue             {with_outbox:>9.0}   ({:.1} %)",
            100.0 * with_outbox / plain
        );
        println!(
            "  business insert + SELECT 1            {empty:>9.0}   ({:.1} %: any extra statement)",
            100.0 * empty / plain
        );
        println!(
            "  business insert + same-size row       {same_size:>9.0}   ({:.1} %: a plain table, same indexes)",
            100.0 * same_size / plain
        );
        println!(
            "  enqueue against the same-size row: {:.2}x (target 0.95x)",
            with_outbox / same_size
        );
    }
    schema.remove().await
}

/// The drain phase: the raw rate (rdkafka's produce, or JetStream's publish on NATS), then
/// each backlog drained by one relay and by two.
async fn drains(
    db: &impl Drained,
    settings: &Settings,
    producer: Option<&FutureProducer>,
) -> Result<(), BoxError> {
    let (raw, raw_name) = match (&settings.nats, producer) {
        (Some(nats), _) => (
            nats.raw_throughput(settings).await?,
            "raw JetStream publish, acks awaited per window",
        ),
        (None, Some(producer)) => (raw_throughput(producer).await?, "raw rdkafka produce"),
        (None, None) => return Err("no Kafka producer".into()),
    };
    let mut drains = Vec::new();
    for &rows in &settings.sizes {
        let (mut one, mut two) = (0f64, 0f64);
        for _ in 0..settings.rounds.max(1) {
            let a = drain(db, settings, rows, 1).await?;
            let b = drain(db, settings, rows, 2).await?;
            println!("  ... {rows} rows: 1 relay {a:.0}/s, 2 relays {b:.0}/s");
            (one, two) = (one.max(a), two.max(b));
        }
        drains.push((rows, one, two));
    }
    print_drains(raw, raw_name, &drains);
    Ok(())
}

/// The drain phase on NATS JetStream (`NATS_URL`): raw JetStream publishing, then the relays
/// through `NatsPublisher`, on PostgreSQL or MySQL/MariaDB.
async fn on_nats(mut settings: Settings, url: &str, mysql: bool) -> Result<(), BoxError> {
    if settings.phases != "drain" {
        return Err("on NATS the bench has the drain phase only: pass `--phases drain`".into());
    }
    settings.nats = Some(NatsSide::connect(url).await?);
    println!(
        "relay bench: NATS JetStream at {url}, {PARTITIONS} partitions, {} workers per relay, \
         batch {} (the raw publish's window), backlogs {:?}",
        settings.workers,
        settings.relay_config().batch_size,
        settings.sizes
    );
    let result = if mysql {
        #[cfg(feature = "mysql")]
        {
            on_mysql::run(&settings, None).await
        }
        #[cfg(not(feature = "mysql"))]
        Err::<(), BoxError>("DATABASE_URL names MySQL: build with `--features mysql`".into())
    } else {
        let schema = Schema::create(&settings).await?;
        let result = drains(&schema, &settings, None).await;
        schema.remove().await?;
        result
    };
    if let Some(nats) = &settings.nats {
        nats.remove().await;
    }
    result
}

/// The bench's topic on the server of `NATS_URL` (feature `nats`).
#[cfg(feature = "nats")]
struct NatsSide {
    url: String,
    js: async_nats::jetstream::Context,
}

#[cfg(feature = "nats")]
impl NatsSide {
    async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Self {
            url: url.to_owned(),
            js: common::nats::jetstream(url).await?,
        })
    }

    /// Empties the topic: fresh streams (as the relay's publisher creates them), so that the
    /// server holds one run's messages at a time.
    async fn empty(&self) -> Result<(), BoxError> {
        common::nats::fresh_stream(&self.js, TOPIC, PARTITIONS.unsigned_abs()).await
    }

    async fn remove(&self) {
        common::nats::remove_stream(&self.js, TOPIC, PARTITIONS.unsigned_abs()).await;
    }

    /// Raw JetStream publishing: `RAW_EVENTS` messages shaped as the relay's, in windows of
    /// `--batch` (each window's acknowledgements awaited before the next), from `--workers`
    /// tasks side by side on one connection: what the relays do with a batch, without the
    /// database. Events/s.
    async fn raw_throughput(&self, settings: &Settings) -> Result<f64, BoxError> {
        self.empty().await?;
        let partitions = PARTITIONS.unsigned_abs();
        let took = common::nats::publish_windows(
            &self.js,
            TOPIC,
            partitions,
            RAW_EVENTS,
            settings.batch,
            settings.workers,
        )
        .await?;
        Ok(RAW_EVENTS as f64 / took.as_secs_f64())
    }

    /// `n` relays on `db`, each with a `NatsPublisher` of its own.
    async fn relays(
        &self,
        db: &impl Drained,
        config: &RelayConfig,
        n: usize,
    ) -> Result<Vec<Running>, BoxError> {
        let mut running = Vec::with_capacity(n);
        for _ in 0..n {
            let publisher =
                inoutbox::nats::NatsPublisher::connect(&self.url, PARTITIONS.unsigned_abs())
                    .await?;
            running.push(db.relay(config, publisher));
        }
        Ok(running)
    }
}

/// Without the feature `nats`: `NATS_URL` is refused.
#[cfg(not(feature = "nats"))]
enum NatsSide {}

#[cfg(not(feature = "nats"))]
impl NatsSide {
    async fn connect(url: &str) -> Result<Self, BoxError> {
        Err(format!("NATS_URL={url}: build with `--features nats`").into())
    }

    async fn empty(&self) -> Result<(), BoxError> {
        match *self {}
    }

    async fn remove(&self) {
        match *self {}
    }

    async fn raw_throughput(&self, _: &Settings) -> Result<f64, BoxError> {
        match *self {}
    }

    async fn relays(
        &self,
        _: &impl Drained,
        _: &RelayConfig,
        _: usize,
    ) -> Result<Vec<Running>, BoxError> {
        match *self {}
    }
}
