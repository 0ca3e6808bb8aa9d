//! The parts an [`App`](super::App) runs: [`ConsumerSpec`] (a consumer group) and
//! [`RelaySpec`] (a relay). Each takes the same setters as the builder it stands for
//! ([`ConsumerBuilder`](crate::ConsumerBuilder), [`RelayBuilder`](crate::relay::RelayBuilder)):
//! they are written once (`consumer_setters!`, `relay_builder_setters!`) and expanded in both.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::consumer::sampler::Sampling;
use crate::effects::Executors;
use crate::engine::{InboxConfig, Report};
use crate::relay::{RelayConfig, RelayReport};
use crate::telemetry::{Health, DEFAULT_SAMPLE_INTERVAL};

/// A consumer group to run in an [`App`](super::App): its group, topics, every setting of a
/// [`ConsumerBuilder`](crate::ConsumerBuilder) (the same setters: retries, ordering, effect
/// executors, sample interval, ...) and the Kafka settings of its member.
///
/// ```no_run
/// # async fn demo(app: inoutbox::App) {
/// use std::time::Duration;
/// use inoutbox::app::ConsumerSpec;
/// use inoutbox::RetryPolicy;
///
/// let billing = ConsumerSpec::new("billing", ["orders"])
///     .retry(RetryPolicy::default().max_attempts(3))
///     .effect("send_receipt", |effect: inoutbox::effects::Effect| async move {
///         let _ = effect.idempotency_key; // call the mail service with it
///         Ok(())
///     })
///     .sample_interval(Duration::from_secs(5));
/// let health = billing.health(); // for a probe of your own; `App::ops_endpoint` serves it too
/// let app = app.consumer_with(billing);
/// # let _ = (health, app);
/// # }
/// ```
#[must_use]
pub struct ConsumerSpec {
    pub(super) group: String,
    pub(super) topics: Vec<String>,
    pub(super) config: InboxConfig,
    pub(super) reports: Option<mpsc::UnboundedSender<Report>>,
    pub(super) sampling: Sampling,
    pub(super) effects: Executors,
    pub(super) health: Health,
    pub(super) settings: Vec<(String, String)>,
    pub(super) group_id: Option<String>,
    pub(super) startup_timeout: Option<Duration>,
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
            reports: None,
            sampling: Sampling::default(),
            effects: Executors::default(),
            health: Health::default(),
            settings: Vec::new(),
            group_id: None,
            startup_timeout: None,
        }
    }

    crate::consumer::consumer_setters!();

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The Kafka group id, when it is not the group's name (e.g. a fresh one per run on a
    /// shared broker).
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
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

    /// The settings of [`kafka::QUICK_JOIN`](crate::kafka::QUICK_JOIN): quick group joins on a
    /// development broker (not for production). The in-process Kafka has settings of its own
    /// and needs none.
    pub fn quick_join(self) -> Self {
        crate::kafka::QUICK_JOIN
            .iter()
            .fold(self, |spec, (key, value)| spec.set(*key, *value))
    }
}

/// A relay to run in an [`App`](super::App): every setting of a
/// [`RelayBuilder`](crate::relay::RelayBuilder) (the same setters) and of its producer (the
/// brokers are the app's).
#[must_use]
pub struct RelaySpec {
    pub(super) config: RelayConfig,
    pub(super) reports: Option<mpsc::UnboundedSender<RelayReport>>,
    pub(super) sample_interval: Duration,
    pub(super) health: Health,
    pub(super) idempotence: bool,
}

impl Default for RelaySpec {
    fn default() -> Self {
        Self {
            config: RelayConfig::default(),
            reports: None,
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
            health: Health::default(),
            idempotence: true,
        }
    }
}

impl RelaySpec {
    /// A relay with the default settings.
    pub fn new() -> Self {
        Self::default()
    }

    crate::relay::relay_builder_setters!();

    /// Whether to use the idempotent producer (default true; Tansu needs `false`).
    pub fn idempotence(mut self, on: bool) -> Self {
        self.idempotence = on;
        self
    }
}
