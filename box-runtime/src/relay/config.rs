//! [`RelayConfig`]: a relay's settings, and their setters.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::message::Retention;
use crate::names;

/// Settings of a relay; every one has a safe default. Set them through [`RelayBuilder`], or
/// change the fields of the default value.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RelayConfig {
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
    /// Purge of published rows (default: keep 7 days, every minute); `None` disables it.
    pub retention: Option<Retention>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            source: names::DEFAULT_SOURCE.to_owned(),
            batch_size: 1000,
            workers: 2,
            poll_interval: Duration::from_secs(1),
            rebalance_interval: Duration::from_secs(1),
            grace: Duration::from_secs(10),
            max_attempts: 10,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
            retention: Some(Retention::default()),
        }
    }
}

/// The setters of a [`RelayConfig`], written once: expanded in `impl RelayConfig` and in the
/// builders that hold one (`relay_setters!(config)` sets `self.config.<field>`).
macro_rules! relay_setters {
    ($($field:ident)?) => {
        /// `ce_source` of published events (default `"inoutbox"`); name your service.
        pub fn source(mut self, source: impl Into<String>) -> Self {
            self$(.$field)?.source = source.into();
            self
        }

        /// Rows per read of one worker (default 1000).
        pub fn batch_size(mut self, rows: usize) -> Self {
            self$(.$field)?.batch_size = rows.max(1);
            self
        }

        /// Workers per relay (default 2): each holds a share of the slots on a connection of
        /// its own and publishes them concurrently with the others.
        pub fn workers(mut self, workers: usize) -> Self {
            self$(.$field)?.workers = workers.max(1);
            self
        }

        /// How long a stop waits for in-flight batches to be acknowledged and marked before it
        /// abandons them (default 10 s). Abandoned rows stay unpublished: at least once.
        pub fn grace(mut self, grace: std::time::Duration) -> Self {
            self$(.$field)?.grace = grace;
            self
        }

        /// How often workers recount the workers of all relays and rebalance the slots
        /// (default 1 s). A slot of a relay that died is taken over within about this long.
        pub fn rebalance_interval(mut self, interval: std::time::Duration) -> Self {
            self$(.$field)?.rebalance_interval =
                interval.max(std::time::Duration::from_millis(10));
            self
        }

        /// The poll interval, the fallback for missed notifications (default 1 s).
        pub fn poll_interval(mut self, interval: std::time::Duration) -> Self {
            self$(.$field)?.poll_interval = interval;
            self
        }

        /// Attempts before a rejected message is parked (default 10).
        pub fn max_attempts(mut self, attempts: u32) -> Self {
            self$(.$field)?.max_attempts = attempts.max(1);
            self
        }

        /// The wait of a key after a failed publication (default 200 ms doubling to 30 s).
        pub fn backoff(mut self, backoff: $crate::backoff::Backoff) -> Self {
            self$(.$field)?.backoff = backoff;
            self
        }

        /// Retention of published rows; `None` disables the relay's purge.
        pub fn retention(mut self, retention: Option<$crate::message::Retention>) -> Self {
            self$(.$field)?.retention = retention;
            self
        }
    };
}
pub(crate) use relay_setters;

impl RelayConfig {
    relay_setters!();
}
