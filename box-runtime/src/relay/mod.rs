//! The relay: publishes committed outbox rows to Kafka, at least once, in per-key commit order,
//! with any number of relay processes running at once.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use inoutbox::{PgStore, Relay};
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
//! # How it works
//!
//! * **Slots.** Every row has a `slot`, a hash of its key (PostgreSQL: 64 slots, computed by
//!   the enqueue's INSERT or by a trigger), so all rows of one key share a slot. A relay runs
//!   [`RelayBuilder::workers`] workers (default 2); each opens a session of its own
//!   (PostgreSQL: a dedicated connection) and claims a contiguous block of about
//!   `64 / (workers of all relays)` slots with session advisory locks (`pg_try_advisory_lock`,
//!   never waited for). Workers recount each other every
//!   [`RelayBuilder::rebalance_interval`] (in `pg_locks`) and give back or take slots, so a
//!   second relay gets half the slots within a second, and the slots of a relay that died
//!   (its connections, and so its locks, gone) are taken over as quickly.
//! * **A batch.** A worker reads up to [`RelayBuilder::batch_size`] publishable rows of its
//!   slots, oldest first: PostgreSQL walks the partial index of fresh rows `(seq, slot)` in
//!   `seq` order for each run of contiguous slots held, skipping other slots' entries inside
//!   the index (no sort, no per-key query, a cost that does not grow with the backlog, and the
//!   table visited in the order it was written). It produces them in that order, waits for
//!   every delivery report, marks the delivered rows published in one `UPDATE` and the failed
//!   ones in another, then reads again.
//! * **Overlap.** The workers run concurrently: while one waits for the broker, others read or
//!   mark. Per-key order needs no cross-batch bookkeeping, because a worker never has two
//!   batches in flight.
//!
//! # Why per-key order holds with several relays
//!
//! * **Commit order = `seq` order per key.** [`enqueue`](crate::outbox::enqueue) takes a
//!   transaction-level advisory lock on `(topic, key)` before the row's `seq` is drawn and
//!   keeps it until commit. Two transactions of one key are therefore serialised, and the one
//!   that draws the smaller `seq` commits first. So in any snapshot in which a row is visible,
//!   every row of its key with a smaller `seq` is visible too (or rolled back). Ordering by
//!   `created_at` or by the UUID would not do: both are taken before commit, and a transaction
//!   that started earlier can commit later.
//! * **One worker per key at a time.** A key's rows are all in one slot, and a slot is held by
//!   one session; it is given back only between batches, with nothing in flight.
//! * **From the oldest row, in one snapshot.** Each read starts at the slot's oldest
//!   publishable row and is one statement, so it never returns a row of a key while an older
//!   row of that key is left behind. (A cursor that moved on past a row still uncommitted
//!   could: that row's key could commit a later row before the cursor's next read.)
//! * **One batch at a time per worker, in order to the producer.** A batch is fully
//!   acknowledged and marked before the next read, which starts again from the oldest row.
//! * **Kafka keeps the order it is given** within a partition (one key maps to one partition):
//!   with the idempotent producer (the default) even across internal retries; with
//!   `idempotence(false)` the relay sets `max.in.flight.requests.per.connection = 1` so a retry
//!   cannot overtake an earlier message.
//! * **Crashes**: a relay that dies between publish and mark leaves the rows unpublished; its
//!   locks go with its connections, and the next holder of the slot publishes them again, from
//!   the oldest (at least once: the inbox on the consumer side drops the duplicates). The first
//!   copies of a key's events are still in order: every copy is part of a run that starts at
//!   the oldest unmarked row of the key.
//!
//! Limits, stated plainly: if a worker's connection breaks while its batch is in flight,
//! another worker can take the slot and publish the same rows again at the same moment
//! (duplicates; the first copies stay in order). If a delivery fails asynchronously while later
//! messages of the same key were already handed to librdkafka, those later messages may be
//! published before the failed one is retried (with the idempotent producer librdkafka fails
//! them together, which avoids this).
//!
//! # Failures
//!
//! A failed row counts an attempt, keeps its error (`attempts`, `last_error`) and waits for its
//! retry (`next_attempt_at`, exponential backoff); the later rows of its key wait behind it, so
//! the order holds, while other keys flow. Errors that are about the message itself (too large,
//! topic unknown, invalid or not authorised, invalid record) park the row (`parked_at`) after
//! [`RelayBuilder::max_attempts`]; the key then moves on. Parked rows leave the indexes the
//! relay reads, so however many a key has, they never hold up its other rows or other keys.
//! Broker outages (timeouts, transport errors) are retried forever with backoff and never
//! park. A parked row can be retried by setting `parked_at = NULL`; it is then published after
//! the rows of its key that went ahead.
//!
//! # Wake-up
//!
//! An enqueue notifies (delivered at commit) if no other transaction in flight already will
//! (see `postgres::outbox`); the relay `LISTEN`s on a connection of its own and wakes its idle
//! workers at once. Polling at [`RelayBuilder::poll_interval`] (default 1 s) covers a missed
//! notification. A worker that finds rows reads again without waiting.
//!
//! # Stopping
//!
//! [`Relay::run`] watches its shutdown future from its first moment. On shutdown no new batch
//! is read; batches in flight are acknowledged and marked, for at most
//! [`RelayBuilder::grace`] (default 10 s), after which they are abandoned unmarked (published
//! again later). During a broker outage the relay therefore stops after the grace period, not
//! after `message.timeout.ms`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
use crate::telemetry::{Health, DEFAULT_SAMPLE_INTERVAL};

mod publish;
mod run;
mod store;
mod telemetry;
mod worker;

pub use crate::postgres::relay::PgRelaySession;
#[cfg(feature = "sqlite")]
pub use crate::sqlite::relay::SqliteRelaySession;
pub(crate) use store::parse_headers;
pub use store::{Backlog, Failure, KeyRef, Members, PendingRow, RelaySession, RelayStore};

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
/// change the fields of [`RelayConfig::new`]'s value. Its `Debug` hides secret producer
/// settings (see [`is_secret_setting`](crate::redact::is_secret_setting)).
#[derive(Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// `ce_source` of published events.
    pub source: String,
    /// Rows per read of one worker (default 1000).
    pub batch_size: usize,
    /// Workers per relay: sessions of their own, each with its share of the slots, reading,
    /// publishing and marking concurrently (default 2).
    pub workers: usize,
    /// Poll interval, the fallback for missed notifications (default 1 s).
    pub poll_interval: Duration,
    /// How often a worker recounts the workers of every relay and takes or gives back slots
    /// (default 1 s).
    pub rebalance_interval: Duration,
    /// On shutdown, how long in-flight batches may take to be acknowledged and marked before
    /// they are abandoned (default 10 s; abandoned rows stay unpublished and are published
    /// again later).
    pub grace: Duration,
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

impl std::fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConfig")
            .field("brokers", &crate::store::redact_url(&self.brokers))
            .field("source", &self.source)
            .field("batch_size", &self.batch_size)
            .field("workers", &self.workers)
            .field("poll_interval", &self.poll_interval)
            .field("rebalance_interval", &self.rebalance_interval)
            .field("grace", &self.grace)
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("idempotence", &self.idempotence)
            .field(
                "producer_settings",
                &crate::redact::Settings(&self.producer_settings),
            )
            .field("retention", &self.retention)
            .finish()
    }
}

impl RelayConfig {
    /// Defaults for `brokers`.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            source: names::DEFAULT_SOURCE.to_owned(),
            batch_size: 1000,
            workers: 2,
            poll_interval: Duration::from_secs(1),
            rebalance_interval: Duration::from_secs(1),
            grace: Duration::from_secs(10),
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
    health: Health,
    sample_interval: Duration,
}

/// Builds a [`Relay`] on a PostgreSQL or SQLite store; every setting has a safe default.
#[must_use]
pub struct RelayBuilder<S> {
    store: S,
    config: RelayConfig,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
    sample_interval: Duration,
}

impl<S: RelayStore> RelayBuilder<S> {
    /// Replaces every setting at once.
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// `ce_source` of published events (default `"inoutbox"`); name your service.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.config.source = source.into();
        self
    }

    /// Rows per read of one worker (default 1000).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.config.batch_size = rows.max(1);
        self
    }

    /// Workers per relay (default 2): each holds a share of the slots on a connection of its
    /// own and publishes them concurrently with the others.
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers.max(1);
        self
    }

    /// How long a stop waits for in-flight batches to be acknowledged and marked before it
    /// abandons them (default 10 s). Abandoned rows stay unpublished: at least once.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.config.grace = grace;
        self
    }

    /// How often workers recount the workers of all relays and rebalance the slots (default
    /// 1 s). A slot of a relay that died is taken over within about this long.
    pub fn rebalance_interval(mut self, interval: Duration) -> Self {
        self.config.rebalance_interval = interval.max(Duration::from_millis(10));
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

    /// How often the backlog gauges are sampled (one statement; default 15 s, see
    /// [`crate::telemetry`]).
    pub fn sample_interval(mut self, interval: Duration) -> Self {
        self.sample_interval = interval;
        self
    }

    /// Creates the producer.
    pub fn build(self) -> Result<Relay<S>, RelayError> {
        let mut relay = Relay::with_store(self.store, self.config)?;
        relay.reports = self.reports;
        relay.sample_interval = self.sample_interval;
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
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
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
            health: Health::default(),
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
        })
    }

    /// The relay's health (see [`Health`]): live while `run` runs, joined once its workers
    /// have opened their sessions, the database reachable as the last read and the last
    /// backlog sample found it, and the time of the last read.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Sends a [`RelayReport`] for every row published or failed (for tests and metrics).
    pub fn reports(mut self, sender: mpsc::UnboundedSender<RelayReport>) -> Self {
        self.reports = Some(sender);
        self
    }

    /// Publishes until SIGINT or SIGTERM (see [`Relay::run`]).
    pub async fn run_until_signal(self) -> Result<(), RelayError> {
        self.run(crate::shutdown_signal()).await
    }

    /// Publishes until `shutdown` completes, then stops within [`RelayBuilder::grace`].
    ///
    /// `shutdown` is polled once before anything else (so [`shutdown_signal`](crate::shutdown_signal)
    /// has its handlers installed from the start) and then throughout, however busy the relay
    /// is. On shutdown no new batch is read; batches in flight get until the grace period's
    /// end to be acknowledged and marked, and whatever is still unacknowledged then is
    /// abandoned unmarked (it is published again later: at least once). A graceful stop
    /// therefore publishes nothing twice unless the broker is slower than the grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), RelayError> {
        run::run(self, shutdown).await
    }

    /// Publishes every row committed so far and the rows committed while it runs, and returns
    /// once none is left to publish ([`RelayStore::unpublished`] is 0: every row published
    /// or parked), stopping as [`Relay::run`] does. For tests, tools and batch jobs: a test
    /// enqueues, drains, and then reads the topic knowing everything is there.
    ///
    /// It waits as long as rows remain, a broker outage included: bound it with
    /// `tokio::time::timeout` when the broker may be away.
    pub async fn drain(self) -> Result<(), RelayError> {
        let store = Arc::clone(&self.store);
        let check = Duration::from_millis(20);
        self.run(async move {
            loop {
                if let Ok(0) = store.unpublished().await {
                    return;
                }
                tokio::time::sleep(check).await;
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_every_secret_setting() {
        let mut config = RelayConfig::new("b:9092");
        for (k, v) in [
            ("sasl.password", "pw-sasl"),
            ("ssl.key.password", "pw-key"),
            ("ssl.keystore.password", "pw-store"),
            ("sasl.oauthbearer.client.secret", "pw-oauth"),
            ("ssl.key.pem", "pw-pem"),
            ("security.protocol", "SASL_SSL"),
        ] {
            config.producer_settings.push((k.into(), v.into()));
        }
        let debug = format!("{config:?} {config:#?}");
        assert!(!debug.contains("pw-"), "{debug}");
        assert!(debug.contains("SASL_SSL"), "{debug}");
    }
}
