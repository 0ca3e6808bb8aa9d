//! The consumer the soak test (tests/crash.rs) runs as a child process and kills with SIGKILL.
//!
//! Like `billing`, it writes one invoice per `OrderCreated`, but its handler fails on purpose,
//! as the last digit of `total_cents` says: `1` fails transiently on the first attempt, `2` fails
//! permanently (after writing, so the rollback is exercised). Reads `DATABASE_URL`,
//! `KAFKA_BROKERS` and `--topic`; runs until SIGTERM.

use std::time::Duration;

use inoutbox::prelude::*;
use sqlx::postgres::PgPoolOptions;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag, OrderCreated};

#[inbox_handler(event = "OrderCreated", group = "soak")]
async fn invoice_with_faults(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    match event.total_cents % 10 {
        1 if meta.attempt == 1 => Err(HandlerError::transient("injected transient failure")),
        2 => Err(HandlerError::permanent("injected permanent failure")),
        _ => Ok(()),
    }
}

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topic = flag(&args, "--topic", "orders")?;
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    let brokers = env("KAFKA_BROKERS", "127.0.0.1:9092")?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&database_url)
        .await?;
    let store = inoutbox::PgStore::new(pool);
    store.migrate().await?;
    let kafka = inoutbox::KafkaConfig::new(brokers, [topic.as_str()]).quick_join();
    let retry =
        inoutbox::RetryPolicy::default()
            .max_attempts(3)
            .backoff(inoutbox::inbox::Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(100),
            ));
    inoutbox::Consumer::builder("soak", store, kafka)
        .retry(retry)
        .build()?
        .run_until_signal()
        .await?;
    Ok(())
}
