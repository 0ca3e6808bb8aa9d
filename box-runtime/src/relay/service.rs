//! [`Relay`]: built, then run until shutdown or drained.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{RelayConfig, RelayError, RelayReport, RelayStore};
use crate::shutdown::shutdown_signal;
use crate::telemetry::{Health, DEFAULT_SAMPLE_INTERVAL};
use crate::transport::Publisher;

/// A relay: a store, a publisher and settings. Build one with [`Relay::builder`].
#[must_use = "a relay does nothing until `run` or `run_until_signal` is awaited"]
pub struct Relay<S, P> {
    pub(super) store: Arc<S>,
    pub(super) publisher: P,
    pub(super) config: RelayConfig,
    pub(super) reports: Option<mpsc::UnboundedSender<RelayReport>>,
    pub(super) health: Health,
    pub(super) sample_interval: Duration,
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// A relay on any [`RelayStore`] and [`Publisher`], with `config`.
    pub fn with_store(store: S, publisher: P, config: RelayConfig) -> Self {
        Self {
            store: Arc::new(store),
            publisher,
            config,
            reports: None,
            health: Health::default(),
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
        }
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
        self.run(shutdown_signal()).await
    }

    /// Publishes every row committed so far and the rows committed while it runs, and returns
    /// once none is left to publish ([`RelayStore::unpublished`] is 0: every row published
    /// or parked; rows scheduled for later are left for when they are due), stopping as
    /// [`Relay::run`] does. For tests, tools and batch jobs: a test
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
