//! An inventory service in one process, on either store with one handler per event.
//!
//! - `OrderPlaced` reserves every line of an order, or none: the lines are taken under a
//!   savepoint, rolled back as a whole when one is short; the handler then enqueues
//!   `StockReserved` or `StockRejected` (outbox events chained from the handler).
//! - `OrderCancelled` releases what the order holds and enqueues `StockReleased`.
//! - `StockReserved`, published by the relay running in the same process, creates a shipment
//!   (consumer group `shipping`).
//!
//! The handlers are written once, generic over the store (`D: inoutbox::Db`), and registered for
//! PostgreSQL and SQLite with `stores(postgres, sqlite)`. A demo driver places and cancels
//! orders, prints what became of each and the stock, and exits 0 only when every figure is the
//! expected one.
//!
//! ```text
//! cargo run --example inventory                      # SQLite in a temp dir + in-process Kafka
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example inventory -- --no-idempotence
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test NATS_URL=nats://127.0.0.1:4222 \
//!     cargo run --features nats --example inventory    # PostgreSQL + NATS JetStream
//! ```
//!
//! With `NATS_URL` set (feature `nats`) the app runs on NATS JetStream (`App::connect_nats`:
//! its topics are streams of three partitions; `KAFKA_BROKERS` is then not read).
//!
//! On PostgreSQL the tables go to a schema `inoutbox_inventory`, recreated on each run.

use std::time::{Duration, Instant};

use inoutbox::app::{ConsumerSpec, RelaySpec, Store};
use inoutbox::inbox::UnknownEvent;
use inoutbox::prelude::*;
use inoutbox::{sql, App, AppError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

type Error = common::BoxError;

/// One line of an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Line {
    pub sku: String,
    pub qty: i64,
}

/// An order was placed: reserve its lines.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderPlaced", topic = "shop-orders", key = order_id)]
pub struct OrderPlaced {
    pub order_id: Uuid,
    pub lines: Vec<Line>,
}

/// An order was cancelled: release what it holds. Same topic and key as `OrderPlaced`, so it
/// is handled after the order's placement.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCancelled", topic = "shop-orders", key = order_id)]
pub struct OrderCancelled {
    pub order_id: Uuid,
}

/// Every line of the order is reserved.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "StockReserved", topic = "stock", key = order_id)]
pub struct StockReserved {
    pub order_id: Uuid,
}

/// No line is reserved: `sku` is short.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "StockRejected", topic = "stock", key = order_id)]
pub struct StockRejected {
    pub order_id: Uuid,
    pub sku: String,
}

/// The order's reservation was given back.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "StockReleased", topic = "stock", key = order_id)]
pub struct StockReleased {
    pub order_id: Uuid,
}

/// All or nothing: the lines are taken under a savepoint; when one is short, the savepoint is
/// rolled back (the lines taken before it come back) and the order is rejected. The inbox row,
/// the status and the chained event commit together with the reservation.
#[inbox_handler(event = "OrderPlaced", group = "inventory", stores(postgres, sqlite))]
async fn reserve<D: Db>(event: OrderPlaced, tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    let id = event.order_id;
    if !is_placed(tx, id).await? {
        return Ok(()); // an order of another run, or one already handled
    }
    sql("SAVEPOINT reserve").execute(tx).await?;
    for line in &event.lines {
        let taken =
            sql("UPDATE stock SET available = available - $1 WHERE sku = $2 AND available >= $1")
                .bind(line.qty)
                .bind(&line.sku)
                .execute(tx)
                .await?;
        if taken == 0 {
            sql("ROLLBACK TO SAVEPOINT reserve").execute(tx).await?;
            sql("RELEASE SAVEPOINT reserve").execute(tx).await?;
            set_status(tx, id, "rejected").await?;
            let rejected = StockRejected {
                order_id: id,
                sku: line.sku.clone(),
            };
            inoutbox::outbox::enqueue(tx, &rejected).await?;
            return Ok(());
        }
        sql("INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(&line.sku)
            .bind(line.qty)
            .execute(tx)
            .await?;
    }
    sql("RELEASE SAVEPOINT reserve").execute(tx).await?;
    set_status(tx, id, "reserved").await?;
    inoutbox::outbox::enqueue(tx, &StockReserved { order_id: id }).await?;
    Ok(())
}

/// Gives back what the order holds (nothing for a rejected order).
#[inbox_handler(
    event = "OrderCancelled",
    group = "inventory",
    stores(postgres, sqlite)
)]
async fn release<D: Db>(event: OrderCancelled, tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    let id = event.order_id;
    let held = sql("SELECT sku, qty FROM reservations WHERE order_id = $1")
        .bind(id)
        .fetch_all(tx)
        .await?;
    for row in &held {
        sql("UPDATE stock SET available = available + $1 WHERE sku = $2")
            .bind(row.get::<i64>(1)?)
            .bind(row.get::<String>(0)?)
            .execute(tx)
            .await?;
    }
    sql("DELETE FROM reservations WHERE order_id = $1")
        .bind(id)
        .execute(tx)
        .await?;
    set_status(tx, id, "cancelled").await?;
    if !held.is_empty() {
        inoutbox::outbox::enqueue(tx, &StockReleased { order_id: id }).await?;
    }
    Ok(())
}

/// The chained event, consumed: one shipment per reserved order.
#[inbox_handler(event = "StockReserved", group = "shipping", stores(postgres, sqlite))]
async fn ship<D: Db>(event: StockReserved, tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    sql("INSERT INTO shipments (order_id) VALUES ($1)")
        .bind(event.order_id)
        .execute(tx)
        .await?;
    Ok(())
}

async fn is_placed<D: Db>(tx: &mut Tx<'_, D>, id: Uuid) -> Result<bool, sqlx::Error> {
    let row = sql("SELECT status FROM orders WHERE id = $1")
        .bind(id)
        .fetch_optional(tx)
        .await?;
    Ok(match row {
        Some(row) => row.get::<String>(0)? == "placed",
        None => false,
    })
}

async fn set_status<D: Db>(tx: &mut Tx<'_, D>, id: Uuid, status: &str) -> Result<(), sqlx::Error> {
    sql("UPDATE orders SET status = $1 WHERE id = $2")
        .bind(status)
        .bind(id)
        .execute(tx)
        .await?;
    Ok(())
}

/// The business tables: the same DDL on both stores (`UUID` is a 16-byte blob on SQLite).
const TABLES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available BIGINT NOT NULL CHECK (available >= 0))",
    "CREATE TABLE IF NOT EXISTS orders (id UUID PRIMARY KEY, status TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reservations (order_id UUID NOT NULL, sku TEXT NOT NULL, qty BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shipments (order_id UUID PRIMARY KEY)",
];

/// How long one step of the demo may take.
const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let no_idempotence = std::env::args().any(|a| a == "--no-idempotence");
    if let Err(e) = service(no_idempotence).await {
        eprintln!("inventory failed: {e}");
        std::process::exit(1);
    }
}

/// The app on the database (SQLite in a temp dir when none) and on NATS JetStream when
/// `NATS_URL` is set (feature `nats`), else on the Kafka of `KAFKA_BROKERS` (the in-process one
/// when unset).
async fn connect(database_url: Option<&str>) -> Result<App, Error> {
    #[cfg(feature = "nats")]
    if let Some(url) = std::env::var("NATS_URL").ok().filter(|u| !u.is_empty()) {
        return Ok(App::connect_nats(database_url, &url).await?);
    }
    let brokers = std::env::var("KAFKA_BROKERS")
        .ok()
        .filter(|b| !b.is_empty());
    Ok(App::connect(database_url, brokers.as_deref()).await?)
}

/// The service and its demo driver, side by side: the driver stops the app when it is done.
async fn service(no_idempotence: bool) -> Result<(), Error> {
    let database_url = common::database_url_in_schema("inoutbox_inventory").await?;
    let app = connect(database_url.as_deref()).await?;
    println!("inoutbox inventory: {}", app.describe());
    for topic in ["shop-orders", "stock"] {
        app.create_topic(topic, 3).await?;
    }
    let relay = RelaySpec::new()
        .source("inventory")
        .poll_interval(Duration::from_millis(50));
    let mut app = app
        .consumer("inventory", ["shop-orders"])
        // `stock` also carries StockRejected and StockReleased, which shipping leaves alone.
        .consumer_with(ConsumerSpec::new("shipping", ["stock"]).unknown_event(UnknownEvent::Skip))
        .relay_with(relay.idempotence(!no_idempotence));
    let store = app.store().clone();
    let stop = app.shutdown_token();
    let demo = async move {
        let result = match &store {
            Store::Postgres(s) => demo(s.pool()).await,
            Store::Sqlite(s) => demo(s.pool()).await,
            _ => Err("a store this example does not know".into()),
        };
        stop.cancel();
        result
    };
    let (ran, demo): (Result<(), AppError>, Result<(), Error>) = tokio::join!(app.run(), demo);
    ran?;
    demo
}

/// One order of the demo: its name, lines (sku, quantity) and the expected outcome.
type Step = (&'static str, &'static [(&'static str, i64)], &'static str);

/// The demo: stock, four orders and a cancellation, one step at a time.
async fn demo<D: Db>(pool: &sqlx::Pool<D>) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    for ddl in TABLES {
        sql(*ddl).execute(&mut conn).await?;
    }
    for (sku, available) in [("apple", 10_i64), ("pear", 5)] {
        sql("INSERT INTO stock (sku, available) VALUES ($1, $2) \
             ON CONFLICT (sku) DO UPDATE SET available = excluded.available")
        .bind(sku)
        .bind(available)
        .execute(&mut conn)
        .await?;
    }
    drop(conn);
    let steps: [Step; 4] = [
        ("A", &[("apple", 3), ("pear", 2)], "reserved"),
        ("B", &[("apple", 4), ("pear", 4)], "rejected"),
        ("C", &[("apple", 5)], "reserved"),
        ("D", &[("pear", 5)], "reserved"),
    ];
    let mut ids = Vec::new();
    let mut failures = 0;
    for (i, (name, lines, expected)) in steps.iter().enumerate() {
        if i == 3 {
            // Cancel A before D: D's pears are those A gave back.
            failures += cancel(pool, "A", ids[0]).await?;
        }
        let id = place(pool, lines).await?;
        ids.push(id);
        let status = wait_for_status(pool, id, "placed").await?;
        let what = lines
            .iter()
            .map(|(s, q)| format!("{s} {q}"))
            .collect::<Vec<_>>()
            .join(", ");
        failures += report(pool, &format!("order {name} ({what})"), &status, expected).await?;
    }
    failures += check_totals(pool, &ids).await?;
    if failures > 0 {
        return Err(format!("{failures} figure(s) differ from the expected ones").into());
    }
    println!("every order reserved all or nothing, the cancellation released its stock");
    Ok(())
}

/// Places an order: the row and its `OrderPlaced` in one transaction (the outbox).
async fn place<D: Db>(pool: &sqlx::Pool<D>, lines: &[(&str, i64)]) -> Result<Uuid, Error> {
    let order_id = Uuid::new_v4();
    let mut tx = pool.begin().await?;
    sql("INSERT INTO orders (id, status) VALUES ($1, 'placed')")
        .bind(order_id)
        .execute(&mut tx)
        .await?;
    let lines = lines
        .iter()
        .map(|(sku, qty)| Line {
            sku: (*sku).to_owned(),
            qty: *qty,
        })
        .collect();
    inoutbox::outbox::enqueue(&mut tx, &OrderPlaced { order_id, lines }).await?;
    tx.commit().await?;
    Ok(order_id)
}

/// Cancels an order and reports what became of it.
async fn cancel<D: Db>(pool: &sqlx::Pool<D>, name: &str, order_id: Uuid) -> Result<usize, Error> {
    let mut tx = pool.begin().await?;
    inoutbox::outbox::enqueue(&mut tx, &OrderCancelled { order_id }).await?;
    tx.commit().await?;
    let status = wait_for_status(pool, order_id, "reserved").await?;
    report(
        pool,
        &format!("order {name} cancelled"),
        &status,
        "cancelled",
    )
    .await
}

/// Waits until the order's status is no longer `from`; returns it.
async fn wait_for_status<D: Db>(
    pool: &sqlx::Pool<D>,
    id: Uuid,
    from: &str,
) -> Result<String, Error> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut conn = pool.acquire().await?;
        let status: String = sql("SELECT status FROM orders WHERE id = $1")
            .bind(id)
            .fetch_one(&mut conn)
            .await?
            .get(0)?;
        if status != from {
            return Ok(status);
        }
        if Instant::now() > deadline {
            return Err(format!("order {id} still {from} after {} s", PATIENCE.as_secs()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints one step with the stock after it; 1 when the status is not the expected one.
async fn report<D: Db>(
    pool: &sqlx::Pool<D>,
    what: &str,
    status: &str,
    expected: &str,
) -> Result<usize, Error> {
    let mut conn = pool.acquire().await?;
    let stock = sql("SELECT sku, available FROM stock ORDER BY sku")
        .fetch_all(&mut conn)
        .await?;
    let stock = stock
        .iter()
        .map(|row| Ok(format!("{} {}", row.get::<String>(0)?, row.get::<i64>(1)?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?
        .join(", ");
    let ok = status == expected;
    let mark = if ok {
        String::new()
    } else {
        format!("  <- expected {expected}")
    };
    println!("  {what:<34} {status:<10} stock: {stock}{mark}");
    Ok(usize::from(!ok))
}

/// The end state: stock, reservations held, and shipments made from `StockReserved` events
/// (published by the relay and consumed by `shipping`).
async fn check_totals<D: Db>(pool: &sqlx::Pool<D>, ids: &[Uuid]) -> Result<usize, Error> {
    let deadline = Instant::now() + PATIENCE;
    let mut conn = pool.acquire().await?;
    let count = |sql_text: &'static str| sql(sql_text);
    let mut shipped = 0;
    while Instant::now() < deadline {
        shipped = 0;
        for id in ids {
            let row = count("SELECT count(*) FROM shipments WHERE order_id = $1")
                .bind(id)
                .fetch_one(&mut conn)
                .await?;
            shipped += row.get::<i64>(0)?;
        }
        if shipped >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut held = 0;
    for id in ids {
        let row = count("SELECT count(*) FROM reservations WHERE order_id = $1")
            .bind(id)
            .fetch_one(&mut conn)
            .await?;
        held += row.get::<i64>(0)?;
    }
    let apple: i64 = sql("SELECT available FROM stock WHERE sku = 'apple'")
        .fetch_one(&mut conn)
        .await?
        .get(0)?;
    let pear: i64 = sql("SELECT available FROM stock WHERE sku = 'pear'")
        .fetch_one(&mut conn)
        .await?
        .get(0)?;
    let rows = [
        ("shipments made from StockReserved (A, C, D)", shipped, 3),
        ("reservation lines held (C 1, D 1)", held, 2),
        ("apples left (10 - C 5)", apple, 5),
        ("pears left (5 - D 5)", pear, 0),
    ];
    let mut failures = 0;
    for (what, got, expected) in rows {
        let mark = if got == expected {
            String::new()
        } else {
            format!("  <- expected {expected}")
        };
        println!("  {what:<45} {got:>6}{mark}");
        failures += usize::from(got != expected);
    }
    Ok(failures)
}
