//! The consumer the soak test (tests/crash.rs) runs as a child process and kills with SIGKILL.
//!
//! Like `billing`, it writes one invoice per `OrderCreated`, but its handler fails on purpose,
//! as the last digit of `total_cents` says: `1` fails transiently on the first attempt, `2` fails
//! permanently (after writing, so the rollback is exercised). Reads `DATABASE_URL`,
//! `KAFKA_BROKERS` and `--topic`; runs until SIGTERM.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use txbox::prelude::*;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topic = args
        .iter()
        .position(|a| a == "--topic")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "orders".to_owned());
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&std::env::var("DATABASE_URL")?)
        .await?;
    let store = txbox::PgStore::new(pool);
    store.migrate().await?;
    let kafka = txbox::KafkaConfig::new(std::env::var("KAFKA_BROKERS")?, [topic.as_str()])
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000");
    let retry = txbox::RetryPolicy::default()
        .max_attempts(3)
        .backoff(txbox::inbox::Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(100),
        ));
    txbox::Consumer::builder("soak", store, kafka)
        .retry(retry)
        .build()?
        .run_until_signal()
        .await?;
    Ok(())
}
