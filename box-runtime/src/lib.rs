//! The runtime of inoutbox: the handler registry, the inbox engine, the outbox and its relay, the
//! PostgreSQL and SQLite backends and the Kafka transport.
//!
//! Users depend on the `inoutbox` facade crate, which re-exports what is public here; see its
//! documentation for the tour and `ARCHITECTURE.md` for the map.

#![deny(missing_docs)]

pub mod admin;
pub mod app;
mod backoff;
mod consumer;
pub mod db;
pub mod effects;
pub mod engine;
mod event;
mod failpoint;
mod handler;
mod ident;
pub mod kafka;
pub mod message;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod names;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "http")]
pub mod ops;
pub mod outbox;
pub mod postgres;
pub mod redact;
pub mod relay;
mod sealed;
pub mod shutdown;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
mod util;

pub use backoff::Backoff;
pub use consumer::{Consumer, ConsumerBuilder};
pub use event::{InboxEvent, OutboxEvent};
pub use handler::{ErrorKind, HandlerError, HandlerMode, IntoHandlerError, MessageMeta};

/// What generated code reaches; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::event::{key_string, BusinessKey, InboxEvent, KeyField, OutboxEvent};
    pub use crate::handler::event_check::{check_event_type, event_type_mismatch, ConstMessage};
    pub use crate::handler::glue::{
        decode, decode_all, downcast_tx, fail, into_future, meta_param, tx_type_id, HandlerOutput,
        MetaParam, Probe, ProbeFallback,
    };
    pub use crate::handler::{
        registrations, BusinessKeyFn, DispatchTable, HandlerFuture, HandlerRegistration, HandlerTx,
        IntoHandlerError, MessageMeta, RegistryError,
    };
    pub use inventory;
    #[cfg(feature = "mysql")]
    pub use sqlx::MySql;
    pub use sqlx::Postgres;
    #[cfg(feature = "sqlite")]
    pub use sqlx::Sqlite;
}

/// Rules on the sources that a compiler does not check.
#[cfg(test)]
mod source_rules;
