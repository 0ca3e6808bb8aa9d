//! Telemetry: `tracing` spans, metrics through the [`metrics`] facade, and health.
//!
//! - **Spans.** Every message gets a span `inoutbox.message` (target `inoutbox::inbox`) with its
//!   group, event type, event id, topic, partition and offset; its attempt, outcome and
//!   duration are recorded when it is resolved, and the handler runs inside it. A batch taken
//!   from a partition is a span `inoutbox.batch` with its size; a relay batch a span
//!   `inoutbox.relay.batch` (target `inoutbox::relay`) with its rows. With the `otel` feature the
//!   message span continues the trace of the message's W3C `traceparent` (see `otel`), and
//!   [`enqueue`](crate::outbox::enqueue) stores the current span's trace context.
//! - **Metrics.** Recorded only when the application installs a `metrics` recorder (such as
//!   `metrics-exporter-prometheus`) *before* it builds its consumers and relays: they take
//!   their handles once, when built. The names, types, labels and meanings are in [`metric`].
//!   Gauges are sampled by a task of each consumer and relay every
//!   [`DEFAULT_SAMPLE_INTERVAL`] (configurable), one set of queries per tick.
//! - **Health.** [`Consumer::health`](crate::Consumer::health) and
//!   [`Relay::health`](crate::relay::Relay::health) return a [`Health`] (the builders and an
//!   app's specs hand it out before the part runs); with the `http` feature the operations
//!   endpoint serves it, and the metrics, over HTTP.
//! - **Logs.** One line per message at debug (target `inoutbox::engine`); a summary of each
//!   group at info every [`DEFAULT_SUMMARY_INTERVAL`] (configurable): messages processed,
//!   duplicates, retries and dead letters since the last one.

use std::time::Duration;

mod health;
pub mod metric;

pub use health::Health;

/// How often gauges are sampled, by default: every 15 s.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(15);
/// The shortest sample interval accepted.
pub(crate) const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
/// After how long a received, unprocessed inbox row counts as stuck, by default: 5 minutes.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(300);
/// How often a consumer logs the summary of its group's messages at info, by default: every
/// minute (see [`ConsumerBuilder::summary_interval`](crate::ConsumerBuilder::summary_interval)).
pub const DEFAULT_SUMMARY_INTERVAL: Duration = Duration::from_secs(60);
