//! [`ConsumerBuilder`]: a consumer's settings, every one with a safe default.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::run::Consumer;
use super::sampler::Sampling;
use crate::effects::Executors;
use crate::engine::{Inbox, InboxConfig, Report, SetupError};
use crate::store::InboxStore;
use crate::telemetry::Health;
use crate::transport::Transport;

/// The setters of a consumer that are not its store or transport, written once: expanded in
/// [`ConsumerBuilder`] and in [`ConsumerSpec`](crate::app::ConsumerSpec), which hold the same
/// fields (`config`, `reports`, `sampling`, `effects`, `health`), so that a setting added here
/// reaches both.
macro_rules! consumer_setters {
    () => {
        $crate::engine::inbox_setters!(config);

        /// Replaces the whole inbox configuration.
        pub fn config(mut self, config: $crate::engine::InboxConfig) -> Self {
            self.config = config;
            self
        }

        /// Registers the executor of effects of `kind`, scheduled by handlers with
        /// [`effects::after_commit`](crate::effects::after_commit); the consumer then drains the
        /// effects table after each commit and at start-up (see [`crate::effects`]). The
        /// executor must be idempotent on
        /// [`Effect::idempotency_key`](crate::effects::Effect::idempotency_key): an effect runs
        /// at least once.
        pub fn effect<F, Fut>(mut self, kind: impl Into<String>, executor: F) -> Self
        where
            F: Fn($crate::effects::Effect) -> Fut + Send + Sync + 'static,
            Fut: std::future::Future<Output = Result<(), $crate::handler::HandlerError>>
                + Send
                + 'static,
        {
            self.effects.insert(kind, executor);
            self
        }

        /// How many effects the consumer runs at once, at most (default
        /// [`DEFAULT_EFFECT_CONCURRENCY`](crate::effects::DEFAULT_EFFECT_CONCURRENCY), 8; at
        /// least 1: `build` refuses 0). Each runs in a task of its own, with no transaction
        /// open, so slow calls overlap; each is still run at least once with its idempotency
        /// key, and a failed one retried after a backoff. Lower it for a receiving service that
        /// takes few calls at once; raise it for many slow calls.
        pub fn effect_concurrency(mut self, effects: usize) -> Self {
            self.effects.concurrency = effects;
            self
        }

        /// How often the consumer samples its gauges (dead letters, stuck rows, lag per
        /// partition) and probes its database (default 15 s; see [`crate::telemetry`]).
        pub fn sample_interval(mut self, interval: std::time::Duration) -> Self {
            self.sampling.interval = interval;
            self
        }

        /// After how long a received inbox row still not processed counts as stuck (default
        /// 5 minutes).
        pub fn stuck_after(mut self, after: std::time::Duration) -> Self {
            self.sampling.stuck_after = after;
            self
        }

        /// How often the consumer logs a summary at info (messages processed, duplicates,
        /// retries and dead letters of the group since the last one; nothing when there was
        /// nothing), default 60 s. Each message is logged at debug.
        pub fn summary_interval(mut self, interval: std::time::Duration) -> Self {
            self.sampling.summary_interval = interval;
            self
        }

        /// Sends a [`Report`](crate::engine::Report) for every message handled (for tests and
        /// metrics).
        pub fn reports(
            mut self,
            sender: tokio::sync::mpsc::UnboundedSender<$crate::engine::Report>,
        ) -> Self {
            self.reports = Some(sender);
            self
        }

        /// The consumer's [`Health`](crate::telemetry::Health), before it is built or run: the
        /// handle that [`Consumer::health`](crate::Consumer::health) returns once built (for a
        /// probe served while the consumer starts).
        pub fn health(&self) -> $crate::telemetry::Health {
            self.health.clone()
        }
    };
}
pub(crate) use consumer_setters;

/// The settings of [`consumer_setters!`], as a spec hands them to a builder.
pub(crate) struct Settings {
    pub(crate) config: InboxConfig,
    pub(crate) reports: Option<mpsc::UnboundedSender<Report>>,
    pub(crate) sampling: Sampling,
    pub(crate) effects: Executors,
    pub(crate) health: Health,
}

/// Builds a [`Consumer`]; every setting has a safe default.
#[must_use]
pub struct ConsumerBuilder<S, T> {
    group: String,
    store: S,
    transport: T,
    config: InboxConfig,
    reports: Option<mpsc::UnboundedSender<Report>>,
    sampling: Sampling,
    effects: Executors,
    health: Health,
}

impl<S: InboxStore, T: Transport> Consumer<S, T> {
    /// A consumer for `group` (the `group = "..."` of its handlers), on `store`, fed by
    /// `transport` (for Kafka, a [`KafkaConfig`](crate::kafka::KafkaConfig)).
    pub fn builder(group: impl Into<String>, store: S, transport: T) -> ConsumerBuilder<S, T> {
        ConsumerBuilder::new(group.into(), store, transport)
    }
}

impl<S: InboxStore, T: Transport> ConsumerBuilder<S, T> {
    fn new(group: String, store: S, transport: T) -> Self {
        Self {
            group,
            store,
            transport,
            config: InboxConfig::default(),
            reports: None,
            sampling: Sampling::default(),
            effects: Executors::default(),
            health: Health::default(),
        }
    }

    consumer_setters!();

    /// Takes every setting of `settings` (those of a [`ConsumerSpec`](crate::app::ConsumerSpec)).
    pub(crate) fn settings(mut self, settings: Settings) -> Self {
        self.config = settings.config;
        self.reports = settings.reports;
        self.sampling = settings.sampling;
        self.effects = settings.effects;
        self.health = settings.health;
        self
    }

    /// Builds the dispatch table of the group from every handler linked into the binary; fails
    /// on two handlers for one event type, none for the group, or an `effect_concurrency` of 0.
    pub fn build(self) -> Result<Consumer<S, T>, SetupError> {
        if self.effects.concurrency == 0 {
            return Err(SetupError::Config(
                "effect_concurrency is 0: a consumer runs at least one effect at a time \
                 (the default is 8)"
                    .to_owned(),
            ));
        }
        let mut inbox = Inbox::new(self.store, &self.group, self.config)?;
        inbox.share_health(self.health);
        Ok(Consumer {
            inbox: Arc::new(inbox),
            transport: self.transport,
            reports: self.reports,
            sampling: self.sampling,
            effects: self.effects,
        })
    }
}
