//! An orders service: creates orders (table `orders`) and enqueues `OrderCreated` in the same
//! transaction, at a configurable rate, until SIGTERM (or `--count` orders).
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example orders -- [--rate 5] [--count 0]
//! ```
//!
//! `--rate` is orders per second; `--count 0` means no limit. Nothing here talks to a broker:
//! the relay (`examples/relay.rs`) publishes what commits, to Kafka, or to NATS JetStream when
//! it runs with `NATS_URL` set.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{env, flag, OrderCreated};

const ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id uuid PRIMARY KEY,
    total_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

/// Creates one order and its event in one transaction.
async fn create_order(pool: &sqlx::PgPool, total_cents: i64) -> Result<Uuid, common::BoxError> {
    let order_id = Uuid::new_v4();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
        .bind(order_id)
        .bind(total_cents)
        .execute(&mut *tx)
        .await?;
    let event_id = inoutbox::outbox::enqueue(
        &mut tx,
        &OrderCreated {
            order_id,
            total_cents,
        },
    )
    .await?;
    tx.commit().await?;
    tracing::info!(%order_id, %event_id, total_cents, "order created");
    Ok(order_id)
}

#[tokio::main]
async fn main() -> Result<(), common::Failure> {
    tracing_subscriber::fmt().with_target(false).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rate: f64 = flag(&args, "--rate", "5")?.parse()?;
    let count: u64 = flag(&args, "--count", "0")?.parse()?;
    let database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    if rate <= 0.0 {
        return Err("--rate must be positive".into());
    }

    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&database_url)
        .await?;
    sqlx::query(ORDERS).execute(&pool).await?;
    inoutbox::PgStore::new(pool.clone()).migrate().await?;

    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let shutdown = inoutbox::shutdown_signal();
    tokio::pin!(shutdown);
    let mut created = 0u64;
    while count == 0 || created < count {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut shutdown => break,
        }
        let total_cents = 100 + (Uuid::new_v4().as_u128() % 10_000) as i64;
        create_order(&pool, total_cents).await?;
        created += 1;
    }
    tracing::info!(created, "orders stopped");
    Ok(())
}
