//! The SQLite relay store.
//!
//! SQLite has one writer at a time, and `seq` (an autoincrement key) is commit order across
//! every key, so one relay worker at a time publishes the whole table, from its oldest row on,
//! in `seq` order: the store has a single slot. The slot is a lease in a table
//! (`<outbox>_relay_locks`): a worker takes it by writing its owner id with an expiry and renews
//! it while it runs (between batches, and every quarter of the lease while a batch waits for
//! the broker), and another may take it only once the lease expired, so a relay that dies
//! releases it after [`LEASE`] ([`SqliteRelayStore::lease`]). Writing the lease is atomic (one
//! writer at a time). A row whose id is not a UUID is parked with the reason (it holds its
//! key, as every parked row does, until it is unparked). There is no
//! NOTIFY: the relay polls at its poll interval, and wakes up at the next due time of a
//! scheduled row. A scheduled row not yet due is skipped by the read's walk in `seq` order
//! (SQLite's outbox is meant for small volumes: many rows scheduled far ahead cost each read a
//! pass over them).

use std::time::Duration;

use sqlx::sqlite::SqlitePool;
use sqlx::Row;
use uuid::Uuid;

use super::{SqliteStore, NOW};
use crate::outbox::Retention;
use crate::relay::{
    parse_headers, Backlog, Failure, IntoRelayStore, Members, PendingRow, RelaySession, RelayStore,
};
use crate::store::sql::{stmt, Stmt};
use crate::store::text::{safe_text, MAX_LABEL_BYTES};
use crate::store::{StoreError, Tables};

/// How long a relay's hold on the slot lasts if it is never renewed (a crashed relay).
pub const LEASE: Duration = Duration::from_secs(60);

/// The lease row's key in `<outbox>_relay_locks`.
const SLOT_KEY: &str = "slot";

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
    sql: std::sync::Arc<Statements>,
    lease: Duration,
}

#[derive(Debug)]
struct Statements {
    lock: Stmt,
    renew: Stmt,
    unlock: Stmt,
    read: Stmt,
    park_bad_id: Stmt,
    mark_published: Stmt,
    record_failure: Stmt,
    purge: Stmt,
    backlog: Stmt,
    next_due: Stmt,
}

impl SqliteRelayStore {
    /// A relay store on `pool`'s database and `tables.outbox` (migrated by
    /// [`SqliteStore::migrate`]).
    pub fn new(pool: SqlitePool, tables: &Tables) -> Self {
        let t = &tables.outbox;
        let locks = t.derived("relay_locks");
        let sql = Statements {
            lock: stmt(format!(
                "INSERT INTO {locks} AS l (topic, lock_key, owner, expires_at) VALUES ('', '{SLOT_KEY}', $1, {lease}) \
                 ON CONFLICT (topic, lock_key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at \
                 WHERE l.expires_at < {NOW} OR l.owner = excluded.owner \
                 RETURNING owner",
                lease = later("$2")
            )),
            renew: stmt(format!(
                "UPDATE {locks} SET expires_at = {lease} \
                 WHERE topic = '' AND lock_key = '{SLOT_KEY}' AND owner = $1",
                lease = later("$2")
            )),
            unlock: stmt(format!("DELETE FROM {locks} WHERE owner = $1")),
            // A row waiting for its retry, or parked, blocks its key's later rows
            // (`pending_key_idx`); a scheduled row not yet due is left out, blocking nothing.
            read: stmt(format!(
                "SELECT id, seq, topic, message_key, type, payload, headers, attempts, \
                   (julianday(due_at) - 2440587.5) * 86400.0 AS due_epoch FROM {t} o \
                 WHERE published_at IS NULL AND parked_at IS NULL \
                   AND (due_at IS NULL OR due_at <= {NOW}) \
                   AND (message_key IS NOT NULL OR next_attempt_at <= {NOW}) \
                   AND NOT EXISTS (SELECT 1 FROM {t} w \
                     WHERE w.topic = o.topic AND w.message_key = o.message_key AND w.seq <= o.seq \
                       AND w.published_at IS NULL \
                       AND (w.parked_at IS NOT NULL OR w.next_attempt_at > {NOW})) \
                 ORDER BY seq LIMIT $1"
            )),
            // A row the relay cannot publish as it is (its id is not a UUID): parked with the
            // reason, so it holds its key, visibly, instead of going out again and again.
            park_bad_id: stmt(format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, parked_at = {NOW}, \
                   next_attempt_at = {NOW} \
                 WHERE seq = $1 AND published_at IS NULL"
            )),
            mark_published: stmt(format!(
                "UPDATE {t} SET published_at = {NOW} \
                 WHERE id IN (SELECT value FROM json_each($1)) AND published_at IS NULL"
            )),
            record_failure: stmt(format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, \
                   parked_at = CASE WHEN $3 THEN {NOW} END, next_attempt_at = {until} \
                 WHERE id = $1 AND published_at IS NULL",
                until = later("$4")
            )),
            purge: stmt(format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} \
                 WHERE published_at IS NOT NULL AND published_at < {before} \
                 ORDER BY published_at LIMIT $2)",
                before = earlier("$1")
            )),
            // Rows not yet due are counted apart; a due scheduled row is as old as its due time.
            backlog: stmt(format!(
                "SELECT (SELECT count(*) FROM {t} WHERE published_at IS NULL AND parked_at IS NULL \
                     AND (due_at IS NULL OR due_at <= {NOW})), \
                   (SELECT (julianday('now') - julianday(min(coalesce(due_at, created_at)))) \
                       * 86400.0 FROM {t} \
                     WHERE published_at IS NULL AND parked_at IS NULL \
                       AND (due_at IS NULL OR due_at <= {NOW})), \
                   (SELECT count(*) FROM {t} WHERE published_at IS NULL AND parked_at IS NOT NULL), \
                   (SELECT count(*) FROM (SELECT DISTINCT topic, message_key FROM {t} \
                     WHERE published_at IS NULL AND parked_at IS NOT NULL \
                       AND message_key IS NOT NULL)), \
                   (SELECT count(*) FROM {t} WHERE due_at > {NOW} AND published_at IS NULL \
                     AND parked_at IS NULL)"
            )),
            next_due: stmt(format!(
                "SELECT (julianday(min(due_at)) - julianday('now')) * 86400.0 FROM {t} \
                 WHERE due_at > {NOW} AND published_at IS NULL AND parked_at IS NULL"
            )),
        };
        Self {
            pool,
            sql: std::sync::Arc::new(sql),
            lease: LEASE,
        }
    }

    /// How long a relay's hold on the outbox lasts without renewal (default [`LEASE`]): a
    /// relay that dies leaves it to another after this long. A running relay renews it a few
    /// times per lease, between batches and while a batch is in flight.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(100));
        self
    }
}

/// A relay worker's session on SQLite: its owner id and, when it holds it, the slot's lease.
#[derive(Debug)]
pub struct SqliteRelaySession {
    pool: SqlitePool,
    sql: std::sync::Arc<Statements>,
    owner: String,
    lease: Duration,
}

/// A row as read, or the `seq` and the reason of a row that cannot be published as it is.
fn pending_row(
    row: &sqlx::sqlite::SqliteRow,
) -> Result<Result<PendingRow, (i64, String)>, StoreError> {
    let id: String = row.try_get("id")?;
    let seq: i64 = row.try_get("seq")?;
    let Ok(uuid) = Uuid::parse_str(&id) else {
        let shown = safe_text(&id, MAX_LABEL_BYTES);
        return Ok(Err((
            seq,
            format!("the row's id `{shown}` is not a UUID: it cannot be published as an event id"),
        )));
    };
    let headers = parse_headers(&row.try_get::<String, _>("headers")?);
    let attempts: i64 = row.try_get("attempts")?;
    Ok(Ok(PendingRow {
        id: uuid,
        seq: row.try_get("seq")?,
        slot: 0,
        topic: row.try_get("topic")?,
        key: row.try_get("message_key")?,
        event_type: row.try_get("type")?,
        payload: row.try_get("payload")?,
        headers,
        attempts: attempts as i32,
        due_at: row.try_get("due_epoch")?,
    }))
}

impl crate::sealed::Sealed for SqliteRelaySession {}
impl crate::sealed::Sealed for SqliteRelayStore {}
impl crate::sealed::Sealed for SqliteStore {}

impl RelaySession for SqliteRelaySession {
    async fn members(&mut self) -> Result<Members, StoreError> {
        // One slot: every session wants it, one holds it.
        Ok(Members { count: 1, rank: 0 })
    }

    async fn claim<'a>(
        &'a mut self,
        candidates: &'a [u32],
        want: usize,
    ) -> Result<Vec<u32>, StoreError> {
        if want == 0 || !candidates.contains(&0) {
            return Ok(Vec::new());
        }
        let got: Option<String> = sqlx::query_scalar(self.sql.lock.clone())
            .bind(&self.owner)
            .bind(self.lease.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?;
        Ok(got.map(|_| vec![0]).unwrap_or_default())
    }

    async fn release<'a>(&'a mut self, _slots: &'a [u32]) -> Result<(), StoreError> {
        sqlx::query(self.sql.unlock.clone())
            .bind(&self.owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn verify<'a>(&'a mut self, held: &'a [u32]) -> Result<(), StoreError> {
        if held.is_empty() {
            return Ok(());
        }
        let renewed = sqlx::query(self.sql.renew.clone())
            .bind(&self.owner)
            .bind(self.lease.as_secs_f64())
            .execute(&self.pool)
            .await?;
        if renewed.rows_affected() == 0 {
            return Err(StoreError::Config(format!(
                "the relay's lease on the outbox expired and was taken over (held for more than {:?} without renewal)",
                self.lease
            )));
        }
        Ok(())
    }

    async fn read<'a>(
        &'a mut self,
        slots: &'a [u32],
        _start: u32,
        limit: usize,
    ) -> Result<Vec<PendingRow>, StoreError> {
        if !slots.contains(&0) {
            return Ok(Vec::new());
        }
        loop {
            let rows = sqlx::query(self.sql.read.clone())
                .bind(limit as i64)
                .fetch_all(&self.pool)
                .await?;
            let mut read = Vec::with_capacity(rows.len());
            let mut bad = Vec::new();
            for row in &rows {
                match pending_row(row)? {
                    Ok(row) => read.push(row),
                    Err(unpublishable) => bad.push(unpublishable),
                }
            }
            if bad.is_empty() {
                return Ok(read);
            }
            // Parked, they hold their keys: read again without them and their keys' later rows.
            for (seq, reason) in bad {
                tracing::warn!(target: "inoutbox::relay", seq, "{reason}; the row is parked");
                sqlx::query(self.sql.park_bad_id.clone())
                    .bind(seq)
                    .bind(reason)
                    .execute(&self.pool)
                    .await?;
            }
        }
    }

    async fn next_due<'a>(&'a mut self, slots: &'a [u32]) -> Result<Option<Duration>, StoreError> {
        if !slots.contains(&0) {
            return Ok(None);
        }
        let secs: Option<f64> = sqlx::query_scalar(self.sql.next_due.clone())
            .fetch_one(&self.pool)
            .await?;
        Ok(secs.map(crate::relay::due_in))
    }

    fn renew_every(&self) -> Option<Duration> {
        Some(self.lease / 4)
    }

    async fn mark_published<'a>(&'a mut self, ids: &'a [Uuid]) -> Result<(), StoreError> {
        let list = serde_json::to_string(&ids.iter().map(Uuid::to_string).collect::<Vec<_>>())
            .unwrap_or_else(|_| "[]".to_owned());
        sqlx::query(self.sql.mark_published.clone())
            .bind(list)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn record_failures<'a>(
        &'a mut self,
        failures: &'a [Failure<'a>],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for failure in failures {
            sqlx::query(self.sql.record_failure.clone())
                .bind(failure.row.id.to_string())
                .bind(failure.error)
                .bind(failure.park)
                .bind(failure.backoff.as_secs_f64())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn close(mut self) {
        let _ = self.release(&[0]).await;
    }
}

impl RelayStore for SqliteRelayStore {
    type Session = SqliteRelaySession;

    fn slots(&self) -> u32 {
        1
    }

    async fn open(&self) -> Result<SqliteRelaySession, StoreError> {
        Ok(SqliteRelaySession {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            owner: Uuid::new_v4().to_string(),
            lease: self.lease,
        })
    }

    async fn listen(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn wait(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
    }

    async fn purge<'a>(&'a self, retention: &'a Retention) -> Result<u64, StoreError> {
        crate::store::delete_in_batches(retention.batch_size, |limit| async move {
            let done = sqlx::query(self.sql.purge.clone())
                .bind(retention.older_than.as_secs_f64())
                .bind(i64::from(limit))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        let (unpublished, oldest, parked, held, scheduled): (i64, Option<f64>, i64, i64, i64) =
            sqlx::query_as(self.sql.backlog.clone())
                .fetch_one(&self.pool)
                .await?;
        Ok(Backlog::new(unpublished, oldest, parked)
            .with_held_keys(held)
            .with_scheduled(scheduled))
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
