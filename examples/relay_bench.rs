//! Relay benchmark: commit-to-broker latency and throughput, with a raw rdkafka baseline
//! measured in the same run against the same broker.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --release --example relay_bench -- [--events 5000] [--rate 200] [--no-idempotence]
//! ```
//!
//! * **Latency**: a writer commits one event per transaction at `--rate` events/s while a relay
//!   (1 s poll interval, woken by NOTIFY) publishes; latency = broker acknowledgement (the
//!   delivery report) minus the commit's return. Baseline: the same messages produced directly
//!   with rdkafka at the same rate, latency = acknowledgement minus send.
//! * **Throughput**: `--events` rows committed first, then one relay started; events/s = rows /
//!   time to publish all. Baseline: the same messages produced directly, as fast as possible.
//!
//! Rows live in a fresh schema (dropped at the end); messages go to topic `txbox-bench`
//! (created with 4 partitions if missing).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::mpsc;
use txbox::prelude::*;
use txbox::relay::{Relay, RelayConfig, RelayReport};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{create_topic, env, flag, order_created_headers, BoxError};

/// `OrderCreated` on the bench's own topic (the shared event goes to `orders`).
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "txbox-bench", key = order_id)]
pub struct BenchOrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

const TOPIC: &str = <BenchOrderCreated as txbox::OutboxEvent>::TOPIC;
const PARTITIONS: i32 = 4;

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
        "{name:<34} n={:<6} p50={:>8.2} ms  p99={:>8.2} ms  max={:>8.2} ms",
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

async fn commit_event(pool: &PgPool) -> (Uuid, SystemTime) {
    let mut tx = pool.begin().await.expect("begin");
    let id = txbox::outbox::enqueue(&mut tx, &event())
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    (id, SystemTime::now())
}

struct Running {
    reports: mpsc::UnboundedReceiver<RelayReport>,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<()>,
}

fn start_relay(pool: &PgPool, tables: &txbox::Tables, config: &RelayConfig) -> Running {
    let (tx, reports) = mpsc::unbounded_channel();
    let store = txbox::PgStore::with_tables(pool.clone(), tables.clone());
    let relay = Relay::builder(store, config.brokers.clone())
        .source("bench")
        .idempotence(config.idempotence)
        .poll_interval(Duration::from_secs(1))
        .retention(None)
        .reports(tx)
        .build()
        .expect("relay");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stopped.await;
            })
            .await
            .expect("relay");
    });
    Running {
        reports,
        stop,
        handle,
    }
}

async fn published(
    reports: &mut mpsc::UnboundedReceiver<RelayReport>,
    n: usize,
) -> Vec<(Uuid, SystemTime)> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(60), reports.recv()).await {
            Ok(Some(RelayReport::Published { id, acked_at, .. })) => out.push((id, acked_at)),
            Ok(Some(RelayReport::Failed { error, .. })) => panic!("relay failed: {error}"),
            _ => panic!("relay stalled after {} of {n}", out.len()),
        }
    }
    out
}

/// What to measure, from the command line and the environment.
struct Settings {
    events: usize,
    rate: f64,
    latency_events: usize,
    idempotence: bool,
    database_url: String,
    brokers: String,
}

impl Settings {
    fn from_args() -> Result<Self, BoxError> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let events: usize = flag(&args, "--events", "5000")?.parse()?;
        let rate: f64 = flag(&args, "--rate", "200")?.parse()?;
        Ok(Self {
            events,
            rate,
            latency_events: (rate * 10.0).clamp(100.0, events as f64) as usize,
            idempotence: !args.iter().any(|a| a == "--no-idempotence"),
            database_url: env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?,
            brokers: env("KAFKA_BROKERS", "127.0.0.1:9092")?,
        })
    }

    /// One commit (or send) per period at `--rate`.
    fn period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rate)
    }
}

/// A schema of this run's own, with txbox's tables in it.
struct Schema {
    name: String,
    admin_pool: PgPool,
    pool: PgPool,
    tables: txbox::Tables,
}

impl Schema {
    async fn create(database_url: &str) -> Result<Self, BoxError> {
        let suffix = &Uuid::new_v4().simple().to_string()[..8];
        let name = format!("txbox_bench_{suffix}");
        let admin_pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(database_url)
            .await?;
        sqlx::raw_sql(&format!("CREATE SCHEMA \"{name}\""))
            .execute(&admin_pool)
            .await?;
        let options: PgConnectOptions = database_url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options.options([("search_path", name.as_str())]))
            .await?;
        let tables = txbox::Tables::with_schema(&name)?;
        txbox::PgStore::with_tables(pool.clone(), tables.clone())
            .migrate()
            .await?;
        Ok(Self {
            name,
            admin_pool,
            pool,
            tables,
        })
    }

    fn start_relay(&self, config: &RelayConfig) -> Running {
        start_relay(&self.pool, &self.tables, config)
    }

    async fn remove(self) -> Result<(), BoxError> {
        sqlx::raw_sql(&format!("DROP SCHEMA \"{}\" CASCADE", self.name))
            .execute(&self.admin_pool)
            .await?;
        Ok(())
    }
}

/// Latency, raw rdkafka baseline: send at the bench's rate, latency = ack - send.
async fn raw_latency(producer: &FutureProducer, settings: &Settings) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(settings.latency_events);
    let mut tick = tokio::time::interval(settings.period());
    let (lat_tx, mut lat_rx) = mpsc::unbounded_channel();
    for _ in 0..settings.latency_events {
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
    while let Some(l) = lat_rx.recv().await {
        latencies.push(l);
    }
    latencies
}

/// Latency through the outbox: commit at the bench's rate with a relay running,
/// latency = ack - commit.
async fn relay_latency(
    schema: &Schema,
    config: &RelayConfig,
    settings: &Settings,
) -> Result<Vec<Duration>, BoxError> {
    let mut relay = schema.start_relay(config);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writer_pool = schema.pool.clone();
    let (period, latency_events) = (settings.period(), settings.latency_events);
    let writer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        let mut commits = HashMap::with_capacity(latency_events);
        for _ in 0..latency_events {
            tick.tick().await;
            let (id, at) = commit_event(&writer_pool).await;
            commits.insert(id, at);
        }
        commits
    });
    let acks = published(&mut relay.reports, latency_events).await;
    let commits = writer.await?;
    let latencies = acks
        .iter()
        .filter_map(|(id, acked)| {
            commits
                .get(id)
                .map(|c| acked.duration_since(*c).unwrap_or_default())
        })
        .collect();
    let _ = relay.stop.send(());
    relay.handle.await?;
    Ok(latencies)
}

/// Throughput, raw baseline: all messages as fast as possible.
async fn raw_throughput(producer: &FutureProducer, events: usize) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let deliveries: Vec<_> = (0..events)
        .map(|_| raw_send(producer, TOPIC, &event()))
        .collect();
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(started.elapsed())
}

/// Throughput through the relay: `events` committed rows, then one relay drains them.
async fn relay_throughput(
    schema: &Schema,
    config: &RelayConfig,
    events: usize,
) -> Result<Duration, BoxError> {
    for chunk in 0..events.div_ceil(500) {
        let n = 500.min(events - chunk * 500);
        let batch: Vec<BenchOrderCreated> = (0..n).map(|_| event()).collect();
        let mut tx = schema.pool.begin().await?;
        txbox::outbox::enqueue_all(&mut tx, &batch).await?;
        tx.commit().await?;
    }
    let started = Instant::now();
    let mut relay = schema.start_relay(config);
    published(&mut relay.reports, events).await;
    let elapsed = started.elapsed();
    let _ = relay.stop.send(());
    relay.handle.await?;
    Ok(elapsed)
}

fn print_results(
    settings: &Settings,
    (raw_latency, relay_latency): (Vec<Duration>, Vec<Duration>),
    (raw_elapsed, relay_elapsed): (Duration, Duration),
) {
    let (rate, events) = (settings.rate, settings.events);
    println!("\ncommit-to-broker latency (paced at {rate}/s):");
    println!(
        "{}",
        summary("  raw rdkafka produce (baseline)", raw_latency)
    );
    println!(
        "{}",
        summary("  outbox + relay (NOTIFY, 1 s poll)", relay_latency)
    );
    println!("\nthroughput ({events} events):");
    println!(
        "  raw rdkafka produce (baseline)     {:>9.0} events/s ({:.2} s)",
        events as f64 / raw_elapsed.as_secs_f64(),
        raw_elapsed.as_secs_f64()
    );
    println!(
        "  relay, backlog drained             {:>9.0} events/s ({:.2} s)",
        events as f64 / relay_elapsed.as_secs_f64(),
        relay_elapsed.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::from_args()?;
    // A schema of this run's own; the topic is shared between runs.
    let schema = Schema::create(&settings.database_url).await?;
    create_topic(&settings.brokers, TOPIC, PARTITIONS).await?;

    let mut config = RelayConfig::new(settings.brokers.clone());
    config.idempotence = settings.idempotence;
    let producer: FutureProducer = config.client_config().create()?;
    println!(
        "relay bench: {} events for throughput, {} at {}/s for latency, \
         {PARTITIONS} partitions, idempotence={}, poll interval 1 s",
        settings.events, settings.latency_events, settings.rate, settings.idempotence
    );

    // Warm-up: metadata and connections.
    raw_send(&producer, TOPIC, &event())
        .await?
        .map_err(|(e, _)| e)?;

    let latency = (
        raw_latency(&producer, &settings).await,
        relay_latency(&schema, &config, &settings).await?,
    );
    let throughput = (
        raw_throughput(&producer, settings.events).await?,
        relay_throughput(&schema, &config, settings.events).await?,
    );
    print_results(&settings, latency, throughput);
    schema.remove().await
}
