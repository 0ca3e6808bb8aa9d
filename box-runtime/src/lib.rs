//! The runtime of txbox: the handler registry, the inbox engine, the outbox and its relay, the
//! stores (PostgreSQL) and the transports (Kafka).
//!
//! Users depend on the `txbox` facade crate, which re-exports what is public here; see its
//! documentation for the tour.

#![warn(missing_docs)]

pub mod config;
pub mod consumer;
pub mod engine;
pub mod event;
pub mod handler;
pub mod ident;
pub mod names;
pub mod outbox;
pub mod relay;
pub mod store;
pub mod transport;
mod util;

pub use config::{AckStrategy, CommitOn, EventId, OnExhausted, RetryPolicy, Source, UnknownEvent};
pub use consumer::{shutdown_signal, Consumer, ConsumerBuilder};
pub use engine::Outcome;
pub use event::OutboxEvent;
pub use handler::{ErrorKind, HandlerError, IntoHandlerError, MessageMeta};
pub use store::postgres::{PgStore, Tables};
pub use transport::kafka::{KafkaConfig, Report};

/// The transaction type a PostgreSQL handler takes: `tx: &mut PgTx<'_>`.
pub type PgTx<'c> = sqlx::Transaction<'c, sqlx::Postgres>;

/// What generated code reaches; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::event::OutboxEvent;
    pub use crate::handler::{
        invoke, tx_type_id, HandlerFuture, HandlerRegistration, HandlerTx, IntoHandlerError,
        MessageMeta,
    };
    pub use inventory;
}
