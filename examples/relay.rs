//! The outbox relay as a process: publishes committed outbox rows to Kafka (or NATS
//! JetStream), in per-key commit order, until SIGTERM. Run as many as you like against one
//! database.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example relay -- [--source orders-service] [--poll-ms 1000] [--no-idempotence] \
//!         [--workers 2] [--batch 1000] [--grace-ms 10000] [--print-published]
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test NATS_URL=nats://127.0.0.1:4222 \
//!     cargo run --example relay --features nats -- [--partitions 3] [...]
//! ```
//!
//! `DATABASE_URL` may also name MySQL/MariaDB (`mysql://...`, built with `--features mysql`).
//! `--no-idempotence` turns the idempotent producer off (Tansu rejects it). With `NATS_URL` set
//! (feature `nats`) it publishes to JetStream with `NatsPublisher`, each message to the subject
//! `<topic>.<partition>` of its key among `--partitions` (the consumers' number; default 3);
//! `KAFKA_BROKERS` and `--no-idempotence` are then not read. `--print-published` prints a line
//! per row the broker acknowledged (`relay: published <event id> at <partition>@<offset>`; on
//! NATS the offset is the sequence in the partition's stream), repeats included: the crash
//! tests count them. The relay applies inoutbox's migrations on start, so it also works before
//! any producer ran. SIGTERM or SIGINT stop it: batches in flight are acknowledged and marked
//! (for at most `--grace-ms`), then it exits.

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
    /// Partitions per topic on NATS.
    partitions: u32,
    /// Print a line per row the broker acknowledged (`--print-published`).
    print_published: bool,
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
        partitions: flag(&args, "--partitions", "3")?.parse()?,
        print_published: args.iter().any(|a| a == "--print-published"),
    };
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    if database_url.starts_with("mysql:") || database_url.starts_with("mariadb:") {
        #[cfg(feature = "mysql")]
        {
            let store = inoutbox::MySqlStore::connect(&database_url).await?;
            store.migrate().await?;
            return run(store, &settings).await;
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
    run(store, &settings).await
}

/// Runs the relay on `store` until SIGTERM or SIGINT: to NATS when `NATS_URL` is set (feature
/// `nats`), else to the Kafka of `KAFKA_BROKERS`.
async fn run<S: IntoRelayStore>(store: S, s: &Settings) -> Result<(), common::Failure> {
    let (source, poll_ms, workers, batch) = (&s.source, s.poll_ms, s.workers, s.batch);
    #[cfg(feature = "nats")]
    if let Ok(url) = std::env::var("NATS_URL") {
        let publisher = inoutbox::nats::NatsPublisher::connect(&url, s.partitions).await?;
        // The URL is not logged: it may hold credentials.
        let partitions = s.partitions;
        tracing::info!(transport = "nats", partitions, %source, poll_ms, workers, batch, "relay started");
        let relay = inoutbox::Relay::builder(store, publisher);
        run_relay(relay, s).await?;
        return Ok(());
    }
    let _ = s.partitions;
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;
    let idempotence = s.idempotence;
    tracing::info!(%brokers, %source, idempotence, poll_ms, workers, batch, "relay started");
    let relay = inoutbox::Relay::builder(store, inoutbox::kafka::KafkaProducer::new(brokers))
        .idempotence(idempotence);
    run_relay(relay, s).await
}

/// Builds the relay with the settings every transport shares and runs it until SIGTERM or
/// SIGINT.
async fn run_relay<S, I>(
    relay: inoutbox::relay::RelayBuilder<S, I>,
    s: &Settings,
) -> Result<(), common::Failure>
where
    S: inoutbox::relay::RelayStore,
    I: inoutbox::transport::IntoPublisher,
{
    let relay = if s.print_published {
        let (reports, mut published) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(report) = published.recv().await {
                if let inoutbox::relay::RelayReport::Published {
                    id,
                    partition,
                    offset,
                    ..
                } = report
                {
                    println!("relay: published {id} at {partition}@{offset}");
                }
            }
        });
        relay.reports(reports)
    } else {
        relay
    };
    relay
        .source(s.source.clone())
        .poll_interval(Duration::from_millis(s.poll_ms))
        .workers(s.workers)
        .batch_size(s.batch)
        .grace(Duration::from_millis(s.grace_ms))
        .build()?
        .run_until_signal()
        .await?;
    tracing::info!("relay stopped");
    Ok(())
}
