//! Consumer lag as seen from outside the group: each group's committed offset against the
//! partition's high watermark, for `inoutbox::admin::consumer_lag`.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// How far one consumer group is behind on one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionLag {
    /// The Kafka consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset (the next message it will read).
    pub committed: i64,
    /// The partition's high watermark (the offset the next message will get).
    pub high_watermark: i64,
    /// Messages not yet consumed: `high_watermark - committed`.
    pub lag: i64,
}

/// The lag of `group` on every partition where it has a committed offset, asking the brokers at
/// `brokers` with the extra librdkafka `settings`; each request waits at most `timeout`. Blocks:
/// call it on a blocking thread.
pub(crate) fn group_lag(
    brokers: &str,
    group: &str,
    settings: &[(String, String)],
    timeout: Duration,
) -> Result<Vec<PartitionLag>, KafkaError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    for (k, v) in settings {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().map_err(super::redacted)?;
    let metadata = consumer.fetch_metadata(None, timeout)?;
    let mut partitions = TopicPartitionList::new();
    for topic in metadata.topics() {
        if topic.name().starts_with("__") {
            continue;
        }
        for p in topic.partitions() {
            partitions.add_partition(topic.name(), p.id());
        }
    }
    if partitions.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer.committed_offsets(partitions, timeout)?;
    let mut lags = Vec::new();
    for e in committed.elements() {
        let Offset::Offset(at) = e.offset() else {
            continue;
        };
        let (_, high) = consumer.fetch_watermarks(e.topic(), e.partition(), timeout)?;
        lags.push(PartitionLag {
            group: group.to_owned(),
            topic: e.topic().to_owned(),
            partition: e.partition(),
            committed: at,
            high_watermark: high,
            lag: (high - at).max(0),
        });
    }
    Ok(lags)
}
