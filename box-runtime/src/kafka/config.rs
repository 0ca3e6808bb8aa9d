//! Settings of the Kafka consumer.

use std::time::Duration;

/// Settings of the Kafka consumer.
///
/// ```
/// let kafka = txbox::KafkaConfig::new("127.0.0.1:9092", ["orders"])
///     .set("session.timeout.ms", "6000")
///     .dead_letter_topic("orders.dlq");
/// assert_eq!(kafka.topics, ["orders"]);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// The Kafka consumer group id; defaults to the inbox group.
    pub group_id: Option<String>,
    /// Extra librdkafka settings, applied last.
    pub settings: Vec<(String, String)>,
    /// Messages buffered per partition before the consumer waits for the partition's task.
    pub partition_buffer: usize,
    /// Where dead letters are also published (besides the dead-letter table), if anywhere.
    pub dead_letter_topic: Option<String>,
    /// librdkafka settings of the dead-letter producer (e.g. `enable.idempotence=false` for
    /// brokers without idempotent producers).
    pub producer_settings: Vec<(String, String)>,
    /// How long the consumer waits at start-up for a broker to answer before it fails
    /// (default 30 s). After start-up it retries without limit.
    pub startup_timeout: Duration,
    /// How long a graceful stop waits for the messages in hand (default 30 s); a handler
    /// still running then is abandoned: its transaction rolls back and its offset is not
    /// committed, so the next owner of the partition processes it.
    pub shutdown_grace: Duration,
}

impl KafkaConfig {
    /// Consume `topics` from `brokers`.
    pub fn new(
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            brokers: brokers.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            group_id: None,
            settings: Vec::new(),
            partition_buffer: 1000,
            dead_letter_topic: None,
            producer_settings: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    /// Also publishes dead letters to `topic`: the original key, payload and headers, plus
    /// `txbox_dlq_*` headers saying where the message came from and why it was given up.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// Sets a librdkafka setting of the dead-letter producer.
    pub fn set_producer(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_settings.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka setting (e.g. `session.timeout.ms`).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Messages buffered per partition before the partition is paused (default 1000).
    pub fn partition_buffer(mut self, messages: usize) -> Self {
        self.partition_buffer = messages.max(1);
        self
    }

    /// How long start-up waits for a broker to answer (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// How long a graceful stop waits for the messages in hand (default 30 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Overrides the Kafka group id.
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }
}
