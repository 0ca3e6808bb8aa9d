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

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::mpsc;
use txbox::prelude::*;
use txbox::relay::{Relay, RelayConfig, RelayReport};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "txbox-bench", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

const PARTITIONS: i32 = 4;

fn flag(args: &[String], name: &str, default: &str) -> Result<String, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .cloned()
            .ok_or_else(|| format!("{name} needs a value")),
        None => Ok(default.to_owned()),
    }
}

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

fn event() -> OrderCreated {
    OrderCreated {
        order_id: Uuid::new_v4(),
        total_cents: 1200,
    }
}

/// The record the relay would produce for `event`.
fn raw_send(
    producer: &FutureProducer,
    topic: &str,
    e: &OrderCreated,
) -> rdkafka::producer::DeliveryFuture {
    let id = Uuid::now_v7().to_string();
    let key = e.order_id.to_string();
    let payload = serde_json::to_string(e).expect("json");
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "ce_id",
            value: Some(id.as_str()),
        })
        .insert(Header {
            key: "ce_type",
            value: Some("OrderCreated"),
        })
        .insert(Header {
            key: "ce_source",
            value: Some("bench"),
        })
        .insert(Header {
            key: "ce_specversion",
            value: Some("1.0"),
        })
        .insert(Header {
            key: "content-type",
            value: Some("application/json"),
        });
    let record = FutureRecord::to(topic)
        .key(key.as_str())
        .payload(payload.as_str())
        .headers(headers);
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let events: usize = flag(&args, "--events", "5000")?.parse()?;
    let rate: f64 = flag(&args, "--rate", "200")?.parse()?;
    let idempotence = !args.iter().any(|a| a == "--no-idempotence");
    let database_url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test)")?;
    let brokers =
        std::env::var("KAFKA_BROKERS").map_err(|_| "set KAFKA_BROKERS (e.g. 127.0.0.1:9092)")?;
    let latency_events = (rate * 10.0).clamp(100.0, events as f64) as usize;

    // A schema of this run's own; the topic is shared between runs.
    let suffix = &Uuid::new_v4().simple().to_string()[..8];
    let schema = format!("txbox_bench_{suffix}");
    let topic = "txbox-bench"; // the topic of `OrderCreated` above
    let admin_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url)
        .await?;
    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&admin_pool)
        .await?;
    let options: PgConnectOptions = database_url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.options([("search_path", schema.as_str())]))
        .await?;
    let tables = txbox::Tables::with_schema(&schema)?;
    txbox::PgStore::with_tables(pool.clone(), tables.clone())
        .migrate()
        .await?;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    for r in admin
        .create_topics(
            [&NewTopic::new(
                topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?
    {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(format!("create topic {t}: {e}").into()),
        }
    }

    let mut config = RelayConfig::new(brokers.clone());
    config.idempotence = idempotence;
    let producer: FutureProducer = config.client_config().create()?;
    let period = Duration::from_secs_f64(1.0 / rate);
    println!(
        "relay bench: {events} events for throughput, {latency_events} at {rate}/s for latency, \
         {PARTITIONS} partitions, idempotence={idempotence}, poll interval 1 s"
    );

    // Warm-up: metadata and connections.
    raw_send(&producer, topic, &event())
        .await?
        .map_err(|(e, _)| e)?;

    // 1. Latency, raw rdkafka baseline: send at `rate`, latency = ack - send.
    let mut raw_latency_paced = Vec::with_capacity(latency_events);
    let mut tick = tokio::time::interval(period);
    let (lat_tx, mut lat_rx) = mpsc::unbounded_channel();
    for _ in 0..latency_events {
        tick.tick().await;
        let sent = Instant::now();
        let delivery = raw_send(&producer, topic, &event());
        let lat_tx = lat_tx.clone();
        tokio::spawn(async move {
            if let Ok(Ok(_)) = delivery.await {
                let _ = lat_tx.send(sent.elapsed());
            }
        });
    }
    drop(lat_tx);
    while let Some(l) = lat_rx.recv().await {
        raw_latency_paced.push(l);
    }

    // 2. Latency through the outbox: commit at `rate` with a relay running.
    let mut relay = start_relay(&pool, &tables, &config);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writer_pool = pool.clone();
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
    let relay_latency: Vec<Duration> = acks
        .iter()
        .filter_map(|(id, acked)| {
            commits
                .get(id)
                .map(|c| acked.duration_since(*c).unwrap_or_default())
        })
        .collect();
    let _ = relay.stop.send(());
    relay.handle.await?;

    // 3. Throughput, raw baseline: all messages as fast as possible.
    let started = Instant::now();
    let deliveries: Vec<_> = (0..events)
        .map(|_| raw_send(&producer, topic, &event()))
        .collect();
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    let raw_elapsed = started.elapsed();

    // 4. Throughput through the relay: `events` committed rows, then one relay drains them.
    for chunk in 0..events.div_ceil(500) {
        let n = 500.min(events - chunk * 500);
        let batch: Vec<OrderCreated> = (0..n).map(|_| event()).collect();
        let mut tx = pool.begin().await?;
        txbox::outbox::enqueue_all(&mut tx, &batch).await?;
        tx.commit().await?;
    }
    let started = Instant::now();
    let mut relay = start_relay(&pool, &tables, &config);
    published(&mut relay.reports, events).await;
    let relay_elapsed = started.elapsed();
    let _ = relay.stop.send(());
    relay.handle.await?;

    println!("\ncommit-to-broker latency (paced at {rate}/s):");
    println!(
        "{}",
        summary("  raw rdkafka produce (baseline)", raw_latency_paced)
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

    sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&admin_pool)
        .await?;
    Ok(())
}
