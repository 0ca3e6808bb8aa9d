//! The relay side of the contract.

use std::future::Future;

use crate::names;

/// A broker's producer side: publishes the relay's messages.
///
/// The relay hands a batch's messages to [`send`](Publisher::send) one after another, in the
/// order they must reach the broker, then awaits every acknowledgement before it marks the
/// rows published. A publisher must therefore keep the order of the messages it is handed for
/// one topic and key while they are in flight (Kafka: one partition per key, and retries that
/// cannot reorder).
///
/// `Relay::builder(store, publisher)` takes any [`IntoPublisher`]; Kafka's is
/// [`KafkaProducer`](crate::kafka::KafkaProducer).
pub trait Publisher: Send + Sync + 'static {
    /// Queues `message` for the broker without waiting for it. The returned future completes
    /// when the broker has the message ([`Receipt`]) or refused it. `Err` at once means the
    /// message could not even be queued: the relay then holds back the later messages of its
    /// key until the next attempt.
    fn send(
        &self,
        message: &OutgoingMessage<'_>,
    ) -> Result<
        impl Future<Output = Result<Receipt, PublishError>> + Send + 'static + use<Self>,
        PublishError,
    >;
}

/// What a relay is built with: a [`Publisher`], or a configuration that creates one
/// ([`KafkaProducer`](crate::kafka::KafkaProducer)).
pub trait IntoPublisher {
    /// The publisher.
    type Publisher: Publisher;

    /// Creates the publisher (a client, its connections); fails on a bad setting.
    fn into_publisher(self) -> Result<Self::Publisher, PublishError>;
}

impl<P: Publisher> IntoPublisher for P {
    type Publisher = P;

    fn into_publisher(self) -> Result<P, PublishError> {
        Ok(self)
    }
}

/// One message the relay publishes: an outbox row as a CloudEvent in binary mode.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct OutgoingMessage<'a> {
    /// The topic (or subject).
    pub topic: &'a str,
    /// The key: messages of one key keep their order.
    pub key: Option<&'a str>,
    /// The payload (JSON).
    pub payload: &'a [u8],
    /// The event id (`ce_id`).
    pub id: &'a str,
    /// The event type (`ce_type`).
    pub event_type: &'a str,
    /// The producing service (`ce_source`).
    pub source: &'a str,
    /// The row's own headers (trace context, ...), after the CloudEvents attributes.
    pub extra_headers: &'a [(String, String)],
}

impl<'a> OutgoingMessage<'a> {
    /// A message to `topic` without a key or headers of its own (for a publisher's tests; the
    /// relay fills every field from the outbox row).
    pub fn new(
        topic: &'a str,
        payload: &'a [u8],
        id: &'a str,
        event_type: &'a str,
        source: &'a str,
    ) -> Self {
        Self {
            topic,
            key: None,
            payload,
            id,
            event_type,
            source,
            extra_headers: &[],
        }
    }

    /// The same message with `key`.
    pub fn with_key(mut self, key: &'a str) -> Self {
        self.key = Some(key);
        self
    }

    /// The same message with the row's own headers.
    pub fn with_headers(mut self, headers: &'a [(String, String)]) -> Self {
        self.extra_headers = headers;
        self
    }

    /// Every header, in the order they are sent: `ce_id`, `ce_type`, `ce_source`,
    /// `ce_specversion`, `content-type`, then the row's own.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let extra = self.extra_headers;
        self.attributes()
            .into_iter()
            .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// The number of headers [`headers`](Self::headers) yields.
    pub fn header_count(&self) -> usize {
        self.attributes().len() + self.extra_headers.len()
    }

    /// The CloudEvents attributes, as headers.
    fn attributes(&self) -> [(&'a str, &'a str); 5] {
        [
            (names::HEADER_ID, self.id),
            (names::HEADER_TYPE, self.event_type),
            (names::HEADER_SOURCE, self.source),
            (names::HEADER_SPECVERSION, names::SPECVERSION),
            (names::HEADER_CONTENT_TYPE, names::CONTENT_TYPE_JSON),
        ]
    }
}

/// Where the broker stored a published message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Receipt {
    /// The partition (0 for a broker without partitions).
    pub partition: i32,
    /// The offset in the partition, or the stream's sequence number.
    pub offset: i64,
}

impl Receipt {
    /// A receipt for `offset` in `partition`.
    pub fn new(partition: i32, offset: i64) -> Self {
        Self { partition, offset }
    }
}

/// Why a message was not published.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct PublishError {
    rejected: bool,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl PublishError {
    /// The broker refused the message itself (too large, unknown topic, not authorised):
    /// retrying the same message will not help, so after its attempts the row is parked.
    pub fn rejected(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            rejected: true,
            source: error.into(),
        }
    }

    /// The broker was unreachable, slow or refused for a passing reason: the row is retried
    /// with backoff, for ever (never parked).
    pub fn unavailable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            rejected: false,
            source: error.into(),
        }
    }

    /// Whether the message itself was refused (see [`PublishError::rejected`]).
    pub fn is_rejected(&self) -> bool {
        self.rejected
    }
}

#[cfg(test)]
mod tests {
    use super::OutgoingMessage;

    #[test]
    fn the_cloudevents_attributes_come_first_then_the_rows_own_headers() {
        let extra = [("traceparent".to_owned(), "00-ab-cd-01".to_owned())];
        let message = OutgoingMessage::new("orders", b"{}", "id-1", "OrderCreated", "shop")
            .with_key("k")
            .with_headers(&extra);
        let headers: Vec<_> = message.headers().collect();
        assert_eq!(headers.len(), message.header_count());
        assert_eq!(
            headers,
            [
                ("ce_id", "id-1"),
                ("ce_type", "OrderCreated"),
                ("ce_source", "shop"),
                ("ce_specversion", "1.0"),
                ("content-type", "application/json"),
                ("traceparent", "00-ab-cd-01"),
            ]
        );
    }
}
