//! The SQLite relay store.
//!
//! Key locks are leases in a table (`<outbox>_relay_locks`): a relay takes a key by writing its
//! owner id with an expiry, and another relay may take it only once the lease expired, so a
//! relay that dies releases its keys after [`LEASE`]. SQLite has one writer at a time, which
//! makes taking a lease atomic. There is no NOTIFY: the relay polls at its poll interval.

use std::time::Duration;

use sqlx::sqlite::SqlitePool;
use sqlx::Row;
use uuid::Uuid;

use super::{SqliteStore, NOW};
use crate::outbox::Retention;
use crate::relay::{parse_headers, Failure, IntoRelayStore, KeyRef, PendingRow, RelayStore};
use crate::store::{StoreError, Tables};

/// How long a relay's hold on a key lasts if it is never released (a crashed relay).
pub const LEASE: Duration = Duration::from_secs(60);

fn later(param: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('+%f seconds', {param}))")
}

fn earlier(param: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', {param}))")
}

/// The relay's store on SQLite.
#[derive(Debug)]
pub struct SqliteRelayStore {
    pool: SqlitePool,
    owner: String,
    sql: Statements,
}

#[derive(Debug)]
struct Statements {
    candidates: String,
    lock: String,
    unlock: String,
    pending_key: String,
    pending_id: String,
    mark_published: String,
    record_failure: String,
    backoff_key: String,
    backoff_id: String,
    release_key: String,
    purge: String,
}

fn lock_key(key: &KeyRef) -> String {
    match &key.key {
        Some(k) => format!("k:{k}"),
        None => format!("id:{}", key.id),
    }
}

impl SqliteRelayStore {
    /// A relay store on `pool`'s database and `tables.outbox` (migrated by
    /// [`SqliteStore::migrate`]).
    pub fn new(pool: SqlitePool, tables: &Tables) -> Self {
        let t = &tables.outbox;
        let locks = t.derived("relay_locks");
        let cols = format!(
            "id, seq, topic, message_key, type, payload, headers, attempts, \
             next_attempt_at > {NOW} AS waiting, parked_at IS NULL AS pending"
        );
        let sql = Statements {
            candidates: format!(
                "SELECT topic, message_key, id FROM {t} \
                 WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at <= {NOW} \
                 ORDER BY seq LIMIT $1"
            ),
            lock: format!(
                "INSERT INTO {locks} AS l (topic, lock_key, owner, expires_at) VALUES ($1, $2, $3, {lease}) \
                 ON CONFLICT (topic, lock_key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at \
                 WHERE l.expires_at < {NOW} OR l.owner = excluded.owner \
                 RETURNING owner",
                lease = later("$4")
            ),
            unlock: format!("DELETE FROM {locks} WHERE topic = $1 AND lock_key = $2 AND owner = $3"),
            pending_key: format!(
                "SELECT {cols} FROM {t} WHERE published_at IS NULL AND topic = $1 AND message_key = $2 \
                 ORDER BY seq LIMIT $3"
            ),
            pending_id: format!("SELECT {cols} FROM {t} WHERE published_at IS NULL AND id = $1"),
            mark_published: format!(
                "UPDATE {t} SET published_at = {NOW} \
                 WHERE id IN (SELECT value FROM json_each($1)) AND published_at IS NULL"
            ),
            record_failure: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, \
                   parked_at = CASE WHEN $3 THEN {NOW} END \
                 WHERE id = $1"
            ),
            backoff_key: format!(
                "UPDATE {t} SET next_attempt_at = {until} \
                 WHERE published_at IS NULL AND parked_at IS NULL AND topic = $1 AND message_key = $2",
                until = later("$3")
            ),
            backoff_id: format!("UPDATE {t} SET next_attempt_at = {until} WHERE id = $1", until = later("$2")),
            release_key: format!(
                "UPDATE {t} SET next_attempt_at = {NOW} \
                 WHERE published_at IS NULL AND parked_at IS NULL AND topic = $1 AND message_key = $2 \
                   AND next_attempt_at > {NOW}"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} \
                 WHERE published_at IS NOT NULL AND published_at < {before} \
                 ORDER BY published_at LIMIT $2)",
                before = earlier("$1")
            ),
        };
        Self {
            pool,
            owner: Uuid::new_v4().to_string(),
            sql,
        }
    }
}

fn pending_row(row: &sqlx::sqlite::SqliteRow) -> Result<PendingRow, StoreError> {
    let id: String = row.try_get("id")?;
    let headers = parse_headers(&row.try_get::<String, _>("headers")?);
    let attempts: i64 = row.try_get("attempts")?;
    Ok(PendingRow {
        id: Uuid::parse_str(&id).unwrap_or_default(),
        seq: row.try_get("seq")?,
        topic: row.try_get("topic")?,
        key: row.try_get("message_key")?,
        event_type: row.try_get("type")?,
        payload: row.try_get("payload")?,
        headers,
        attempts: attempts as i32,
        waiting: row.try_get("waiting")?,
    })
}

impl RelayStore for SqliteRelayStore {
    async fn listen(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn candidates(&self, limit: usize) -> Result<Vec<KeyRef>, StoreError> {
        let rows = sqlx::query(&self.sql.candidates)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        let mut keys: Vec<KeyRef> = Vec::new();
        for row in rows {
            let key: Option<String> = row.try_get("message_key")?;
            let id: String = row.try_get("id")?;
            let k = KeyRef {
                topic: row.try_get("topic")?,
                id: if key.is_some() {
                    Uuid::nil()
                } else {
                    Uuid::parse_str(&id).unwrap_or_default()
                },
                key,
            };
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        Ok(keys)
    }

    async fn lock_keys<'a>(&'a self, keys: &'a [KeyRef]) -> Result<Vec<KeyRef>, StoreError> {
        let mut held = Vec::with_capacity(keys.len());
        for key in keys {
            let got: Option<String> = sqlx::query_scalar(&self.sql.lock)
                .bind(&key.topic)
                .bind(lock_key(key))
                .bind(&self.owner)
                .bind(LEASE.as_secs_f64())
                .fetch_optional(&self.pool)
                .await?;
            if got.is_some() {
                held.push(key.clone());
            }
        }
        Ok(held)
    }

    async fn unlock_keys<'a>(&'a self, keys: &'a [KeyRef]) -> Result<(), StoreError> {
        for key in keys {
            sqlx::query(&self.sql.unlock)
                .bind(&key.topic)
                .bind(lock_key(key))
                .bind(&self.owner)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    async fn pending<'a>(
        &'a self,
        keys: &'a [KeyRef],
        limit: usize,
    ) -> Result<Vec<PendingRow>, StoreError> {
        let mut rows = Vec::new();
        for key in keys {
            let found = match &key.key {
                Some(k) => {
                    sqlx::query(&self.sql.pending_key)
                        .bind(&key.topic)
                        .bind(k)
                        .bind(limit as i64)
                        .fetch_all(&self.pool)
                        .await?
                }
                None => {
                    sqlx::query(&self.sql.pending_id)
                        .bind(key.id.to_string())
                        .fetch_all(&self.pool)
                        .await?
                }
            };
            for row in &found {
                if row.try_get::<bool, _>("pending")? {
                    rows.push(pending_row(row)?);
                }
            }
        }
        rows.sort_by_key(|r| r.seq);
        rows.truncate(limit);
        Ok(rows)
    }

    async fn mark_published<'a>(&'a self, ids: &'a [Uuid]) -> Result<(), StoreError> {
        let list = serde_json::to_string(&ids.iter().map(Uuid::to_string).collect::<Vec<_>>())
            .unwrap_or_else(|_| "[]".to_owned());
        sqlx::query(&self.sql.mark_published)
            .bind(list)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn record_failure<'a>(&'a self, failure: Failure<'a>) -> Result<(), StoreError> {
        let row = failure.row;
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.sql.record_failure)
            .bind(row.id.to_string())
            .bind(failure.error)
            .bind(failure.park)
            .execute(&mut *tx)
            .await?;
        match (&row.key, failure.park) {
            (Some(key), true) => {
                sqlx::query(&self.sql.release_key)
                    .bind(&row.topic)
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
            }
            (Some(key), false) => {
                sqlx::query(&self.sql.backoff_key)
                    .bind(&row.topic)
                    .bind(key)
                    .bind(failure.backoff.as_secs_f64())
                    .execute(&mut *tx)
                    .await?;
            }
            (None, false) => {
                sqlx::query(&self.sql.backoff_id)
                    .bind(row.id.to_string())
                    .bind(failure.backoff.as_secs_f64())
                    .execute(&mut *tx)
                    .await?;
            }
            (None, true) => {}
        }
        tx.commit().await?;
        Ok(())
    }

    async fn wait(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
    }

    async fn purge<'a>(&'a self, retention: &'a Retention) -> Result<u64, StoreError> {
        crate::store::delete_in_batches(retention.batch_size, |limit| async move {
            let done = sqlx::query(&self.sql.purge)
                .bind(retention.older_than.as_secs_f64())
                .bind(i64::from(limit))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }
}

impl IntoRelayStore for SqliteStore {
    type Store = SqliteRelayStore;

    fn into_relay_store(self) -> SqliteRelayStore {
        SqliteRelayStore::new(self.pool().clone(), self.tables())
    }
}

impl IntoRelayStore for SqliteRelayStore {
    type Store = Self;

    fn into_relay_store(self) -> Self {
        self
    }
}
