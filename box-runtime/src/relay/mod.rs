//! The relay: publishes committed outbox rows to Kafka, at least once, in per-key commit order,
//! with any number of relay processes running at once.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use txbox::{PgStore, Relay};
//!
//! Relay::builder(PgStore::new(pool), "127.0.0.1:9092")
//!     .source("orders-service")     // ce_source
//!     .idempotence(false)           // e.g. for Tansu, which rejects the idempotent producer
//!     .build()?
//!     .run_until_signal()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # One cycle
//!
//! 1. **Candidates**: the keys of the oldest publishable rows (`ORDER BY seq LIMIT batch`).
//! 2. **Lock keys**: for each `(topic, key)`, `pg_try_advisory_lock` on the relay's own
//!    connection (a session lock, never waited for). A key held by another relay is skipped.
//! 3. **Re-read** the unpublished rows of the locked keys in `seq` order. Reading *after*
//!    locking matters: another relay may have published and marked some of them between step 1
//!    and step 2.
//! 4. **Produce** them with rdkafka, in `seq` order, keyed by the event key; wait for every
//!    delivery report.
//! 5. **Mark** the delivered rows published (one `UPDATE`); record failures.
//! 6. **Unlock** the keys.
//!
//! # Why per-key order holds with several relays
//!
//! * **Commit order = `seq` order per key.** [`enqueue`](crate::outbox::enqueue) takes a
//!   transaction-level advisory lock on `(topic, key)` before the row's `seq` is drawn and
//!   keeps it until commit. Two transactions of one key are therefore serialised, and the one
//!   that draws the smaller `seq` commits first. So when a relay sees a row, every row of its
//!   key with a smaller `seq` is either visible or will never exist (rolled back). Ordering by
//!   `created_at` or by the UUID would not do: both are taken before commit, and a transaction
//!   that started earlier can commit later.
//! * **One relay per key at a time.** Only the relay holding a key's session lock publishes
//!   that key, from the oldest unpublished row on, and it marks rows before releasing the lock.
//!   Different keys are spread over relays by whoever locks them first.
//! * **Kafka keeps the order it is given** within a partition (one key maps to one partition):
//!   with the idempotent producer (the default) even across internal retries; with
//!   `idempotence(false)` the relay sets `max.in.flight.requests.per.connection = 1` so a retry
//!   cannot overtake an earlier message.
//! * **Crashes**: a relay that dies between publish and mark leaves the rows unpublished; its
//!   session locks go with its connection, and the next relay publishes them again, from the
//!   oldest (at least once: the inbox on the consumer side drops the duplicates).
//!
//! Limits, stated plainly: if the relay's *lock connection* breaks while a batch is in flight,
//! another relay may publish the same key concurrently for that moment (duplicates, possibly
//! out of order). If a delivery fails asynchronously while later messages of the same key were
//! already handed to librdkafka, those later messages may be published before the failed one
//! is retried (with the idempotent producer librdkafka fails them together, which avoids this).
//!
//! # Failures
//!
//! A failed row counts an attempt and keeps its error (`attempts`, `last_error`), and its whole
//! key backs off exponentially (`next_attempt_at`), so later rows of that key wait and the
//! order holds, while other keys flow. Errors that are about the message itself (too large,
//! topic unknown, invalid or not authorised, invalid record) park the row (`parked_at`) after
//! [`RelayBuilder::max_attempts`]; the key then moves on. Broker outages (timeouts, transport
//! errors) are retried forever with backoff and never park. A parked row can be retried by
//! setting `parked_at = NULL`; it is then published after the rows of its key that went ahead.
//!
//! # Wake-up
//!
//! Each enqueue sends `NOTIFY` (delivered at commit); the relay `LISTEN`s on a connection of
//! its own and runs a cycle as soon as one arrives. Polling at
//! [`RelayBuilder::poll_interval`] (default 1 s) covers missed notifications (e.g. while the
//! listening connection reconnects). While cycles find work, the relay loops without waiting.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureProducer;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::names;
use crate::outbox::Retention;
use crate::postgres::PgRelayStore;
use crate::store::StoreError;

mod publish;
mod store;

pub(crate) use store::parse_headers;
pub use store::{Failure, KeyRef, PendingRow, RelayStore};

/// A relay failure that stops it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The Kafka producer could not be created (a bad setting, ...).
    #[error("cannot create the relay's Kafka producer for {brokers}: {source}")]
    Producer {
        /// `bootstrap.servers`.
        brokers: String,
        /// The rdkafka error.
        #[source]
        source: KafkaError,
    },
    /// The store failed at start-up.
    #[error("relay store: {0}")]
    Store(#[from] StoreError),
}

/// What the relay did with one row; sent to [`RelayBuilder::reports`] (for tests and benches).
#[derive(Clone, Debug)]
pub enum RelayReport {
    /// The broker acknowledged the row; it is being marked published.
    Published {
        /// Event id.
        id: Uuid,
        /// Topic.
        topic: String,
        /// Key.
        key: Option<String>,
        /// Partition written to.
        partition: i32,
        /// Offset written to.
        offset: i64,
        /// When the delivery report arrived.
        acked_at: SystemTime,
    },
    /// Publishing the row failed.
    Failed {
        /// Event id.
        id: Uuid,
        /// The error.
        error: String,
        /// Whether the row was parked (given up on).
        parked: bool,
    },
}

/// Settings of a relay; every one has a safe default. Set them through [`RelayBuilder`], or
/// change the fields of [`RelayConfig::new`]'s value.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RelayConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// `ce_source` of published events.
    pub source: String,
    /// Rows per cycle (default 500).
    pub batch_size: usize,
    /// Poll interval, the fallback for missed notifications (default 1 s).
    pub poll_interval: Duration,
    /// Attempts before a row whose message is rejected is parked (default 10).
    pub max_attempts: u32,
    /// The wait of a key after a failed publication (default 200 ms doubling to 30 s).
    pub backoff: Backoff,
    /// Use the idempotent producer (default true).
    pub idempotence: bool,
    /// Extra librdkafka producer settings, applied last.
    pub producer_settings: Vec<(String, String)>,
    /// Purge of published rows (default: keep 7 days, every minute); `None` disables it.
    pub retention: Option<Retention>,
}

impl RelayConfig {
    /// Defaults for `brokers`.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            source: names::DEFAULT_SOURCE.to_owned(),
            batch_size: 500,
            poll_interval: Duration::from_secs(1),
            max_attempts: 10,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
            idempotence: true,
            producer_settings: Vec::new(),
            retention: Some(Retention::default()),
        }
    }

    /// The librdkafka configuration of the relay's producer.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("acks", "all")
            .set("enable.idempotence", self.idempotence.to_string())
            .set("linger.ms", "1")
            .set("message.timeout.ms", "30000");
        if !self.idempotence {
            // Without idempotence, one request in flight keeps retries from reordering.
            c.set("max.in.flight.requests.per.connection", "1");
        }
        for (k, v) in &self.producer_settings {
            c.set(k, v);
        }
        c
    }
}
/// A relay: a store, a producer and settings. Build one with [`Relay::builder`].
#[must_use = "a relay does nothing until `run` or `run_until_signal` is awaited"]
pub struct Relay<S = PgRelayStore> {
    store: Arc<S>,
    producer: FutureProducer,
    config: RelayConfig,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
}

/// Builds a [`Relay`] on a PostgreSQL or SQLite store; every setting has a safe default.
#[must_use]
pub struct RelayBuilder<S> {
    store: S,
    config: RelayConfig,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
}

impl<S: RelayStore> RelayBuilder<S> {
    /// Replaces every setting at once.
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// `ce_source` of published events (default `"txbox"`); name your service.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.config.source = source.into();
        self
    }

    /// Rows per cycle (default 500).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.config.batch_size = rows.max(1);
        self
    }

    /// The poll interval, the fallback for missed notifications (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Attempts before a rejected message is parked (default 10).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = attempts.max(1);
        self
    }

    /// The wait of a key after a failed publication (default 200 ms doubling to 30 s).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// Whether to use the idempotent producer (default true). Tansu rejects it: use `false`.
    pub fn idempotence(mut self, on: bool) -> Self {
        self.config.idempotence = on;
        self
    }

    /// Sets a librdkafka setting of the relay's producer (applied after the relay's own).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config
            .producer_settings
            .push((key.into(), value.into()));
        self
    }

    /// Retention of published rows; `None` disables the relay's purge.
    pub fn retention(mut self, retention: Option<Retention>) -> Self {
        self.config.retention = retention;
        self
    }

    /// Sends a [`RelayReport`] per row to `sender`.
    pub fn reports(mut self, sender: mpsc::UnboundedSender<RelayReport>) -> Self {
        self.reports = Some(sender);
        self
    }

    /// Creates the producer.
    pub fn build(self) -> Result<Relay<S>, RelayError> {
        let mut relay = Relay::with_store(self.store, self.config)?;
        relay.reports = self.reports;
        Ok(relay)
    }
}

/// Whether a produce error is about the message itself (retrying the same message will not
/// help), as opposed to the broker being unreachable or slow.
pub fn is_message_error(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidRecord
                | C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::UnknownPartition
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
        )
    )
}

/// What one cycle did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CycleStats {
    /// Rows published.
    pub published: usize,
    /// Rows that failed.
    pub failed: usize,
}

/// A store a relay can be built on: the backend's [`RelayStore`], or the inbox store of the
/// same database ([`PgStore`](crate::PgStore), [`SqliteStore`](crate::SqliteStore)), whose table
/// names it takes.
pub trait IntoRelayStore {
    /// The relay store.
    type Store: RelayStore;
    /// Converts.
    fn into_relay_store(self) -> Self::Store;
}

impl Relay {
    /// A relay on `store`'s outbox, producing to `brokers`: `store` is the [`PgStore`] or
    /// [`SqliteStore`](crate::SqliteStore) of the consumer, or a relay store.
    ///
    /// [`PgStore`]: crate::PgStore
    pub fn builder<T: IntoRelayStore>(
        store: T,
        brokers: impl Into<String>,
    ) -> RelayBuilder<T::Store> {
        RelayBuilder {
            store: store.into_relay_store(),
            config: RelayConfig::new(brokers),
            reports: None,
        }
    }
}

impl<S: RelayStore> Relay<S> {
    /// A relay on any [`RelayStore`].
    pub fn with_store(store: S, config: RelayConfig) -> Result<Self, RelayError> {
        let producer = config
            .client_config()
            .create()
            .map_err(|source| RelayError::Producer {
                brokers: config.brokers.clone(),
                source,
            })?;
        Ok(Self {
            store: Arc::new(store),
            producer,
            config,
            reports: None,
        })
    }

    /// Sends a [`RelayReport`] for every row published or failed (for tests and metrics).
    pub fn reports(mut self, sender: mpsc::UnboundedSender<RelayReport>) -> Self {
        self.reports = Some(sender);
        self
    }

    /// Publishes until SIGINT or SIGTERM.
    pub async fn run_until_signal(self) -> Result<(), RelayError> {
        self.run(crate::shutdown_signal()).await
    }

    /// Publishes until `shutdown` completes. A cycle in progress is finished first (its rows
    /// are marked), so a graceful stop publishes nothing twice.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), RelayError> {
        tokio::pin!(shutdown);
        self.store.listen().await?;
        let mut next_purge = Instant::now();
        let mut errors = 0u32;
        loop {
            if let Some(retention) = &self.config.retention {
                if Instant::now() >= next_purge {
                    match self.store.purge(retention).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(deleted = n, "outbox retention purge"),
                        Err(e) => tracing::warn!(error = %e, "outbox retention purge failed"),
                    }
                    next_purge = Instant::now() + retention.interval;
                }
            }
            match self.cycle().await {
                Ok(stats) => {
                    errors = 0;
                    if stats.published + stats.failed > 0 {
                        continue;
                    }
                }
                Err(e) => {
                    errors += 1;
                    let pause = self.config.backoff.delay(errors);
                    tracing::warn!(error = %e, retry_in = ?pause, "relay cycle failed");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => continue,
                        () = &mut shutdown => return Ok(()),
                    }
                }
            }
            tokio::select! {
                () = self.store.wait(self.config.poll_interval) => {}
                () = &mut shutdown => return Ok(()),
            }
        }
    }
}
