//! An in-process Kafka: librdkafka's mock cluster, for zero-setup runs and tests that only need
//! Kafka semantics. Not durable: it lives and dies with the process, and keeps at most a few
//! MiB per partition.

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::{BaseProducer, Producer};

/// A mock Kafka cluster inside this process, tuned for quick group joins.
///
/// ```no_run
/// let kafka = inoutbox::kafka::InProcessKafka::start()?;
/// kafka.create_topic("orders", 3)?;
/// let brokers = kafka.brokers(); // give this to consumers and producers as bootstrap.servers
/// # Ok::<(), rdkafka::error::KafkaError>(())
/// ```
pub struct InProcessKafka {
    /// The client that owns the mock cluster; the cluster lives as long as it does.
    owner: BaseProducer,
    brokers: String,
}

impl std::fmt::Debug for InProcessKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessKafka")
            .field("brokers", &self.brokers)
            .finish()
    }
}

/// Consumer settings that suit the in-process cluster: quick joins and rebalances.
pub(crate) const CONSUMER_SETTINGS: &[(&str, &str)] = &[
    ("session.timeout.ms", "1500"),
    ("heartbeat.interval.ms", "300"),
    // The mock cluster answers a fetch only when its wait ends, not when a message arrives:
    // a short wait keeps light traffic from waiting up to librdkafka's 500 ms default.
    ("fetch.wait.max.ms", "10"),
];

impl InProcessKafka {
    /// Starts a one-broker mock cluster with no initial rebalance delay.
    pub fn start() -> KafkaResult<Self> {
        let owner: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .create()?;
        // SAFETY: the handle belongs to `owner`, which is alive; the call only sets a number.
        unsafe {
            let cluster =
                rdkafka::bindings::rd_kafka_handle_mock_cluster(owner.client().native_ptr());
            if !cluster.is_null() {
                rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, 0);
            }
        }
        let brokers = owner
            .client()
            .mock_cluster()
            .map(|c| c.bootstrap_servers())
            .ok_or(rdkafka::error::KafkaError::MockCluster(
                rdkafka::types::RDKafkaErrorCode::Fail,
            ))?;
        Ok(Self { owner, brokers })
    }

    /// The bootstrap servers of the cluster.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The librdkafka consumer settings this cluster needs (short session timeouts, frequent
    /// metadata refreshes), for a consumer of your own; [`consumer_config`](Self::consumer_config)
    /// applies them.
    pub fn consumer_settings() -> &'static [(&'static str, &'static str)] {
        CONSUMER_SETTINGS
    }

    /// A consumer of `topics` on this cluster, with the settings the mock cluster needs
    /// (short session timeouts, frequent metadata refreshes).
    pub fn consumer_config(
        &self,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> super::KafkaConfig {
        CONSUMER_SETTINGS.iter().fold(
            super::KafkaConfig::new(self.brokers.clone(), topics),
            |config, (k, v)| config.set(*k, *v),
        )
    }

    /// Creates a topic (producing to an unknown topic also creates one, with 4 partitions).
    pub fn create_topic(&self, topic: &str, partitions: i32) -> KafkaResult<()> {
        match self.owner.client().mock_cluster() {
            Some(cluster) => cluster.create_topic(topic, partitions, 1),
            None => Err(rdkafka::error::KafkaError::MockCluster(
                rdkafka::types::RDKafkaErrorCode::Fail,
            )),
        }
    }
}
