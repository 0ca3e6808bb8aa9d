//! The Kafka transport (rdkafka): a consumer group member that hands each partition to its own
//! task, commits offsets only for resolved messages of partitions it still owns, follows
//! rebalances and shuts down gracefully; and an in-process Kafka for zero-setup runs.
//!
//! - `config`: [`KafkaConfig`];
//! - `member`: joining the group, routing messages to partition tasks, leaving;
//! - `close`: the last commits made sure of, and librdkafka's close, within the grace;
//! - `ownership`: which partitions are owned since which rebalance; commits only while owned;
//! - `dead_letter`: the optional dead-letter topic;
//! - `in_process`: librdkafka's mock cluster;
//! - `topics`: creating topics on a broker outside (`App::create_topic`);
//! - `group_lag`: a group's lag read from outside it (`admin::consumer_lag`).
//!
//! rdkafka is named in this room only: the others reach the broker through what it exports.

mod budget;
mod close;
mod config;
mod dead_letter;
mod group_lag;
mod headers;
mod in_process;
mod lag;
mod member;
mod ownership;
mod producer;
mod topics;

pub use config::{KafkaConfig, QUICK_JOIN};
pub(crate) use group_lag::group_lag;
pub use group_lag::PartitionLag;
pub use in_process::InProcessKafka;
pub(crate) use in_process::CONSUMER_SETTINGS;
pub use producer::{is_message_error, KafkaProducer, KafkaPublisher};
pub(crate) use rdkafka::error::KafkaError;
pub(crate) use topics::create_topic;

/// `error` with secrets hidden: librdkafka's configuration errors quote the value they
/// refused, which for `ssl.key.password` and the like is the secret itself
/// ([`redact_setting`](crate::redact::redact_setting)).
pub(crate) fn redacted(error: KafkaError) -> KafkaError {
    match error {
        KafkaError::ClientConfig(code, description, key, value) => {
            let shown = crate::redact::redact_setting(&key, &value);
            let description = if shown == value || value.is_empty() {
                description
            } else {
                description.replace(&value, &shown)
            };
            KafkaError::ClientConfig(code, description, key, shown)
        }
        other => other,
    }
}

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
    /// librdkafka reported a fatal error: this client cannot go on (e.g. another member with
    /// the same `group.instance.id` fenced it).
    #[error("fatal Kafka consumer error ({code}): {reason}")]
    Fatal {
        /// librdkafka's error code.
        code: String,
        /// librdkafka's description.
        reason: String,
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

#[cfg(test)]
mod tests {
    use crate::transport::IntoPublisher;

    #[test]
    fn a_refused_secret_setting_is_not_quoted_in_the_error() {
        for key in ["ssl.key.password", "sasl.password", "my.client.secret"] {
            let error = super::KafkaProducer::new("127.0.0.1:1")
                .set(key, "hunter2-not-shown")
                .set("ssl.key.location", "/nonexistent/key.pem")
                .set("security.protocol", "ssl")
                .into_publisher()
                .err()
                .unwrap_or_else(|| panic!("{key}: the producer was created"));
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("hunter2"), "{key}: {shown}");
        }
    }
}
