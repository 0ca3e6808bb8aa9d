//! The outbox relay as a process: publishes committed outbox rows to Kafka, in per-key commit
//! order, until SIGTERM. Run as many as you like against one database.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example relay -- [--source orders-service] [--poll-ms 1000] [--no-idempotence] \
//!         [--workers 2] [--batch 1000] [--grace-ms 10000]
//! ```
//!
//! `DATABASE_URL` may also name MySQL/MariaDB (`mysql://...`, built with `--features mysql`).
//! `--no-idempotence` turns the idempotent producer off (Tansu rejects it). The relay applies
//! inoutbox's migrations on start, so it also works before any producer ran. SIGTERM or SIGINT
//! stop it: batches in flight are acknowledged and marked (for at most `--grace-ms`), then it
//! exits.

use std::time::Duration;

use inoutbox::relay::IntoRelayStore;
use sqlx::postgres::PgPoolOptions;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag};

/// The relay's settings, from the command line.
struct Settings {
    source: String,
    poll_ms: u64,
    workers: usize,
    batch: usize,
    grace_ms: u64,
    idempotence: bool,
}

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = Settings {
        source: flag(&args, "--source", "orders-service")?,
        poll_ms: flag(&args, "--poll-ms", "1000")?.parse()?,
        workers: flag(&args, "--workers", "2")?.parse()?,
        batch: flag(&args, "--batch", "1000")?.parse()?,
        grace_ms: flag(&args, "--grace-ms", "10000")?.parse()?,
        idempotence: !args.iter().any(|a| a == "--no-idempotence"),
    };
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;
    if database_url.starts_with("mysql:") || database_url.starts_with("mariadb:") {
        #[cfg(feature = "mysql")]
        {
            let store = inoutbox::MySqlStore::connect(&database_url).await?;
            store.migrate().await?;
            return run(store, brokers, &settings).await;
        }
        #[cfg(not(feature = "mysql"))]
        return Err(common::Failure::from(
            "DATABASE_URL names MySQL: build with `--features mysql`",
        ));
    }
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&database_url)
        .await?;
    let store = inoutbox::PgStore::new(pool);
    store.migrate().await?;
    run(store, brokers, &settings).await
}

/// Runs the relay on `store` until SIGTERM or SIGINT.
async fn run<S: IntoRelayStore>(
    store: S,
    brokers: String,
    s: &Settings,
) -> Result<(), common::Failure> {
    let (source, idempotence, poll_ms, workers, batch) =
        (&s.source, s.idempotence, s.poll_ms, s.workers, s.batch);
    tracing::info!(%brokers, %source, idempotence, poll_ms, workers, batch, "relay started");
    inoutbox::Relay::builder(store, inoutbox::kafka::KafkaProducer::new(brokers))
        .source(source.clone())
        .idempotence(idempotence)
        .poll_interval(Duration::from_millis(poll_ms))
        .workers(workers)
        .batch_size(batch)
        .grace(Duration::from_millis(s.grace_ms))
        .build()?
        .run_until_signal()
        .await?;
    tracing::info!("relay stopped");
    Ok(())
}
