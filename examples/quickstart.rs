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
//! `DATABASE_URL` may be `postgres://...` (the tables go to a schema `txbox_quickstart`,
//! recreated on each run) or `sqlite:...`; `KAFKA_BROKERS` a real broker (`--no-idempotence` for
//! brokers without the idempotent producer, such as Tansu).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use txbox::inbox::{Backoff, Report};
use txbox::kafka::{InProcessKafka, CONSUMER_SETTINGS};
use txbox::outbox::OutboxTx;
use txbox::prelude::*;
use txbox::relay::{Relay, RelayConfig, RelayReport, RelayStore};
use txbox::store::InboxStore;
use txbox::{Consumer, KafkaConfig, Outcome, RetryPolicy};
use uuid::Uuid;

#[allow(dead_code)] // each example uses only some of the shared helpers
#[path = "common/mod.rs"]
mod common;

use common::{create_topic, BoxError as Error, OrderCreated};

const ORDERS: usize = 20;
/// Rows published a second time, as after a relay that crashed between publishing and marking.
const REPUBLISHED: usize = 5;
/// How long the relay, and then the consumer, may take.
const PATIENCE: Duration = Duration::from_secs(60);
/// The topic of `OrderCreated`.
const TOPIC: &str = <OrderCreated as txbox::OutboxEvent>::TOPIC;

/// The billing handler's body, for either database: one invoice; the order with
/// `total_cents == 1003` fails on its first attempt, to show a retry.
macro_rules! invoice {
    ($event:ident, $tx:ident, $meta:ident) => {{
        sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
            .bind($event.order_id)
            .bind($event.total_cents)
            .execute(&mut **$tx)
            .await?;
        if $event.total_cents == 1003 && $meta.attempt == 1 {
            return Err(HandlerError::transient(
                "payment service timed out (first attempt)",
            ));
        }
        Ok(())
    }};
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn invoice_pg(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    invoice!(event, tx, meta)
}

#[inbox_handler(event = "OrderCreated", group = "billing")]
async fn invoice_sqlite(
    event: OrderCreated,
    tx: &mut txbox::SqliteTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    invoice!(event, tx, meta)
}

/// What differs between the two databases: the business tables and raw statements.
trait Database: Send + Sync + 'static {
    type Store: InboxStore<Tx = Self::Tx> + Clone;
    type Tx: OutboxTx + Send;
    type Relay: RelayStore;
    fn describe(&self) -> String;
    fn store(&self) -> Self::Store;
    fn relay_store(&self) -> Self::Relay;
    async fn exec(&self, sql: &str) -> Result<u64, sqlx::Error>;
    async fn count(&self, sql: &str) -> Result<i64, sqlx::Error>;
    async fn insert_order(tx: &mut Self::Tx, id: Uuid, cents: i64) -> Result<(), sqlx::Error>;
}

struct Postgres {
    pool: sqlx::PgPool,
}

impl Database for Postgres {
    type Store = txbox::PgStore;
    type Tx = PgTx<'static>;
    type Relay = txbox::relay::PgRelayStore;

    fn describe(&self) -> String {
        "PostgreSQL (schema txbox_quickstart)".to_owned()
    }
    fn store(&self) -> Self::Store {
        txbox::PgStore::new(self.pool.clone())
    }
    fn relay_store(&self) -> Self::Relay {
        txbox::relay::PgRelayStore::new(self.pool.clone(), txbox::Tables::default())
    }
    async fn exec(&self, sql: &str) -> Result<u64, sqlx::Error> {
        Ok(sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
    async fn count(&self, sql: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await
    }
    async fn insert_order(tx: &mut Self::Tx, id: Uuid, cents: i64) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
            .bind(id)
            .bind(cents)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

struct Sqlite {
    pool: sqlx::SqlitePool,
    path: String,
}

impl Database for Sqlite {
    type Store = txbox::SqliteStore;
    type Tx = txbox::SqliteTx<'static>;
    type Relay = txbox::relay::SqliteRelayStore;

    fn describe(&self) -> String {
        format!("SQLite ({})", self.path)
    }
    fn store(&self) -> Self::Store {
        txbox::SqliteStore::new(self.pool.clone())
    }
    fn relay_store(&self) -> Self::Relay {
        txbox::relay::SqliteRelayStore::new(self.pool.clone(), &txbox::Tables::default())
    }
    async fn exec(&self, sql: &str) -> Result<u64, sqlx::Error> {
        Ok(sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
    async fn count(&self, sql: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await
    }
    async fn insert_order(tx: &mut Self::Tx, id: Uuid, cents: i64) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
            .bind(id)
            .bind(cents)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// PostgreSQL at `url`: the schema `txbox_quickstart`, recreated, with the business tables and
/// txbox's.
async fn postgres(url: &str) -> Result<Postgres, Error> {
    let admin = PgPoolOptions::new().max_connections(1).connect(url).await?;
    sqlx::raw_sql("DROP SCHEMA IF EXISTS txbox_quickstart CASCADE; CREATE SCHEMA txbox_quickstart")
        .execute(&admin)
        .await?;
    admin.close().await;
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.options([("search_path", "txbox_quickstart")]))
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE orders (id uuid PRIMARY KEY, total_cents bigint NOT NULL);
         CREATE TABLE invoices (id bigserial PRIMARY KEY, order_id uuid NOT NULL, total_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    txbox::PgStore::new(pool.clone()).migrate().await?;
    Ok(Postgres { pool })
}

/// SQLite as `options` say (`path` names it in the output), with the business tables and txbox's.
async fn sqlite(options: SqliteConnectOptions, path: String) -> Result<Sqlite, Error> {
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS orders (id blob PRIMARY KEY, total_cents integer NOT NULL);
         CREATE TABLE IF NOT EXISTS invoices (id integer PRIMARY KEY AUTOINCREMENT, order_id blob NOT NULL, total_cents integer NOT NULL)",
    )
    .execute(&pool)
    .await?;
    txbox::SqliteStore::new(pool.clone()).migrate().await?;
    Ok(Sqlite { pool, path })
}

#[tokio::main]
async fn main() {
    // Warnings and errors only: the table below tells the story.
    tracing_subscriber::fmt()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let no_idempotence = std::env::args().any(|a| a == "--no-idempotence");
    if let Err(e) = on_chosen_database(no_idempotence).await {
        eprintln!("quickstart failed: {e}");
        std::process::exit(1);
    }
}

/// Runs the flow on the database `DATABASE_URL` names, or on SQLite in a temporary directory.
async fn on_chosen_database(no_idempotence: bool) -> Result<(), Error> {
    match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) if url.starts_with("postgres") => {
            run(postgres(&url).await?, no_idempotence).await
        }
        Some(url) if url.starts_with("sqlite:") => {
            let file = url.trim_start_matches("sqlite:").trim_start_matches("//");
            let db = sqlite(SqliteConnectOptions::new().filename(file), url.clone()).await?;
            run(db, no_idempotence).await
        }
        Some(url) => {
            // The URL may hold a password: never echo it.
            let url = txbox::store::redact_url(&url);
            Err(format!("DATABASE_URL must start with postgres:// or sqlite:, got {url}").into())
        }
        None => on_temporary_sqlite(no_idempotence).await,
    }
}

/// Zero setup: SQLite in a directory of its own, removed afterwards whatever happened.
async fn on_temporary_sqlite(no_idempotence: bool) -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("txbox-quickstart-{}", Uuid::new_v4().simple()));
    let path = dir.join("quickstart.db");
    let result = async {
        std::fs::create_dir_all(&dir)?;
        let options = SqliteConnectOptions::new().filename(&path);
        let db = sqlite(options, path.display().to_string()).await?;
        run(db, no_idempotence).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The whole flow on `db`, from the first order to the verdict.
async fn run<D: Database>(db: D, no_idempotence: bool) -> Result<(), Error> {
    let kafka = Kafka::start().await?;
    println!("txbox quickstart: {} + {}", db.describe(), kafka.name);

    // 1. Orders, each with its event in the same transaction (the outbox).
    let events = create_orders(&db).await?;
    // 2. The relay publishes the events, five of them twice (as after a crash).
    let mut relay = start_relay(&db, &kafka.brokers, no_idempotence)?;
    let published = publish_some_twice(&db, &mut relay).await?;
    // 3. The billing consumer: every message through the inbox, one handler failing once.
    let billing = bill_through_inbox(&db, &kafka.brokers, &events).await?;
    relay.stop().await?;
    // 4. What became of the orders.
    let invoices = count_invoices(&db).await?;
    verdict(published, &billing, &invoices)
}

/// Where the events go: the broker in `KAFKA_BROKERS`, or librdkafka's mock cluster inside this
/// process.
struct Kafka {
    brokers: String,
    /// What the first line of output calls it.
    name: String,
    /// The mock cluster, alive as long as this is.
    _in_process: Option<InProcessKafka>,
}

impl Kafka {
    async fn start() -> Result<Self, Error> {
        match std::env::var("KAFKA_BROKERS")
            .ok()
            .filter(|b| !b.is_empty())
        {
            Some(brokers) => {
                create_topic(&brokers, TOPIC, 3).await?;
                Ok(Self {
                    name: format!("Kafka at {brokers}"),
                    brokers,
                    _in_process: None,
                })
            }
            None => {
                let in_process = InProcessKafka::start()?;
                in_process.create_topic(TOPIC, 3)?;
                Ok(Self {
                    brokers: in_process.brokers().to_owned(),
                    name: "in-process Kafka (librdkafka mock cluster)".to_owned(),
                    _in_process: Some(in_process),
                })
            }
        }
    }
}

/// A relay or a consumer in a task of its own: its reports, and a way to stop it.
struct Running<R> {
    reports: mpsc::UnboundedReceiver<R>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), Error>>,
}

impl<R> Running<R> {
    /// The next report, or `None` once `deadline` has passed or the task has ended.
    async fn next_report(&mut self, deadline: Instant) -> Option<R> {
        tokio::time::timeout_at(deadline.into(), self.reports.recv())
            .await
            .ok()
            .flatten()
    }

    /// Asks the task to stop and waits until it has.
    async fn stop(self) -> Result<(), Error> {
        let _ = self.stop.send(());
        self.task.await?
    }
}

/// Step 1: `ORDERS` orders, each inserted with its `OrderCreated` enqueued in the same
/// transaction. Returns the event ids.
async fn create_orders<D: Database>(db: &D) -> Result<HashSet<String>, Error> {
    let store = db.store();
    let mut ids = HashSet::new();
    for i in 0..ORDERS {
        let order_id = Uuid::new_v4();
        let total_cents = 1000 + i as i64;
        let mut tx = store.begin().await?;
        D::insert_order(&mut tx, order_id, total_cents).await?;
        let event = OrderCreated {
            order_id,
            total_cents,
        };
        let id = txbox::outbox::enqueue(&mut tx, &event).await?;
        store.commit(tx).await?;
        ids.insert(id.to_string());
    }
    Ok(ids)
}

fn start_relay<D: Database>(
    db: &D,
    brokers: &str,
    no_idempotence: bool,
) -> Result<Running<RelayReport>, Error> {
    let mut config = RelayConfig::new(brokers);
    config.source = "quickstart".to_owned();
    config.poll_interval = Duration::from_millis(50);
    config.idempotence = !no_idempotence;
    let (reports_tx, reports) = mpsc::unbounded_channel();
    let relay = Relay::with_store(db.relay_store(), config)?.reports(reports_tx);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        Ok(relay.run(shutdown).await?)
    });
    Ok(Running {
        reports,
        stop,
        task,
    })
}

/// Step 2: the relay publishes every event; then `REPUBLISHED` rows are marked unpublished again,
/// as if the relay had crashed after publishing and before marking, and it publishes them a
/// second time. Returns how many events it published.
async fn publish_some_twice<D: Database>(
    db: &D,
    relay: &mut Running<RelayReport>,
) -> Result<usize, Error> {
    let deadline = Instant::now() + PATIENCE;
    let secs = PATIENCE.as_secs();
    let published = count_published(relay, ORDERS, deadline).await;
    if published < ORDERS {
        let error = format!("the relay published {published} of {ORDERS} events within {secs} s");
        return Err(error.into());
    }
    // (The relay reports a row as soon as the broker acknowledged it, and marks it right after.)
    while db
        .count("SELECT count(*) FROM txbox_outbox WHERE published_at IS NULL")
        .await?
        > 0
    {
        if Instant::now() > deadline {
            let error = format!("the relay did not mark its rows published within {secs} s");
            return Err(error.into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.exec(&format!(
        "UPDATE txbox_outbox SET published_at = NULL WHERE seq IN (SELECT seq FROM txbox_outbox ORDER BY seq LIMIT {REPUBLISHED})"
    ))
    .await?;
    if count_published(relay, REPUBLISHED, deadline).await < REPUBLISHED {
        let error = format!("the relay did not publish the rows again within {secs} s");
        return Err(error.into());
    }
    Ok(ORDERS + REPUBLISHED)
}

/// Waits for `n` events published (other reports are passed over); returns how many were
/// published before `deadline` or the relay's end.
async fn count_published(relay: &mut Running<RelayReport>, n: usize, deadline: Instant) -> usize {
    let mut published = 0;
    while published < n {
        match relay.next_report(deadline).await {
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

/// Step 3: the billing consumer handles every message, duplicates included, through the inbox,
/// and stops.
async fn bill_through_inbox<D: Database>(
    db: &D,
    brokers: &str,
    events: &HashSet<String>,
) -> Result<Billing, Error> {
    let mut consumer = start_billing(db.store(), brokers)?;
    let billing = tally_billing(&mut consumer, events).await?;
    consumer.stop().await?;
    Ok(billing)
}

fn start_billing<S>(store: S, brokers: &str) -> Result<Running<Report>, Error>
where
    S: InboxStore + Clone,
{
    let group_id = format!("quickstart-{}", Uuid::new_v4().simple());
    let kafka = CONSUMER_SETTINGS.iter().fold(
        KafkaConfig::new(brokers, [TOPIC]).group_id(group_id),
        |kafka, (k, v)| kafka.set(*k, *v),
    );
    let retry = RetryPolicy::default().backoff(Backoff::new(
        Duration::from_millis(50),
        Duration::from_secs(30),
    ));
    let (reports_tx, reports) = mpsc::unbounded_channel::<Report>();
    let consumer = Consumer::builder("billing", store, kafka)
        .retry(retry)
        .reports(reports_tx)
        .build()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        Ok(consumer.run(shutdown).await?)
    });
    Ok(Running {
        reports,
        stop,
        task,
    })
}

/// Counts the consumer's reports on this run's `events` until every message was handled.
async fn tally_billing(
    consumer: &mut Running<Report>,
    events: &HashSet<String>,
) -> Result<Billing, Error> {
    let expected = ORDERS + REPUBLISHED;
    let mut billing = Billing::default();
    let deadline = Instant::now() + PATIENCE;
    while billing.handled() < expected {
        let Some(report) = consumer.next_report(deadline).await else {
            let (handled, secs) = (billing.handled(), PATIENCE.as_secs());
            let error =
                format!("the consumer handled {handled} of {expected} messages within {secs} s");
            return Err(error.into());
        };
        let id = report
            .delivery
            .header_str(txbox::kafka::HEADER_ID)
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

async fn count_invoices<D: Database>(db: &D) -> Result<Invoices, Error> {
    let written = db
        .count("SELECT count(*) FROM invoices WHERE order_id IN (SELECT id FROM orders)")
        .await?;
    let once = db
        .count(
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
