//! What the two-phase inbox and the effects drain need from a store: received rows claimed
//! with leases, and effects scheduled in a handler's transaction.

use std::time::Duration;

use super::InboxKey;
use crate::message::Delivery;

/// What a worker asks for when it claims a received row.
#[derive(Clone, Copy, Debug)]
pub struct LeaseRequest<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// Who claims (unique per worker pool, across processes).
    pub owner: &'a str,
    /// How long the claim holds unless renewed.
    pub lease: Duration,
    /// The event types of the group's two-phase handlers.
    pub event_types: &'a [&'a str],
    /// Those among them that keep per-key order: a row of such a type is claimed only when no
    /// earlier row of its key (same topic, partition and message key) is still unprocessed.
    pub ordered: &'a [&'a str],
}

/// A received row, claimed by a worker.
#[derive(Clone, Debug)]
pub struct ReceivedRow {
    /// Its inbox key.
    pub key: InboxKey,
    /// The message as it was received (headers, key and payload).
    pub delivery: Delivery,
}

/// An effect scheduled by a handler, claimed by the drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEffect {
    /// Its row id.
    pub id: i64,
    /// The consumer group of the handler that scheduled it.
    pub group: String,
    /// The event id of the message whose handler scheduled it.
    pub event_id: String,
    /// What to run (the name an executor is registered under).
    pub kind: String,
    /// The key the receiving side deduplicates on: the same for every run of this effect.
    pub idempotency_key: String,
    /// The serialized payload.
    pub payload: Vec<u8>,
    /// Earlier failed runs.
    pub attempts: u32,
}

/// A consumer group's effects not done, as the gauge sampler counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EffectCounts {
    /// Effects not done yet.
    pub pending: i64,
    /// Effects not done whose runs failed at least once.
    pub failed: i64,
    /// Seconds since the oldest effect not done was scheduled, if any.
    pub oldest_pending_secs: Option<f64>,
}

impl EffectCounts {
    /// The counts as a store's count statement reads them: pending, failed, and the age of the
    /// oldest in seconds (a clock step back shows as 0, not a negative age).
    pub(crate) fn from_row((pending, failed, oldest): (i64, i64, Option<f64>)) -> Self {
        Self {
            pending,
            failed,
            oldest_pending_secs: oldest.map(|s| s.max(0.0)),
        }
    }
}

/// The row of `key` (`$1`..`$3`) while `$4` holds its lease and it is not processed: the
/// condition of every statement that renews, checks, finishes, releases or drops a leased row,
/// on every store.
pub(crate) const OWNED: &str = "consumer_group = $1 AND source = $2 AND event_id = $3 \
                                AND lease_owner = $4 AND processed_at IS NULL";

/// A claimed row of `group` (a deferred or a two-phase received row) with its stored message,
/// from the columns `source`, `event_id`, `topic`, `partition`, `offset`, `message_key`,
/// `headers` (the JSON text of [`encode_headers`](super::text::encode_headers)) and `payload`:
/// the stores that keep a message's headers in one text column (SQLite, MySQL).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn received_row<'r, R>(
    row: &'r R,
    group: &str,
    business_key: Option<String>,
) -> Result<ReceivedRow, super::StoreError>
where
    R: sqlx::Row,
    for<'n> &'n str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let headers: Option<String> = row.try_get("headers")?;
    Ok(ReceivedRow {
        key: InboxKey {
            group: group.to_owned(),
            source: row.try_get("source")?,
            event_id: row.try_get("event_id")?,
            business_key,
        },
        delivery: Delivery {
            topic: row
                .try_get::<Option<String>, _>("topic")?
                .unwrap_or_default()
                .into(),
            partition: row.try_get::<Option<i64>, _>("partition")?.unwrap_or(0) as i32,
            offset: row.try_get::<Option<i64>, _>("offset")?.unwrap_or(0),
            key: row.try_get("message_key")?,
            payload: row.try_get("payload")?,
            headers: headers
                .as_deref()
                .map(super::text::decode_headers)
                .unwrap_or_default(),
        },
    })
}

/// The trait methods of the optional modes (two-phase handlers, effects after commit, deferred
/// messages) of a store whose own methods carry the names below (`two_phase.rs`, `effects.rs`,
/// `deferred.rs` of SQLite and MySQL), written once: expanded in its `impl InboxStore`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! optional_modes {
    () => {
        // Effects after commit (`effects.rs`).

        async fn claim_effects<'a>(
            &'a self,
            group: &'a str,
            owner: &'a str,
            lease: std::time::Duration,
            limit: u32,
        ) -> Result<Vec<$crate::store::StoredEffect>, $crate::store::StoreError> {
            self.claim_effect_rows(group, owner, lease, limit).await
        }

        async fn settle_effect<'a>(
            &'a self,
            id: i64,
            owner: &'a str,
            error: Option<&'a str>,
            retry_in: std::time::Duration,
        ) -> Result<(), $crate::store::StoreError> {
            self.settle_effect_row(id, owner, error, retry_in).await
        }

        async fn count_effects<'a>(
            &'a self,
            group: &'a str,
        ) -> Result<$crate::store::EffectCounts, $crate::store::StoreError> {
            self.count_effect_rows(group).await
        }

        async fn delete_done_effects(
            &self,
            older_than: std::time::Duration,
            limit: u32,
        ) -> Result<u64, $crate::store::StoreError> {
            self.delete_done_effect_rows(older_than, limit).await
        }

        // Two-phase handlers (`two_phase.rs`): received rows claimed with leases.

        async fn receive<'a>(
            &'a self,
            tx: &'a mut Self::Tx,
            requests: &'a [$crate::store::ClaimRequest<'a>],
        ) -> Result<Vec<bool>, $crate::store::StoreError> {
            self.receive_rows(tx, requests).await
        }

        async fn claim_received<'a>(
            &'a self,
            request: &'a $crate::store::LeaseRequest<'a>,
        ) -> Result<Option<$crate::store::ReceivedRow>, $crate::store::StoreError> {
            self.claim_received_row(request).await
        }

        async fn renew_lease<'a>(
            &'a self,
            key: &'a $crate::store::InboxKey,
            owner: &'a str,
            lease: std::time::Duration,
        ) -> Result<bool, $crate::store::StoreError> {
            self.renew_row(key, owner, lease).await
        }

        // Deferred messages; the lease methods below serve their rows and the received rows of
        // two-phase handlers alike.

        async fn defer<'a>(
            &'a self,
            tx: &'a mut Self::Tx,
            key: &'a $crate::store::InboxKey,
            delivery: &'a $crate::message::Delivery,
            after: std::time::Duration,
        ) -> Result<u32, $crate::store::StoreError> {
            self.defer_row(tx, key, delivery, after).await
        }

        async fn claim_deferred<'a>(
            &'a self,
            group: &'a str,
            owner: &'a str,
            lease: std::time::Duration,
        ) -> Result<Option<$crate::store::ReceivedRow>, $crate::store::StoreError> {
            self.claim_deferred_row(group, owner, lease).await
        }

        async fn count_deferred<'a>(
            &'a self,
            group: &'a str,
        ) -> Result<i64, $crate::store::StoreError> {
            self.count_deferred_rows(group).await
        }

        async fn check_lease<'a>(
            &'a self,
            tx: &'a mut Self::Tx,
            key: &'a $crate::store::InboxKey,
            owner: &'a str,
        ) -> Result<Option<u32>, $crate::store::StoreError> {
            self.check_row(tx, key, owner).await
        }

        async fn finish_leased<'a>(
            &'a self,
            tx: &'a mut Self::Tx,
            key: &'a $crate::store::InboxKey,
            owner: &'a str,
            had_failures: bool,
        ) -> Result<bool, $crate::store::StoreError> {
            self.finish_row(tx, key, owner, had_failures).await
        }

        async fn release_lease<'a>(
            &'a self,
            key: &'a $crate::store::InboxKey,
            owner: &'a str,
        ) -> Result<(), $crate::store::StoreError> {
            self.release_row(key, owner).await
        }

        async fn drop_received<'a>(
            &'a self,
            key: &'a $crate::store::InboxKey,
            owner: &'a str,
        ) -> Result<(), $crate::store::StoreError> {
            self.drop_row(key, owner).await
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use optional_modes;
