//! Relay latency on each store: a writer commits one event per transaction at a steady rate
//! while one relay publishes them; latency = the broker's acknowledgement (the relay's delivery
//! report) minus the moment the writer's commit returned. Prints p50, p99 and max.
//!
//! ```text
//! KAFKA_BROKERS=127.0.0.1:9092 DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release --features mysql --example relay_latency -- \
//!     [--events 1000] [--rate 50] [--poll-ms 1000] [--no-idempotence]
//! ```
//!
//! `DATABASE_URL` may be `postgres://...` (a schema `relay_latency` of the run's own, dropped
//! and created again), `sqlite:` (a new file in the temporary directory) or `mysql://...` (a
//! database `relay_latency` of the run's own on that server, dropped and created again; feature
//! `mysql`). PostgreSQL's relay is woken by `LISTEN/NOTIFY`; SQLite's and MySQL's poll every
//! `--poll-ms` (the relay's default: 1000 ms). `--no-idempotence` for Tansu.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use inoutbox::prelude::*;
use inoutbox::relay::{IntoRelayStore, RelayReport};
use inoutbox::Db;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{create_topic, env, flag, BoxError};

/// The event, on a topic of its own.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "LatencyProbe", topic = "inoutbox-latency", key = id)]
pub struct LatencyProbe {
    pub id: Uuid,
}

/// The settings, from the command line.
struct Settings {
    events: usize,
    rate: f64,
    poll: Duration,
    idempotence: bool,
    brokers: String,
}

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = Settings {
        events: flag(&args, "--events", "1000")?.parse()?,
        rate: flag(&args, "--rate", "50")?.parse()?,
        poll: Duration::from_millis(flag(&args, "--poll-ms", "1000")?.parse()?),
        idempotence: !args.iter().any(|a| a == "--no-idempotence"),
        brokers: env("KAFKA_BROKERS", "127.0.0.1:9092")?,
    };
    let url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    create_topic(&settings.brokers, LatencyProbe::TOPIC, 1).await?;
    let scheme = url.split(':').next().unwrap_or_default();
    let latencies = match scheme {
        "postgres" | "postgresql" => {
            let url = common::database_url_in_schema("relay_latency")
                .await?
                .expect("set");
            let store = inoutbox::PgStore::connect(&url, 4).await?;
            store.migrate().await?;
            measure(store.pool().clone(), store, &settings).await?
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let file = std::env::temp_dir().join(format!("relay_latency_{}.db", Uuid::new_v4()));
            let store =
                inoutbox::SqliteStore::connect(&format!("sqlite:{}", file.display())).await?;
            store.migrate().await?;
            let measured = measure(store.pool().clone(), store, &settings).await;
            let _ = std::fs::remove_file(file);
            measured?
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let store = inoutbox::MySqlStore::connect(&mysql_database(&url).await?).await?;
            store.migrate().await?;
            measure(store.pool().clone(), store, &settings).await?
        }
        _ => return Err(format!("DATABASE_URL: no store for `{scheme}:` in this build").into()),
    };
    report(scheme, &settings, latencies);
    Ok(())
}

/// The database `relay_latency`, empty, on the server of `url`; its URL.
#[cfg(feature = "mysql")]
async fn mysql_database(url: &str) -> Result<String, BoxError> {
    let admin = sqlx::MySqlPool::connect(url).await?;
    sqlx::raw_sql("DROP DATABASE IF EXISTS relay_latency; CREATE DATABASE relay_latency")
        .execute(&admin)
        .await?;
    admin.close().await;
    let (main, query) = url.split_once('?').unwrap_or((url, ""));
    let authority = main.find("://").map_or(0, |i| i + 3);
    let server = main[authority..]
        .find('/')
        .map_or(main, |i| &main[..authority + i]);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    Ok(format!("{server}/relay_latency{query}"))
}

/// Commits `settings.events` events, one per transaction at `settings.rate` a second, on
/// `pool`, with one relay on `store` publishing; the latency of each.
async fn measure<D: Db, S: IntoRelayStore>(
    pool: sqlx::Pool<D>,
    store: S,
    settings: &Settings,
) -> Result<Vec<Duration>, BoxError> {
    let (reports_tx, mut reports) = mpsc::unbounded_channel();
    let relay = inoutbox::Relay::builder(
        store,
        inoutbox::kafka::KafkaProducer::new(settings.brokers.clone()),
    )
    .source("relay-latency")
    .idempotence(settings.idempotence)
    .poll_interval(settings.poll)
    .reports(reports_tx)
    .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (n, period) = (
        settings.events,
        Duration::from_secs_f64(1.0 / settings.rate),
    );
    let writer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        let mut commits = HashMap::with_capacity(n);
        for _ in 0..n {
            tick.tick().await;
            let mut tx = pool.begin().await.expect("begin");
            let probe = LatencyProbe { id: Uuid::new_v4() };
            let id = inoutbox::outbox::enqueue(&mut tx, &probe)
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
            Ok(Some(RelayReport::Failed { error, .. })) => return Err(error.into()),
            _ => return Err(format!("the relay stalled after {} of {n}", acks.len()).into()),
        }
    }
    let commits = writer.await?;
    let _ = stop.send(());
    running.await??;
    Ok(acks
        .iter()
        .filter_map(|(id, acked)| Some(acked.duration_since(*commits.get(id)?).unwrap_or_default()))
        .collect())
}

/// Prints one line: the store, the settings, p50, p99 and max in milliseconds.
fn report(store: &str, settings: &Settings, mut latencies: Vec<Duration>) {
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len().saturating_sub(1)) as f64 * q).round() as usize;
        latencies
            .get(i)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "{store}: {} events at {}/s, poll {} ms: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        settings.rate,
        settings.poll.as_millis(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}
