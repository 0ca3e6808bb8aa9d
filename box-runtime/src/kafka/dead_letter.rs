//! The dead-letter topic: a copy of each dead letter, besides the dead-letter table.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::backoff::Backoff;
use crate::message::Delivery;

/// Publishes dead letters to a topic, besides the dead-letter table.
pub(super) struct DeadLetterTopic {
    pub(super) producer: FutureProducer,
    pub(super) topic: String,
    pub(super) group: String,
}

impl DeadLetterTopic {
    pub(super) async fn publish(&self, d: &Delivery, reason: &str, id: i64) {
        let mut headers = OwnedHeaders::new_with_capacity(d.headers.len() + 6);
        for (name, value) in &d.headers {
            headers = headers.insert(Header {
                key: name.as_str(),
                value: value.as_deref(),
            });
        }
        let partition = d.partition.to_string();
        let offset = d.offset.to_string();
        let id = id.to_string();
        for (key, value) in [
            ("inoutbox_dlq_reason", reason),
            ("inoutbox_dlq_group", self.group.as_str()),
            ("inoutbox_dlq_topic", &*d.topic),
            ("inoutbox_dlq_partition", partition.as_str()),
            ("inoutbox_dlq_offset", offset.as_str()),
            ("inoutbox_dlq_id", id.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).start();
        // The dead-letter table already holds the message: the topic is a copy, so a broker that
        // refuses it for long is logged, not waited on forever.
        for attempt in 1..=5 {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&self.topic).headers(headers.clone());
            if let Some(key) = &d.key {
                record = record.key(key.as_slice());
            }
            if let Some(payload) = &d.payload {
                record = record.payload(payload.as_slice());
            }
            match self.producer.send(record, Duration::from_secs(10)).await {
                Ok(_) => return,
                Err((e, _)) => {
                    tracing::warn!(target: "inoutbox::kafka", topic = %self.topic, attempt, error = %e, "publishing a dead letter failed");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
        tracing::error!(target: "inoutbox::kafka", topic = %self.topic, at = %d.coordinates(),
            "dead letter not published to the topic after 5 attempts; it is in the dead-letter table");
    }
}
