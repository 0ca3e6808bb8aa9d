//! The whole flow in one program, with nothing installed: orders are created with their
//! `OrderCreated` event in the same transaction (the outbox), a relay publishes the events to
//! Kafka, and a billing consumer writes one invoice per order (the inbox), while duplicates are
//! delivered and a handler fails once. Prints what happened and exits 0 when every order was
//! invoiced exactly once.
//!
//! ```text
//! cargo run --example quickstart                      # SQLite in a temp dir + in-process Kafka
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example quickstart
//! KAFKA_BROKERS=127.0.0.1:9092 cargo run --example quickstart -- --no-idempotence
//! ```
//!
//! `DATABASE_URL` may be `postgres://...` (the tables go to a schema `inoutbox_quickstart`,
//! recreated on each run) or `sqlite:...`; `KAFKA_BROKERS` a real broker (`--no-idempotence` for
//! brokers without the idempotent producer, such as Tansu).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use inoutbox::app::{ConsumerSpec, RelaySpec, Store};
use inoutbox::inbox::{Backoff, Report};
use inoutbox::prelude::*;
use inoutbox::relay::RelayReport;
use inoutbox::{sql, App, Outcome, RetryPolicy};
use tokio::sync::mpsc;
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{BoxError as Error, OrderCreated};

const ORDERS: usize = 20;
/// Rows published a second time, as after a relay that crashed between publishing and marking.
const REPUBLISHED: usize = 5;
/// How long the relay, and then the consumer, may take.
const PATIENCE: Duration = Duration::from_secs(60);
/// The topic of `OrderCreated`.
const TOPIC: &str = <OrderCreated as inoutbox::OutboxEvent>::TOPIC;

/// The billing handler, written once for both databases: one invoice; the order with
/// `total_cents == 1003` fails on its first attempt, to show a retry.
#[inbox_handler(event = "OrderCreated", group = "billing", stores(postgres, sqlite))]
async fn invoice<D: Db>(
    event: OrderCreated,
    tx: &mut Tx<'_, D>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    sql("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(tx)
        .await?;
    if event.total_cents == 1003 && meta.attempt == 1 {
        return Err(HandlerError::transient(
            "payment service timed out (first attempt)",
        ));
    }
    Ok(())
}

/// The business tables: the same DDL on both databases (`UUID` is a blob on SQLite).
const TABLES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS orders (id UUID PRIMARY KEY, total_cents BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS invoices (order_id UUID NOT NULL, total_cents BIGINT NOT NULL)",
];

#[tokio::main]
async fn main() {
    // Warnings and errors only: the table below tells the story.
    tracing_subscriber::fmt()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let no_idempotence = std::env::args().any(|a| a == "--no-idempotence");
    if let Err(e) = quickstart(no_idempotence).await {
        eprintln!("quickstart failed: {e}");
        std::process::exit(1);
    }
}

/// The app on the database and broker the environment names (or SQLite in a temporary
/// directory and the in-process Kafka), with the billing consumer and a relay; the flow runs
/// beside it and stops it.
async fn quickstart(no_idempotence: bool) -> Result<(), Error> {
    let database_url = common::database_url_in_schema("inoutbox_quickstart").await?;
    let brokers = std::env::var("KAFKA_BROKERS")
        .ok()
        .filter(|b| !b.is_empty());
    let app = App::connect(database_url.as_deref(), brokers.as_deref()).await?;
    println!("inoutbox quickstart: {}", app.describe());
    app.create_topic(TOPIC, 3).await?;
    let (relay_reports, relayed) = mpsc::unbounded_channel();
    let (consumer_reports, consumed) = mpsc::unbounded_channel();
    let retry = RetryPolicy::default().backoff(Backoff::new(
        Duration::from_millis(50),
        Duration::from_secs(30),
    ));
    // A group id of its own: on a shared broker, earlier runs' offsets do not apply.
    let billing = ConsumerSpec::new("billing", [TOPIC])
        .group_id(format!("quickstart-{}", Uuid::new_v4().simple()))
        .retry(retry)
        .reports(consumer_reports);
    let relay = RelaySpec::new()
        .source("quickstart")
        .poll_interval(Duration::from_millis(50))
        .idempotence(!no_idempotence)
        .reports(relay_reports);
    let mut app = app.consumer_with(billing).relay_with(relay);
    let store = app.store().clone();
    let stop = app.shutdown_token();
    let flow = async move {
        let result = match &store {
            Store::Postgres(s) => flow(s.pool(), relayed, consumed).await,
            Store::Sqlite(s) => flow(s.pool(), relayed, consumed).await,
            _ => Err("a store this example does not know".into()),
        };
        stop.cancel();
        result
    };
    let (ran, flow) = tokio::join!(app.run(), flow);
    ran?;
    flow
}

/// The whole flow on `pool`, from the first order to the verdict.
async fn flow<D: Db>(
    pool: &sqlx::Pool<D>,
    mut relayed: mpsc::UnboundedReceiver<RelayReport>,
    mut consumed: mpsc::UnboundedReceiver<Report>,
) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    for ddl in TABLES {
        sql(*ddl).execute(&mut conn).await?;
    }
    drop(conn);
    // 1. Orders, each with its event in the same transaction (the outbox).
    let events = create_orders(pool).await?;
    // 2. The relay publishes the events, five of them twice (as after a crash).
    let published = publish_some_twice(pool, &mut relayed).await?;
    // 3. The billing consumer: every message through the inbox, one handler failing once.
    let billing = tally_billing(&mut consumed, &events).await?;
    // 4. What became of the orders.
    let invoices = count_invoices(pool).await?;
    verdict(published, &billing, &invoices)
}

/// The next report, or `None` once `deadline` has passed or the sender is gone.
async fn next_report<R>(reports: &mut mpsc::UnboundedReceiver<R>, deadline: Instant) -> Option<R> {
    tokio::time::timeout_at(deadline.into(), reports.recv())
        .await
        .ok()
        .flatten()
}

/// Step 1: `ORDERS` orders, each inserted with its `OrderCreated` enqueued in the same
/// transaction. Returns the event ids.
async fn create_orders<D: Db>(pool: &sqlx::Pool<D>) -> Result<HashSet<String>, Error> {
    let mut ids = HashSet::new();
    for i in 0..ORDERS {
        let order_id = Uuid::new_v4();
        let total_cents = 1000 + i as i64;
        let mut tx = pool.begin().await?;
        sql("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
            .bind(order_id)
            .bind(total_cents)
            .execute(&mut tx)
            .await?;
        let event = OrderCreated {
            order_id,
            total_cents,
        };
        let id = inoutbox::outbox::enqueue(&mut tx, &event).await?;
        tx.commit().await?;
        ids.insert(id.to_string());
    }
    Ok(ids)
}

/// One number from the database.
async fn count<D: Db>(pool: &sqlx::Pool<D>, query: &'static str) -> Result<i64, Error> {
    let mut conn = pool.acquire().await?;
    Ok(sql(query).fetch_one(&mut conn).await?.get(0)?)
}

/// Step 2: the relay publishes every event; then `REPUBLISHED` rows are marked unpublished again,
/// as if the relay had crashed after publishing and before marking, and it publishes them a
/// second time. Returns how many events it published.
async fn publish_some_twice<D: Db>(
    pool: &sqlx::Pool<D>,
    relay: &mut mpsc::UnboundedReceiver<RelayReport>,
) -> Result<usize, Error> {
    let deadline = Instant::now() + PATIENCE;
    let secs = PATIENCE.as_secs();
    let published = count_published(relay, ORDERS, deadline).await;
    if published < ORDERS {
        let error = format!("the relay published {published} of {ORDERS} events within {secs} s");
        return Err(error.into());
    }
    // (The relay reports a row as soon as the broker acknowledged it, and marks it right after.)
    while count(
        pool,
        "SELECT count(*) FROM inoutbox_outbox WHERE published_at IS NULL",
    )
    .await?
        > 0
    {
        if Instant::now() > deadline {
            let error = format!("the relay did not mark its rows published within {secs} s");
            return Err(error.into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut conn = pool.acquire().await?;
    sql("UPDATE inoutbox_outbox SET published_at = NULL WHERE seq IN (SELECT seq FROM inoutbox_outbox ORDER BY seq LIMIT $1)")
        .bind(REPUBLISHED as i64)
        .execute(&mut conn)
        .await?;
    drop(conn);
    if count_published(relay, REPUBLISHED, deadline).await < REPUBLISHED {
        let error = format!("the relay did not publish the rows again within {secs} s");
        return Err(error.into());
    }
    Ok(ORDERS + REPUBLISHED)
}

/// Waits for `n` events published (other reports are passed over); returns how many were
/// published before `deadline` or the relay's end.
async fn count_published(
    relay: &mut mpsc::UnboundedReceiver<RelayReport>,
    n: usize,
    deadline: Instant,
) -> usize {
    let mut published = 0;
    while published < n {
        match next_report(relay, deadline).await {
            Some(RelayReport::Published { .. }) => published += 1,
            Some(_) => {}
            None => break,
        }
    }
    published
}

/// What the billing consumer reported about this run's events.
#[derive(Default)]
struct Billing {
    delivered: usize,
    duplicates: usize,
    retries: usize,
    processed: usize,
}

impl Billing {
    /// Messages done with: processed, or skipped as duplicates.
    fn handled(&self) -> usize {
        self.processed + self.duplicates
    }
}

/// Counts the consumer's reports on this run's `events` until every message was handled.
async fn tally_billing(
    consumer: &mut mpsc::UnboundedReceiver<Report>,
    events: &HashSet<String>,
) -> Result<Billing, Error> {
    let expected = ORDERS + REPUBLISHED;
    let mut billing = Billing::default();
    let deadline = Instant::now() + PATIENCE;
    while billing.handled() < expected {
        let Some(report) = next_report(consumer, deadline).await else {
            let (handled, secs) = (billing.handled(), PATIENCE.as_secs());
            let error =
                format!("the consumer handled {handled} of {expected} messages within {secs} s");
            return Err(error.into());
        };
        let id = report
            .delivery
            .header_str(inoutbox::kafka::HEADER_ID)
            .unwrap_or_default()
            .to_owned();
        if !events.contains(&id) {
            continue; // an event of an earlier run on the same broker
        }
        billing.delivered += 1;
        match report.outcome {
            Outcome::Processed { attempt } => {
                billing.processed += 1;
                billing.retries += attempt as usize - 1;
            }
            Outcome::Duplicate => billing.duplicates += 1,
            other => return Err(format!("unexpected outcome for event {id}: {other:?}").into()),
        }
    }
    Ok(billing)
}

/// The invoices of this run's orders (on a shared broker, events of earlier runs are read too).
struct Invoices {
    written: i64,
    /// Orders with exactly one invoice.
    once: i64,
}

async fn count_invoices<D: Db>(pool: &sqlx::Pool<D>) -> Result<Invoices, Error> {
    let written = count(
        pool,
        "SELECT count(*) FROM invoices WHERE order_id IN (SELECT id FROM orders)",
    )
    .await?;
    let once = count(
        pool,
        "SELECT count(*) FROM (SELECT order_id FROM invoices WHERE order_id IN (SELECT id FROM orders) \
         GROUP BY order_id HAVING count(*) = 1) AS once",
    )
    .await?;
    Ok(Invoices { written, once })
}

/// Prints what happened; an error unless every order was invoiced exactly once.
fn verdict(published: usize, billing: &Billing, invoices: &Invoices) -> Result<(), Error> {
    let rows = [
        (
            "orders created, event enqueued in the same transaction",
            ORDERS.to_string(),
        ),
        (
            "events published by the relay (5 of them twice)",
            published.to_string(),
        ),
        (
            "messages delivered to the billing handler",
            billing.delivered.to_string(),
        ),
        (
            "duplicates skipped by the inbox",
            billing.duplicates.to_string(),
        ),
        (
            "handler retries (one order fails on its first attempt)",
            billing.retries.to_string(),
        ),
        ("invoices written", invoices.written.to_string()),
        (
            "orders invoiced exactly once",
            format!("{}/{ORDERS}", invoices.once),
        ),
    ];
    for (what, n) in rows {
        println!("  {what:<58} {n:>6}");
    }
    let orders = ORDERS as i64;
    if invoices.written != orders || invoices.once != orders || billing.duplicates != REPUBLISHED {
        return Err("some order was not invoiced exactly once".into());
    }
    println!("every order invoiced exactly once");
    Ok(())
}
