//! One relay cycle: claim keys, publish their rows in order, mark them, release the keys.

use std::time::SystemTime;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use super::{
    is_message_error, CycleStats, Failure, KeyRef, PendingRow, Relay, RelayReport, RelayStore,
};
use crate::names;
use crate::store::StoreError;

impl<S: RelayStore> Relay<S> {
    /// Runs one cycle: claim keys, publish their rows in order, mark them, release the keys.
    pub async fn cycle(&self) -> Result<CycleStats, StoreError> {
        let candidates = self.store.candidates(self.config.batch_size).await?;
        if candidates.is_empty() {
            return Ok(CycleStats::default());
        }
        let locked = self.store.lock_keys(&candidates).await?;
        if locked.is_empty() {
            return Ok(CycleStats::default());
        }
        let result = self.publish_locked(&locked).await;
        let unlocked = self.store.unlock_keys(&locked).await;
        let stats = result?;
        unlocked?;
        Ok(stats)
    }

    async fn publish_locked(&self, locked: &[KeyRef]) -> Result<CycleStats, StoreError> {
        let rows = self.store.pending(locked, self.config.batch_size).await?;
        // Per key, publish the prefix up to the first row that is backing off.
        let mut blocked = std::collections::HashSet::new();
        let mut in_flight = Vec::with_capacity(rows.len());
        let mut failures: Vec<(&PendingRow, KafkaError)> = Vec::new();
        for row in &rows {
            let key = row.key_ref();
            if row.waiting || blocked.contains(&key) {
                blocked.insert(key);
                continue;
            }
            match self.send(row) {
                Ok(delivery) => in_flight.push((row, delivery)),
                Err(e) => {
                    // Handed nothing to librdkafka: later rows of this key wait for this one.
                    blocked.insert(key);
                    failures.push((row, e));
                }
            }
        }
        let mut published = Vec::with_capacity(in_flight.len());
        for (row, delivery) in in_flight {
            match delivery.await {
                Ok(Ok(d)) => {
                    published.push(row.id);
                    self.report(RelayReport::Published {
                        id: row.id,
                        topic: row.topic.clone(),
                        key: row.key.clone(),
                        partition: d.partition,
                        offset: d.offset,
                        acked_at: SystemTime::now(),
                    });
                }
                Ok(Err((e, _))) => failures.push((row, e)),
                Err(_canceled) => failures.push((row, KafkaError::Canceled)),
            }
        }
        if !published.is_empty() {
            crate::failpoint::hit("relay_after_publish").await;
            self.store.mark_published(&published).await?;
        }
        let failed = failures.len();
        for (row, error) in failures {
            let attempts = u32::try_from(row.attempts).unwrap_or(0) + 1;
            let park = is_message_error(&error) && attempts >= self.config.max_attempts;
            let message = format!(
                "publishing event {} ({}) to topic `{}` failed: {error}",
                row.id, row.event_type, row.topic
            );
            tracing::warn!(id = %row.id, attempts, parked = park, "{message}");
            self.store
                .record_failure(Failure {
                    row,
                    error: &message,
                    park,
                    backoff: self.config.backoff.delay(attempts),
                })
                .await?;
            self.report(RelayReport::Failed {
                id: row.id,
                error: message,
                parked: park,
            });
        }
        Ok(CycleStats {
            published: published.len(),
            failed,
        })
    }

    fn send(&self, row: &PendingRow) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
        let id = row.id.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(5 + row.headers.len())
            .insert(Header {
                key: names::HEADER_ID,
                value: Some(id.as_str()),
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

    fn report(&self, report: RelayReport) {
        if let Some(tx) = &self.reports {
            let _ = tx.send(report);
        }
    }
}
