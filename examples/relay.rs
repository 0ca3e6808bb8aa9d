//! The outbox relay as a process: publishes committed outbox rows to Kafka, in per-key commit
//! order, until SIGTERM. Run as many as you like against one database.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example relay -- [--source orders-service] [--poll-ms 1000] [--no-idempotence] \
//!         [--workers 2] [--batch 1000] [--grace-ms 10000]
//! ```
//!
//! `--no-idempotence` turns the idempotent producer off (Tansu rejects it). The relay applies
//! inoutbox's migrations on start, so it also works before any producer ran. SIGTERM or SIGINT
//! stop it: batches in flight are acknowledged and marked (for at most `--grace-ms`), then it
//! exits.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag};

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let source = flag(&args, "--source", "orders-service")?;
    let poll_ms: u64 = flag(&args, "--poll-ms", "1000")?.parse()?;
    let workers: usize = flag(&args, "--workers", "2")?.parse()?;
    let batch: usize = flag(&args, "--batch", "1000")?.parse()?;
    let grace_ms: u64 = flag(&args, "--grace-ms", "10000")?.parse()?;
    let idempotence = !args.iter().any(|a| a == "--no-idempotence");
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;

    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&database_url)
        .await?;
    let store = inoutbox::PgStore::new(pool);
    store.migrate().await?;
    tracing::info!(%brokers, %source, idempotence, poll_ms, workers, batch, "relay started");
    inoutbox::Relay::builder(store, inoutbox::kafka::KafkaProducer::new(brokers))
        .source(source)
        .idempotence(idempotence)
        .poll_interval(Duration::from_millis(poll_ms))
        .workers(workers)
        .batch_size(batch)
        .grace(Duration::from_millis(grace_ms))
        .build()?
        .run_until_signal()
        .await?;
    tracing::info!("relay stopped");
    Ok(())
}
