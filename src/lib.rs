#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

#[doc = include_str!("docs/inbox_handler.md")]
pub use box_macros::inbox_handler;
#[doc = include_str!("docs/outbox_event.md")]
pub use box_macros::OutboxEvent;
pub use box_runtime::{
    config, consumer, engine, handler, ident, names, outbox, relay, shutdown_signal, store,
    transport, AckStrategy, CommitOn, Consumer, ConsumerBuilder, ErrorKind, EventId, HandlerError,
    IntoHandlerError, KafkaConfig, MessageMeta, OnExhausted, OutboxEvent, Outcome, PgStore, PgTx,
    Report, RetryPolicy, Source, Tables, UnknownEvent,
};

#[cfg(feature = "sqlite")]
pub use box_runtime::{SqliteStore, SqliteTx};

#[doc(hidden)]
pub use box_runtime::__private;

/// The names most services need: `use txbox::prelude::*;`.
pub mod prelude {
    pub use crate::{inbox_handler, HandlerError, MessageMeta, OutboxEvent, PgTx};
}
