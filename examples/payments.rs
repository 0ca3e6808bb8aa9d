//! A payments service on `App`, in one process: deferred messages, effects after commit and the
//! operations endpoint, on either store with one handler per event.
//!
//! - `OrderPlaced` captures a payment, enqueues `PaymentCaptured` in the same transaction and
//!   schedules a fraud review as an effect after commit (a slow call: `--review-ms`, 3 s by
//!   default). The consumer runs up to `effect_concurrency` reviews at once, with no
//!   transaction open.
//! - `OrderCancelled` refunds the order's payment and enqueues `PaymentRefunded`. A cancel that
//!   arrives before its order (the order service's retry published the cancel first) finds no
//!   payment: the handler answers `HandlerError::defer`, the partition goes on, and the cancel
//!   runs again when due, once, after the order.
//! - Both handlers deduplicate on `order_id` (`dedup_by`): business keys are scoped by event
//!   type, so the cancel of a placed order is not taken for a duplicate of it.
//! - `/metrics`, `/healthz` and `/readyz` are served on `--addr` (a free port by default); the
//!   demo scrapes them at the end.
//!
//! The demo driver places eight orders (two of them cancelled before they are placed, one
//! cancelled after), prints what became of them, the deferrals, the reviews and the scrape, and
//! exits 0 only when every figure is the expected one. Needs the `http` feature.
//!
//! ```text
//! cargo run --features http --example payments                    # SQLite + in-process Kafka
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --features http --example payments -- --no-idempotence
//! ```
//!
//! On PostgreSQL the tables go to a schema `inoutbox_payments`, recreated on each run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inoutbox::app::{ConsumerSpec, RelaySpec, Store};
use inoutbox::effects::{after_commit, Effect, EffectsDb};
use inoutbox::inbox::UnknownEvent;
use inoutbox::prelude::*;
use inoutbox::{sql, App, AppError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{flag, http_get, BoxError, Failure};

/// An order was placed: capture its payment.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderPlaced", topic = "pay-orders", key = order_id)]
pub struct OrderPlaced {
    pub order_id: Uuid,
    pub amount_cents: i64,
}

/// An order was cancelled: refund it. Same topic and key as `OrderPlaced`.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCancelled", topic = "pay-orders", key = order_id)]
pub struct OrderCancelled {
    pub order_id: Uuid,
}

/// The payment of an order was captured.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "PaymentCaptured", topic = "payments", key = order_id)]
pub struct PaymentCaptured {
    pub order_id: Uuid,
    pub amount_cents: i64,
}

/// The payment of an order was refunded.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "PaymentRefunded", topic = "payments", key = order_id)]
pub struct PaymentRefunded {
    pub order_id: Uuid,
    pub amount_cents: i64,
}

/// What the fraud review effect receives.
#[derive(Debug, Serialize, Deserialize)]
struct Review {
    order_id: Uuid,
    amount_cents: i64,
}

/// How long a cancel that came before its order waits before it runs again.
const NOT_YET: Duration = Duration::from_millis(300);

/// Captures the payment, announces it and schedules the review; all of it commits with the
/// inbox row, and the review runs only after that commit.
#[inbox_handler(
    event = "OrderPlaced",
    group = "payments",
    dedup_by = order_id,
    stores(postgres, sqlite)
)]
async fn capture<D: Db + EffectsDb>(
    event: OrderPlaced,
    tx: &mut Tx<'_, D>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    sql("INSERT INTO payments (order_id, amount_cents, status) VALUES ($1, $2, 'captured')")
        .bind(event.order_id)
        .bind(event.amount_cents)
        .execute(tx)
        .await?;
    let captured = PaymentCaptured {
        order_id: event.order_id,
        amount_cents: event.amount_cents,
    };
    inoutbox::outbox::enqueue(tx, &captured).await?;
    let review = Review {
        order_id: event.order_id,
        amount_cents: event.amount_cents,
    };
    after_commit(tx, meta, "fraud_review", &review).await?;
    Ok(())
}

/// Refunds the order's payment; a cancel before its order is deferred until the order is in.
#[inbox_handler(
    event = "OrderCancelled",
    group = "payments",
    dedup_by = order_id,
    stores(postgres, sqlite)
)]
async fn refund<D: Db>(event: OrderCancelled, tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    let payment = sql("SELECT amount_cents, status FROM payments WHERE order_id = $1")
        .bind(event.order_id)
        .fetch_optional(tx)
        .await?;
    let Some(payment) = payment else {
        return Err(HandlerError::defer_because(
            NOT_YET,
            "no payment yet: the cancel came before its order",
        ));
    };
    if payment.get::<String>(1)? != "captured" {
        return Ok(());
    }
    sql("UPDATE payments SET status = 'refunded' WHERE order_id = $1")
        .bind(event.order_id)
        .execute(tx)
        .await?;
    let refunded = PaymentRefunded {
        order_id: event.order_id,
        amount_cents: payment.get::<i64>(0)?,
    };
    inoutbox::outbox::enqueue(tx, &refunded).await?;
    Ok(())
}

/// The fraud service's side: reviews by idempotency key (a repeated run is recognised), and how
/// many ran at once.
#[derive(Default)]
struct FraudService {
    runs: Mutex<HashMap<String, u32>>,
    in_flight: Mutex<(usize, usize)>,
    /// When the first review started and the last one ended.
    window: Mutex<Option<(Instant, Instant)>>,
}

impl FraudService {
    async fn review(&self, effect: Effect, took: Duration) -> Result<(), HandlerError> {
        let review: Review = effect.payload_as()?;
        let started = Instant::now();
        {
            let mut flight = self.in_flight.lock().unwrap();
            flight.0 += 1;
            flight.1 = flight.1.max(flight.0);
        }
        tokio::time::sleep(took).await;
        self.in_flight.lock().unwrap().0 -= 1;
        let mut window = self.window.lock().unwrap();
        let first = window.map_or(started, |(first, _)| first.min(started));
        *window = Some((first, Instant::now()));
        drop(window);
        *self
            .runs
            .lock()
            .unwrap()
            .entry(effect.idempotency_key)
            .or_default() += 1;
        tracing::debug!(order = %review.order_id, cents = review.amount_cents, "reviewed");
        Ok(())
    }

    /// From the first review's start to the last one's end.
    fn took(&self) -> Duration {
        self.window
            .lock()
            .unwrap()
            .map_or(Duration::ZERO, |(first, last)| last - first)
    }

    /// (reviews, reviews run more than once, most at once)
    fn figures(&self) -> (usize, usize, usize) {
        let runs = self.runs.lock().unwrap();
        let repeated = runs.values().filter(|n| **n > 1).count();
        (runs.len(), repeated, self.in_flight.lock().unwrap().1)
    }
}

/// The business table: the same DDL on both stores (`UUID` is a 16-byte blob on SQLite).
const TABLE: &str = "CREATE TABLE IF NOT EXISTS payments \
     (order_id UUID PRIMARY KEY, amount_cents BIGINT NOT NULL, status TEXT NOT NULL)";

const ORDERS: usize = 8;
/// The orders cancelled before they are placed, and the one cancelled after.
const CANCELLED_FIRST: [usize; 2] = [1, 5];
const CANCELLED_AFTER: usize = 3;
/// How long one step of the demo may take.
const PATIENCE: Duration = Duration::from_secs(90);

#[tokio::main]
async fn main() -> Result<(), Failure> {
    tracing_subscriber::fmt()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let review = Duration::from_millis(flag(&args, "--review-ms", "3000")?.parse()?);
    let addr = match flag(&args, "--addr", "")?.as_str() {
        "" => free_port()?,
        addr => addr.parse()?,
    };
    let no_idempotence = args.iter().any(|a| a == "--no-idempotence");
    Ok(service(review, addr, no_idempotence).await?)
}

/// The service and its demo driver, side by side: the driver stops the app when it is done.
async fn service(review: Duration, addr: SocketAddr, no_idempotence: bool) -> Result<(), BoxError> {
    let database_url = common::database_url_in_schema("inoutbox_payments").await?;
    let brokers = std::env::var("KAFKA_BROKERS")
        .ok()
        .filter(|b| !b.is_empty());
    let app = App::connect(database_url.as_deref(), brokers.as_deref()).await?;
    println!("inoutbox payments: {}", app.describe());
    for topic in ["pay-orders", "payments"] {
        app.create_topic(topic, 3).await?;
    }
    let fraud = Arc::new(FraudService::default());
    let reviews = Arc::clone(&fraud);
    let payments = ConsumerSpec::new("payments", ["pay-orders"])
        .unknown_event(UnknownEvent::Skip)
        .effect("fraud_review", move |effect| {
            let fraud = Arc::clone(&reviews);
            async move { fraud.review(effect, review).await }
        })
        .effect_concurrency(ORDERS)
        .sample_interval(Duration::from_millis(500));
    let relay = RelaySpec::new()
        .source("payments")
        .poll_interval(Duration::from_millis(50))
        .idempotence(!no_idempotence);
    let mut app = app
        .consumer_with(payments)
        .relay_with(relay)
        .ops_endpoint(addr);
    let store = app.store().clone();
    let stop = app.shutdown_token();
    let demo = async move {
        let result = match &store {
            Store::Postgres(s) => demo(s.pool(), &fraud, addr, review).await,
            Store::Sqlite(s) => demo(s.pool(), &fraud, addr, review).await,
            _ => Err("a store this example does not know".into()),
        };
        stop.cancel();
        result
    };
    let (ran, demo): (Result<(), AppError>, Result<(), BoxError>) = tokio::join!(app.run(), demo);
    ran?;
    demo
}

/// The demo: the orders and cancels through the outbox, then every figure checked.
async fn demo<D: Db>(
    pool: &sqlx::Pool<D>,
    fraud: &FraudService,
    addr: SocketAddr,
    review: Duration,
) -> Result<(), BoxError> {
    sql(TABLE).execute(&mut pool.acquire().await?).await?;
    let orders: Vec<Uuid> = (0..ORDERS).map(|_| Uuid::new_v4()).collect();
    for &i in &CANCELLED_FIRST {
        enqueue(
            pool,
            &OrderCancelled {
                order_id: orders[i],
            },
        )
        .await?;
    }
    wait_for(pool, "the early cancels deferred", deferred_count, |n| {
        n == CANCELLED_FIRST.len() as i64
    })
    .await?;
    for (i, &order_id) in orders.iter().enumerate() {
        let amount_cents = 1_000 + i as i64;
        enqueue(
            pool,
            &OrderPlaced {
                order_id,
                amount_cents,
            },
        )
        .await?;
    }
    wait_for(
        pool,
        "every order captured",
        |p| count(p, "1 = 1"),
        |n| n == ORDERS as i64,
    )
    .await?;
    let late = OrderCancelled {
        order_id: orders[CANCELLED_AFTER],
    };
    enqueue(pool, &late).await?;
    wait_for(
        pool,
        "three refunds",
        |p| count(p, "status = 'refunded'"),
        |n| n == 3,
    )
    .await?;
    wait_for(pool, "nothing deferred", deferred_count, |n| n == 0).await?;
    let deadline = Instant::now() + PATIENCE;
    while fraud.figures().0 < ORDERS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await; // one more sample of the gauges
    report(pool, fraud, addr, review, &orders).await
}

/// Prints the figures and the scrape; an error when a figure differs from the expected one.
async fn report<D: Db>(
    pool: &sqlx::Pool<D>,
    fraud: &FraudService,
    addr: SocketAddr,
    review: Duration,
    orders: &[Uuid],
) -> Result<(), BoxError> {
    let refunded: Vec<Uuid> = sql("SELECT order_id FROM payments WHERE status = 'refunded'")
        .fetch_all(&mut pool.acquire().await?)
        .await?
        .iter()
        .map(|row| row.get::<Uuid>(0))
        .collect::<Result<_, _>>()?;
    let mut expected_refunds: Vec<Uuid> = CANCELLED_FIRST.iter().map(|&i| orders[i]).collect();
    expected_refunds.push(orders[CANCELLED_AFTER]);
    let (reviews, repeated, at_once) = fraud.figures();
    let serial = review * ORDERS as u32;
    let figures = [
        (
            "payments captured",
            count(pool, "1 = 1").await?,
            ORDERS as i64,
        ),
        ("payments refunded", refunded.len() as i64, 3),
        (
            "  of them cancelled before their order",
            CANCELLED_FIRST
                .iter()
                .filter(|&&i| refunded.contains(&orders[i]))
                .count() as i64,
            2,
        ),
        (
            "fraud reviews run (effects after commit)",
            reviews as i64,
            ORDERS as i64,
        ),
        ("  of them run more than once", repeated as i64, 0),
        (
            "events in the outbox not yet published",
            unpublished(pool).await?,
            0,
        ),
    ];
    let mut wrong = 0;
    for (what, got, want) in figures {
        let mark = if got == want { "" } else { "   <- expected " };
        let want = if got == want {
            String::new()
        } else {
            want.to_string()
        };
        println!("  {what:<48}{got:>6}{mark}{want}");
        wrong += usize::from(!mark.is_empty());
    }
    println!(
        "  fraud reviews at once, at most                  {at_once:>6}   ({ORDERS} reviews of {} ms within {:.1} s; one at a time: {:.1} s)",
        review.as_millis(),
        fraud.took().as_secs_f64(),
        serial.as_secs_f64()
    );
    let mut all_refunded = refunded.clone();
    all_refunded.sort();
    expected_refunds.sort();
    if all_refunded != expected_refunds {
        wrong += 1;
        println!("  the refunded orders are not the cancelled ones");
    }
    if at_once < 2 && review > Duration::ZERO {
        wrong += 1;
        println!("  the reviews ran one at a time");
    }
    wrong += scrape(addr).await?;
    if wrong > 0 {
        return Err(format!("{wrong} figure(s) differ from the expected ones").into());
    }
    println!("every order captured once, every cancel refunded once (the early ones deferred), every review run once");
    Ok(())
}

/// Prints the deferral and effect lines of `/metrics` and the readiness; how many are missing.
async fn scrape(addr: SocketAddr) -> Result<usize, BoxError> {
    let (status, metrics) = http_get(addr, "/metrics").await?;
    println!("GET http://{addr}/metrics -> {status}");
    let wanted = [
        "inoutbox_inbox_deferred",
        "inoutbox_effect",
        "inoutbox_inbox_processed_total",
    ];
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| wanted.iter().any(|w| l.starts_with(w)) && !l.contains("_bucket"))
        .collect();
    for line in &lines {
        println!("    {line}");
    }
    let (ready, body) = http_get(addr, "/readyz").await?;
    println!("GET http://{addr}/readyz -> {ready} {body}");
    let missing = ["inoutbox_inbox_deferred_total", "inoutbox_effect"]
        .iter()
        .filter(|m| !lines.iter().any(|l| l.starts_with(**m)))
        .inspect(|m| println!("  the scrape has no {m}"))
        .count();
    Ok(missing + usize::from(status != 200) + usize::from(ready != 200))
}

/// Enqueues `event` in a transaction of its own (the order service's side).
async fn enqueue<D: Db, E: OutboxEvent>(pool: &sqlx::Pool<D>, event: &E) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    inoutbox::outbox::enqueue(&mut tx, event).await?;
    tx.commit().await?;
    Ok(())
}

async fn count<D: Db>(pool: &sqlx::Pool<D>, filter: &str) -> Result<i64, BoxError> {
    let statement = format!("SELECT count(*) FROM payments WHERE {filter}");
    let row = sql(sqlx::AssertSqlSafe(statement))
        .fetch_one(&mut pool.acquire().await?)
        .await?;
    Ok(row.get::<i64>(0)?)
}

async fn deferred_count<D: Db>(pool: &sqlx::Pool<D>) -> Result<i64, BoxError> {
    let row = sql(
        "SELECT count(*) FROM inoutbox_inbox WHERE due_at IS NOT NULL AND processed_at IS NULL",
    )
    .fetch_one(&mut pool.acquire().await?)
    .await?;
    Ok(row.get::<i64>(0)?)
}

async fn unpublished<D: Db>(pool: &sqlx::Pool<D>) -> Result<i64, BoxError> {
    let row = sql("SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL")
        .fetch_one(&mut pool.acquire().await?)
        .await?;
    Ok(row.get::<i64>(0)?)
}

/// Polls `figure` until `done` holds, for at most `PATIENCE`.
async fn wait_for<'p, D: Db, F, Fut>(
    pool: &'p sqlx::Pool<D>,
    what: &str,
    figure: F,
    done: impl Fn(i64) -> bool,
) -> Result<(), BoxError>
where
    F: Fn(&'p sqlx::Pool<D>) -> Fut,
    Fut: std::future::Future<Output = Result<i64, BoxError>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        let n = figure(pool).await?;
        if done(n) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("waiting for {what}: {n} after {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free port on the loopback for the operations endpoint.
fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}
