//! The PostgreSQL relay store: key locks are session advisory locks on a dedicated connection.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::Mutex;
use uuid::Uuid;

use super::outbox::{fnv1a64, notify_channel};
use super::PgStore;
use crate::outbox::Retention;
use crate::relay::{parse_headers, Failure, IntoRelayStore, KeyRef, PendingRow, RelayStore};
use crate::store::{StoreError, Tables};

/// The PostgreSQL relay store.
///
/// Key locks are session-level advisory locks (`pg_try_advisory_lock`) held on one dedicated
/// connection of the relay: PostgreSQL releases them when that connection ends, so a relay that
/// crashes (or is SIGKILLed) never leaves a key locked.
pub struct PgRelayStore {
    pool: PgPool,
    tables: Tables,
    scope: String,
    channel: String,
    locks: Mutex<Option<PgConnection>>,
    listener: Mutex<Option<PgListener>>,
    sql: Statements,
}

struct Statements {
    candidates: String,
    pending: String,
    mark_published: String,
    record_failure: String,
    backoff_key: String,
    release_key: String,
}

impl PgRelayStore {
    /// A relay store on `pool`'s database and `tables.outbox`.
    pub fn new(pool: PgPool, tables: Tables) -> Self {
        let t = &tables.outbox;
        let sql = Statements {
            candidates: format!(
                "SELECT topic, message_key, id FROM {t} \
                 WHERE published_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now() \
                 ORDER BY seq LIMIT $1"
            ),
            // One index probe per key. The predicates are chosen so that only
            // `pending_key_idx` (`WHERE published_at IS NULL`) matches the per-key branch and
            // only the primary key the keyless one: before the table has statistics, the
            // planner would otherwise walk `pending_idx` in `seq` order and filter the whole
            // backlog for every key. Parked and published rows are dropped in Rust.
            pending: format!(
                "SELECT * FROM ( \
                   SELECT o.* FROM unnest($1::text[], $2::text[]) AS k(topic, message_key) \
                   CROSS JOIN LATERAL ( \
                     SELECT {cols} FROM {t} \
                     WHERE published_at IS NULL \
                       AND topic = k.topic AND message_key = k.message_key \
                     ORDER BY seq LIMIT $4) AS o \
                   UNION ALL \
                   SELECT {cols} FROM {t} WHERE id = ANY($3) \
                 ) AS pending ORDER BY seq LIMIT $4",
                cols = "id, seq, topic, message_key, type, payload::text AS payload, \
                        headers::text AS headers, attempts, next_attempt_at > now() AS waiting, \
                        published_at IS NULL AND parked_at IS NULL AS pending"
            ),
            mark_published: format!(
                "UPDATE {t} SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL"
            ),
            record_failure: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, \
                   parked_at = CASE WHEN $3 THEN now() END \
                 WHERE id = $1"
            ),
            backoff_key: format!(
                "UPDATE {t} SET next_attempt_at = now() + make_interval(secs => $3) \
                 WHERE published_at IS NULL AND parked_at IS NULL \
                   AND topic = $1 AND message_key = $2"
            ),
            release_key: format!(
                "UPDATE {t} SET next_attempt_at = now() \
                 WHERE published_at IS NULL AND parked_at IS NULL \
                   AND topic = $1 AND message_key = $2 AND next_attempt_at > now()"
            ),
        };
        Self {
            scope: tables.outbox.name().as_str().to_owned(),
            channel: notify_channel(&tables),
            pool,
            tables,
            locks: Mutex::new(None),
            listener: Mutex::new(None),
            sql,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn lock_id(&self, key: &KeyRef) -> i64 {
        match &key.key {
            Some(k) => fnv1a64(&[
                b"txbox-relay",
                self.scope.as_bytes(),
                key.topic.as_bytes(),
                k.as_bytes(),
            ]),
            None => fnv1a64(&[b"txbox-relay-id", self.scope.as_bytes(), key.id.as_bytes()]),
        }
    }

    async fn lock_connection(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<PgConnection>>, StoreError> {
        let mut guard = self.locks.lock().await;
        if guard.is_none() {
            let options: PgConnectOptions = (*self.pool.connect_options()).clone();
            *guard = Some(PgConnection::connect_with(&options).await?);
        }
        Ok(guard)
    }
}

fn split_keys(keys: &[KeyRef]) -> (Vec<&str>, Vec<&str>, Vec<Uuid>) {
    let mut topics = Vec::new();
    let mut names = Vec::new();
    let mut ids = Vec::new();
    for k in keys {
        match &k.key {
            Some(key) => {
                topics.push(k.topic.as_str());
                names.push(key.as_str());
            }
            None => ids.push(k.id),
        }
    }
    (topics, names, ids)
}

impl RelayStore for PgRelayStore {
    async fn listen(&self) -> Result<(), StoreError> {
        let mut guard = self.listener.lock().await;
        if guard.is_none() {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(&self.channel).await?;
            *guard = Some(listener);
        }
        Ok(())
    }

    async fn candidates(&self, limit: usize) -> Result<Vec<KeyRef>, StoreError> {
        let rows = sqlx::query(&self.sql.candidates)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        let mut seen = std::collections::HashSet::new();
        let mut keys = Vec::new();
        for row in rows {
            let key: Option<String> = row.try_get("message_key")?;
            let id: Uuid = row.try_get("id")?;
            let k = KeyRef {
                topic: row.try_get("topic")?,
                id: if key.is_some() { Uuid::nil() } else { id },
                key,
            };
            if seen.insert(k.clone()) {
                keys.push(k);
            }
        }
        Ok(keys)
    }

    async fn lock_keys<'a>(&'a self, keys: &'a [KeyRef]) -> Result<Vec<KeyRef>, StoreError> {
        // Keys whose lock ids collide share one lock (session locks are re-entrant: take each
        // id once).
        let mut by_id: BTreeMap<i64, Vec<&KeyRef>> = BTreeMap::new();
        for k in keys {
            by_id.entry(self.lock_id(k)).or_default().push(k);
        }
        let ids: Vec<i64> = by_id.keys().copied().collect();
        let mut guard = self.lock_connection().await?;
        let conn = guard.as_mut().expect("connected above");
        let got: Result<Vec<i64>, sqlx::Error> = sqlx::query_scalar(
            "SELECT k FROM unnest($1::int8[]) AS k WHERE pg_try_advisory_lock(k)",
        )
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await;
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                // Whatever this connection held is released with it.
                *guard = None;
                return Err(e.into());
            }
        };
        Ok(got
            .iter()
            .flat_map(|id| by_id.get(id).into_iter().flatten().map(|k| (*k).clone()))
            .collect())
    }

    async fn unlock_keys<'a>(&'a self, keys: &'a [KeyRef]) -> Result<(), StoreError> {
        let ids: Vec<i64> = keys
            .iter()
            .map(|k| self.lock_id(k))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut guard = self.locks.lock().await;
        let Some(conn) = guard.as_mut() else {
            return Ok(()); // the connection went away, and its locks with it
        };
        let result = sqlx::query("SELECT pg_advisory_unlock(k) FROM unnest($1::int8[]) AS k")
            .bind(&ids)
            .execute(&mut *conn)
            .await;
        if let Err(e) = result {
            *guard = None; // closing the session releases every lock it held
            return Err(e.into());
        }
        Ok(())
    }

    async fn pending<'a>(
        &'a self,
        keys: &'a [KeyRef],
        limit: usize,
    ) -> Result<Vec<PendingRow>, StoreError> {
        let (topics, names, ids) = split_keys(keys);
        let rows = sqlx::query(&self.sql.pending)
            .bind(&topics)
            .bind(&names)
            .bind(&ids)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            if !row.try_get::<bool, _>("pending")? {
                continue; // parked, or published meanwhile
            }
            if pending.len() == limit {
                break;
            }
            pending.push(row);
        }
        pending
            .into_iter()
            .map(|row| {
                let headers = parse_headers(&row.try_get::<String, _>("headers")?);
                Ok(PendingRow {
                    id: row.try_get("id")?,
                    seq: row.try_get("seq")?,
                    topic: row.try_get("topic")?,
                    key: row.try_get("message_key")?,
                    event_type: row.try_get("type")?,
                    payload: row.try_get("payload")?,
                    headers,
                    attempts: row.try_get("attempts")?,
                    waiting: row.try_get("waiting")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    async fn mark_published<'a>(&'a self, ids: &'a [Uuid]) -> Result<(), StoreError> {
        sqlx::query(&self.sql.mark_published)
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn record_failure<'a>(&'a self, failure: Failure<'a>) -> Result<(), StoreError> {
        let row = failure.row;
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.sql.record_failure)
            .bind(row.id)
            .bind(failure.error)
            .bind(failure.park)
            .execute(&mut *tx)
            .await?;
        if let Some(key) = &row.key {
            let q = if failure.park {
                sqlx::query(&self.sql.release_key)
                    .bind(&row.topic)
                    .bind(key)
            } else {
                sqlx::query(&self.sql.backoff_key)
                    .bind(&row.topic)
                    .bind(key)
                    .bind(failure.backoff.as_secs_f64())
            };
            q.execute(&mut *tx).await?;
        } else if !failure.park {
            sqlx::query(&format!(
                "UPDATE {} SET next_attempt_at = now() + make_interval(secs => $2) WHERE id = $1",
                self.tables.outbox
            ))
            .bind(row.id)
            .bind(failure.backoff.as_secs_f64())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn wait(&self, timeout: Duration) {
        let mut guard = self.listener.lock().await;
        let Some(listener) = guard.as_mut() else {
            drop(guard);
            tokio::time::sleep(timeout).await;
            if let Err(e) = self.listen().await {
                tracing::warn!(error = %e, "relay cannot LISTEN; polling only");
            }
            return;
        };
        if listener.next_buffered().is_none() {
            if let Ok(Err(e)) = tokio::time::timeout(timeout, listener.recv()).await {
                tracing::warn!(error = %e, "relay lost its LISTEN connection; reconnecting");
                *guard = None;
                return;
            }
        }
        while listener.next_buffered().is_some() {}
    }

    async fn purge<'a>(&'a self, retention: &'a Retention) -> Result<u64, StoreError> {
        purge_published(&self.pool, &self.tables, retention).await
    }
}

/// Deletes rows published more than `retention.older_than` ago, `batch_size` rows per
/// statement, until none is left; returns how many were deleted.
///
/// Only published rows are touched, and rows another session has locked are skipped
/// (`FOR UPDATE SKIP LOCKED`), so the purge never waits for, nor blocks, enqueues and the relay.
/// Unpublished and parked rows stay.
pub(crate) async fn purge_published(
    pool: &PgPool,
    tables: &Tables,
    retention: &Retention,
) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM {t} WHERE id IN (\
           SELECT id FROM {t} \
           WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
           ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        t = tables.outbox
    );
    let secs = retention.older_than.as_secs_f64();
    let sql = &sql;
    crate::store::delete_in_batches(retention.batch_size, |limit| async move {
        let done = sqlx::query(sql)
            .bind(secs)
            .bind(i64::from(limit))
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    })
    .await
}

impl IntoRelayStore for PgStore {
    type Store = PgRelayStore;

    fn into_relay_store(self) -> PgRelayStore {
        PgRelayStore::new(self.pool().clone(), self.tables().clone())
    }
}

impl IntoRelayStore for PgRelayStore {
    type Store = Self;

    fn into_relay_store(self) -> Self {
        self
    }
}
