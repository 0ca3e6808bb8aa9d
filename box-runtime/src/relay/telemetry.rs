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
    /// A row with this id (and, if scheduled, this due time in seconds since the epoch) was
    /// acknowledged by the broker now. The latency runs from the enqueue, or from the due time
    /// of a scheduled row (its wait is not the relay's).
    pub(crate) fn published(&self, id: &Uuid, due_at: Option<f64>) {
        self.published.increment(1);
        if let Some((secs, nanos)) = id.get_timestamp().map(|t| t.to_unix()) {
            let enqueued = UNIX_EPOCH + Duration::new(secs, nanos);
            let due = due_at
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .map(|d| UNIX_EPOCH + d);
            let from = due.map_or(enqueued, |due| due.max(enqueued));
            if let Ok(latency) = SystemTime::now().duration_since(from) {
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
    scheduled: Gauge,
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
            scheduled: metrics::gauge!(m::OUTBOX_SCHEDULED),
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
        self.scheduled.set(backlog.scheduled as f64);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::*;

    /// Records gauges by name (as f64 bits); counters and histograms go nowhere.
    #[derive(Default)]
    struct Gauges(Mutex<HashMap<String, Arc<AtomicU64>>>);

    impl Gauges {
        fn value(&self, name: &str) -> Option<f64> {
            let gauges = self.0.lock().unwrap();
            gauges
                .get(name)
                .map(|g| f64::from_bits(g.load(Ordering::Relaxed)))
        }
    }

    impl Recorder for Gauges {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            let mut gauges = self.0.lock().unwrap();
            Gauge::from_arc(gauges.entry(key.name().to_owned()).or_default().clone())
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn the_backlog_gauges_show_scheduled_rows_apart_from_unpublished_ones() {
        let gauges = Gauges::default();
        metrics::with_local_recorder(&gauges, || {
            let telemetry = RelayTelemetry::new(Health::default());
            telemetry.backlog(&Backlog::new(3, Some(1.5), 0).with_scheduled(7));
        });
        assert_eq!(gauges.value(m::OUTBOX_SCHEDULED), Some(7.0));
        assert_eq!(gauges.value(m::OUTBOX_UNPUBLISHED), Some(3.0));
        assert_eq!(gauges.value(m::OUTBOX_OLDEST_UNPUBLISHED_AGE), Some(1.5));
    }
}
