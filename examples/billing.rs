//! A billing service: consumes `OrderCreated` from Kafka (or NATS JetStream) and writes one
//! invoice per order, exactly once per event id, however often the broker delivers it.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example billing -- [--topic orders] [--group billing] [--pool 8]
//! DATABASE_URL=postgres://postgres@127.0.0.1/test NATS_URL=nats://127.0.0.1:4222 \
//!     cargo run --example billing --features nats -- [--topic orders] [--partitions 3] \
//!         [--lease-ttl-ms 10000]
//! ```
//!
//! With `NATS_URL` set (feature `nats`) it reads the topic's `--partitions` partitioned
//! subjects (`orders.0` in the stream `orders_0`, ...; the relay's publisher must use the same
//! number),
//! holding each partition by a lease of `--lease-ttl-ms` (`NatsConfig::lease_ttl`; the crash
//! tests shorten it); `KAFKA_BROKERS` is then not read.
//!
//! Messages are JSON (`{"order_id": "<uuid>", "total_cents": 1200}`) in CloudEvents binary mode:
//! headers `ce_id`, `ce_type = OrderCreated`, `ce_source`, `ce_specversion = 1.0`,
//! `content-type: application/json`. It logs one line per message (inoutbox logs them at debug:
//! this example shows `inoutbox::engine` at debug) and runs until SIGTERM; `RUST_LOG` (targets
//! syntax) changes what is logged.
//!
//! `--pool N` (PostgreSQL, default 8) sizes its connection pool: the group handles the keys of a
//! partition side by side (`Ordering::Key`, the default), one transaction per connection, so a
//! database far away needs more of them (about 32 at 1 ms each way).
//!
//! `--finish-slowly-ms N` (for the graceful-stop test) makes the handler wait N ms after
//! writing the invoice, saying so on stderr, so a stop can arrive while a message is in hand.

use std::sync::OnceLock;
use std::time::Duration;

use inoutbox::prelude::*;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag, OrderCreated};

/// How long the handler waits after writing an invoice (`--finish-slowly-ms`; zero by default).
static FINISH_SLOWLY: OnceLock<Duration> = OnceLock::new();

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    if let Some(wait) = FINISH_SLOWLY.get().filter(|w| !w.is_zero()) {
        eprintln!(
            "billing: invoice written for order {}, finishing in {wait:?}",
            event.order_id
        );
        tokio::time::sleep(*wait).await;
    }
    Ok(())
}

/// The same handler on MySQL/MariaDB (`DATABASE_URL=mysql://...`, feature `mysql`).
#[cfg(feature = "mysql")]
#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice_mysql(
    event: OrderCreated,
    tx: &mut inoutbox::MySqlTx<'_>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)")
        .bind(event.order_id.to_string())
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The invoices table on MySQL/MariaDB (the order id as its text).
#[cfg(feature = "mysql")]
const MYSQL_INVOICES: &str = "CREATE TABLE IF NOT EXISTS invoices (
    id bigint AUTO_INCREMENT PRIMARY KEY,
    order_id varchar(36) NOT NULL,
    total_cents bigint NOT NULL,
    created_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))";

/// Deliberately no unique constraint: a doubled effect would show as two rows.
const INVOICES: &str = "CREATE TABLE IF NOT EXISTS invoices (
    id bigserial PRIMARY KEY,
    order_id uuid NOT NULL,
    total_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    // `RUST_LOG` picks what is logged, in targets syntax (e.g. `info,inoutbox::kafka=debug`
    // shows when a partition is no longer owned and its offset not committed); by default info,
    // and each message's line (debug, `inoutbox::engine`): the crash and network tests read them.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| {
            Targets::new()
                .with_default(tracing::Level::INFO)
                .with_target("inoutbox::engine", tracing::Level::DEBUG)
        });
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_target(false))
        .with(filter)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topic = flag(&args, "--topic", "orders")?;
    let group = flag(&args, "--group", "billing")?;
    let slowly: u64 = flag(&args, "--finish-slowly-ms", "0")?.parse()?;
    FINISH_SLOWLY.get_or_init(|| Duration::from_millis(slowly));
    let partitions: u32 = flag(&args, "--partitions", "3")?.parse()?;
    // PostgreSQL connections: the transactions in flight at once (the default order runs the
    // keys of a partition side by side, one transaction per connection).
    let pool: u32 = flag(&args, "--pool", "8")?.parse()?;
    let lease_ttl = Duration::from_millis(flag(&args, "--lease-ttl-ms", "10000")?.parse()?);
    let nats = NatsSettings {
        partitions,
        lease_ttl,
    };
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;

    #[cfg(feature = "mysql")]
    if database_url.starts_with("mysql://") {
        let store = inoutbox::MySqlStore::connect(&database_url).await?;
        sqlx::query(MYSQL_INVOICES).execute(store.pool()).await?;
        store.migrate().await?;
        return run(&group, store, &topic, &nats).await;
    }

    // Refuses a URL of another database, and names the target (password hidden) if it
    // cannot connect within a few seconds.
    let store = inoutbox::PgStore::connect(&database_url, pool).await?;
    sqlx::query(INVOICES).execute(store.pool()).await?;
    store.migrate().await?;
    run(&group, store, &topic, &nats).await
}

/// What only NATS reads: partitions per topic and the lease TTL.
struct NatsSettings {
    partitions: u32,
    lease_ttl: Duration,
}

/// Runs the group on `store` until SIGTERM: on NATS when `NATS_URL` is set (feature `nats`),
/// else on the Kafka of `KAFKA_BROKERS`.
async fn run<S: inoutbox::store::InboxStore>(
    group: &str,
    store: S,
    topic: &str,
    nats: &NatsSettings,
) -> Result<(), common::Failure> {
    #[cfg(feature = "nats")]
    if let Ok(url) = std::env::var("NATS_URL") {
        let nats = inoutbox::nats::NatsConfig::new(url, [topic])
            .partitions(nats.partitions)
            .lease_ttl(nats.lease_ttl);
        inoutbox::Consumer::builder(group, store, nats)
            .build()?
            .run_until_signal()
            .await?;
        return Ok(());
    }
    let _ = (nats.partitions, nats.lease_ttl);
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;
    let kafka = inoutbox::KafkaConfig::new(brokers, [topic]).quick_join();
    inoutbox::Consumer::builder(group, store, kafka)
        .build()?
        .run_until_signal()
        .await?;
    Ok(())
}
