//! The dead-letter topic: a copy of each dead letter, besides the dead-letter table.
//!
//! The table holds the whole message; the topic gets a copy. A copy that the producer or the
//! broker refuses as too large (a payload over `message.max.bytes`, 1 MB by default) is sent
//! again as a reference: the same key and headers, no payload, and headers that say how large
//! the payload was and that the dead-letter table holds it (with the letter's id).

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::headers;
use crate::backoff::Backoff;
use crate::message::Delivery;
use crate::store::text::header_name_bytes;

/// Attempts at publishing one copy.
const ATTEMPTS: u32 = 5;

/// Publishes dead letters to a topic, besides the dead-letter table.
pub(super) struct DeadLetterTopic {
    pub(super) producer: FutureProducer,
    pub(super) topic: String,
    pub(super) group: String,
}

/// What became of a dead letter's copy on the topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Copied {
    /// The whole message.
    Whole,
    /// A reference: the message without its payload, which was too large for the topic.
    Reference,
    /// Nothing: the broker refused it every time (the dead-letter table has it).
    Not,
}

/// Is `e` a refusal of the message's size (by the producer or by the broker)?
fn too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

impl DeadLetterTopic {
    pub(super) async fn publish(&self, d: &Delivery, reason: &str, id: i64) -> Copied {
        let whole = self.headers(d, reason, id, None);
        match self.send(d, &whole, d.payload.as_deref()).await {
            Ok(()) => return Copied::Whole,
            Err(Some(e)) if too_large(&e) => {
                tracing::warn!(target: "inoutbox::kafka", topic = %self.topic, at = %d.coordinates(), error = %e,
                    "dead letter too large for its topic: publishing a reference to the dead-letter table instead");
            }
            Err(_) => return self.gave_up(d),
        }
        let size = d.payload.as_ref().map_or(0, Vec::len);
        let reference = self.headers(d, reason, id, Some(size));
        match self.send(d, &reference, None).await {
            Ok(()) => Copied::Reference,
            Err(_) => self.gave_up(d),
        }
    }

    fn gave_up(&self, d: &Delivery) -> Copied {
        tracing::error!(target: "inoutbox::kafka", topic = %self.topic, at = %d.coordinates(),
            "dead letter not published to the topic after {ATTEMPTS} attempts; it is in the dead-letter table");
        Copied::Not
    }

    /// The message's headers (names as the bytes they arrived as), then the letter's own;
    /// `omitted`: the size of a payload left out.
    fn headers(&self, d: &Delivery, reason: &str, id: i64, omitted: Option<usize>) -> OwnedHeaders {
        let partition = d.partition.to_string();
        let offset = d.offset.to_string();
        let id = id.to_string();
        let omitted =
            omitted.map(|n| format!("{n} bytes, in the dead-letter table (inoutbox_dlq_id)"));
        let names: Vec<_> = d
            .headers
            .iter()
            .map(|(n, _)| header_name_bytes(n))
            .collect();
        let ours = [
            ("inoutbox_dlq_reason", Some(reason)),
            ("inoutbox_dlq_group", Some(self.group.as_str())),
            ("inoutbox_dlq_topic", Some(&*d.topic)),
            ("inoutbox_dlq_partition", Some(partition.as_str())),
            ("inoutbox_dlq_offset", Some(offset.as_str())),
            ("inoutbox_dlq_id", Some(id.as_str())),
            ("inoutbox_dlq_payload_omitted", omitted.as_deref()),
        ];
        let all =
            names
                .iter()
                .zip(&d.headers)
                .map(|(name, (_, value))| (&**name, value.as_deref()))
                .chain(ours.into_iter().filter_map(|(name, value)| {
                    value.map(|v| (name.as_bytes(), Some(v.as_bytes())))
                }));
        headers::owned(all, d.headers.len() + ours.len())
    }

    /// Sends one copy, up to [`ATTEMPTS`] times; a refusal of its size is not tried again.
    async fn send(
        &self,
        d: &Delivery,
        headers: &OwnedHeaders,
        payload: Option<&[u8]>,
    ) -> Result<(), Option<KafkaError>> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).start();
        // The dead-letter table already holds the message: the topic is a copy, so a broker that
        // refuses it for long is logged, not waited on forever.
        for attempt in 1..=ATTEMPTS {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&self.topic).headers(headers.clone());
            if let Some(key) = &d.key {
                record = record.key(key.as_slice());
            }
            if let Some(payload) = payload {
                record = record.payload(payload);
            }
            match self.producer.send(record, Duration::from_secs(10)).await {
                Ok(_) => return Ok(()),
                Err((e, _)) if too_large(&e) => return Err(Some(e)),
                Err((e, _)) => {
                    tracing::warn!(target: "inoutbox::kafka", topic = %self.topic, attempt, error = %e, "publishing a dead letter failed");
                    if attempt < ATTEMPTS {
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                }
            }
        }
        Err(None)
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::config::ClientConfig;

    use super::*;
    use crate::kafka::InProcessKafka;

    fn letter(payload: usize) -> Delivery {
        Delivery {
            topic: "orders".into(),
            partition: 0,
            offset: 7,
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'x'; payload]),
            // A name with a NUL, as the consumer writes it.
            headers: vec![("a\\x00b".to_owned(), Some(b"v".to_vec()))],
        }
    }

    #[tokio::test]
    async fn a_dead_letter_too_large_for_its_topic_is_copied_as_a_reference() {
        let kafka = InProcessKafka::start().expect("mock cluster");
        kafka.create_topic("orders.dlq", 1).expect("topic");
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", kafka.brokers())
            .create()
            .expect("producer");
        let topic = DeadLetterTopic {
            producer,
            topic: "orders.dlq".to_owned(),
            group: "billing".to_owned(),
        };
        // Over the producer's default `message.max.bytes` (1 MB).
        let copied = topic.publish(&letter(1_500_000), "bad payload", 1).await;
        assert_eq!(copied, Copied::Reference);
        let copied = topic.publish(&letter(100), "bad payload", 2).await;
        assert_eq!(copied, Copied::Whole);
    }
}
