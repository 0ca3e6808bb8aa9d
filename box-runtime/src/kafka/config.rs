//! Settings of the Kafka consumer.

use std::time::Duration;

/// librdkafka settings every consumer starts with (see `docs/deployment.md`); `set` overrides
/// them.
///
/// librdkafka's defaults wait 60 s for a request's answer and 30 s for a new connection's
/// handshake. Across a partition or a half-open connection that is how long a member sits on
/// a dead connection after the network heals (its fetches and its group requests are stuck on
/// it), and a reconnection tried during the partition hangs as long again. 10 s each bounds
/// that; keepalives let the kernel find dead idle connections.
///
/// A partition paused because its task is busy is fetched again only after the fetch in
/// flight returns, and a broker holds a fetch for its whole wait when it has nothing new for
/// the partitions in it (librdkafka waits up to 500 ms): 100 ms keeps a draining partition fed,
/// at the cost of an empty fetch every 100 ms when idle.
pub(crate) const NETWORK_DEFAULTS: &[(&str, &str)] = &[
    ("socket.timeout.ms", "10000"),
    ("socket.connection.setup.timeout.ms", "10000"),
    ("socket.keepalive.enable", "true"),
    ("fetch.wait.max.ms", "100"),
];

/// What the partition runs of one consumer may hold by default: 64 MiB.
pub(crate) const DEFAULT_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// Settings of the Kafka consumer. Its `Debug` hides secret settings (`sasl.password`, ...:
/// see [`is_secret_setting`](crate::redact::is_secret_setting)) and URL passwords.
///
/// ```
/// let kafka = inoutbox::KafkaConfig::new("127.0.0.1:9092", ["orders"])
///     .set("session.timeout.ms", "6000")
///     .dead_letter_topic("orders.dlq");
/// assert_eq!(kafka.topics, ["orders"]);
/// ```
#[derive(Clone)]
#[non_exhaustive]
#[must_use]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// The Kafka consumer group id; defaults to the inbox group.
    pub group_id: Option<String>,
    /// librdkafka settings, applied last: inoutbox's network defaults first
    /// (`socket.timeout.ms=10000`, `socket.connection.setup.timeout.ms=10000`,
    /// `socket.keepalive.enable=true`, `fetch.wait.max.ms=100`; see `docs/deployment.md`),
    /// then those given to
    /// [`set`](Self::set), which override them.
    pub settings: Vec<(String, String)>,
    /// Messages buffered per partition before the consumer waits for the partition's task.
    pub partition_buffer: usize,
    /// Bytes of messages (payloads, keys, headers) the partition runs may hold together,
    /// buffered or in hand, before the consumer pauses the partitions whose next message would
    /// pass it (default 64 MiB). A partition whose run holds nothing always gets its next
    /// message, however large: one larger than the budget is handled alone, never stalled.
    pub buffer_bytes: usize,
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

/// Consumer settings for quick group joins on a development broker (Kafka, Redpanda or Tansu
/// on a laptop or in CI): a 6 s session instead of librdkafka's 45 s, with a heartbeat every
/// second, so that a member joins, rebalances and notices a dead member in seconds. Not for
/// production, where a member paused for 6 s (a long GC, a stalled disk, a busy node) would
/// lose its partitions: keep librdkafka's defaults there.
///
/// [`KafkaConfig::quick_join`] and [`ConsumerSpec::quick_join`](crate::app::ConsumerSpec::quick_join)
/// set them.
///
/// ```
/// let kafka = inoutbox::KafkaConfig::new("127.0.0.1:9092", ["orders"]).quick_join();
/// assert!(kafka.settings.iter().any(|(k, v)| k == "session.timeout.ms" && v == "6000"));
/// ```
pub const QUICK_JOIN: &[(&str, &str)] = &[
    ("session.timeout.ms", "6000"),
    ("heartbeat.interval.ms", "1000"),
];

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
            settings: NETWORK_DEFAULTS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            partition_buffer: 1000,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            dead_letter_topic: None,
            producer_settings: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    /// Also publishes dead letters to `topic`: the original key, payload and headers, plus
    /// `inoutbox_dlq_*` headers saying where the message came from and why it was given up.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// Sets a librdkafka setting of the dead-letter producer.
    pub fn set_producer(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_settings.push((key.into(), value.into()));
        self
    }

    /// Sets [`QUICK_JOIN`]: quick group joins on a development broker (not for production).
    pub fn quick_join(self) -> Self {
        QUICK_JOIN
            .iter()
            .fold(self, |kafka, (key, value)| kafka.set(*key, *value))
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

    /// Bytes of messages the partition runs may hold together (default 64 MiB; see
    /// [`buffer_bytes`](Self::buffer_bytes)). With librdkafka's own prefetch (16 MiB) and one
    /// message per partition in hand, it bounds what the consumer holds whatever the size of
    /// the messages.
    pub fn buffer_bytes(mut self, bytes: usize) -> Self {
        self.buffer_bytes = bytes;
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

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::redact::Settings;
        f.debug_struct("KafkaConfig")
            .field("brokers", &crate::store::redact_url(&self.brokers))
            .field("topics", &self.topics)
            .field("group_id", &self.group_id)
            .field("settings", &Settings(&self.settings))
            .field("partition_buffer", &self.partition_buffer)
            .field("buffer_bytes", &self.buffer_bytes)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("producer_settings", &Settings(&self.producer_settings))
            .field("startup_timeout", &self.startup_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_every_secret_setting() {
        let config = KafkaConfig::new("b:9092", ["t"])
            .set("sasl.password", "pw-consumer")
            .set("ssl.key.password", "pw-key")
            .set("sasl.oauthbearer.client.secret", "pw-oauth")
            .set("ssl.key.pem", "pw-pem")
            .set_producer("ssl.keystore.password", "pw-store")
            .set("sasl.username", "app");
        let debug = format!("{config:?} {config:#?}");
        assert!(!debug.contains("pw-"), "{debug}");
        assert!(
            debug.contains("sasl.username") && debug.contains("app"),
            "{debug}"
        );
        assert!(debug.contains("\"sasl.password\", \"***\""), "{debug}");
    }
}
