#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[doc = include_str!("docs/inbox_handler.md")]
pub use inoutbox_macros::inbox_handler;
/// Derives [`InboxEvent`](trait@crate::InboxEvent) for an event this service consumes and never
/// publishes: `#[derive(Deserialize, InboxEvent)]` with `#[inbox(event_type = "OrderPlaced")]`
/// (and optionally `idempotency_key = field`), no topic. Handlers take it; `enqueue` refuses it
/// at compile time. See the trait for an example.
pub use inoutbox_macros::InboxEvent;
#[doc = include_str!("docs/outbox_event.md")]
pub use inoutbox_macros::OutboxEvent;

#[doc(inline)]
pub use inoutbox_runtime::app::{App, AppError};
#[doc(inline)]
pub use inoutbox_runtime::db::{sql, Db, Tx};
#[doc(inline)]
pub use inoutbox_runtime::engine::{AckStrategy, RetryPolicy};
#[doc(inline)]
pub use inoutbox_runtime::kafka::KafkaConfig;
#[doc(inline)]
pub use inoutbox_runtime::message::Outcome;
#[cfg(feature = "mysql")]
#[doc(inline)]
pub use inoutbox_runtime::mysql::{MySqlStore, MySqlTx};
#[doc(inline)]
pub use inoutbox_runtime::postgres::{PgStore, PgTx};
#[doc(inline)]
pub use inoutbox_runtime::relay::{Relay, RelayBuilder};
#[doc(inline)]
pub use inoutbox_runtime::shutdown::shutdown_signal;
#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use inoutbox_runtime::sqlite::{SqliteStore, SqliteTx};
#[doc(inline)]
pub use inoutbox_runtime::store::Tables;
#[doc(inline)]
pub use inoutbox_runtime::{
    Consumer, ConsumerBuilder, HandlerError, InboxEvent, MessageMeta, OutboxEvent,
};

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
    #[doc = include_str!("../docs/nats.md")]
    pub mod nats {}
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
    #[cfg(feature = "mysql")]
    pub use crate::MySqlTx;
    #[cfg(feature = "sqlite")]
    pub use crate::SqliteTx;
    pub use crate::{inbox_handler, Db, HandlerError, MessageMeta, OutboxEvent, PgTx, Tx};
    // The derive only: the trait beside `OutboxEvent` would make `T::EVENT_TYPE` ambiguous.
    pub use inoutbox_macros::InboxEvent;
}

/// One runner for a service: [`App`](crate::App), the store it picked, and the consumer groups
/// and relays it runs.
pub mod app {
    #[doc(inline)]
    pub use inoutbox_runtime::app::{App, AppError, ConsumerSpec, RelaySpec, Store};
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
    pub use inoutbox_runtime::admin::{
        consumer_lag, impossible_lag, Admin, AdminError, DeadLetterFilter, DeadLetterRow,
        EffectsStatus, GroupStatus, OutboxStatus, ParkedKey, PartitionLag, Purged, Status,
    };
}

#[cfg(feature = "cli")]
pub mod cli;

/// The consumer side in detail: how a consumer group's inbox behaves, what became of a message,
/// and the engine itself (for tests and tools).
pub mod inbox {
    #[doc(inline)]
    pub use inoutbox_runtime::engine::{
        AckStrategy, CommitOn, EventId, Inbox, InboxConfig, OnExhausted, Ordering, ReplayError,
        Report, RetryPolicy, SetupError, Source, UnknownEvent, DEFAULT_RETENTION,
    };
    #[doc(inline)]
    pub use inoutbox_runtime::message::{Delivery, Outcome};
    #[doc(inline)]
    pub use inoutbox_runtime::{Backoff, ErrorKind, HandlerMode, IntoHandlerError};
}

/// Effects after commit: work a handler schedules to run only if its transaction commits, at
/// least once, with a stable idempotency key (PostgreSQL).
pub mod effects {
    #[doc(inline)]
    pub use inoutbox_runtime::effects::{
        after_commit, idempotency_key, Effect, EffectFuture, EffectsDb, DEFAULT_EFFECT_CONCURRENCY,
    };
}

/// The producer side: enqueue events in the caller's transaction.
pub mod outbox {
    #[doc(inline)]
    pub use inoutbox_runtime::message::Retention;
    #[cfg(feature = "mysql")]
    #[doc(inline)]
    pub use inoutbox_runtime::mysql::MySqlOutbox;
    #[doc(inline)]
    pub use inoutbox_runtime::outbox::{
        current_traceparent, enqueue, enqueue_after, enqueue_all, enqueue_at, is_valid_traceparent,
        with_traceparent, EnqueueError, NewRow, OutboxTx,
    };
    #[doc(inline)]
    pub use inoutbox_runtime::postgres::PgOutbox;
    #[cfg(feature = "sqlite")]
    #[doc(inline)]
    pub use inoutbox_runtime::sqlite::SqliteOutbox;
}

/// The relay: publishes committed outbox rows through a [`Publisher`](crate::transport::Publisher)
/// (Kafka's: [`KafkaProducer`](crate::kafka::KafkaProducer)).
pub mod relay {
    #[cfg(feature = "mysql")]
    #[doc(inline)]
    pub use inoutbox_runtime::mysql::MySqlRelayStore;
    #[doc(inline)]
    pub use inoutbox_runtime::postgres::PgRelayStore;
    #[doc(inline)]
    pub use inoutbox_runtime::relay::{
        Backlog, Failure, IntoRelayStore, KeyRef, Members, PendingRow, Relay, RelayBuilder,
        RelayConfig, RelayError, RelayReport, RelaySession, RelayStore,
    };
    #[cfg(feature = "sqlite")]
    #[doc(inline)]
    pub use inoutbox_runtime::sqlite::SqliteRelayStore;
}

/// Stores: where inbox rows, attempt counts and dead letters live, and their table names. The
/// [`InboxStore`](store::InboxStore) trait is open: wrap a store (to observe or fault it) by
/// implementing it over another.
pub mod store {
    #[doc(inline)]
    pub use inoutbox_runtime::redact::redact_url;
    #[doc(inline)]
    pub use inoutbox_runtime::store::{
        Claim, ClaimRequest, DeadLetter, EffectCounts, ErrorClass, InboxKey, InboxStore,
        LeaseRequest, ReceivedRow, StoreError, StoredDeadLetter, StoredEffect, Tables,
        CONNECT_TIMEOUT,
    };
}

/// The PostgreSQL backend: the inbox store, its transactions, the outbox writer and relay store
/// for other table names, and the daily-partitioned inbox.
pub mod postgres {
    #[doc(inline)]
    pub use inoutbox_runtime::postgres::{
        DailyPartitions, PartitionChanges, PgOutbox, PgRelayStore, PgStore, PgTx, Retire,
    };
}

/// The SQLite backend: the embedded store of the zero-setup mode and of tests.
#[cfg(feature = "sqlite")]
pub mod sqlite {
    #[doc(inline)]
    pub use inoutbox_runtime::sqlite::{
        SchemaNotSupported, SqliteOutbox, SqliteRelayStore, SqliteStore, SqliteTx,
    };
}

/// The MySQL/MariaDB backend (MariaDB >= 10.6, MySQL >= 8.0): the inbox store, its
/// transactions, the outbox writer and the relay store (one relay publishes at a time; it polls).
#[cfg(feature = "mysql")]
pub mod mysql {
    #[doc(inline)]
    pub use inoutbox_runtime::mysql::{
        MySqlOutbox, MySqlRelaySession, MySqlRelayStore, MySqlStore, MySqlTx,
    };
}

/// The transport contract: what a broker does for inoutbox, for a second broker to implement.
pub mod transport {
    #[doc(inline)]
    pub use inoutbox_runtime::message::Delivery;
    #[doc(inline)]
    pub use inoutbox_runtime::transport::{
        IntoPublisher, OutgoingMessage, PartitionLink, Partitions, PublishError, Publisher,
        Receipt, Transport,
    };
}

/// Shutdown: one [`CancellationToken`](shutdown::CancellationToken) carries it to every task;
/// see the module for the grace rules.
pub mod shutdown {
    #[doc(inline)]
    pub use inoutbox_runtime::shutdown::{shutdown_signal, CancellationToken};
}

#[cfg(feature = "testing")]
#[doc = include_str!("docs/testing.md")]
pub mod testing {
    #[doc(inline)]
    pub use inoutbox_runtime::testing::{
        conformance, delivery, delivery_on, relay_conformance, sqlite_memory, wait_idle,
        Conformance, ConformanceError, EffectRun, NotIdle, TestInbox,
    };
}

/// Operations: the metric names ([`telemetry::metric`]), the [`Health`](telemetry::Health) of
/// consumers and relays, and how spans are named. See `docs/operations.md`.
pub mod telemetry {
    #[doc(inline)]
    pub use inoutbox_runtime::telemetry::{
        metric, Health, DEFAULT_SAMPLE_INTERVAL, DEFAULT_STUCK_AFTER, DEFAULT_SUMMARY_INTERVAL,
    };
}

/// (Feature `http`.) The operations endpoint: `/metrics` (Prometheus), `/healthz`, `/readyz`
/// ([`OpsEndpoint`](ops::OpsEndpoint), served for an app by
/// [`App::ops_endpoint`](crate::App::ops_endpoint)), and the Prometheus recorder behind it.
#[cfg(feature = "http")]
pub mod ops {
    #[doc(inline)]
    pub use inoutbox_runtime::ops::{install_prometheus, OpsEndpoint, OpsError, Prometheus};
}

/// (Feature `nats`.) The NATS JetStream transport: the consumer's settings
/// ([`NatsConfig`](nats::NatsConfig)) and the relay's publisher
/// ([`NatsPublisher`](nats::NatsPublisher)); see `docs/nats.md`.
#[cfg(feature = "nats")]
pub mod nats {
    #[doc(inline)]
    pub use inoutbox_runtime::nats::{
        consumer_lag, partition_for, stream_name, subject, ConsumerLag, NatsConfig, NatsPublisher,
        NatsTransportError, HEADER_KEY,
    };
}

/// The Kafka transport: the consumer's settings ([`KafkaConfig`](kafka::KafkaConfig)), the
/// relay's producer ([`KafkaProducer`](kafka::KafkaProducer)), and an in-process Kafka for
/// zero-setup runs.
pub mod kafka {
    #[doc(inline)]
    pub use inoutbox_runtime::kafka::{
        InProcessKafka, KafkaConfig, KafkaProducer, KafkaPublisher, KafkaTransportError, QUICK_JOIN,
    };
    #[doc(inline)]
    pub use inoutbox_runtime::names::{
        CONTENT_TYPE_JSON, HEADER_CONTENT_TYPE, HEADER_ID, HEADER_SOURCE, HEADER_SPECVERSION,
        HEADER_TRACEPARENT, HEADER_TYPE, SPECVERSION,
    };
    #[doc(inline)]
    pub use inoutbox_runtime::redact::{is_secret_setting, redact_setting, REDACTED};
}
