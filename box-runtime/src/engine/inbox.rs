//! [`Inbox`]: one consumer group's handlers on a store, with its settings and telemetry, and
//! how it is set up.

use super::config::{AckStrategy, InboxConfig};
use super::setup::{self, SetupError};
use super::telemetry::InboxTelemetry;
use crate::handler::DispatchTable;
use crate::store::InboxStore;
use crate::telemetry::Health;

/// One consumer group's inbox on a store.
#[derive(Debug)]
pub struct Inbox<S> {
    pub(super) store: S,
    pub(super) handlers: DispatchTable,
    pub(super) config: InboxConfig,
    pub(super) telemetry: InboxTelemetry,
    /// Wakes this process's two-phase workers when rows were received.
    pub(super) wake: tokio::sync::Notify,
    /// Wakes the effects drain when a handler's transaction committed.
    pub(crate) committed: tokio::sync::Notify,
    /// The store's effects table, rendered once for every message's metadata.
    pub(super) effects_table: std::sync::Arc<str>,
    /// The transactions the partitions' key-ordered lanes may run at once: one per connection
    /// the store can hold ([`InboxStore::parallel_transactions`]).
    pub(crate) transactions: std::sync::Arc<tokio::sync::Semaphore>,
}

impl<S: InboxStore> Inbox<S> {
    /// The inbox of `group` on `store`, with the handlers linked into the binary.
    pub fn new(store: S, group: &str, config: InboxConfig) -> Result<Self, SetupError> {
        let handlers = DispatchTable::for_store::<S::Tx>(group, S::NAME)?;
        Self::with_handlers(store, handlers, config)
    }

    /// The inbox with an explicit dispatch table.
    pub(crate) fn with_handlers(
        store: S,
        handlers: DispatchTable,
        config: InboxConfig,
    ) -> Result<Self, SetupError> {
        handlers.check_tx_type::<S::Tx>(S::NAME)?;
        if config.retry.max_attempts == 0 {
            return Err(SetupError::Config(
                "retry.max_attempts must be at least 1".into(),
            ));
        }
        if let Err(e) = store.tables().validate() {
            return Err(SetupError::Config(e.to_string()));
        }
        setup::check_two_phase::<S>(&handlers, &config)?;
        Ok(Self {
            effects_table: store.tables().effects.to_string().into(),
            transactions: std::sync::Arc::new(tokio::sync::Semaphore::new(
                store.parallel_transactions().max(1),
            )),
            telemetry: InboxTelemetry::new(handlers.group(), handlers.event_types()),
            store,
            handlers,
            config,
            wake: tokio::sync::Notify::new(),
            committed: tokio::sync::Notify::new(),
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        self.handlers.group()
    }

    /// The inbox's health: see [`Health`] (the consumer running it sets liveness and
    /// membership; the inbox records its cycles).
    pub fn health(&self) -> Health {
        self.telemetry.health.clone()
    }

    /// Logs at info what the group did since the last summary, unless it did nothing (the
    /// consumer calls it every `summary_interval` and when it stops).
    pub(crate) fn log_summary(&self) {
        self.telemetry.log_summary();
    }

    /// Makes `health` the inbox's health handle (one handed out before the consumer was built).
    pub(crate) fn share_health(&mut self, health: Health) {
        self.telemetry.health = health;
    }

    /// The most transactions one partition runs at once with
    /// [`Ordering::Key`](super::Ordering::Key): [`InboxConfig::key_lanes`], or, when that is 0,
    /// what the store can run in parallel (its pool's connections), at most
    /// [`MAX_AUTO_LANES`]. (The group's partitions share [`Inbox::transactions`] besides.)
    pub(crate) fn key_lanes(&self) -> usize {
        match self.config.key_lanes {
            0 => self.store.parallel_transactions().clamp(1, MAX_AUTO_LANES),
            lanes => lanes,
        }
    }

    /// Whether the offset is committed before the handler runs ([`AckStrategy::AtMostOnce`]).
    pub(crate) fn acknowledges_before_processing(&self) -> bool {
        self.config.ack == AckStrategy::AtMostOnce
    }
}

/// The most lanes per partition [`Inbox::key_lanes`] sizes from a pool: beyond it, lanes only
/// wait for connections.
const MAX_AUTO_LANES: usize = 64;
