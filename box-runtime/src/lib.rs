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
mod failpoint;
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
pub use store::postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use store::sqlite::SqliteStore;
pub use store::Tables;
pub use transport::kafka::{KafkaConfig, Report};

/// The transaction type a PostgreSQL handler takes: `tx: &mut PgTx<'_>`.
pub type PgTx<'c> = sqlx::Transaction<'c, sqlx::Postgres>;

/// The transaction type a SQLite handler takes: `tx: &mut SqliteTx<'_>`.
#[cfg(feature = "sqlite")]
pub type SqliteTx<'c> = sqlx::Transaction<'c, sqlx::Sqlite>;

/// What generated code reaches; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::event::{key_string, KeyField, OutboxEvent};
    pub use crate::handler::{
        check_event_type, decode, downcast_tx, fail, into_future, meta_param, registrations,
        tx_type_id, DispatchTable, HandlerFuture, HandlerOutput, HandlerRegistration, HandlerTx,
        IntoHandlerError, MessageMeta, MetaParam, Probe, ProbeFallback, RegistryError,
    };
    pub use crate::handler::{event_type_mismatch, ConstMessage};
    pub use inventory;
}
