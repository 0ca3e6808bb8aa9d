//! [`InboxStore`] on MySQL/MariaDB.
//!
//! A claim inserts the rows with `ON DUPLICATE KEY UPDATE` (an existing row, by event id or by
//! business key, keeps everything but its claim token) and marks those it inserts with a random
//! token. The statement's affected rows tell whether every row was new (an inserted row counts
//! 1, an existing one 2: see `insert_rows`); then only the group's recorded failures are read.
//! Otherwise, as MySQL has no `RETURNING`, it reads back which rows of the batch carry its
//! tokens, with their failures.

use std::collections::HashMap;

use sqlx::{MySql, Row};

use super::{marks, micros, pairs, MySqlStore, AGO};
use crate::message::Delivery;
use crate::store::sql::stmt;
use crate::store::text::{decode_headers, encode_headers, safe_text, MAX_ERROR_BYTES};
use crate::store::{
    Claim, ClaimRequest, DeadLetter, InboxKey, InboxStore, StoreError, StoredDeadLetter, Tables,
};

type Tx = sqlx::Transaction<'static, MySql>;

/// The most recorded failures of a group read at once; a group with more has those of a batch
/// read by key.
const GROUP_FAILURES: usize = 1000;

impl MySqlStore {
    pub(super) async fn clear_attempts(
        &self,
        conn: &mut sqlx::MySqlConnection,
        key: &InboxKey,
    ) -> Result<(), StoreError> {
        sqlx::query(self.sql.clear_attempts.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// What a claim that inserted nothing for `key` met: the event id, or the business key.
    async fn duplicate_of(&self, tx: &mut Tx, key: &InboxKey) -> Result<Claim, StoreError> {
        if key.business_key.is_none() {
            return Ok(Claim::Duplicate);
        }
        let known: i64 = sqlx::query_scalar(self.sql.known_event.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_one(&mut **tx)
            .await?;
        Ok(match known {
            0 => Claim::DuplicateBusinessKey,
            _ => Claim::Duplicate,
        })
    }

    /// Inserts the rows of `requests` unless they exist; returns, for each request in order,
    /// its recorded failed runs when this claim inserted its row, `None` when a row held it
    /// already. Two statements whatever the batch's size: the insert, then, when every row was
    /// new, the group's failures ([`Self::group_failures`]), else one read of the rows carrying
    /// this claim's tokens joined with their failures.
    async fn insert_claims(
        &self,
        tx: &mut Tx,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<i64>>, StoreError> {
        // Two tokens of this claim's own, never 1 or 2 (bit 40 set, or negative).
        let random = super::claim_token();
        let tokens = ((random | (1 << 40)) & !1, (random | (1 << 40)) | 1);
        let affected = self.insert_rows(tx, requests, tokens).await?;
        if affected == requests.len() as u64 {
            if let Some(failed) = self.group_failures(tx, &requests[0].key.group).await? {
                return Ok(requests
                    .iter()
                    .map(|r| Some(lookup(&failed, r).unwrap_or(0)))
                    .collect());
            }
        }
        let select = stmt(format!(
            "SELECT i.source, i.event_id, a.attempts FROM {} i LEFT JOIN {} a \
             ON a.consumer_group = i.consumer_group AND a.source = i.source \
             AND a.event_id = i.event_id WHERE i.consumer_group = ? \
             AND i.claim_token IN (?, ?) AND (i.source, i.event_id) IN ({})",
            self.sql.inbox,
            self.sql.attempts,
            pairs(requests.len())
        ));
        let mut query = sqlx::query_as(select)
            .bind(&requests[0].key.group)
            .bind(tokens.0)
            .bind(tokens.1);
        for r in requests {
            query = query.bind(&r.key.source).bind(&r.key.event_id);
        }
        let inserted: Vec<(Vec<u8>, Vec<u8>, Option<i32>)> = query.fetch_all(&mut **tx).await?;
        let inserted: HashMap<(String, String), i64> = inserted
            .into_iter()
            .map(|(s, e, n)| ((text(s), text(e)), i64::from(n.unwrap_or(0))))
            .collect();
        Ok(requests.iter().map(|r| lookup(&inserted, r)).collect())
    }

    /// The claim's insert, with `tokens.0` on the rows it inserts: its affected rows. Every row
    /// it meets changes its token, so counts 2 (sqlx's `CLIENT_FOUND_ROWS` counts an unchanged
    /// row 1, as an inserted one): a row of this claim's own (an earlier row of the batch with
    /// the same business key) flips between the claim's two tokens, any other gets 1 or 2.
    async fn insert_rows(
        &self,
        tx: &mut Tx,
        requests: &[ClaimRequest<'_>],
        tokens: (i64, i64),
    ) -> Result<u64, StoreError> {
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?, NOW(6), ?, ?)"; requests.len()].join(", ");
        let insert = stmt(format!(
            "INSERT INTO {} (consumer_group, source, event_id, event_type, topic, `partition`, \
             `offset`, processed_at, business_key, claim_token) VALUES {rows} \
             ON DUPLICATE KEY UPDATE claim_token = IF(claim_token IN (?, ?), \
               IF(claim_token = ?, ?, ?), IF(claim_token = 1, 2, 1))",
            self.sql.inbox
        ));
        let mut query = sqlx::query(insert);
        for r in requests {
            query = query
                .bind(&r.key.group)
                .bind(&r.key.source)
                .bind(&r.key.event_id)
                .bind(r.event_type)
                .bind(&*r.delivery.topic)
                .bind(r.delivery.partition)
                .bind(r.delivery.offset)
                .bind(r.key.business_key.as_deref())
                .bind(tokens.0);
        }
        let (t, u) = tokens;
        let done = query
            .bind(t)
            .bind(u)
            .bind(t)
            .bind(u)
            .bind(t)
            .execute(&mut **tx)
            .await?;
        Ok(done.rows_affected())
    }

    /// Every recorded failure of `group` (by `(source, event id)`), or `None` when it has
    /// [`GROUP_FAILURES`] or more: one short read of the attempts table's primary key (failures
    /// are few, cleared when a message is processed or dead-lettered).
    async fn group_failures(
        &self,
        tx: &mut Tx,
        group: &str,
    ) -> Result<Option<HashMap<(String, String), i64>>, StoreError> {
        let select = stmt(format!(
            "SELECT source, event_id, attempts FROM {} WHERE consumer_group = ? LIMIT {GROUP_FAILURES}",
            self.sql.attempts
        ));
        let failed: Vec<(Vec<u8>, Vec<u8>, i32)> = sqlx::query_as(select)
            .bind(group)
            .fetch_all(&mut **tx)
            .await?;
        if failed.len() >= GROUP_FAILURES {
            return Ok(None);
        }
        Ok(Some(
            failed
                .into_iter()
                .map(|(s, e, n)| ((text(s), text(e)), i64::from(n)))
                .collect(),
        ))
    }
}

/// What `map` (failed runs, by `(source, event id)`) holds for a claim's message. Failures are
/// rare: with the map empty, no key is copied to look it up.
fn lookup(map: &HashMap<(String, String), i64>, r: &ClaimRequest<'_>) -> Option<i64> {
    if map.is_empty() {
        return None;
    }
    map.get(&(r.key.source.clone(), r.key.event_id.clone()))
        .copied()
}

impl InboxStore for MySqlStore {
    type Tx = Tx;

    const NAME: &'static str = "mysql";

    fn tables(&self) -> &Tables {
        &self.tables
    }

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Ok(tx.commit().await?)
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Ok(tx.rollback().await?)
    }

    // Two-phase handlers, effects after commit and deferred messages (`two_phase.rs`,
    // `effects.rs`, `deferred.rs`).

    const TWO_PHASE: bool = true;
    const EFFECTS: bool = true;
    const DEFERRAL: bool = true;

    crate::store::optional_modes!();

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> Result<Claim, StoreError> {
        let request = [ClaimRequest {
            key,
            event_type,
            delivery,
        }];
        let claims = self.claim_batch(tx, &request).await?;
        Ok(claims[0])
    }

    async fn claim_batch<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> Result<Vec<Claim>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let inserted = self.insert_claims(tx, requests).await?;
        let mut claims = Vec::with_capacity(requests.len());
        for (r, inserted) in requests.iter().zip(inserted) {
            claims.push(match inserted {
                Some(failed) => Claim::New {
                    attempts: u32::try_from(failed).unwrap_or(0),
                },
                None => self.duplicate_of(tx, r.key).await?,
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
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for key in keys {
            let Some(business_key) = key.business_key.as_deref() else {
                continue;
            };
            match groups.iter_mut().find(|(g, _)| *g == key.group) {
                Some((_, held)) => held.push(business_key),
                None => groups.push((&key.group, vec![business_key])),
            }
        }
        for (group, business_keys) in groups {
            let update = stmt(format!(
                "UPDATE {} SET business_key = NULL WHERE consumer_group = ? \
                 AND business_key IN ({}) AND received_at < {AGO}",
                self.sql.inbox,
                marks(business_keys.len())
            ));
            let mut query = sqlx::query(update).bind(group);
            for business_key in business_keys {
                query = query.bind(business_key);
            }
            query.bind(micros(older_than)).execute(&mut **tx).await?;
        }
        Ok(())
    }

    async fn release_claims<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
    ) -> Result<(), StoreError> {
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let delete = stmt(format!(
            "DELETE FROM {} WHERE consumer_group = ? AND (source, event_id) IN ({})",
            self.sql.inbox,
            pairs(keys.len())
        ));
        let mut query = sqlx::query(delete).bind(&first.group);
        for key in keys {
            query = query.bind(&key.source).bind(&key.event_id);
        }
        query.execute(&mut **tx).await?;
        Ok(())
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
            self.clear_attempts(tx, key).await?;
        }
        Ok(())
    }

    async fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> Result<u32, StoreError> {
        let error = safe_text(error, MAX_ERROR_BYTES);
        let mut tx = self.pool.begin().await?;
        sqlx::query(self.sql.record_failure.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(error.as_ref())
            .bind(error.as_ref())
            .execute(&mut *tx)
            .await?;
        let attempts: i32 = sqlx::query_scalar(self.sql.failures_of.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u32::try_from(attempts).unwrap_or(0))
    }

    async fn dead_letter<'a>(&'a self, letter: &'a DeadLetter<'a>) -> Result<i64, StoreError> {
        let d = letter.delivery;
        let (payload, payload_size, payload_sha256) = letter.stored_payload();
        let event_id = letter.key.map(|k| k.event_id.as_str());
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(self.sql.dead_letter.clone())
            .bind(letter.group)
            .bind(letter.stored_source())
            .bind(event_id)
            .bind(letter.stored_event_type())
            .bind(&*d.topic)
            .bind(d.partition)
            .bind(d.offset)
            .bind(d.key.as_deref())
            .bind(encode_headers(&d.headers))
            .bind(payload)
            .bind(letter.stored_error())
            .bind(i64::from(letter.attempts))
            .bind(letter.group)
            .bind(letter.stored_source())
            .bind(event_id)
            .bind(payload_size)
            .bind(payload_sha256)
            .execute(&mut *tx)
            .await?;
        if let Some(key) = letter.key {
            self.clear_attempts(&mut tx, key).await?;
        }
        tx.commit().await?;
        Ok(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX))
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
        let attempts: i32 = row.try_get("attempts")?;
        let replayed: i64 = row.try_get("replayed")?;
        Ok(Some(StoredDeadLetter {
            id: row.try_get("id")?,
            group: text(row.try_get("consumer_group")?),
            event_id: row.try_get::<Option<Vec<u8>>, _>("event_id")?.map(text),
            event_type: row.try_get("event_type")?,
            delivery: Delivery {
                topic: row.try_get::<String, _>("topic")?.into(),
                partition: row.try_get("partition")?,
                offset: row.try_get("offset")?,
                key: row.try_get("message_key")?,
                payload: row.try_get("payload")?,
                headers: decode_headers(&headers),
            },
            error: row.try_get("error")?,
            attempts: u32::try_from(attempts).unwrap_or(0),
            replayed: replayed != 0,
        }))
    }

    async fn mark_replayed(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query(self.sql.mark_replayed.clone())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn delete_processed(
        &self,
        older_than: std::time::Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(self.sql.delete_processed.clone())
            .bind(micros(older_than))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn count_stuck(&self, older_than: std::time::Duration) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(self.sql.count_stuck.clone())
            .bind(micros(older_than))
            .bind(micros(older_than))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn count_dead_letters<'a>(&'a self, group: &'a str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(self.sql.count_dead_letters.clone())
            .bind(group)
            .fetch_one(&self.pool)
            .await?)
    }
}

/// A key column (`varbinary`: compared byte by byte) as the text it was written from.
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
