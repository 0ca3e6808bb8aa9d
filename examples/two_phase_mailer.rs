//! A mailing service whose handler takes seconds: a two-phase handler (`mode = "two_phase"`)
//! that writes a receipt row and schedules the e-mail as an effect after commit.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example two_phase_mailer -- [--topic orders] [--handler-ms 3000] [--workers 8] \
//!     [--lease-ms 30000] [--mail-url 127.0.0.1:8025]
//! ```
//!
//! The consumer stores each `OrderCreated` as a received inbox row and commits its offset at
//! once; `--workers` workers (in this process, and in any other running this program) claim
//! the rows with leases and run the handler, which takes `--handler-ms`. With `--mail-url` the
//! handler schedules a `send_receipt` effect, which the consumer sends after the handler's
//! transaction commits, as an HTTP POST to that address with an `Idempotency-Key` header (see
//! `examples/mail_stub.rs`, a mail service stub that deduplicates on it).
//!
//! For the tests, each run of the handler is also recorded, outside its transaction, in
//! `handler_runs` (order, process id, start and end), and printed on stderr.

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::Duration;

use inoutbox::effects::Effect;
use inoutbox::prelude::*;
use serde::{Deserialize, Serialize};

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag, OrderCreated};

/// The handler's settings, from the command line.
struct Settings {
    handler_time: Duration,
    mail: bool,
    /// A pool outside the handler's transaction, for `handler_runs`.
    runs: sqlx::PgPool,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// The e-mail the effect sends.
#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    order_id: uuid::Uuid,
    total_cents: i64,
}

#[inbox_handler(event = "OrderCreated", group = "mailing", mode = "two_phase")]
async fn send_receipt(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    let settings = SETTINGS
        .get()
        .ok_or_else(|| HandlerError::permanent("settings not set"))?;
    let pid = std::process::id() as i32;
    let run: i64 = sqlx::query_scalar(
        "INSERT INTO handler_runs (order_id, pid, started_at) VALUES ($1, $2, clock_timestamp()) RETURNING id",
    )
    .bind(event.order_id)
    .bind(pid)
    .fetch_one(&settings.runs)
    .await?;
    eprintln!(
        "mailer: handling order {} (attempt {}, pid {pid})",
        event.order_id, meta.attempt
    );
    sqlx::query("INSERT INTO receipts (order_id, pid) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(pid)
        .execute(&mut **tx)
        .await?;
    if settings.mail {
        let receipt = Receipt {
            order_id: event.order_id,
            total_cents: event.total_cents,
        };
        inoutbox::effects::after_commit(tx, meta, "send_receipt", &receipt).await?;
    }
    // The slow part: an external API, say.
    tokio::time::sleep(settings.handler_time).await;
    sqlx::query("UPDATE handler_runs SET ended_at = clock_timestamp() WHERE id = $1")
        .bind(run)
        .execute(&settings.runs)
        .await?;
    Ok(())
}

/// Sends the receipt: one HTTP POST with the effect's idempotency key.
async fn post_receipt(address: String, effect: Effect) -> Result<(), HandlerError> {
    let receipt: Receipt = effect.payload_as()?;
    let body = serde_json::to_vec(&receipt)?;
    let key = effect.idempotency_key.clone();
    let status = tokio::task::spawn_blocking(move || post(&address, &key, &body))
        .await
        .map_err(HandlerError::transient)??;
    eprintln!(
        "mailer: receipt for order {} sent (HTTP {status}, key {})",
        receipt.order_id, effect.idempotency_key
    );
    match status {
        200..=299 => Ok(()),
        _ => Err(HandlerError::transient(format!(
            "mail service answered HTTP {status}"
        ))),
    }
}

/// A minimal HTTP/1.1 POST over a plain TCP connection; returns the status code.
fn post(address: &str, key: &str, body: &[u8]) -> Result<u16, std::io::Error> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let head = format!(
        "POST /send HTTP/1.1\r\nHost: {address}\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {answer:?}")))
}

/// Deliberately no unique constraint: a doubled effect would show as two rows.
const TABLES: &str = "CREATE TABLE IF NOT EXISTS receipts (
    id bigserial PRIMARY KEY, order_id uuid NOT NULL, pid integer NOT NULL);
CREATE TABLE IF NOT EXISTS handler_runs (
    id bigserial PRIMARY KEY, order_id uuid NOT NULL, pid integer NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz)";

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topic = flag(&args, "--topic", "orders")?;
    let handler_ms: u64 = flag(&args, "--handler-ms", "3000")?.parse()?;
    let workers: usize = flag(&args, "--workers", "8")?.parse()?;
    let lease_ms: u64 = flag(&args, "--lease-ms", "30000")?.parse()?;
    let mail_url = flag(&args, "--mail-url", "")?;
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;

    // Workers hold a connection each while their handler runs, plus the partitions' own.
    let store = inoutbox::PgStore::connect(&database_url, workers as u32 + 8).await?;
    sqlx::raw_sql(TABLES).execute(store.pool()).await?;
    store.migrate().await?;
    let runs = sqlx::postgres::PgPoolOptions::new()
        .max_connections(workers as u32 + 2)
        .connect(&database_url)
        .await?;
    let settings = Settings {
        handler_time: Duration::from_millis(handler_ms),
        mail: !mail_url.is_empty(),
        runs,
    };
    let _ = SETTINGS.set(settings);

    let kafka = inoutbox::KafkaConfig::new(brokers, [topic.as_str()]).quick_join();
    let mut builder = inoutbox::Consumer::builder("mailing", store, kafka)
        .two_phase_workers(workers)
        .lease(Duration::from_millis(lease_ms))
        .two_phase_poll(Duration::from_millis(200))
        // A handler may take longer than the default minute.
        .transaction_timeout(Duration::from_millis(handler_ms) + Duration::from_secs(60));
    if !mail_url.is_empty() {
        builder = builder.effect("send_receipt", move |effect| {
            post_receipt(mail_url.clone(), effect)
        });
    }
    builder.build()?.run_until_signal().await?;
    Ok(())
}
