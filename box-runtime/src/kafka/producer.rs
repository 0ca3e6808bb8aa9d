//! The relay's side of Kafka: [`KafkaProducer`] (the settings) creates a [`KafkaPublisher`]
//! (an rdkafka `FutureProducer`) that implements [`Publisher`].

use std::future::Future;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

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
        let producer = self.client_config().create().map_err(|e| {
            let brokers = crate::store::redact_url(&self.brokers);
            let e = super::redacted(e);
            PublishError::rejected(format!("cannot create a Kafka producer for {brokers}: {e}"))
        })?;
        Ok(KafkaPublisher { producer })
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
pub struct KafkaPublisher {
    producer: FutureProducer,
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
        let delivery = self
            .producer
            .send_result(record)
            .map_err(|(e, _)| publish_error(e))?;
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
