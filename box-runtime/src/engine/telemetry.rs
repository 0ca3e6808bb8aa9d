//! The consumer side's metrics and spans: handles built once per group and event type, so a
//! message costs a map lookup and a few atomic adds, never a label string.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{Counter, Histogram, SharedString};
use tracing::Span;

use crate::message::{Delivery, Outcome};
use crate::telemetry::metric::{self as m, LABEL_EVENT_TYPE, LABEL_GROUP, UNKNOWN_EVENT_TYPE};
use crate::telemetry::Health;

/// The metric handles of one event type of one group.
struct TypeMetrics {
    processed: Counter,
    duplicates: Counter,
    retries: Counter,
    dead_lettered: Counter,
    deferred: Counter,
    replayed: Counter,
    handler_duration: Histogram,
    event_age: Histogram,
}

impl TypeMetrics {
    fn new(group: &SharedString, event_type: &'static str) -> Self {
        let labels = [
            (LABEL_GROUP, group.clone()),
            (LABEL_EVENT_TYPE, SharedString::from(event_type)),
        ];
        Self {
            processed: metrics::counter!(m::INBOX_PROCESSED, &labels),
            duplicates: metrics::counter!(m::INBOX_DUPLICATES, &labels),
            retries: metrics::counter!(m::INBOX_RETRIES, &labels),
            dead_lettered: metrics::counter!(m::INBOX_DEAD_LETTERED, &labels),
            deferred: metrics::counter!(m::INBOX_DEFERRED, &labels),
            replayed: metrics::counter!(m::INBOX_REPLAYED, &labels),
            handler_duration: metrics::histogram!(m::INBOX_HANDLER_DURATION, &labels),
            event_age: metrics::histogram!(m::INBOX_EVENT_AGE, &labels),
        }
    }
}

/// One consumer group's telemetry: metric handles (taken from the recorder installed when the
/// inbox is built), its [`Health`], and the names its spans carry.
pub(crate) struct InboxTelemetry {
    group: SharedString,
    types: HashMap<&'static str, TypeMetrics>,
    unknown: TypeMetrics,
    batch_size: Histogram,
    pub(crate) health: Health,
    /// What the group did since the last summary.
    tally: Tally,
}

/// Counts of one group's messages since the last [`Summary`], whatever the recorder.
#[derive(Debug)]
struct Tally {
    /// When the last summary was taken.
    since: std::sync::Mutex<Instant>,
    processed: AtomicU64,
    duplicates: AtomicU64,
    retries: AtomicU64,
    dead_lettered: AtomicU64,
}

/// What one consumer group did since the last summary, logged at info by the consumer every
/// `summary_interval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) processed: u64,
    pub(crate) duplicates: u64,
    pub(crate) retries: u64,
    pub(crate) dead_lettered: u64,
    /// The time the summary covers.
    pub(crate) over: Duration,
}

impl Summary {
    /// Whether nothing happened.
    pub(crate) fn is_empty(&self) -> bool {
        self.processed + self.duplicates + self.retries + self.dead_lettered == 0
    }
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            since: std::sync::Mutex::new(Instant::now()),
            processed: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for InboxTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxTelemetry")
            .field("group", &&*self.group)
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl InboxTelemetry {
    pub(crate) fn new(group: &str, event_types: impl Iterator<Item = &'static str>) -> Self {
        let group = SharedString::from(group.to_owned());
        let types = event_types
            .map(|t| (t, TypeMetrics::new(&group, t)))
            .collect();
        Self {
            unknown: TypeMetrics::new(&group, UNKNOWN_EVENT_TYPE),
            batch_size: metrics::histogram!(m::INBOX_BATCH_SIZE, LABEL_GROUP => group.clone()),
            group,
            types,
            health: Health::default(),
            tally: Tally::default(),
        }
    }

    /// Logs at info what the group did since the last summary (messages processed, duplicates,
    /// retries, dead letters), unless it did nothing.
    pub(crate) fn log_summary(&self) {
        let s = self.take_summary();
        if s.is_empty() {
            return;
        }
        tracing::info!(target: "inoutbox::consumer", group = &*self.group,
            processed = s.processed, duplicates = s.duplicates, retries = s.retries,
            dead_lettered = s.dead_lettered, seconds = s.over.as_secs(), "summary");
    }

    /// What the group did since the last call, and starts counting again.
    pub(crate) fn take_summary(&self) -> Summary {
        let take = |n: &AtomicU64| n.swap(0, Ordering::Relaxed);
        let t = &self.tally;
        let over = match t.since.lock() {
            Ok(mut since) => std::mem::replace(&mut *since, Instant::now()).elapsed(),
            Err(_) => Duration::ZERO,
        };
        Summary {
            over,
            processed: take(&t.processed),
            duplicates: take(&t.duplicates),
            retries: take(&t.retries),
            dead_lettered: take(&t.dead_lettered),
        }
    }

    fn of(&self, event_type: Option<&str>) -> &TypeMetrics {
        event_type
            .and_then(|t| self.types.get(t))
            .unwrap_or(&self.unknown)
    }

    /// The span of one message (see [`message_span`]).
    /// `headers` names the event type and event id headers, read only when the span is
    /// enabled.
    pub(crate) fn message_span(&self, d: &Delivery, headers: (&str, &str)) -> Span {
        message_span(&self.group, d, headers)
    }

    /// A batch of `size` messages was taken from a partition.
    pub(crate) fn batch_size(&self, size: usize) {
        self.batch_size.record(size as f64);
    }

    /// The span of a batch of `size` messages.
    pub(crate) fn batch_span(&self, size: usize) -> Span {
        tracing::info_span!(target: "inoutbox::inbox", "inoutbox.batch", group = &*self.group, size)
    }

    /// A message is resolved: its counters, its age, and its span's outcome and duration.
    pub(crate) fn resolved(
        &self,
        span: &Span,
        event_type: Option<&str>,
        event_id: Option<&str>,
        outcome: &Outcome,
        started: Instant,
    ) {
        let metrics = self.of(event_type);
        let tally = |n: &AtomicU64| {
            n.fetch_add(1, Ordering::Relaxed);
        };
        match outcome {
            Outcome::Processed { attempt } => {
                tally(&self.tally.processed);
                metrics.processed.increment(1);
                if let Some(age) = event_id.and_then(event_age) {
                    metrics.event_age.record(age.as_secs_f64());
                }
                span.record("attempt", attempt);
            }
            Outcome::Duplicate | Outcome::DuplicateBusinessKey { .. } => {
                tally(&self.tally.duplicates);
                if matches!(outcome, Outcome::Duplicate) {
                    metrics.duplicates.increment(1);
                }
            }
            Outcome::DeadLettered { .. } => {
                tally(&self.tally.dead_lettered);
                metrics.dead_lettered.increment(1);
            }
            Outcome::Deferred { .. } => metrics.deferred.increment(1),
            _ => {}
        }
        if !span.is_disabled() {
            span.record("outcome", outcome.label());
            span.record("duration_ms", started.elapsed().as_secs_f64() * 1e3);
        }
    }

    /// A failed run of `event_type` is retried.
    pub(crate) fn retried(&self, event_type: &str) {
        self.tally.retries.fetch_add(1, Ordering::Relaxed);
        self.of(Some(event_type)).retries.increment(1);
    }

    /// A dead letter was replayed.
    pub(crate) fn replayed(&self, event_type: Option<&str>) {
        self.of(event_type).replayed.increment(1);
    }

    /// One handler run of `event_type` took `elapsed`.
    pub(crate) fn handler_ran(&self, event_type: &str, elapsed: Duration) {
        self.of(Some(event_type))
            .handler_duration
            .record(elapsed.as_secs_f64());
    }
}

/// The span of one message: group, event type, event id, topic, partition, offset; attempt,
/// outcome and duration are recorded when it is resolved. With the `otel` feature its parent
/// is the trace context of the message's `traceparent` header.
fn message_span(group: &str, d: &Delivery, (type_header, id_header): (&str, &str)) -> Span {
    // The field values are computed only if a subscriber wants the span.
    let span = tracing::info_span!(target: "inoutbox::inbox", "inoutbox.message",
        group,
        event_type = d.header_str(type_header).unwrap_or(""),
        event_id = d.header_str(id_header).unwrap_or(""),
        topic = &*d.topic,
        partition = d.partition,
        offset = d.offset,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    crate::message::trace::continue_trace(&span, d);
    span
}

/// How old the event with this id is, when the id is a time-based UUID (the outbox's v7).
pub(crate) fn event_age(id: &str) -> Option<Duration> {
    let (secs, nanos) = uuid::Uuid::try_parse(id).ok()?.get_timestamp()?.to_unix();
    let at = UNIX_EPOCH + Duration::new(secs, nanos);
    SystemTime::now().duration_since(at).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_age_reads_the_time_of_a_v7_id() {
        let id = uuid::Uuid::now_v7().to_string();
        let age = event_age(&id).expect("a v7 id has a time");
        assert!(age < Duration::from_secs(5), "{age:?}");
        assert_eq!(event_age(&uuid::Uuid::new_v4().to_string()), None);
        assert_eq!(event_age("order-17"), None);
    }
}
