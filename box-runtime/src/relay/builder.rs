//! [`RelayBuilder`]: a relay's settings, every one with a safe default.

use std::time::Duration;

use tokio::sync::mpsc;

use super::service::Relay;
use super::{RelayConfig, RelayError, RelayReport, RelayStore};
use crate::telemetry::{Health, DEFAULT_SAMPLE_INTERVAL};
use crate::transport::{IntoPublisher, Publisher};

/// The setters of a relay that are not its store or publisher, written once: expanded in
/// [`RelayBuilder`] and in [`RelaySpec`](crate::app::RelaySpec), which hold the same fields
/// (`config`, `reports`, `sample_interval`, `health`), so that a setting added here reaches both.
macro_rules! relay_builder_setters {
    () => {
        $crate::relay::relay_setters!(config);

        /// Replaces every setting of the [`RelayConfig`](crate::relay::RelayConfig) at once.
        pub fn config(mut self, config: $crate::relay::RelayConfig) -> Self {
            self.config = config;
            self
        }

        /// Sends a [`RelayReport`](crate::relay::RelayReport) per row to `sender`.
        pub fn reports(
            mut self,
            sender: tokio::sync::mpsc::UnboundedSender<$crate::relay::RelayReport>,
        ) -> Self {
            self.reports = Some(sender);
            self
        }

        /// How often the backlog gauges are sampled (one statement; default 15 s, see
        /// [`crate::telemetry`]).
        pub fn sample_interval(mut self, interval: std::time::Duration) -> Self {
            self.sample_interval = interval;
            self
        }

        /// The relay's [`Health`](crate::telemetry::Health), before it is built or run: the
        /// handle that [`Relay::health`](crate::relay::Relay::health) returns once built.
        pub fn health(&self) -> $crate::telemetry::Health {
            self.health.clone()
        }
    };
}
pub(crate) use relay_builder_setters;

/// Builds a [`Relay`] on a PostgreSQL, SQLite or MySQL/MariaDB store; every setting has a safe default.
#[must_use]
pub struct RelayBuilder<S, I> {
    store: S,
    pub(crate) publisher: I,
    config: RelayConfig,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
    sample_interval: Duration,
    health: Health,
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// A relay on `store`'s outbox, publishing through `publisher` (for Kafka, a
    /// [`KafkaProducer`](crate::kafka::KafkaProducer)); `store` is the
    /// [`PgStore`](crate::postgres::PgStore) or [`SqliteStore`](crate::sqlite::SqliteStore) of
    /// the consumer, or a relay store.
    pub fn builder<T, I>(store: T, publisher: I) -> RelayBuilder<S, I>
    where
        T: IntoRelayStore<Store = S>,
        I: IntoPublisher<Publisher = P>,
    {
        RelayBuilder::new(store.into_relay_store(), publisher)
    }
}

impl<S: RelayStore, I: IntoPublisher> RelayBuilder<S, I> {
    fn new(store: S, publisher: I) -> Self {
        Self {
            store,
            publisher,
            config: RelayConfig::default(),
            reports: None,
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
            health: Health::default(),
        }
    }

    relay_builder_setters!();

    /// Takes the settings a [`RelaySpec`](crate::app::RelaySpec) holds besides its config.
    pub(crate) fn handed(
        mut self,
        reports: Option<mpsc::UnboundedSender<RelayReport>>,
        sample_interval: Duration,
        health: Health,
    ) -> Self {
        self.reports = reports;
        self.sample_interval = sample_interval;
        self.health = health;
        self
    }

    /// Creates the publisher.
    pub fn build(self) -> Result<Relay<S, I::Publisher>, RelayError> {
        let publisher = self
            .publisher
            .into_publisher()
            .map_err(RelayError::Publisher)?;
        let mut relay = Relay::with_store(self.store, publisher, self.config);
        relay.reports = self.reports;
        relay.sample_interval = self.sample_interval;
        relay.health = self.health;
        Ok(relay)
    }
}

/// A store a relay can be built on: the backend's [`RelayStore`], or the inbox store of the
/// same database ([`PgStore`](crate::postgres::PgStore), [`SqliteStore`](crate::sqlite::SqliteStore)), whose table
/// names it takes.
/// A store written outside the crate implements it for its [`RelayStore`] (`type Store = Self`).
pub trait IntoRelayStore {
    /// The relay store.
    type Store: RelayStore;
    /// Converts.
    fn into_relay_store(self) -> Self::Store;
}
