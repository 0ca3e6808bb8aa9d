//! The dead-letter subject: a copy of each dead letter, besides the dead-letter table, on a
//! subject with a stream of its own. A copy the server refuses (too large) is sent again as a
//! reference without its payload, as on Kafka.

use async_nats::jetstream;
use async_nats::HeaderMap;

use super::headers::outgoing;
use crate::message::Delivery;

/// Publishes dead letters to a subject.
pub(super) struct DeadLetterSubject {
    pub(super) js: jetstream::Context,
    pub(super) subject: String,
    pub(super) group: String,
}

impl DeadLetterSubject {
    /// Creates the subject's stream unless it exists.
    pub(super) async fn ensure(&self) -> Result<(), String> {
        let config = jetstream::stream::Config {
            name: super::token(&self.subject),
            subjects: vec![self.subject.clone()],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        super::get_or_create_stream(&self.js, config)
            .await
            .map(|_| ())
            .map_err(|e| format!("dead-letter stream of {}: {e}", self.subject))
    }

    pub(super) async fn publish(&self, d: &Delivery, reason: &str, id: i64) {
        let payload = d.payload.clone().unwrap_or_default();
        let size = payload.len();
        if self.send(self.headers(d, reason, id, None), payload).await {
            return;
        }
        tracing::warn!(target: "inoutbox::nats", subject = %self.subject, at = %d.coordinates(),
            "dead letter not taken by its subject: publishing a reference to the dead-letter table instead");
        if !self
            .send(self.headers(d, reason, id, Some(size)), Vec::new())
            .await
        {
            tracing::error!(target: "inoutbox::nats", subject = %self.subject, at = %d.coordinates(),
                "dead letter not published to its subject; it is in the dead-letter table");
        }
    }

    async fn send(&self, headers: HeaderMap, payload: Vec<u8>) -> bool {
        match self
            .js
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await
        {
            Ok(ack) => ack.await.is_ok(),
            Err(_) => false,
        }
    }

    fn headers(&self, d: &Delivery, reason: &str, id: i64, omitted: Option<usize>) -> HeaderMap {
        let partition = d.partition.to_string();
        let offset = d.offset.to_string();
        let id = id.to_string();
        let omitted =
            omitted.map(|n| format!("{n} bytes, in the dead-letter table (inoutbox_dlq_id)"));
        let original = d.headers.iter().filter_map(|(name, value)| {
            let value = std::str::from_utf8(value.as_deref()?).ok()?;
            Some((name.as_str(), value))
        });
        let own = [
            ("inoutbox_dlq_reason", reason),
            ("inoutbox_dlq_group", self.group.as_str()),
            ("inoutbox_dlq_topic", &*d.topic),
            ("inoutbox_dlq_partition", partition.as_str()),
            ("inoutbox_dlq_offset", offset.as_str()),
            ("inoutbox_dlq_id", id.as_str()),
        ];
        let omitted = omitted
            .as_deref()
            .map(|text| ("inoutbox_dlq_payload_omitted", text));
        outgoing(original.chain(own).chain(omitted))
    }
}
