//! [`AppError`]: why an [`App`](super::App) could not start, or the first error of one of its
//! parts.

use std::path::PathBuf;

use crate::engine::SetupError;
use crate::kafka::{KafkaError, KafkaTransportError};
use crate::relay::RelayError;
use crate::store::StoreError;

/// Why an [`App`](super::App) could not start, or the first error of one of its parts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// The configuration is unusable (e.g. `DATABASE_URL` of an unknown scheme).
    #[error("{0}")]
    Config(String),
    /// `DATABASE_URL` or a broker (`KAFKA_BROKERS`, `NATS_URL`) is missing while the other is
    /// set, or is set but empty, or both brokers are set, or `NATS_URL` without the feature
    /// `nats`: a half-configured service does not start on an embedded part.
    #[error("{variable} {reason}")]
    Env {
        /// The variable missing or empty.
        variable: &'static str,
        /// What is wrong with it and what to do.
        reason: String,
    },
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(Box<StoreError>),
    /// The in-process Kafka could not start, or a topic could not be created.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// (Feature `nats`.) The NATS server could not be reached, or a stream could not be
    /// created.
    #[cfg(feature = "nats")]
    #[error("nats: {0}")]
    Nats(Box<crate::nats::NatsTransportError>),
    /// A temporary directory for the zero-setup database could not be made.
    #[error("cannot create the zero-setup database directory {path}: {source}")]
    TempDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A consumer group could not be set up (no handler, two handlers for one event, ...).
    #[error("consumer group `{group}`: {source}")]
    Setup {
        /// The group.
        group: String,
        /// The cause.
        source: Box<SetupError>,
    },
    /// A consumer group member failed.
    #[error("consumer group `{group}`: {source}")]
    Consumer {
        /// The group.
        group: String,
        /// The cause.
        source: Box<KafkaTransportError>,
    },
    /// (Feature `nats`.) A consumer group member on NATS failed.
    #[cfg(feature = "nats")]
    #[error("consumer group `{group}`: {source}")]
    NatsConsumer {
        /// The group.
        group: String,
        /// The cause.
        source: Box<crate::nats::NatsTransportError>,
    },
    /// A relay failed.
    #[error("relay: {0}")]
    Relay(Box<RelayError>),
    /// The operations endpoint could not start (see [`App::ops_endpoint`](super::App::ops_endpoint)).
    #[cfg(feature = "http")]
    #[error("operations endpoint: {0}")]
    Ops(#[from] crate::ops::OpsError),
    /// A part panicked.
    #[error("{part} panicked: {message}")]
    Panicked {
        /// `consumer group `..`` or `relay`.
        part: String,
        /// The panic's message, when it has one.
        message: String,
    },
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        AppError::Store(Box::new(error))
    }
}

impl From<RelayError> for AppError {
    fn from(error: RelayError) -> Self {
        AppError::Relay(Box::new(error))
    }
}

#[cfg(feature = "nats")]
impl From<crate::nats::NatsTransportError> for AppError {
    fn from(error: crate::nats::NatsTransportError) -> Self {
        AppError::Nats(Box::new(error))
    }
}
