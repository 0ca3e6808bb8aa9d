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

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio::sync::mpsc;
use txbox::inbox::{Backoff, Report};
use txbox::kafka::{InProcessKafka, CONSUMER_SETTINGS};
use txbox::outbox::OutboxTx;
use txbox::prelude::*;
use txbox::relay::{Relay, RelayConfig, RelayStore};
use txbox::store::InboxStore;
use txbox::{Consumer, KafkaConfig, Outcome, RetryPolicy};
use uuid::Uuid;

const ORDERS: usize = 20;
/// Rows published a second time, as after a relay that crashed between publishing and marking.
const REPUBLISHED: usize = 5;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

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

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() {
    // Warnings and errors only: the table below tells the story.
    tracing_subscriber::fmt()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let no_idempotence = std::env::args().any(|a| a == "--no-idempotence");
    let result = match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) if url.starts_with("postgres") => match postgres(&url).await {
            Ok(db) => run(db, no_idempotence).await,
            Err(e) => Err(e),
        },
        Some(url) if url.starts_with("sqlite:") => match sqlite(
            SqliteConnectOptions::new()
                .filename(url.trim_start_matches("sqlite:").trim_start_matches("//")),
            url.clone(),
        )
        .await
        {
            Ok(db) => run(db, no_idempotence).await,
            Err(e) => Err(e),
        },
        Some(url) => {
            Err(format!("DATABASE_URL must start with postgres:// or sqlite:, got {url}").into())
        }
        None => {
            let dir =
                std::env::temp_dir().join(format!("txbox-quickstart-{}", Uuid::new_v4().simple()));
            let path = dir.join("quickstart.db");
            let made = std::fs::create_dir_all(&dir).map_err(Error::from);
            let result = match made {
                Ok(()) => match sqlite(
                    SqliteConnectOptions::new().filename(&path),
                    path.display().to_string(),
                )
                .await
                {
                    Ok(db) => run(db, no_idempotence).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let _ = std::fs::remove_dir_all(&dir);
            result
        }
    };
    if let Err(e) = result {
        eprintln!("quickstart failed: {e}");
        std::process::exit(1);
    }
}

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

async fn run<D: Database>(db: D, no_idempotence: bool) -> Result<(), Error> {
    // Kafka: the broker in KAFKA_BROKERS, or librdkafka's mock cluster inside this process.
    let in_process;
    let (brokers, kafka_name) = match std::env::var("KAFKA_BROKERS")
        .ok()
        .filter(|b| !b.is_empty())
    {
        Some(brokers) => {
            create_topic(&brokers).await?;
            (brokers.clone(), format!("Kafka at {brokers}"))
        }
        None => {
            in_process = InProcessKafka::start()?;
            in_process.create_topic("orders", 3)?;
            (
                in_process.brokers().to_owned(),
                "in-process Kafka (librdkafka mock cluster)".to_owned(),
            )
        }
    };
    println!("txbox quickstart: {} + {kafka_name}", db.describe());

    // 1. Orders, each with its event in the same transaction.
    let store = db.store();
    let mut ids = HashSet::new();
    for i in 0..ORDERS {
        let order_id = Uuid::new_v4();
        let mut tx = store.begin().await?;
        D::insert_order(&mut tx, order_id, 1000 + i as i64).await?;
        let id = txbox::outbox::enqueue(
            &mut tx,
            &OrderCreated {
                order_id,
                total_cents: 1000 + i as i64,
            },
        )
        .await?;
        store.commit(tx).await?;
        ids.insert(id.to_string());
    }

    // 2. The relay publishes them; then a few rows are marked unpublished again, as if the relay
    // had crashed after publishing and before marking: they are published a second time.
    let mut relay_config = RelayConfig::new(&brokers);
    relay_config.source = "quickstart".to_owned();
    relay_config.poll_interval = Duration::from_millis(50);
    relay_config.idempotence = !no_idempotence;
    let (relay_tx, mut relay_reports) = mpsc::unbounded_channel();
    let relay = Relay::with_store(db.relay_store(), relay_config)?.reports(relay_tx);
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(relay.run(async move {
        let _ = relay_stopped.await;
    }));
    let mut published = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while published < ORDERS {
        match tokio::time::timeout_at(deadline.into(), relay_reports.recv()).await {
            Ok(Some(txbox::relay::RelayReport::Published { .. })) => published += 1,
            Ok(Some(_)) => {}
            _ => {
                return Err(format!(
                    "the relay published {published} of {ORDERS} events within 60 s"
                )
                .into())
            }
        }
    }
    // (The relay reports a row as soon as the broker acknowledged it, and marks it right after.)
    while db
        .count("SELECT count(*) FROM txbox_outbox WHERE published_at IS NULL")
        .await?
        > 0
    {
        if Instant::now() > deadline {
            return Err("the relay did not mark its rows published within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.exec(&format!(
        "UPDATE txbox_outbox SET published_at = NULL WHERE seq IN (SELECT seq FROM txbox_outbox ORDER BY seq LIMIT {REPUBLISHED})"
    ))
    .await?;
    while published < ORDERS + REPUBLISHED {
        match tokio::time::timeout_at(deadline.into(), relay_reports.recv()).await {
            Ok(Some(txbox::relay::RelayReport::Published { .. })) => published += 1,
            Ok(Some(_)) => {}
            _ => return Err("the relay did not publish the rows again within 60 s".into()),
        }
    }

    // 3. The billing consumer: every message, duplicates included, through the inbox.
    let mut kafka = KafkaConfig::new(&brokers, ["orders"])
        .group_id(format!("quickstart-{}", Uuid::new_v4().simple()));
    for (k, v) in CONSUMER_SETTINGS {
        kafka = kafka.set(*k, *v);
    }
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    let consumer = Consumer::builder("billing", store, kafka)
        .retry(RetryPolicy::default().backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(30),
        )))
        .reports(report_tx)
        .build()?;
    let (stop_consumer, consumer_stopped) = tokio::sync::oneshot::channel::<()>();
    let consumer_task = tokio::spawn(consumer.run(async move {
        let _ = consumer_stopped.await;
    }));
    let (mut delivered, mut duplicates, mut retries, mut processed) = (0, 0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while processed + duplicates < ORDERS + REPUBLISHED {
        let report = match tokio::time::timeout_at(deadline.into(), reports.recv()).await {
            Ok(Some(report)) => report,
            _ => {
                return Err(format!(
                    "the consumer handled {} of {} messages within 60 s",
                    processed + duplicates,
                    ORDERS + REPUBLISHED
                )
                .into())
            }
        };
        let id = report
            .delivery
            .header_str("ce_id")
            .unwrap_or_default()
            .to_owned();
        if !ids.contains(&id) {
            continue; // an event of an earlier run on the same broker
        }
        delivered += 1;
        match report.outcome {
            Outcome::Processed { attempt } => {
                processed += 1;
                retries += attempt as usize - 1;
            }
            Outcome::Duplicate => duplicates += 1,
            other => return Err(format!("unexpected outcome for event {id}: {other:?}").into()),
        }
    }
    let _ = stop_consumer.send(());
    let _ = stop_relay.send(());
    consumer_task.await??;
    relay_task.await??;

    // This run's orders only: on a shared broker, events of earlier runs are read too.
    let invoices = db
        .count("SELECT count(*) FROM invoices WHERE order_id IN (SELECT id FROM orders)")
        .await?;
    let once = db
        .count(
            "SELECT count(*) FROM (SELECT order_id FROM invoices WHERE order_id IN (SELECT id FROM orders) \
             GROUP BY order_id HAVING count(*) = 1) AS once",
        )
        .await?;
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
            delivered.to_string(),
        ),
        ("duplicates skipped by the inbox", duplicates.to_string()),
        (
            "handler retries (one order fails on its first attempt)",
            retries.to_string(),
        ),
        ("invoices written", invoices.to_string()),
        ("orders invoiced exactly once", format!("{once}/{ORDERS}")),
    ];
    for (what, n) in rows {
        println!("  {what:<58} {n:>6}");
    }
    if invoices != ORDERS as i64 || once != ORDERS as i64 || duplicates != REPUBLISHED {
        return Err("some order was not invoiced exactly once".into());
    }
    println!("every order invoiced exactly once");
    Ok(())
}

async fn create_topic(brokers: &str) -> Result<(), Error> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let topic = NewTopic::new("orders", 3, TopicReplication::Fixed(1));
    for result in admin.create_topics([&topic], &AdminOptions::new()).await? {
        match result {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic}: {code}").into()),
        }
    }
    Ok(())
}
