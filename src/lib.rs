//! # txbox
//!
//! Transactional inbox and outbox for Rust services on PostgreSQL and Kafka.
//!
//! See the README for the tour.

#![warn(missing_docs)]

pub use box_macros::{inbox_handler, OutboxEvent};
pub use box_runtime::{
    config, consumer, engine, handler, ident, names, outbox, relay, shutdown_signal, store,
    transport, AckStrategy, CommitOn, Consumer, ConsumerBuilder, ErrorKind, EventId, HandlerError,
    IntoHandlerError, KafkaConfig, MessageMeta, OnExhausted, Outcome, PgStore, PgTx, Report,
    RetryPolicy, Source, Tables, UnknownEvent,
};

#[doc(hidden)]
pub use box_runtime::__private;

/// The names most services need: `use txbox::prelude::*;`.
pub mod prelude {
    pub use crate::{inbox_handler, HandlerError, MessageMeta, OutboxEvent, PgTx};
}
