//! A billing service: consumes `OrderCreated` from Kafka and writes one invoice per order,
//! exactly once per event id, however often the broker delivers it.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example billing -- [--topic orders] [--group billing]
//! ```
//!
//! Messages are JSON (`{"order_id": "<uuid>", "total_cents": 1200}`) in CloudEvents binary mode:
//! headers `ce_id`, `ce_type = OrderCreated`, `ce_source`, `ce_specversion = 1.0`,
//! `content-type: application/json`. It logs one line per message and runs until SIGTERM.

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

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn create_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Deliberately no unique constraint: a doubled effect would show as two rows.
const INVOICES: &str = "CREATE TABLE IF NOT EXISTS invoices (
    id bigserial PRIMARY KEY,
    order_id uuid NOT NULL,
    total_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

fn flag(args: &[String], name: &str, default: &str) -> Result<String, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .cloned()
            .ok_or_else(|| format!("{name} needs a value")),
        None => Ok(default.to_owned()),
    }
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!(
            "set {name} (e.g. {})",
            match name {
                "DATABASE_URL" => "postgres://postgres@127.0.0.1:5432/test",
                _ => "127.0.0.1:9092",
            }
        )
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let topic = flag(&args, "--topic", "orders")?;
    let group = flag(&args, "--group", "billing")?;
    let database_url = env("DATABASE_URL")?;
    let brokers = env("KAFKA_BROKERS")?;

    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&database_url)
        .await?;
    sqlx::query(INVOICES).execute(&pool).await?;
    let store = txbox::PgStore::new(pool);
    store.migrate().await?;

    // A 6 s session (librdkafka's default is 45 s) makes joins and rebalances quick; a member
    // that dies is noticed after 6 s.
    let kafka = txbox::KafkaConfig::new(brokers, [topic.as_str()])
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000");
    txbox::Consumer::builder(group, store, kafka)
        .build()?
        .run_until_signal()
        .await?;
    Ok(())
}
