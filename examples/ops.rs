//! Operations endpoint beside a running consumer and relay, with nothing installed: the
//! zero-setup `App` (SQLite in a temporary directory and an in-process Kafka) with
//! `ops_endpoint`, serving on `--addr` (default `127.0.0.1:9000`) the inoutbox metrics for
//! Prometheus (`/metrics`), liveness (`/healthz`) and readiness (`/readyz`), while ten orders
//! go through the outbox, the relay and the billing consumer; one of them is poisoned and ends
//! as a dead letter. Needs the `http` feature.
//!
//! ```text
//! cargo run --features http --example ops               # serves until Ctrl-C
//! cargo run --features http --example ops -- --exit     # prints the scrape and the health once the orders are through
//! curl -s 127.0.0.1:9000/metrics | grep '^inoutbox_'
//! curl -si 127.0.0.1:9000/readyz
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inoutbox::app::{ConsumerSpec, RelaySpec, Store};
use inoutbox::prelude::*;
use inoutbox::telemetry::Health;
use inoutbox::{App, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

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
    let addr: SocketAddr = flag(&args, "--addr", "127.0.0.1:9000")?.parse()?;
    let exit = args.iter().any(|a| a == "--exit");
    Ok(run(addr, exit).await?)
}

async fn run(addr: SocketAddr, exit: bool) -> Result<(), BoxError> {
    let app = App::connect(None, None).await?;
    let Store::Sqlite(store) = app.store().clone() else {
        return Err("the zero-setup store is SQLite".into());
    };
    let pool = store.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE invoices (id integer PRIMARY KEY AUTOINCREMENT, order_id blob NOT NULL, total_cents integer NOT NULL)",
    )
    .execute(&pool)
    .await?;
    app.create_topic("orders", 3).await?;
    let billing = ConsumerSpec::new("billing", ["orders"])
        .retry(RetryPolicy::no_retries())
        .sample_interval(Duration::from_secs(1));
    let relay = RelaySpec::new()
        .source("ops-example")
        .poll_interval(Duration::from_millis(50))
        .sample_interval(Duration::from_secs(1));
    let mut app = app
        .consumer_with(billing)
        .relay_with(relay)
        .ops_endpoint(addr);
    let parts: Vec<Health> = app.health().iter().map(|(_, h)| h.clone()).collect();
    let stop = app.shutdown_token();
    let running = tokio::spawn(async move { app.run().await });

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
    wait_until_through(&pool, &parts).await?;
    println!(
        "metrics: http://{addr}/metrics   health: http://{addr}/healthz, http://{addr}/readyz"
    );
    if exit {
        let (_, scrape) = get(addr, "/metrics").await?;
        for line in scrape
            .lines()
            .filter(|l| l.starts_with("inoutbox_") && !l.contains("_bucket"))
        {
            println!("{line}");
        }
        let (status, body) = get(addr, "/readyz").await?;
        println!("GET /readyz -> {status} {body}");
        stop.cancel();
    } else {
        println!("serving; Ctrl-C to stop");
    }
    running.await??;
    Ok(())
}

/// Waits until every order is invoiced or dead-lettered and the gauges were sampled after.
async fn wait_until_through(pool: &sqlx::SqlitePool, parts: &[Health]) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
            .fetch_one(pool)
            .await?;
        let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM inoutbox_dead_letters")
            .fetch_one(pool)
            .await?;
        let ready = parts.iter().all(Health::ready);
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

/// `GET path` on `addr`: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((status, body))
}
