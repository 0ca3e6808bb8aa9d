//! Operations endpoints beside a running consumer and relay, with nothing installed: SQLite in a
//! temporary directory and an in-process Kafka. Serves the inoutbox metrics for Prometheus on
//! `--metrics` (default `127.0.0.1:9000`, path `/metrics`) and liveness and readiness on
//! `--health` (default `127.0.0.1:9001`, paths `/healthz` and `/readyz`), while ten orders go
//! through the outbox, the relay and the billing consumer; one of them is poisoned and ends as
//! a dead letter.
//!
//! ```text
//! cargo run --example ops               # serves until Ctrl-C
//! cargo run --example ops -- --exit     # prints the scrape and the health once the orders are through
//! curl -s 127.0.0.1:9000/metrics | grep '^inoutbox_'
//! curl -si 127.0.0.1:9001/readyz
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inoutbox::kafka::{InProcessKafka, KafkaProducer};
use inoutbox::prelude::*;
use inoutbox::{Consumer, Relay, RetryPolicy, SqliteStore};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio::net::TcpListener;
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;
#[path = "common/ops_http.rs"]
mod ops_http;

use common::{flag, BoxError, Failure, OrderCreated};

const ORDERS: i64 = 10;
/// The order whose handler always fails: it ends as a dead letter.
const POISONED_CENTS: i64 = -1;

/// Billing: one invoice per order; a negative total is refused for good.
#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn invoice(event: OrderCreated, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    if event.total_cents < 0 {
        return Err(HandlerError::permanent(format!(
            "order {} has a negative total",
            event.order_id
        )));
    }
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let metrics: SocketAddr = flag(&args, "--metrics", "127.0.0.1:9000")?.parse()?;
    let health: SocketAddr = flag(&args, "--health", "127.0.0.1:9001")?.parse()?;
    let exit = args.iter().any(|a| a == "--exit");
    let dir = std::env::temp_dir().join(format!("inoutbox-ops-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let result = run(metrics, health, exit, &dir.join("ops.db")).await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(result?)
}

async fn run(
    metrics: SocketAddr,
    health: SocketAddr,
    exit: bool,
    path: &std::path::Path,
) -> Result<(), BoxError> {
    // First the recorder: consumers and relays take their metric handles when built.
    ops_http::install_prometheus(metrics)?;
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(30)),
        )
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE invoices (id integer PRIMARY KEY AUTOINCREMENT, order_id blob NOT NULL, total_cents integer NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = SqliteStore::new(pool.clone());
    store.migrate().await?;
    let kafka = InProcessKafka::start()?;
    kafka.create_topic("orders", 3)?;

    let relay = Relay::builder(store.clone(), KafkaProducer::new(kafka.brokers()))
        .source("ops-example")
        .poll_interval(Duration::from_millis(50))
        .sample_interval(Duration::from_secs(1))
        .build()?;
    let config = kafka.consumer_config(["orders"]);
    let consumer = Consumer::builder("billing", store.clone(), config)
        .retry(RetryPolicy::no_retries())
        .sample_interval(Duration::from_secs(1))
        .build()?;
    let components = vec![("consumer", consumer.health()), ("relay", relay.health())];
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relay = tokio::spawn(relay.run(until(stopped.clone())));
    let consumer = tokio::spawn(consumer.run(until(stopped.clone())));
    let listener = TcpListener::bind(health).await?;
    tokio::spawn(ops_http::serve_health(listener, components.clone()));

    for i in 0..ORDERS {
        let total_cents = if i == 3 { POISONED_CENTS } else { 1000 + i };
        let mut tx = pool.begin().await?;
        let event = OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents,
        };
        inoutbox::outbox::enqueue(&mut tx, &event).await?;
        tx.commit().await?;
    }
    wait_until_through(&pool, &components).await?;
    println!("metrics: http://{metrics}/metrics   health: http://{health}/healthz, http://{health}/readyz");
    if exit {
        let (_, scrape) = ops_http::get(metrics, "/metrics").await?;
        for line in scrape
            .lines()
            .filter(|l| l.starts_with("inoutbox_") && !l.contains("_bucket"))
        {
            println!("{line}");
        }
        let (status, body) = ops_http::get(health, "/readyz").await?;
        println!("GET /readyz -> {status} {body}");
    } else {
        println!("serving; Ctrl-C to stop");
        inoutbox::shutdown_signal().await;
    }
    let _ = stop.send(true);
    relay.await??;
    consumer.await??;
    Ok(())
}

/// Waits until every order is invoiced or dead-lettered and the gauges were sampled after.
async fn wait_until_through(
    pool: &sqlx::SqlitePool,
    components: &[(&'static str, inoutbox::telemetry::Health)],
) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
            .fetch_one(pool)
            .await?;
        let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM inoutbox_dead_letters")
            .fetch_one(pool)
            .await?;
        let ready = components.iter().all(|(_, h)| h.ready());
        if invoices == ORDERS - 1 && letters == 1 && ready {
            // One more sample of the gauges (every second here).
            tokio::time::sleep(Duration::from_millis(1500)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "after 60 s: {invoices} invoices, {letters} dead letters, ready: {ready}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
