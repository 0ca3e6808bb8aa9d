//! The relay's side of Kafka: [`KafkaProducer`] (the settings) creates a [`KafkaPublisher`]
//! (an rdkafka `FutureProducer`) that implements [`Publisher`].

use std::future::Future;
use std::sync::{Arc, Mutex};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::redact::Settings;
use crate::relay::RelayBuilder;
use crate::transport::{IntoPublisher, OutgoingMessage, PublishError, Publisher, Receipt};

/// Settings of the relay's Kafka producer: `Relay::builder(store, KafkaProducer::new(brokers))`.
/// Its `Debug` hides secret settings (see
/// [`is_secret_setting`](crate::redact::is_secret_setting)) and URL passwords.
///
/// ```
/// let producer = inoutbox::kafka::KafkaProducer::new("127.0.0.1:9092")
///     .idempotence(false) // Tansu rejects the idempotent producer
///     .set("linger.ms", "5");
/// assert_eq!(producer.brokers(), "127.0.0.1:9092");
/// ```
#[derive(Clone)]
#[must_use]
pub struct KafkaProducer {
    brokers: String,
    idempotence: bool,
    settings: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaProducer")
            .field("brokers", &crate::store::redact_url(&self.brokers))
            .field("idempotence", &self.idempotence)
            .field("settings", &Settings(&self.settings))
            .finish()
    }
}

impl KafkaProducer {
    /// A producer for `brokers` (`bootstrap.servers`), idempotent, acknowledged by all
    /// in-sync replicas.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            idempotence: true,
            settings: Vec::new(),
        }
    }

    /// `bootstrap.servers`.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Whether to use the idempotent producer (default true). Tansu rejects it: use `false`.
    pub fn idempotence(mut self, on: bool) -> Self {
        self.idempotence = on;
        self
    }

    /// Sets a librdkafka producer setting (applied after the relay's own).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// The librdkafka configuration of the producer.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("acks", "all")
            .set("enable.idempotence", self.idempotence.to_string())
            .set("linger.ms", "1")
            .set("message.timeout.ms", "30000");
        if !self.idempotence {
            // Without idempotence, one request in flight keeps retries from reordering.
            c.set("max.in.flight.requests.per.connection", "1");
        }
        for (k, v) in &self.settings {
            c.set(k, v);
        }
        c
    }
}

impl IntoPublisher for KafkaProducer {
    type Publisher = KafkaPublisher;

    fn into_publisher(self) -> Result<KafkaPublisher, PublishError> {
        let config = self.client_config();
        let producer = config.create().map_err(|e| {
            let brokers = crate::store::redact_url(&self.brokers);
            let e = super::redacted(e);
            PublishError::rejected(format!("cannot create a Kafka producer for {brokers}: {e}"))
        })?;
        Ok(KafkaPublisher {
            producer: Mutex::new(Arc::new(producer)),
            config,
        })
    }
}

/// The Kafka settings of a relay built with a [`KafkaProducer`].
impl<S> RelayBuilder<S, KafkaProducer> {
    /// Whether to use the idempotent producer (default true). Tansu rejects it: use `false`.
    pub fn idempotence(mut self, on: bool) -> Self {
        self.publisher = self.publisher.idempotence(on);
        self
    }

    /// Sets a librdkafka setting of the relay's producer (applied after the relay's own).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.publisher = self.publisher.set(key, value);
        self
    }
}

/// The relay's Kafka producer: queues each message with librdkafka and resolves when its
/// delivery report arrives.
///
/// A producer that librdkafka declares fatally failed (an idempotent producer whose sequence
/// the broker no longer accepts, a fenced producer) refuses every message for ever: the
/// publisher then replaces it with a new one, and the messages it refused are retried by the
/// relay like any unavailable broker's.
pub struct KafkaPublisher {
    producer: Mutex<Arc<FutureProducer>>,
    /// To create the next producer after a fatal error.
    config: ClientConfig,
}

impl KafkaPublisher {
    /// The producer in use.
    fn producer(&self) -> Arc<FutureProducer> {
        self.producer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces `failed` with a new producer if it has a fatal error and is still the one in
    /// use. The old one is dropped on a thread of its own (dropping waits for its queue).
    fn recover(&self, failed: &Arc<FutureProducer>) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut current = self
            .producer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !Arc::ptr_eq(&current, failed) {
            return;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::error!(target: "inoutbox::kafka", ?code, reason,
                    "fatal Kafka producer error; the producer is replaced by a new one");
                let old = std::mem::replace(&mut *current, Arc::new(fresh));
                let _ = std::thread::Builder::new()
                    .name("kafka-prod-drop".to_owned())
                    .spawn(move || drop(old));
            }
            Err(error) => {
                tracing::error!(target: "inoutbox::kafka", ?code, reason, %error,
                    "fatal Kafka producer error, and a new producer cannot be created");
            }
        }
    }
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}

impl Publisher for KafkaPublisher {
    fn send(
        &self,
        message: &OutgoingMessage<'_>,
    ) -> Result<
        impl Future<Output = Result<Receipt, PublishError>> + Send + 'static + use<>,
        PublishError,
    > {
        let mut headers = OwnedHeaders::new_with_capacity(message.header_count());
        for (key, value) in message.headers() {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(message.topic)
            .payload(message.payload)
            .headers(headers);
        if let Some(key) = message.key {
            record = record.key(key);
        }
        let producer = self.producer();
        let delivery = match producer.send_result(record) {
            Ok(delivery) => delivery,
            Err((e, _)) => {
                self.recover(&producer);
                return Err(publish_error(e));
            }
        };
        // A fatal error also fails the messages in flight: the next send replaces the producer.
        Ok(async move {
            match delivery.await {
                Ok(Ok(d)) => Ok(Receipt::new(d.partition, d.offset)),
                Ok(Err((e, _))) => Err(publish_error(e)),
                Err(_canceled) => Err(publish_error(KafkaError::Canceled)),
            }
        })
    }
}

fn publish_error(error: KafkaError) -> PublishError {
    if is_message_error(&error) {
        PublishError::rejected(error)
    } else {
        PublishError::unavailable(error)
    }
}

/// Whether a produce error is about the message itself (retrying the same message will not
/// help), as opposed to the broker being unreachable or slow.
pub fn is_message_error(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidRecord
                | C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::UnknownPartition
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
        )
    )
}

#[cfg(test)]
mod tests {
    use super::KafkaProducer;
    use crate::transport::{IntoPublisher, OutgoingMessage, Publisher};
    use rdkafka::producer::Producer;

    /// An idempotent producer that librdkafka declares fatally failed refuses every message
    /// for ever; the publisher replaces it, so the relay's next attempt goes through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producer_with_a_fatal_error_is_replaced_and_publishing_goes_on() {
        let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("orders", 1, 1).expect("topic");
        let publisher = KafkaProducer::new(cluster.bootstrap_servers())
            .into_publisher()
            .expect("publisher");
        let message = OutgoingMessage::new("orders", b"{}", "id-1", "OrderCreated", "shop");
        let first = publisher.send(&message).expect("queued").await;
        assert!(first.is_ok(), "{first:?}");

        let failed = publisher.producer();
        // SAFETY: the handle belongs to `failed`, alive here; librdkafka copies the reason.
        let raised = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                failed.client().native_ptr(),
                rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                c"a test's fatal error".as_ptr(),
            )
        };
        assert_eq!(
            raised,
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        );
        assert!(failed.client().fatal_error().is_some());
        drop(failed);

        // The relay retries a refused row: within a few attempts it is published.
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let outcome = match publisher.send(&message) {
                Ok(delivery) => delivery.await,
                Err(e) => Err(e),
            };
            let published = outcome.is_ok();
            outcomes.push(outcome);
            if published {
                break;
            }
        }
        assert!(
            outcomes.last().is_some_and(Result::is_ok),
            "publishing never recovered from the fatal error: {outcomes:?}"
        );
        assert!(publisher.producer().client().fatal_error().is_none());
    }

    #[test]
    fn debug_hides_every_secret_setting() {
        let mut producer = KafkaProducer::new("b:9092");
        for (k, v) in [
            ("sasl.password", "pw-sasl"),
            ("ssl.key.password", "pw-key"),
            ("ssl.keystore.password", "pw-store"),
            ("sasl.oauthbearer.client.secret", "pw-oauth"),
            ("ssl.key.pem", "pw-pem"),
            ("security.protocol", "SASL_SSL"),
        ] {
            producer = producer.set(k, v);
        }
        let debug = format!("{producer:?} {producer:#?}");
        assert!(!debug.contains("pw-"), "{debug}");
        assert!(debug.contains("SASL_SSL"), "{debug}");
    }
}
