//! [`InboxStore`] on PostgreSQL.

use sqlx::{Postgres, Row};

use super::PgStore;
use crate::message::Delivery;
use crate::store::{
    Claim, ClaimRequest, DeadLetter, EffectCounts, InboxKey, InboxStore, LeaseRequest, ReceivedRow,
    StoreError, StoredDeadLetter, StoredEffect, Tables,
};

impl InboxStore for PgStore {
    type Tx = sqlx::Transaction<'static, Postgres>;

    const NAME: &'static str = "postgres";

    fn tables(&self) -> &Tables {
        &self.tables
    }

    fn parallel_transactions(&self) -> usize {
        self.pool().options().get_max_connections() as usize
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
        let n = requests.len();
        let (mut sources, mut ids, mut types) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut partitions, mut offsets) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut business_keys = Vec::with_capacity(n);
        for r in requests {
            sources.push(r.key.source.as_str());
            ids.push(r.key.event_id.as_str());
            types.push(r.event_type);
            partitions.push(r.delivery.partition);
            offsets.push(r.delivery.offset);
            business_keys.push(r.key.business_key.as_deref());
        }
        if self.partitions.is_some() {
            self.lock_keys(tx, &lock_keys(requests)).await?;
        }
        let rows = sqlx::query(self.sql.claim_batch.clone())
            .bind(&first.key.group)
            .bind(&sources)
            .bind(&ids)
            .bind(&types)
            .bind(&partitions)
            .bind(&offsets)
            .bind(&*first.delivery.topic)
            .bind(&business_keys)
            .fetch_all(&mut **tx)
            .await?;
        let mut claims = Vec::with_capacity(n);
        for (row, r) in rows.iter().zip(requests) {
            let inserted: bool = row.try_get("inserted")?;
            let attempts: i32 = row.try_get("attempts")?;
            // `known`: the claim's own snapshot shows a row holding the event id (a duplicate
            // without another round trip). When it shows none, a row committed after that
            // snapshot may still hold it: `duplicate_of` asks again with a fresh one.
            let known: Option<bool> = row.try_get("known")?;
            claims.push(if inserted {
                Claim::New {
                    attempts: attempts.max(0) as u32,
                }
            } else if r.key.business_key.is_none() || known == Some(true) {
                Claim::Duplicate
            } else {
                self.shared().duplicate_of(tx, r.key).await?
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
        let sources: Vec<&str> = keys.iter().map(|k| k.source.as_str()).collect();
        let ids: Vec<&str> = keys.iter().map(|k| k.event_id.as_str()).collect();
        sqlx::query(self.sql.release_claims.clone())
            .bind(&first.group)
            .bind(&sources)
            .bind(&ids)
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
        if self.partitions.is_some() {
            return self.delete_processed_partitioned(older_than, limit).await;
        }
        self.shared().delete_processed(older_than, limit).await
    }

    async fn count_stuck(&self, older_than: std::time::Duration) -> Result<i64, StoreError> {
        self.count_stuck_rows(older_than).await
    }

    const TWO_PHASE: bool = true;
    const EFFECTS: bool = true;

    async fn receive<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> Result<Vec<bool>, StoreError> {
        self.receive_rows(tx, requests).await
    }

    async fn claim_received<'a>(
        &'a self,
        request: &'a LeaseRequest<'a>,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        self.claim_row(request).await
    }

    async fn renew_lease<'a>(
        &'a self,
        key: &'a InboxKey,
        owner: &'a str,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.renew_row(key, owner, lease).await
    }

    async fn release_lease<'a>(
        &'a self,
        key: &'a InboxKey,
        owner: &'a str,
    ) -> Result<(), StoreError> {
        self.release_row(key, owner).await
    }

    async fn drop_received<'a>(
        &'a self,
        key: &'a InboxKey,
        owner: &'a str,
    ) -> Result<(), StoreError> {
        self.drop_row(key, owner).await
    }

    async fn check_lease<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        owner: &'a str,
    ) -> Result<Option<u32>, StoreError> {
        self.check_row(tx, key, owner).await
    }

    async fn finish_leased<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        owner: &'a str,
        had_failures: bool,
    ) -> Result<bool, StoreError> {
        self.finish_row(tx, key, owner, had_failures).await
    }

    async fn claim_effects<'a>(
        &'a self,
        group: &'a str,
        owner: &'a str,
        lease: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<StoredEffect>, StoreError> {
        self.claim_effect_rows(group, owner, lease, limit).await
    }

    async fn settle_effect<'a>(
        &'a self,
        id: i64,
        owner: &'a str,
        error: Option<&'a str>,
        retry_in: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.settle_effect_row(id, owner, error, retry_in).await
    }

    async fn count_effects<'a>(&'a self, group: &'a str) -> Result<EffectCounts, StoreError> {
        self.count_effect_rows(group).await
    }

    async fn delete_done_effects(
        &self,
        older_than: std::time::Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.delete_done_effect_rows(older_than, limit).await
    }

    const DEFERRAL: bool = true;

    async fn defer<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        delivery: &'a Delivery,
        after: std::time::Duration,
    ) -> Result<u32, StoreError> {
        self.defer_row(tx, key, delivery, after).await
    }

    async fn claim_deferred<'a>(
        &'a self,
        group: &'a str,
        owner: &'a str,
        lease: std::time::Duration,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        self.claim_deferred_row(group, owner, lease).await
    }

    async fn count_deferred<'a>(&'a self, group: &'a str) -> Result<i64, StoreError> {
        self.count_deferred_rows(group).await
    }

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
        if self.partitions.is_some() || key.business_key.is_some() {
            let request = [ClaimRequest {
                key,
                event_type,
                delivery,
            }];
            return Ok(self.claim_batch(tx, &request).await?[0]);
        }
        let row = sqlx::query(self.sql.claim.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(event_type)
            .bind(&*delivery.topic)
            .bind(delivery.partition)
            .bind(delivery.offset)
            .fetch_one(&mut **tx)
            .await;
        let row = match row {
            Ok(row) => row,
            // A unique violation can only mean another transaction inserted the row first.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
                return Ok(Claim::Duplicate)
            }
            Err(e) => return Err(e.into()),
        };
        let inserted: bool = row.try_get("inserted")?;
        let attempts: i32 = row.try_get("attempts")?;
        Ok(if inserted {
            Claim::New {
                attempts: attempts.max(0) as u32,
            }
        } else {
            Claim::Duplicate
        })
    }

    async fn dead_letter<'a>(&'a self, letter: &'a DeadLetter<'a>) -> Result<i64, StoreError> {
        let d = letter.delivery;
        let names: Vec<&str> = d.headers.iter().map(|(n, _)| n.as_str()).collect();
        let values: Vec<Option<&[u8]>> = d.headers.iter().map(|(_, v)| v.as_deref()).collect();
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
            .bind(&names)
            .bind(&values)
            .bind(payload)
            .bind(letter.stored_error())
            .bind(letter.attempts as i32)
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
        let names: Vec<String> = row.try_get("header_names")?;
        let values: Vec<Option<Vec<u8>>> = row.try_get("header_values")?;
        let attempts: i32 = row.try_get("attempts")?;
        Ok(Some(StoredDeadLetter {
            id: row.try_get("id")?,
            group: row.try_get("consumer_group")?,
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            delivery: Delivery {
                topic: row.try_get::<String, _>("topic")?.into(),
                partition: row.try_get("partition")?,
                offset: row.try_get("offset")?,
                key: row.try_get("message_key")?,
                payload: row.try_get("payload")?,
                headers: names.into_iter().zip(values).collect(),
            },
            error: row.try_get("error")?,
            attempts: attempts.max(0) as u32,
            replayed: row.try_get("replayed")?,
        }))
    }
}

/// The lock keys of a claim on the partitioned inbox: each event id, and each business key.
fn lock_keys(requests: &[ClaimRequest<'_>]) -> Vec<String> {
    let mut keys = Vec::with_capacity(requests.len() * 2);
    for r in requests {
        let k = r.key;
        keys.push(super::partitions::event_lock_key(
            &k.group,
            &k.source,
            &k.event_id,
        ));
        if let Some(business_key) = &k.business_key {
            keys.push(super::partitions::business_lock_key(&k.group, business_key));
        }
    }
    keys
}
