#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[doc = include_str!("docs/inbox_handler.md")]
pub use inoutbox_macros::inbox_handler;
#[doc = include_str!("docs/outbox_event.md")]
pub use inoutbox_macros::OutboxEvent;

#[doc(inline)]
pub use inoutbox_runtime::engine::{AckStrategy, Outcome, RetryPolicy};
#[doc(inline)]
pub use inoutbox_runtime::{kafka::KafkaConfig, relay::Relay, store::Tables};
#[doc(inline)]
pub use inoutbox_runtime::{
    shutdown_signal, Consumer, HandlerError, MessageMeta, OutboxEvent, PgStore, PgTx,
};
#[doc(inline)]
pub use inoutbox_runtime::{sql, App, AppError, Db, Tx};
#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use inoutbox_runtime::{SqliteStore, SqliteTx};

#[doc(hidden)]
pub use inoutbox_runtime::__private;

/// The guides, rendered with the API so that the README's links to them work on docs.rs and
/// crates.io alike (the same files are `docs/*.md`, `SECURITY.md` and `ARCHITECTURE.md` in the
/// repository). Their Rust blocks are sketches of a service, not doctests.
#[cfg(not(doctest))]
pub mod docs {
    #[doc = include_str!("../docs/behaviour.md")]
    pub mod behaviour {}
    #[doc = include_str!("../docs/deployment.md")]
    pub mod deployment {}
    #[doc = include_str!("../docs/modes.md")]
    pub mod modes {}
    #[doc = include_str!("../docs/operations.md")]
    pub mod operations {}
    #[doc = include_str!("../docs/outbox.md")]
    pub mod outbox {}
    #[doc = include_str!("../docs/two_phase.md")]
    pub mod two_phase {}
    #[doc = include_str!("../SECURITY.md")]
    pub mod security {}
    #[doc = include_str!("../ARCHITECTURE.md")]
    pub mod architecture {}
}

/// The names most services need: `use inoutbox::prelude::*;`.
pub mod prelude {
    #[cfg(feature = "sqlite")]
    pub use crate::SqliteTx;
    pub use crate::{inbox_handler, Db, HandlerError, MessageMeta, OutboxEvent, PgTx, Tx};
}

/// One runner for a service: [`App`](crate::App), the store it picked, and the consumer groups
/// and relays it runs.
pub mod app {
    #[doc(inline)]
    pub use inoutbox_runtime::app::*;
}

/// Handlers written once for PostgreSQL and SQLite: [`Db`](crate::Db), [`Tx`](crate::Tx) and
/// [`sql`](crate::sql) statements, whose values are bound and rows read alike on both stores.
pub mod db {
    #[doc(inline)]
    pub use inoutbox_runtime::db::{sql, Db, Executes, FromColumn, Row, Sql, Tx, Value};
}

/// Operating a inoutbox database: status, dead letters, parked outbox rows, purges, Kafka lag
/// (what the `inoutbox` command shows and does).
pub mod admin {
    #[doc(inline)]
    pub use inoutbox_runtime::admin::*;
}

#[cfg(feature = "cli")]
pub mod cli;

/// The consumer side in detail: how a consumer group's inbox behaves, what became of a message,
/// and the engine itself (for tests and tools).
pub mod inbox {
    #[doc(inline)]
    pub use inoutbox_runtime::engine::{
        AckStrategy, CommitOn, Delivery, EventId, Inbox, InboxConfig, OnExhausted, Ordering,
        Outcome, ReplayError, Report, RetryPolicy, SetupError, Source, UnknownEvent,
        DEFAULT_RETENTION,
    };
    #[doc(inline)]
    pub use inoutbox_runtime::{
        Backoff, ConsumerBuilder, ErrorKind, HandlerMode, IntoHandlerError,
    };
}

/// Effects after commit: work a handler schedules to run only if its transaction commits, at
/// least once, with a stable idempotency key (PostgreSQL).
pub mod effects {
    #[doc(inline)]
    pub use inoutbox_runtime::effects::*;
}

/// The producer side: enqueue events in the caller's transaction.
pub mod outbox {
    #[doc(inline)]
    pub use inoutbox_runtime::outbox::*;
    #[doc(inline)]
    pub use inoutbox_runtime::postgres::PgOutbox;
    #[cfg(feature = "sqlite")]
    #[doc(inline)]
    pub use inoutbox_runtime::sqlite::SqliteOutbox;
}

/// The relay: publishes committed outbox rows to Kafka.
pub mod relay {
    #[doc(inline)]
    pub use inoutbox_runtime::postgres::PgRelayStore;
    #[doc(inline)]
    pub use inoutbox_runtime::relay::*;
    #[cfg(feature = "sqlite")]
    #[doc(inline)]
    pub use inoutbox_runtime::sqlite::SqliteRelayStore;
}

/// Stores: where inbox rows, attempt counts and dead letters live, and their table names.
pub mod store {
    #[doc(inline)]
    pub use inoutbox_runtime::postgres::{DailyPartitions, PartitionChanges, Retire};
    #[doc(inline)]
    pub use inoutbox_runtime::store::*;
    #[doc(inline)]
    pub use inoutbox_runtime::IdentError;
}

#[cfg(feature = "testing")]
#[doc = include_str!("docs/testing.md")]
pub mod testing {
    #[doc(inline)]
    pub use inoutbox_runtime::testing::*;
}

/// Operations: the metric names ([`telemetry::metric`]), the [`Health`](telemetry::Health) of
/// consumers and relays, and how spans are named. See `docs/operations.md`.
pub mod telemetry {
    #[doc(inline)]
    pub use inoutbox_runtime::telemetry::*;
}

/// The Kafka transport: consumer settings, and an in-process Kafka for zero-setup runs.
pub mod kafka {
    #[doc(inline)]
    pub use inoutbox_runtime::kafka::*;
    #[doc(inline)]
    pub use inoutbox_runtime::names::{
        CONTENT_TYPE_JSON, HEADER_CONTENT_TYPE, HEADER_ID, HEADER_SOURCE, HEADER_SPECVERSION,
        HEADER_TRACEPARENT, HEADER_TYPE, SPECVERSION,
    };
    #[doc(inline)]
    pub use inoutbox_runtime::redact::{is_secret_setting, redact_setting, REDACTED};
}
