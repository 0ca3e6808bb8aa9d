//! The relay's metrics: handles per topic (built the first time a topic is seen), and the
//! backlog gauges.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge, Histogram, SharedString};
use uuid::Uuid;

use crate::relay::Backlog;
use crate::telemetry::metric::{self as m, LABEL_TOPIC};
use crate::telemetry::Health;

/// The handles of one topic.
#[derive(Clone)]
pub(crate) struct TopicMetrics {
    published: Counter,
    parked: Counter,
    latency: Histogram,
}

impl TopicMetrics {
    /// A row with this id was acknowledged by the broker now.
    pub(crate) fn published(&self, id: &Uuid) {
        self.published.increment(1);
        if let Some((secs, nanos)) = id.get_timestamp().map(|t| t.to_unix()) {
            let enqueued = UNIX_EPOCH + Duration::new(secs, nanos);
            if let Ok(latency) = SystemTime::now().duration_since(enqueued) {
                self.latency.record(latency.as_secs_f64());
            }
        }
    }

    /// A row was parked.
    pub(crate) fn parked(&self) {
        self.parked.increment(1);
    }
}

/// One relay's telemetry.
pub(crate) struct RelayTelemetry {
    topics: Mutex<HashMap<String, TopicMetrics>>,
    unpublished: Gauge,
    oldest: Gauge,
    parked: Gauge,
    held_keys: Gauge,
    pub(crate) health: Health,
}

impl std::fmt::Debug for RelayTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayTelemetry")
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl RelayTelemetry {
    pub(crate) fn new(health: Health) -> Self {
        Self {
            topics: Mutex::new(HashMap::new()),
            unpublished: metrics::gauge!(m::OUTBOX_UNPUBLISHED),
            oldest: metrics::gauge!(m::OUTBOX_OLDEST_UNPUBLISHED_AGE),
            parked: metrics::gauge!(m::OUTBOX_PARKED_ROWS),
            held_keys: metrics::gauge!(m::OUTBOX_HELD_KEYS),
            health,
        }
    }

    /// The handles of `topic` (a lock and a lookup; the label is built once per topic).
    pub(crate) fn topic(&self, topic: &str) -> TopicMetrics {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = topics.get(topic) {
            return t.clone();
        }
        let label = SharedString::from(topic.to_owned());
        let t = TopicMetrics {
            published: metrics::counter!(m::OUTBOX_PUBLISHED, LABEL_TOPIC => label.clone()),
            parked: metrics::counter!(m::OUTBOX_PARKED, LABEL_TOPIC => label.clone()),
            latency: metrics::histogram!(m::OUTBOX_PUBLISH_LATENCY, LABEL_TOPIC => label),
        };
        topics.insert(topic.to_owned(), t.clone());
        t
    }

    /// Sets the backlog gauges.
    pub(crate) fn backlog(&self, backlog: &Backlog) {
        self.unpublished.set(backlog.unpublished as f64);
        self.oldest.set(
            backlog
                .oldest_unpublished_age
                .map_or(0.0, |a| a.as_secs_f64()),
        );
        self.parked.set(backlog.parked as f64);
        self.held_keys.set(backlog.held_keys as f64);
    }
}
