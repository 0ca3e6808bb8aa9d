//! Every metric inoutbox records, by name, in one place.
//!
//! Names follow the Prometheus conventions: `inoutbox_` prefix, `_total` for counters, the unit
//! (`_seconds`) in the name. Labels have bounded values: a consumer group, an event type its
//! handlers declare (`"unknown"` for any other), a topic the outbox writes, a partition.
//! [`ALL`] lists them with their type, labels and meaning; [`describe`] registers those
//! descriptions with the installed recorder.

/// Label: the consumer group.
pub const LABEL_GROUP: &str = "group";
/// Label: the event type (`"unknown"` for a type the group has no handler for).
pub const LABEL_EVENT_TYPE: &str = "event_type";
/// Label: the topic.
pub const LABEL_TOPIC: &str = "topic";
/// Label: the partition.
pub const LABEL_PARTITION: &str = "partition";
/// Label: the transport, `kafka` or `nats`. Not on a metric's own labels: an
/// [`App`](crate::App) with an operations endpoint puts it on every metric of its recorder
/// (a process runs one transport per app); with a recorder of your own, add it as a global
/// label (`PrometheusBuilder::add_global_label`).
pub const LABEL_TRANSPORT: &str = "transport";
/// The `event_type` label of messages whose type the group does not handle (or that have none):
/// a producer cannot create label values.
pub const UNKNOWN_EVENT_TYPE: &str = "unknown";

/// Counter: messages whose handler committed.
pub const INBOX_PROCESSED: &str = "inoutbox_inbox_processed_total";
/// Counter: messages found already processed (the handler did not run).
pub const INBOX_DUPLICATES: &str = "inoutbox_inbox_duplicates_total";
/// Counter: failed handler runs that are retried.
pub const INBOX_RETRIES: &str = "inoutbox_inbox_retries_total";
/// Counter: messages dead-lettered.
pub const INBOX_DEAD_LETTERED: &str = "inoutbox_inbox_dead_lettered_total";
/// Counter: dead letters replayed successfully.
pub const INBOX_REPLAYED: &str = "inoutbox_inbox_replayed_total";
/// Histogram: one handler run (one message, or one run of a batch handler), in seconds.
pub const INBOX_HANDLER_DURATION: &str = "inoutbox_inbox_handler_duration_seconds";
/// Histogram: messages per batch taken from a partition.
pub const INBOX_BATCH_SIZE: &str = "inoutbox_inbox_batch_size";
/// Histogram: end-to-end age at processing, from the event's time (the time in its UUID v7
/// id, as the outbox writes it) to the commit of its handler, in seconds.
pub const INBOX_EVENT_AGE: &str = "inoutbox_inbox_event_age_seconds";
/// Gauge: dead letters of the group not replayed.
pub const INBOX_DEAD_LETTERS: &str = "inoutbox_inbox_dead_letters";
/// Gauge: inbox rows received and still not processed after the consumer's `stuck_after`.
pub const INBOX_STUCK: &str = "inoutbox_inbox_stuck";
/// Counter: messages a handler deferred (`HandlerError::defer`), each deferral counted.
pub const INBOX_DEFERRED: &str = "inoutbox_inbox_deferred_total";
/// Gauge: deferred messages of the group kept in the inbox, waiting to be due or to run.
pub const INBOX_DEFERRED_PENDING: &str = "inoutbox_inbox_deferred";
/// Gauge: consumer lag of a partition: the broker's high watermark minus the group's
/// committed offset.
pub const CONSUMER_LAG: &str = "inoutbox_consumer_lag";

/// Counter: runs of effects after commit (attempts), whatever their outcome.
pub const EFFECTS_ATTEMPTS: &str = "inoutbox_effects_attempts_total";
/// Counter: failed runs of effects (an error, a panic, an overrun, no executor), each retried
/// after a backoff.
pub const EFFECTS_RETRIES: &str = "inoutbox_effects_retries_total";
/// Histogram: one run of an effect's executor, in seconds.
pub const EFFECTS_RUN_DURATION: &str = "inoutbox_effects_run_duration_seconds";
/// Gauge: effects of the group not done yet.
pub const EFFECTS_PENDING: &str = "inoutbox_effects_pending";
/// Gauge: effects of the group not done whose runs failed at least once.
pub const EFFECTS_FAILED: &str = "inoutbox_effects_failed";
/// Gauge: age of the group's oldest effect not done, in seconds (0 when there is none).
pub const EFFECTS_OLDEST_PENDING_AGE: &str = "inoutbox_effects_oldest_pending_age_seconds";

/// Counter: outbox rows published (acknowledged by the broker).
pub const OUTBOX_PUBLISHED: &str = "inoutbox_outbox_published_total";
/// Counter: outbox rows parked (given up on after their attempts).
pub const OUTBOX_PARKED: &str = "inoutbox_outbox_parked_total";
/// Histogram: from the enqueue (the time in the row's UUID v7 id, taken in the producer's
/// transaction) to the broker's acknowledgement, in seconds.
pub const OUTBOX_PUBLISH_LATENCY: &str = "inoutbox_outbox_publish_latency_seconds";
/// Gauge: outbox rows not yet published (parked rows excluded).
pub const OUTBOX_UNPUBLISHED: &str = "inoutbox_outbox_unpublished";
/// Gauge: age of the oldest unpublished outbox row, in seconds (0 when there is none).
pub const OUTBOX_OLDEST_UNPUBLISHED_AGE: &str = "inoutbox_outbox_oldest_unpublished_age_seconds";
/// Gauge: parked outbox rows.
pub const OUTBOX_PARKED_ROWS: &str = "inoutbox_outbox_parked";
/// Gauge: keys held by a parked outbox row (their later rows wait until it is unparked).
pub const OUTBOX_HELD_KEYS: &str = "inoutbox_outbox_held_keys";
/// Gauge: scheduled outbox rows not yet due (`enqueue_at`, `enqueue_after`).
pub const OUTBOX_SCHEDULED: &str = "inoutbox_outbox_scheduled";

/// What kind of metric a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// A distribution of observations.
    Histogram,
    /// A value sampled periodically.
    Gauge,
}

/// One metric: its name, kind, labels and meaning.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// The Prometheus-style name.
    pub name: &'static str,
    /// Counter, histogram or gauge.
    pub kind: Kind,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// What it measures.
    pub help: &'static str,
}

const BY_TYPE: &[&str] = &[LABEL_GROUP, LABEL_EVENT_TYPE];

/// Every metric inoutbox records.
pub const ALL: &[Metric] = &[
    Metric {
        name: INBOX_PROCESSED,
        kind: Kind::Counter,
        labels: BY_TYPE,
        help: "Messages whose handler committed.",
    },
    Metric {
        name: INBOX_DUPLICATES,
        kind: Kind::Counter,
        labels: BY_TYPE,
        help: "Messages found already processed; the handler did not run.",
    },
    Metric {
        name: INBOX_RETRIES,
        kind: Kind::Counter,
        labels: BY_TYPE,
        help: "Failed handler runs that are retried.",
    },
    Metric {
        name: INBOX_DEAD_LETTERED,
        kind: Kind::Counter,
        labels: BY_TYPE,
        help: "Messages dead-lettered.",
    },
    Metric {
        name: INBOX_REPLAYED,
        kind: Kind::Counter,
        labels: BY_TYPE,
        help: "Dead letters replayed successfully.",
    },
    Metric {
        name: INBOX_HANDLER_DURATION,
        kind: Kind::Histogram,
        labels: BY_TYPE,
        help: "Duration of one handler run, in seconds.",
    },
    Metric {
        name: INBOX_BATCH_SIZE,
        kind: Kind::Histogram,
        labels: &[LABEL_GROUP],
        help: "Messages per batch taken from a partition.",
    },
    Metric {
        name: INBOX_EVENT_AGE,
        kind: Kind::Histogram,
        labels: BY_TYPE,
        help: "Age of the event (from its UUID v7 id) when its handler committed, in seconds.",
    },
    Metric {
        name: INBOX_DEAD_LETTERS,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP],
        help: "Dead letters of the group not replayed.",
    },
    Metric {
        name: INBOX_STUCK,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP],
        help: "Inbox rows received and not processed after the consumer's stuck_after.",
    },
    Metric {
        name: INBOX_DEFERRED,
        kind: Kind::Counter,
        labels: BY_TYPE,
        help: "Messages a handler deferred (each deferral counted).",
    },
    Metric {
        name: INBOX_DEFERRED_PENDING,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP],
        help: "Deferred messages kept in the inbox, not yet run.",
    },
    Metric {
        name: CONSUMER_LAG,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP, LABEL_TOPIC, LABEL_PARTITION],
        help: "High watermark minus committed offset, per assigned partition.",
    },
    Metric {
        name: EFFECTS_ATTEMPTS,
        kind: Kind::Counter,
        labels: &[LABEL_GROUP],
        help: "Runs of effects after commit, whatever their outcome.",
    },
    Metric {
        name: EFFECTS_RETRIES,
        kind: Kind::Counter,
        labels: &[LABEL_GROUP],
        help: "Failed runs of effects, each retried after a backoff.",
    },
    Metric {
        name: EFFECTS_RUN_DURATION,
        kind: Kind::Histogram,
        labels: &[LABEL_GROUP],
        help: "Duration of one run of an effect's executor, in seconds.",
    },
    Metric {
        name: EFFECTS_PENDING,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP],
        help: "Effects of the group not done yet.",
    },
    Metric {
        name: EFFECTS_FAILED,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP],
        help: "Effects of the group not done whose runs failed at least once.",
    },
    Metric {
        name: EFFECTS_OLDEST_PENDING_AGE,
        kind: Kind::Gauge,
        labels: &[LABEL_GROUP],
        help: "Age of the group's oldest effect not done, in seconds.",
    },
    Metric {
        name: OUTBOX_PUBLISHED,
        kind: Kind::Counter,
        labels: &[LABEL_TOPIC],
        help: "Outbox rows published (acknowledged by the broker).",
    },
    Metric {
        name: OUTBOX_PARKED,
        kind: Kind::Counter,
        labels: &[LABEL_TOPIC],
        help: "Outbox rows parked after their attempts.",
    },
    Metric {
        name: OUTBOX_PUBLISH_LATENCY,
        kind: Kind::Histogram,
        labels: &[LABEL_TOPIC],
        help: "From enqueue (the row's UUID v7 time) to the broker's acknowledgement, in seconds.",
    },
    Metric {
        name: OUTBOX_UNPUBLISHED,
        kind: Kind::Gauge,
        labels: &[],
        help: "Outbox rows not yet published (parked rows excluded).",
    },
    Metric {
        name: OUTBOX_OLDEST_UNPUBLISHED_AGE,
        kind: Kind::Gauge,
        labels: &[],
        help: "Age of the oldest unpublished outbox row, in seconds.",
    },
    Metric {
        name: OUTBOX_PARKED_ROWS,
        kind: Kind::Gauge,
        labels: &[],
        help: "Parked outbox rows.",
    },
    Metric {
        name: OUTBOX_HELD_KEYS,
        kind: Kind::Gauge,
        labels: &[],
        help: "Keys held by a parked outbox row: their later rows wait until it is unparked.",
    },
    Metric {
        name: OUTBOX_SCHEDULED,
        kind: Kind::Gauge,
        labels: &[],
        help: "Scheduled outbox rows not yet due.",
    },
];

/// Registers the description of every metric in [`ALL`] with the installed recorder (the
/// Prometheus exporter prints them as `# HELP`). Call it after installing the recorder.
pub fn describe() {
    for m in ALL {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for m in ALL {
            assert!(seen.insert(m.name), "{} listed twice", m.name);
            assert!(m.name.starts_with("inoutbox_"), "{}", m.name);
            assert!(
                m.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                m.name
            );
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}",
                m.name
            );
        }
        assert_eq!(ALL.len(), 27);
    }
}
