//! The Kafka transport (rdkafka): a consumer group member that hands each partition to its own
//! task, commits offsets only for resolved messages of partitions it still owns, follows
//! rebalances and shuts down gracefully; and an in-process Kafka for zero-setup runs.
//!
//! - `config`: [`KafkaConfig`];
//! - `member`: joining the group, routing messages to partition tasks, leaving;
//! - `ownership`: which partitions are owned since which rebalance; commits only while owned;
//! - `dead_letter`: the optional dead-letter topic;
//! - `in_process`: librdkafka's mock cluster;
//! - `topics`: creating topics on a broker outside (`App::create_topic`);
//! - `group_lag`: a group's lag read from outside it (`admin::consumer_lag`).
//!
//! rdkafka is named in this room only: the others reach the broker through what it exports.

mod budget;
mod config;
mod dead_letter;
mod group_lag;
mod in_process;
mod lag;
mod member;
mod ownership;
mod producer;
mod topics;

pub use config::KafkaConfig;
pub(crate) use group_lag::group_lag;
pub use group_lag::PartitionLag;
pub use in_process::InProcessKafka;
pub(crate) use in_process::CONSUMER_SETTINGS;
pub use producer::{is_message_error, KafkaProducer, KafkaPublisher};
pub(crate) use rdkafka::error::KafkaError;
pub(crate) use topics::create_topic;

/// A failure of the Kafka consumer itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaTransportError {
    /// Creating or subscribing the consumer failed.
    #[error("kafka consumer setup failed: {0}")]
    Setup(#[source] KafkaError),
    /// No broker answered within the start-up timeout.
    #[error("no Kafka broker at {brokers} answered within {timeout:?}: {source}")]
    Unreachable {
        /// `bootstrap.servers`.
        brokers: String,
        /// The start-up timeout.
        timeout: std::time::Duration,
        /// The last error.
        #[source]
        source: KafkaError,
    },
    /// A partition task died.
    #[error("partition task for {topic}/{partition} failed: {message}")]
    Task {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// What happened.
        message: String,
    },
}
