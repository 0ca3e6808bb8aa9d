//! A kit for testing handlers and producers without a broker (crate feature `testing`).
//!
//! The facade re-exports it as `inoutbox::testing`; its documentation has the worked example.
//! Nothing here is a mock: [`TestInbox`] runs a message through the consumer group's real
//! inbox path ([`Inbox::process`]: the claim, the handler in the same transaction, retries,
//! dead letters), only the broker is left out; [`sqlite_memory`] is an ordinary migrated
//! [`SqliteStore`](crate::sqlite::SqliteStore) whose database lives in memory;
//! [`wait_idle`] and [`Relay::drain`](crate::relay::Relay::drain) say when the outbox is
//! published; [`TestInbox::run_effects`] runs the group's effect executors on the effects its
//! deliveries scheduled, as the consumer's drain would.

mod conformance;

pub use conformance::{conformance, relay_conformance, Conformance, ConformanceError};

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use crate::shutdown::CancellationToken;
use uuid::Uuid;

use crate::effects::{self, Effect, Executors};
use crate::engine::{Inbox, InboxConfig, SetupError};
use crate::event::{InboxEvent, OutboxEvent};
use crate::handler::HandlerError;
use crate::message::{Delivery, Outcome};
use crate::names;
use crate::relay::{IntoRelayStore, RelayStore};
use crate::store::{InboxStore, StoreError};
use serde::Serialize;

/// One consumer group's inbox on a store, fed by hand instead of by a broker.
///
/// Every message goes through [`Inbox::process`], exactly as the consumer runs it; the
/// returned [`Outcome`] is what the consumer would have acted on (commit the offset or not).
#[derive(Debug)]
pub struct TestInbox<S> {
    inbox: Inbox<S>,
    effects: Executors,
    next_offset: AtomicI64,
    // Never set: a delivery is never abandoned for a shutdown.
    shutdown: CancellationToken,
}

impl<S: InboxStore> TestInbox<S> {
    /// The inbox of `group` on `store` with the default settings and every handler of the
    /// group linked into the test binary. The store must be migrated.
    pub fn new(store: S, group: &str) -> Result<Self, SetupError> {
        Self::with_config(store, group, InboxConfig::default())
    }

    /// The same with explicit settings (e.g. a [`RetryPolicy`](crate::engine::RetryPolicy)
    /// with short waits, to test retries and dead letters quickly).
    pub fn with_config(store: S, group: &str, config: InboxConfig) -> Result<Self, SetupError> {
        let shutdown = CancellationToken::new();
        Ok(Self {
            inbox: Inbox::new(store, group, config)?,
            effects: Executors::default(),
            next_offset: AtomicI64::new(0),
            shutdown,
        })
    }

    /// Delivers `event` as the relay would publish it, with a new event id; returns its
    /// outcome.
    pub async fn deliver<E: OutboxEvent>(&self, event: &E) -> Outcome {
        self.deliver_raw(delivery(event)).await
    }

    /// Delivers an event this service only consumes (`#[derive(InboxEvent)]`, no topic of its
    /// own) as it would arrive on `topic`, without a key and with a new event id.
    pub async fn deliver_on<E: InboxEvent + Serialize>(&self, topic: &str, event: &E) -> Outcome {
        self.deliver_raw(delivery_on(topic, event)).await
    }

    /// Delivers a message as it is (any bytes, any headers; see [`delivery`] for the usual
    /// envelope). Delivering the same message twice is a redelivery: the second is a
    /// [`Outcome::Duplicate`]. A negative offset is replaced by the next offset of this inbox.
    pub async fn deliver_raw(&self, mut delivery: Delivery) -> Outcome {
        if delivery.offset < 0 {
            delivery.offset = self.next_offset.fetch_add(1, Ordering::Relaxed);
        }
        self.inbox.process(&delivery, &self.shutdown).await
    }

    /// Registers the executor of effects of `kind`, as
    /// [`ConsumerBuilder::effect`](crate::ConsumerBuilder::effect) does, for
    /// [`run_effects`](Self::run_effects).
    #[must_use]
    pub fn effect<F, Fut>(mut self, kind: impl Into<String>, executor: F) -> Self
    where
        F: Fn(Effect) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.effects.insert(kind, executor);
        self
    }

    /// Runs the effects the group's committed handlers scheduled and that are due, each once,
    /// through the executors registered with [`effect`](Self::effect), as the consumer's drain
    /// does: each is claimed, run, and marked done, or failed (an error, a panic, no executor
    /// for its kind) and left to run again after its backoff (1 s, then doubling), so a second
    /// call right away does not run it again. Returns the runs, oldest effect first. Effects
    /// are kept on PostgreSQL, SQLite and MySQL/MariaDB: on a store that keeps none this is its
    /// error.
    pub async fn run_effects(&self) -> Result<Vec<EffectRun>, StoreError> {
        let owner = effects::owner_name("test-inbox");
        let mut runs = Vec::new();
        loop {
            let claimed = self
                .store()
                .claim_effects(
                    self.inbox.group(),
                    &owner,
                    effects::EFFECT_LEASE,
                    effects::EFFECT_BATCH,
                )
                .await?;
            if claimed.is_empty() {
                return Ok(runs);
            }
            for row in claimed {
                let (effect, result) =
                    effects::run_one(self.store(), &self.effects, &owner, row).await;
                runs.push(EffectRun {
                    effect,
                    error: result.err(),
                });
            }
        }
    }

    /// The inbox (dead letters, replay, retention).
    pub fn inbox(&self) -> &Inbox<S> {
        &self.inbox
    }

    /// The store.
    pub fn store(&self) -> &S {
        self.inbox.store()
    }
}

/// One run of an effect by [`TestInbox::run_effects`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EffectRun {
    /// The effect as its executor received it.
    pub effect: Effect,
    /// Why the run failed (the executor's error, its panic, no executor for the kind), or
    /// `None`: the effect is done.
    pub error: Option<String>,
}

/// The message the relay would publish for `event`: topic and key of the event, partition 0,
/// the CloudEvents headers (`ce_id` a new UUID v7, `ce_type`, `ce_source` `"inoutbox"`,
/// `ce_specversion`, `content-type`) and the event's JSON as the payload. The offset is -1:
/// [`TestInbox::deliver_raw`] numbers it. Change any field to test other envelopes.
///
/// # Panics
///
/// If the event cannot be serialised (a test's own event type).
pub fn delivery<E: OutboxEvent>(event: &E) -> Delivery {
    Delivery {
        key: event.key().map(String::into_bytes),
        ..delivery_on(E::TOPIC, event)
    }
}

/// The message of an event this service only consumes (`#[derive(InboxEvent)]`), as it would
/// arrive on `topic`: as [`delivery`] makes it, without a key.
///
/// # Panics
///
/// If the event cannot be serialised (a test's own event type).
pub fn delivery_on<E: InboxEvent + Serialize>(topic: &str, event: &E) -> Delivery {
    let payload = serde_json::to_vec(event).expect("the test event serialises to JSON");
    let header = |name: &str, value: &str| (name.to_owned(), Some(value.as_bytes().to_vec()));
    Delivery {
        topic: topic.into(),
        partition: 0,
        offset: -1,
        key: None,
        payload: Some(payload),
        headers: vec![
            header(names::HEADER_ID, &Uuid::now_v7().to_string()),
            header(names::HEADER_TYPE, E::EVENT_TYPE),
            header(names::HEADER_SOURCE, names::DEFAULT_SOURCE),
            header(names::HEADER_SPECVERSION, names::SPECVERSION),
            header(names::HEADER_CONTENT_TYPE, names::CONTENT_TYPE_JSON),
        ],
    }
}

/// A migrated [`SqliteStore`](crate::sqlite::SqliteStore) on a new, private in-memory database.
///
/// The pool's connections share the database (sqlx names each `sqlite::memory:` database
/// uniquely and opens it with a shared cache), and it lives as long as the pool: one
/// connection is kept open and never retired, so the tables do not vanish between
/// statements, as they would once every connection of a plain in-memory pool is closed.
#[cfg(feature = "sqlite")]
pub async fn sqlite_memory() -> Result<crate::sqlite::SqliteStore, StoreError> {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    use std::str::FromStr;
    let options =
        SqliteConnectOptions::from_str("sqlite::memory:")?.busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .min_connections(1)
        .max_connections(4)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    let store = crate::sqlite::SqliteStore::new(pool);
    store.migrate().await?;
    Ok(store)
}

/// The outbox still had rows to publish when [`wait_idle`] gave up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotIdle {
    /// Rows were still unpublished at the deadline.
    #[error("{unpublished} outbox rows still unpublished after {waited:?}")]
    Unpublished {
        /// How many.
        unpublished: u64,
        /// How long it waited.
        waited: Duration,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Waits until a relay running elsewhere (a task, another process) has published every
/// committed row of `store`'s outbox (none unpublished and not parked), for at most `within`.
pub async fn wait_idle<S>(store: &S, within: Duration) -> Result<(), NotIdle>
where
    S: IntoRelayStore + Clone,
{
    let relay_store = store.clone().into_relay_store();
    let started = Instant::now();
    loop {
        let unpublished = relay_store.unpublished().await?;
        if unpublished == 0 {
            return Ok(());
        }
        if started.elapsed() >= within {
            return Err(NotIdle::Unpublished {
                unpublished,
                waited: started.elapsed(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
