//! [`InboxStore`] on SQLite.

use sqlx::{Row, Sqlite};

use super::SqliteStore;
use crate::message::Delivery;
use crate::store::text::{decode_headers, encode_headers};
use crate::store::{
    Claim, ClaimRequest, DeadLetter, InboxKey, InboxStore, StoreError, StoredDeadLetter, Tables,
};

impl InboxStore for SqliteStore {
    type Tx = sqlx::Transaction<'static, Sqlite>;

    const NAME: &'static str = "sqlite";

    fn tables(&self) -> &Tables {
        &self.tables
    }

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        self.shared().begin().await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Ok(tx.commit().await?)
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Ok(tx.rollback().await?)
    }

    async fn mark_processed<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        had_failures: bool,
    ) -> Result<(), StoreError> {
        // `claim` inserted the row already marked processed: only recorded failures remain to
        // be cleared.
        if had_failures {
            self.shared().clear_attempts(tx, key).await?;
        }
        Ok(())
    }

    async fn claim_batch<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> Result<Vec<Claim>, StoreError> {
        let Some(first) = requests.first() else {
            return Ok(Vec::new());
        };
        // SQLite has no arrays: the batch travels as one JSON array of rows.
        type JsonRow<'r> = (&'r str, &'r str, &'r str, i32, i64, Option<&'r str>);
        let rows: Vec<JsonRow<'_>> = requests
            .iter()
            .map(|r| {
                let d = r.delivery;
                (
                    r.key.source.as_str(),
                    r.key.event_id.as_str(),
                    r.event_type,
                    d.partition,
                    d.offset,
                    r.key.business_key.as_deref(),
                )
            })
            .collect();
        let json = serde_json::to_string(&rows).map_err(|e| StoreError::Config(e.to_string()))?;
        let inserted: Vec<(String, String)> = sqlx::query_as(self.sql.claim_batch.clone())
            .bind(&first.key.group)
            .bind(&*first.delivery.topic)
            .bind(&json)
            .fetch_all(&mut **tx)
            .await?;
        let inserted: std::collections::HashSet<(String, String)> = inserted.into_iter().collect();
        let failed: Vec<(String, String, i64)> = sqlx::query_as(self.sql.batch_attempts.clone())
            .bind(&first.key.group)
            .bind(&json)
            .fetch_all(&mut **tx)
            .await?;
        let failed: std::collections::HashMap<(String, String), i64> =
            failed.into_iter().map(|(s, e, n)| ((s, e), n)).collect();
        let mut claims = Vec::with_capacity(requests.len());
        for r in requests {
            let k = (r.key.source.clone(), r.key.event_id.clone());
            claims.push(match inserted.contains(&k) {
                true => Claim::New {
                    attempts: failed.get(&k).copied().unwrap_or(0).max(0) as u32,
                },
                false => self.shared().duplicate_of(tx, r.key).await?,
            });
        }
        Ok(claims)
    }

    async fn expire_business_keys<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
        older_than: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.shared()
            .expire_business_keys(tx, keys, older_than)
            .await
    }

    async fn release_claims<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
    ) -> Result<(), StoreError> {
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let pairs: Vec<(&str, &str)> = keys
            .iter()
            .map(|k| (k.source.as_str(), k.event_id.as_str()))
            .collect();
        let json = serde_json::to_string(&pairs).map_err(|e| StoreError::Config(e.to_string()))?;
        sqlx::query(self.sql.release_claims.clone())
            .bind(&first.group)
            .bind(json)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> Result<u32, StoreError> {
        self.shared().record_failure(key, error).await
    }

    async fn mark_replayed(&self, id: i64) -> Result<(), StoreError> {
        self.shared().mark_replayed(id).await
    }

    async fn delete_processed(
        &self,
        older_than: std::time::Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.shared().delete_processed(older_than, limit).await
    }

    async fn count_stuck(&self, older_than: std::time::Duration) -> Result<i64, StoreError> {
        self.shared().count_stuck(older_than).await
    }

    // Effects after commit (`effects.rs`), two-phase handlers (`two_phase.rs`) and deferred
    // messages (`deferred.rs`).

    const EFFECTS: bool = true;
    const TWO_PHASE: bool = true;
    const DEFERRAL: bool = true;

    crate::store::optional_modes!();

    async fn count_dead_letters(&self, group: &str) -> Result<i64, StoreError> {
        self.shared().count_dead_letters(group).await
    }

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> Result<Claim, StoreError> {
        let inserted = sqlx::query(self.sql.claim.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(event_type)
            .bind(&*delivery.topic)
            .bind(delivery.partition)
            .bind(delivery.offset)
            .bind(key.business_key.as_deref())
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if inserted == 0 {
            return self.shared().duplicate_of(tx, key).await;
        }
        let attempts: Option<i64> = sqlx::query_scalar(self.sql.attempts.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(Claim::New {
            attempts: attempts.unwrap_or(0).max(0) as u32,
        })
    }

    async fn dead_letter<'a>(&'a self, letter: &'a DeadLetter<'a>) -> Result<i64, StoreError> {
        let d = letter.delivery;
        let (payload, payload_size, payload_sha256) = letter.stored_payload();
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(self.sql.dead_letter.clone())
            .bind(letter.group)
            .bind(letter.stored_source())
            .bind(letter.key.map(|k| k.event_id.as_str()))
            .bind(letter.stored_event_type())
            .bind(&*d.topic)
            .bind(d.partition)
            .bind(d.offset)
            .bind(d.key.as_deref())
            .bind(encode_headers(&d.headers))
            .bind(payload)
            .bind(letter.stored_error())
            .bind(letter.attempts as i64)
            .bind(payload_size)
            .bind(payload_sha256)
            .fetch_one(&mut *tx)
            .await?;
        if let Some(key) = letter.key {
            self.shared().clear_attempts(&mut tx, key).await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    async fn load_dead_letter<'a>(
        &'a self,
        group: &'a str,
        id: i64,
    ) -> Result<Option<StoredDeadLetter>, StoreError> {
        let Some(row) = sqlx::query(self.sql.load_dead_letter.clone())
            .bind(group)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let headers: String = row.try_get("headers")?;
        let attempts: i64 = row.try_get("attempts")?;
        let partition: i64 = row.try_get("partition")?;
        Ok(Some(StoredDeadLetter {
            id: row.try_get("id")?,
            group: row.try_get("consumer_group")?,
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            delivery: Delivery {
                topic: row.try_get::<String, _>("topic")?.into(),
                partition: partition as i32,
                offset: row.try_get("offset")?,
                key: row.try_get("message_key")?,
                payload: row.try_get("payload")?,
                headers: decode_headers(&headers),
            },
            error: row.try_get("error")?,
            attempts: attempts.max(0) as u32,
            replayed: row.try_get("replayed")?,
        }))
    }
}
