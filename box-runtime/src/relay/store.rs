//! What the relay needs from a store ([`RelayStore`]), and its PostgreSQL implementation.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::outbox::retention::{purge_published, Retention};
use crate::outbox::{fnv1a64, notify_channel};
use crate::store::StoreError;
use crate::store::Tables;

/// The ordering unit: events of one `(topic, key)` are published in `seq` order. An event
/// without a key is a unit of its own (identified by its id).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRef {
    /// Topic.
    pub topic: String,
    /// The Kafka key; `None` for keyless events.
    pub key: Option<String>,
    /// For keyless events, the row's id (`Uuid::nil()` otherwise).
    pub id: Uuid,
}

/// An unpublished row, as the relay reads it.
#[derive(Clone, Debug)]
pub struct PendingRow {
    /// Event id (`ce_id`).
    pub id: Uuid,
    /// Publication order within the key.
    pub seq: i64,
    /// Topic.
    pub topic: String,
    /// Kafka key.
    pub key: Option<String>,
    /// Event type (`ce_type`).
    pub event_type: String,
    /// The JSON payload, as text.
    pub payload: String,
    /// Extra headers stored with the row (`traceparent`, ...).
    pub headers: Vec<(String, String)>,
    /// Failed attempts so far.
    pub attempts: i32,
    /// Whether the row's key is backing off after a failure (not to be published yet).
    pub waiting: bool,
}

impl PendingRow {
    /// The ordering unit of the row.
    pub fn key_ref(&self) -> KeyRef {
        KeyRef {
            topic: self.topic.clone(),
            key: self.key.clone(),
            id: if self.key.is_some() {
                Uuid::nil()
            } else {
                self.id
            },
        }
    }
}

/// The extra headers stored with a row (a JSON object of strings), as the relay publishes
/// them; anything that is not a string is left out.
pub(crate) fn parse_headers(json: &str) -> Vec<(String, String)> {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json)
        .map(|m| {
            m.into_iter()
                .filter_map(|(k, v)| match v {
                    serde_json::Value::String(s) => Some((k, s)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A failed publication of one row, to record.
#[derive(Clone, Debug)]
pub struct Failure<'a> {
    /// The row.
    pub row: &'a PendingRow,
    /// The error, as text.
    pub error: &'a str,
    /// Give up on the row (park it) rather than retry.
    pub park: bool,
    /// Leave the row's key alone for this long (when not parked).
    pub backoff: Duration,
}

/// The storage a relay needs. PostgreSQL implements it ([`PgRelayStore`]); an embedded store
/// can implement the same seven operations.
///
/// The contract that keeps per-key order with several relays: between [`lock_keys`] and
/// [`unlock_keys`] no other relay publishes rows of the locked keys, and a lock is released
/// when the relay holding it dies.
///
/// [`lock_keys`]: RelayStore::lock_keys
/// [`unlock_keys`]: RelayStore::unlock_keys
pub trait RelayStore: Send + Sync + 'static {
    /// Starts listening for commits (so no wake-up is missed between a cycle and the wait).
    fn listen(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The keys of up to `limit` oldest publishable rows (committed, unpublished, not parked,
    /// not backing off), oldest first, without duplicates.
    fn candidates(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<KeyRef>, StoreError>> + Send;

    /// Tries to take the exclusive relay lock of each key without waiting; returns the keys
    /// now held by this relay.
    fn lock_keys<'a>(
        &'a self,
        keys: &'a [KeyRef],
    ) -> impl Future<Output = Result<Vec<KeyRef>, StoreError>> + Send + 'a;

    /// Releases keys taken by [`RelayStore::lock_keys`].
    fn unlock_keys<'a>(
        &'a self,
        keys: &'a [KeyRef],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Up to `limit` unpublished, unparked rows of `keys`, in `seq` order, read after the keys
    /// were locked. (Per key, the rows returned are a prefix of its pending rows.)
    fn pending<'a>(
        &'a self,
        keys: &'a [KeyRef],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingRow>, StoreError>> + Send + 'a;

    /// Marks rows published.
    fn mark_published<'a>(
        &'a self,
        ids: &'a [Uuid],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Records a failed attempt: attempt count and error; parks the row or backs its key off.
    fn record_failure<'a>(
        &'a self,
        failure: Failure<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Waits until a row may have committed (a notification) or `timeout` passed.
    fn wait(&self, timeout: Duration) -> impl Future<Output = ()> + Send;

    /// Deletes published rows older than the retention window; returns how many.
    fn purge<'a>(
        &'a self,
        retention: &'a Retention,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a;
}

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
