//! One batch: produce its rows in order, wait for every delivery report, mark the delivered
//! rows (one statement) and record the failures (one statement).

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use uuid::Uuid;

use super::shared::Shared;
use super::telemetry::TopicMetrics;
use super::{Failure, PendingRow, RelayReport, RelaySession, RelayStore};
use crate::store::StoreError;
use crate::transport::{OutgoingMessage, PublishError, Publisher, Receipt};

impl<S: RelayStore, P: Publisher> Shared<S, P> {
    /// Publishes `rows` (a worker's batch of the slots `held`, in the order read) and records
    /// the outcome.
    pub(super) async fn publish(
        &self,
        session: &mut S::Session,
        held: &[u32],
        rows: &[PendingRow],
    ) -> Result<(), StoreError> {
        // Keys whose row the publisher could not even queue: their later rows wait.
        let mut blocked: HashSet<(&str, &str)> = HashSet::new();
        let mut in_flight = Vec::with_capacity(rows.len());
        let mut failures: Vec<(&PendingRow, PublishError)> = Vec::new();
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
        let deliveries = async move {
            let mut delivered = Vec::with_capacity(in_flight.len());
            let mut failed = Vec::new();
            for (row, delivery) in in_flight {
                match delivery.await {
                    Ok(receipt) => delivered.push((row, receipt)),
                    Err(e) => failed.push((row, e)),
                }
            }
            (delivered, failed)
        };
        let (delivered, failed) = renewing(session, held, deliveries).await?;
        failures.extend(failed);
        let published = self.acknowledged(delivered, &failures);
        if !published.is_empty() {
            crate::failpoint::hit("relay_after_publish").await;
            session.mark_published(&published).await?;
        }
        if !failures.is_empty() {
            self.record_failures(session, failures).await?;
        }
        Ok(())
    }

    /// The delivered rows that may be marked published, reported and counted: a row of a key
    /// whose earlier row in this batch failed is held back (left unmarked, it is published
    /// again after the failed row, in order), so per-key order holds however the publisher
    /// reports its deliveries.
    fn acknowledged(
        &self,
        delivered: Vec<(&PendingRow, Receipt)>,
        failures: &[(&PendingRow, PublishError)],
    ) -> Vec<Uuid> {
        // The first failed row of each key.
        let mut first_failed: HashMap<(&str, &str), i64> = HashMap::new();
        for (row, _) in failures {
            if let Some(key) = row.key.as_deref() {
                let seq = first_failed.entry((&row.topic, key)).or_insert(row.seq);
                *seq = (*seq).min(row.seq);
            }
        }
        let mut published = Vec::with_capacity(delivered.len());
        // The topic handles of the last row: a batch is mostly of one topic.
        let mut topic: Option<(&str, TopicMetrics)> = None;
        for (row, d) in delivered {
            let held = row.key.as_deref().is_some_and(|key| {
                first_failed
                    .get(&(row.topic.as_str(), key))
                    .is_some_and(|&failed| failed < row.seq)
            });
            if held {
                continue;
            }
            published.push(row.id);
            if topic.as_ref().is_none_or(|(t, _)| *t != row.topic) {
                topic = Some((&row.topic, self.telemetry.topic(&row.topic)));
            }
            if let Some((_, metrics)) = &topic {
                metrics.published(&row.id, row.due_at);
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
        published
    }

    /// Records the first failure of each key (its later rows wait behind it; they count no
    /// attempt of their own).
    async fn record_failures(
        &self,
        session: &mut S::Session,
        mut failures: Vec<(&PendingRow, PublishError)>,
    ) -> Result<(), StoreError> {
        failures.sort_by_key(|(row, _)| row.seq);
        let mut seen = HashSet::new();
        failures.retain(|(row, _)| seen.insert(row.key_ref()));
        let messages: Vec<(String, bool)> = failures
            .iter()
            .map(|(row, error)| {
                let attempts = u32::try_from(row.attempts).unwrap_or(0) + 1;
                let park = error.is_rejected() && attempts >= self.config.max_attempts;
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

    fn send(
        &self,
        row: &PendingRow,
    ) -> Result<
        impl std::future::Future<Output = Result<Receipt, PublishError>> + use<S, P>,
        PublishError,
    > {
        let mut id = Uuid::encode_buffer();
        let id = row.id.hyphenated().encode_lower(&mut id);
        self.publisher.send(&OutgoingMessage {
            topic: &row.topic,
            key: row.key.as_deref(),
            payload: row.payload.as_bytes(),
            id,
            event_type: &row.event_type,
            source: &self.config.source,
            extra_headers: &row.headers,
        })
    }
}

/// Waits for `work` (a batch's deliveries) while renewing the session's hold on its slots as
/// often as the store asks ([`RelaySession::renew_every`]), so a hold that expires (SQLite's
/// lease) cannot lapse while a batch is in flight, however long the broker takes. A renewal
/// that fails means the slots may be someone else's: the batch is abandoned unmarked.
async fn renewing<R: RelaySession, T>(
    session: &mut R,
    held: &[u32],
    work: impl std::future::Future<Output = T>,
) -> Result<T, StoreError> {
    let Some(every) = session.renew_every() else {
        return Ok(work.await);
    };
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            () = tokio::time::sleep(every) => session.verify(held).await?,
        }
    }
}
