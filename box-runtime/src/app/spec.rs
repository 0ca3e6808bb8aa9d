//! The parts an [`App`](super::App) runs: [`ConsumerSpec`] (a consumer group) and
//! [`RelaySpec`] (a relay).

use std::time::Duration;

use tokio::sync::mpsc;

use crate::engine::{InboxConfig, Report};
use crate::relay::{RelayConfig, RelayReport};

/// A consumer group to run in an [`App`](super::App): its group, topics and settings.
#[must_use]
pub struct ConsumerSpec {
    pub(super) group: String,
    pub(super) topics: Vec<String>,
    pub(super) config: InboxConfig,
    pub(super) settings: Vec<(String, String)>,
    pub(super) group_id: Option<String>,
    pub(super) startup_timeout: Option<Duration>,
    pub(super) reports: Option<mpsc::UnboundedSender<Report>>,
}

impl ConsumerSpec {
    /// The handlers of `group`, fed from `topics`, with the default settings.
    pub fn new(
        group: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            config: InboxConfig::default(),
            settings: Vec::new(),
            group_id: None,
            startup_timeout: None,
            reports: None,
        }
    }

    crate::engine::inbox_setters!(config);

    /// The Kafka group id, when it is not the group's name (e.g. a fresh one per run on a
    /// shared broker).
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    /// Replaces the inbox configuration (see [`ConsumerBuilder`](crate::ConsumerBuilder)).
    pub fn config(mut self, config: InboxConfig) -> Self {
        self.config = config;
        self
    }

    /// How long the member may wait for a broker at start-up before it fails (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = Some(timeout);
        self
    }

    /// A librdkafka consumer setting (applied after inoutbox's own).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Sends a [`Report`] for every message handled.
    pub fn reports(mut self, sender: mpsc::UnboundedSender<Report>) -> Self {
        self.reports = Some(sender);
        self
    }
}

/// A relay to run in an [`App`](super::App): its settings (the brokers are the app's).
#[must_use]
pub struct RelaySpec {
    pub(super) config: RelayConfig,
    pub(super) idempotence: bool,
    pub(super) reports: Option<mpsc::UnboundedSender<RelayReport>>,
}

impl Default for RelaySpec {
    fn default() -> Self {
        Self {
            config: RelayConfig::default(),
            idempotence: true,
            reports: None,
        }
    }
}

impl RelaySpec {
    /// A relay with the default settings.
    pub fn new() -> Self {
        Self::default()
    }

    crate::relay::relay_setters!(config);

    /// Replaces every setting (its `brokers` are replaced by the app's).
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// Whether to use the idempotent producer (default true; Tansu needs `false`).
    pub fn idempotence(mut self, on: bool) -> Self {
        self.idempotence = on;
        self
    }

    /// Sends a [`RelayReport`] per row.
    pub fn reports(mut self, sender: mpsc::UnboundedSender<RelayReport>) -> Self {
        self.reports = Some(sender);
        self
    }
}
