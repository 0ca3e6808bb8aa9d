//! One batch: produce its rows in order, wait for every delivery report, mark the delivered
//! rows (one statement) and record the failures (one statement).

use std::collections::HashSet;
use std::time::SystemTime;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord};
use uuid::Uuid;

use super::run::Shared;
use super::{is_message_error, Failure, PendingRow, RelayReport, RelaySession, RelayStore};
use crate::names;
use crate::store::StoreError;
use super::telemetry::TopicMetrics;

impl<S: RelayStore> Shared<S> {
    /// Publishes `rows` (a worker's batch, in the order read) and records the outcome.
    pub(super) async fn publish(
        &self,
        session: &mut S::Session,
        rows: &[PendingRow],
    ) -> Result<(), StoreError> {
        // Keys whose row could not even be handed to librdkafka: their later rows wait.
        let mut blocked: HashSet<(&str, &str)> = HashSet::new();
        let mut in_flight = Vec::with_capacity(rows.len());
        let mut failures: Vec<(&PendingRow, KafkaError)> = Vec::new();
        for row in rows {
            let key = row.key.as_deref();
            if let Some(k) = key.filter(|_| !blocked.is_empty()) {
                if blocked.contains(&(row.topic.as_str(), k)) {
                    continue;
                }
            }
            match self.send(row) {
                Ok(delivery) => in_flight.push((row, delivery)),
                Err(e) => {
                    if let Some(k) = key {
                        blocked.insert((row.topic.as_str(), k));
                    }
                    failures.push((row, e));
                }
            }
        }
        let mut published = Vec::with_capacity(in_flight.len());
        // The topic handles of the last row: a batch is mostly of one topic.
        let mut topic: Option<(&str, TopicMetrics)> = None;
        for (row, delivery) in in_flight {
            match delivery.await {
                Ok(Ok(d)) => {
                    published.push(row.id);
                    if topic.as_ref().is_none_or(|(t, _)| *t != row.topic) {
                        topic = Some((&row.topic, self.telemetry.topic(&row.topic)));
                    }
                    if let Some((_, metrics)) = &topic {
                        metrics.published(&row.id);
                    }
                    if self.reports.is_some() {
                        self.report(RelayReport::Published {
                            id: row.id,
                            topic: row.topic.clone(),
                            key: row.key.clone(),
                            partition: d.partition,
                            offset: d.offset,
                            acked_at: SystemTime::now(),
                        });
                    }
                }
                Ok(Err((e, _))) => failures.push((row, e)),
                Err(_canceled) => failures.push((row, KafkaError::Canceled)),
            }
        }
        if !published.is_empty() {
            crate::failpoint::hit("relay_after_publish").await;
            session.mark_published(&published).await?;
        }
        if !failures.is_empty() {
            self.record_failures(session, failures).await?;
        }
        Ok(())
    }

    /// Records the first failure of each key (its later rows wait behind it; they count no
    /// attempt of their own).
    async fn record_failures(
        &self,
        session: &mut S::Session,
        mut failures: Vec<(&PendingRow, KafkaError)>,
    ) -> Result<(), StoreError> {
        failures.sort_by_key(|(row, _)| row.seq);
        let mut seen = HashSet::new();
        failures.retain(|(row, _)| seen.insert(row.key_ref()));
        let messages: Vec<(String, bool)> = failures
            .iter()
            .map(|(row, error)| {
                let attempts = u32::try_from(row.attempts).unwrap_or(0) + 1;
                let park = is_message_error(error) && attempts >= self.config.max_attempts;
                let message = format!(
                    "publishing event {} ({}) to topic `{}` failed: {error}",
                    row.id, row.event_type, row.topic
                );
                tracing::warn!(target: "inoutbox::relay", id = %row.id, attempts, parked = park, "{message}");
                (message, park)
            })
            .collect();
        let records: Vec<Failure<'_>> = failures
            .iter()
            .zip(&messages)
            .map(|((row, _), (message, park))| Failure {
                row,
                error: message,
                park: *park,
                backoff: self
                    .config
                    .backoff
                    .delay(u32::try_from(row.attempts).unwrap_or(0) + 1),
            })
            .collect();
        session.record_failures(&records).await?;
        for ((row, _), (message, park)) in failures.iter().zip(messages) {
            if park {
                self.telemetry.topic(&row.topic).parked();
            }
            self.report(RelayReport::Failed {
                id: row.id,
                error: message,
                parked: park,
            });
        }
        Ok(())
    }

    fn send(&self, row: &PendingRow) -> Result<DeliveryFuture, KafkaError> {
        let mut id = Uuid::encode_buffer();
        let id = row.id.hyphenated().encode_lower(&mut id);
        let mut headers = OwnedHeaders::new_with_capacity(5 + row.headers.len())
            .insert(Header {
                key: names::HEADER_ID,
                value: Some(&*id),
            })
            .insert(Header {
                key: names::HEADER_TYPE,
                value: Some(row.event_type.as_str()),
            })
            .insert(Header {
                key: names::HEADER_SOURCE,
                value: Some(self.config.source.as_str()),
            })
            .insert(Header {
                key: names::HEADER_SPECVERSION,
                value: Some(names::SPECVERSION),
            })
            .insert(Header {
                key: names::HEADER_CONTENT_TYPE,
                value: Some(names::CONTENT_TYPE_JSON),
            });
        for (k, v) in &row.headers {
            headers = headers.insert(Header {
                key: k.as_str(),
                value: Some(v.as_str()),
            });
        }
        let mut record: FutureRecord<'_, str, str> = FutureRecord::to(&row.topic)
            .payload(row.payload.as_str())
            .headers(headers);
        if let Some(key) = &row.key {
            record = record.key(key.as_str());
        }
        self.producer.send_result(record).map_err(|(e, _)| e)
    }
}
