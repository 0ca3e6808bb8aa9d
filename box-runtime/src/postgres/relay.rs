//! The PostgreSQL relay store: slots claimed with session advisory locks on each worker's own
//! connection, reads that walk the partial index of fresh rows in `seq` order, one-statement
//! marks.
//!
//! Lock ids use the two-`int4` form `(table oid, n)`, so they never meet the enqueue's `bigint`
//! locks: `n` in `0..SLOTS` is a slot, `n < 0` (shown as `objid >= 2^31` in `pg_locks`) marks a
//! member, one per session. Members are counted in `pg_locks`, so every relay knows its share
//! of the slots without a table of its own, and a session that dies releases everything at once.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgRow};
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::Mutex;
use uuid::Uuid;

use super::outbox::notify_channel;
use super::PgStore;
use crate::outbox::Retention;
use crate::relay::{
    parse_headers, Backlog, Failure, IntoRelayStore, Members, PendingRow, RelaySession, RelayStore,
};
use crate::store::sql::{stmt, Stmt};
use crate::store::{StoreError, Tables};

/// The number of slots keys are hashed into: the `slot` column (migration outbox v2) is
/// `hashtextextended(key, 0) & 63`.
pub const SLOTS: u32 = 64;

/// The PostgreSQL relay store.
///
/// Each relay worker opens a `PgRelaySession`: a dedicated connection that holds the
/// session-level advisory locks of its slots (`pg_try_advisory_lock`, never waited for) and
/// runs every read and mark of those slots. PostgreSQL releases the locks when that connection
/// ends, so a relay that crashes (or is SIGKILLed) never leaves a slot held.
///
/// **Connection poolers**: session advisory locks need a real session. Through PgBouncer in
/// *transaction* (or statement) pooling mode, consecutive statements may run on different
/// server connections; [`RelaySession::verify`] detects that (the backend pid changes, or the
/// locks are not on the backend that took them) and the relay stops with an error. Connect
/// relays directly to PostgreSQL, or through a pool in *session* mode.
pub struct PgRelayStore {
    pool: PgPool,
    tables: Tables,
    channel: String,
    listener: Mutex<Option<PgListener>>,
    sql: Arc<Statements>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    read: Stmt,
    mark_published: Stmt,
    record_failures: Stmt,
    next_due: Stmt,
}

/// Members, and this session's rank among them (by member id).
const MEMBERS: &str = "SELECT count(*), count(*) FILTER (WHERE objid::int8 < $2) FROM pg_locks \
    WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
      AND classid = $1::int8::oid AND objsubid = 2 AND objid::int8 >= 2147483648 AND granted";

const CLAIM: &str =
    "SELECT s FROM unnest($2::int4[]) AS s WHERE pg_try_advisory_lock($1::int4, s) LIMIT $3";

const RELEASE: &str = "SELECT count(pg_advisory_unlock($1::int4, s)) FROM unnest($2::int4[]) AS s";

/// What the session's backend holds in the table's lock class.
const HELD: &str = "SELECT pg_backend_pid(), \
      coalesce(array_agg(objid::int8) FILTER (WHERE objid::int8 >= 2147483648), '{}'), \
      coalesce(array_agg(objid::int8) FILTER (WHERE objid::int8 < 2147483648), '{}') \
    FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' \
      AND classid = $1::int8::oid AND objsubid = 2 AND granted";

impl Statements {
    fn new(tables: &Tables) -> Self {
        let t = &tables.outbox;
        let cols = "id, seq, slot, topic, message_key, type, payload::text AS payload, \
                    headers::text AS headers, attempts, \
                    EXTRACT(EPOCH FROM due_at)::float8 AS due_epoch";
        // Per run of contiguous slots ($2, $3: bounds), the ready index `(seq, slot)` is walked
        // in `seq` order; other slots' entries are skipped in the index, and LIMIT stops the
        // walk: a read costs what it returns, whatever the backlog, and visits the table in
        // the order rows were written. Beside it, the run's scheduled rows that are due, from
        // the front of the scheduled index `(due_at, slot)` (rows not yet due are never
        // visited). The first $4 of each side, merged in `seq` order and cut at $4, are the
        // first $4 publishable rows of the run in `seq` order: each key's rows come as a
        // prefix, in order.
        let ready = "published_at IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL \
                     AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.topic = o.topic \
                                     AND b.message_key = o.message_key AND b.seq < o.seq)";
        let fresh = format!(
            "(SELECT f.* FROM unnest($2::int4[], $3::int4[]) AS r(lo, hi) CROSS JOIN LATERAL ( \
               SELECT * FROM ( \
                 (SELECT {cols} FROM {t} o \
                  WHERE slot >= r.lo AND slot < r.hi AND due_at IS NULL AND {ready} \
                  ORDER BY seq LIMIT $4) \
                 UNION ALL \
                 (SELECT {cols} FROM {t} o \
                  WHERE slot >= r.lo AND slot < r.hi AND due_at <= now() AND {ready} \
                  ORDER BY seq LIMIT $4)) AS u \
               ORDER BY seq LIMIT $4) AS f)"
        );
        Self {
            table: t.to_string(),
            // Rows that failed carry their retry time (`next_attempt_at`) and sit in the retry
            // index (normally empty); parked rows sit in the parked index (normally small). A
            // row waiting for its retry, or parked, blocks the later rows of its key (a parked
            // row until it is unparked); due retries come first.
            read: stmt(format!(
                "WITH retry AS MATERIALIZED ( \
                   SELECT id, seq, topic, message_key, next_attempt_at <= now() AS due FROM {t} \
                   WHERE slot = ANY($1) AND published_at IS NULL AND parked_at IS NULL \
                     AND next_attempt_at IS NOT NULL), \
                 blocked AS MATERIALIZED ( \
                   SELECT topic, message_key, min(seq) AS seq FROM retry \
                   WHERE NOT due AND message_key IS NOT NULL GROUP BY topic, message_key \
                   UNION ALL \
                   SELECT topic, message_key, min(seq) FROM {t} \
                   WHERE parked_at IS NOT NULL AND published_at IS NULL AND slot = ANY($1) \
                     AND message_key IS NOT NULL GROUP BY topic, message_key) \
                 (SELECT {cols} FROM {t} WHERE id IN ( \
                    SELECT r.id FROM retry r WHERE r.due AND NOT EXISTS ( \
                      SELECT 1 FROM blocked b WHERE b.topic = r.topic \
                        AND b.message_key = r.message_key AND b.seq < r.seq)) \
                  ORDER BY seq LIMIT $4) \
                 UNION ALL {fresh} LIMIT $4"
            )),
            mark_published: stmt(format!(
                "UPDATE {t} SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL"
            )),
            record_failures: stmt(format!(
                "UPDATE {t} AS o SET attempts = o.attempts + 1, last_error = f.error, \
                   parked_at = CASE WHEN f.park THEN now() END, \
                   next_attempt_at = now() + make_interval(secs => f.secs) \
                 FROM unnest($1::uuid[], $2::text[], $3::bool[], $4::float8[]) \
                   AS f(id, error, park, secs) \
                 WHERE o.id = f.id AND o.published_at IS NULL"
            )),
            // The next due time still ahead (strictly: a due row that is held waits for what
            // holds it, not for this), from the front of the scheduled index.
            next_due: stmt(format!(
                "SELECT EXTRACT(EPOCH FROM min(due_at) - now())::float8 FROM {t} \
                 WHERE due_at > now() AND slot = ANY($1) AND published_at IS NULL \
                   AND parked_at IS NULL AND next_attempt_at IS NULL"
            )),
        }
    }
}

impl PgRelayStore {
    /// A relay store on `pool`'s database and `tables.outbox`.
    pub fn new(pool: PgPool, tables: Tables) -> Self {
        Self {
            channel: notify_channel(&tables),
            sql: Arc::new(Statements::new(&tables)),
            pool,
            tables,
            listener: Mutex::new(None),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// A relay worker's session on PostgreSQL: one connection, its member lock and slot locks.
pub struct PgRelaySession {
    conn: PgConnection,
    sql: Arc<Statements>,
    /// The lock class: the outbox table's oid.
    class: i32,
    member: i32,
    pid: i32,
}

impl std::fmt::Debug for PgRelaySession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRelaySession")
            .field("table", &self.sql.table)
            .field("member", &self.member)
            .field("pid", &self.pid)
            .finish()
    }
}

fn lost_session(table: &str, what: String) -> StoreError {
    StoreError::Config(format!(
        "the relay's session advisory locks on {table} are not held by its connection ({what}): \
         is it connected through a pooler in transaction or statement mode (PgBouncer)? \
         Connect relays directly to PostgreSQL, or through a pool in session mode"
    ))
}

impl PgRelaySession {
    async fn open(pool: &PgPool, sql: Arc<Statements>) -> Result<Self, StoreError> {
        let options: PgConnectOptions = (*pool.connect_options()).clone();
        let mut conn = PgConnection::connect_with(&options).await?;
        let (oid, pid): (i64, i32) =
            sqlx::query_as("SELECT $1::regclass::oid::int8, pg_backend_pid()")
                .bind(&sql.table)
                .fetch_one(&mut conn)
                .await?;
        let class = oid as u32 as i32;
        let mut session = Self {
            conn,
            sql,
            class,
            member: 0,
            pid,
        };
        loop {
            // A member id of its own (the sign bit set keeps it apart from the slots).
            let member = i32::MIN | (Uuid::new_v4().as_u128() as i32 & 0x3fff_ffff);
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1::int4, $2::int4)")
                .bind(class)
                .bind(member)
                .fetch_one(&mut session.conn)
                .await?;
            if got {
                session.member = member;
                break;
            }
        }
        session.verify(&[]).await?;
        Ok(session)
    }
}

fn pending_row(row: &PgRow) -> Result<PendingRow, sqlx::Error> {
    let headers: &str = row.try_get("headers")?;
    let slot: i16 = row.try_get("slot")?;
    Ok(PendingRow {
        id: row.try_get("id")?,
        seq: row.try_get("seq")?,
        slot: slot as u32,
        topic: row.try_get("topic")?,
        key: row.try_get("message_key")?,
        event_type: row.try_get("type")?,
        payload: row.try_get("payload")?,
        headers: parse_headers(headers),
        attempts: row.try_get("attempts")?,
        due_at: row.try_get("due_epoch")?,
    })
}

fn as_i32(slots: &[u32]) -> Vec<i32> {
    slots.iter().map(|&s| s as i32).collect()
}

/// `slots` as runs of contiguous slots `[lo, hi)`, the first one starting at or after `start`
/// (or the lowest, if none does).
fn runs(slots: &[u32], start: u32) -> (Vec<i32>, Vec<i32>) {
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(i32, i32)> = Vec::new();
    for s in sorted {
        let s = s as i32;
        match runs.last_mut() {
            Some((_, hi)) if *hi == s => *hi = s + 1,
            _ => runs.push((s, s + 1)),
        }
    }
    let first = runs
        .iter()
        .position(|&(lo, _)| lo >= start as i32)
        .unwrap_or(0);
    runs.rotate_left(first);
    runs.into_iter().unzip()
}

impl crate::sealed::Sealed for PgRelaySession {}
impl crate::sealed::Sealed for PgRelayStore {}
impl crate::sealed::Sealed for PgStore {}

impl RelaySession for PgRelaySession {
    async fn members(&mut self) -> Result<Members, StoreError> {
        let (count, rank): (i64, i64) = sqlx::query_as(MEMBERS)
            .bind(i64::from(self.class as u32))
            .bind(i64::from(self.member as u32))
            .fetch_one(&mut self.conn)
            .await?;
        Ok(Members {
            count: usize::try_from(count).unwrap_or(1).max(1),
            rank: usize::try_from(rank).unwrap_or(0),
        })
    }

    async fn claim<'a>(
        &'a mut self,
        candidates: &'a [u32],
        want: usize,
    ) -> Result<Vec<u32>, StoreError> {
        let got: Vec<i32> = sqlx::query_scalar(CLAIM)
            .bind(self.class)
            .bind(as_i32(candidates))
            .bind(want as i64)
            .fetch_all(&mut self.conn)
            .await?;
        Ok(got.into_iter().map(|s| s as u32).collect())
    }

    async fn release<'a>(&'a mut self, slots: &'a [u32]) -> Result<(), StoreError> {
        sqlx::query(RELEASE)
            .bind(self.class)
            .bind(as_i32(slots))
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }

    async fn verify<'a>(&'a mut self, held: &'a [u32]) -> Result<(), StoreError> {
        let (pid, members, mut slots): (i32, Vec<i64>, Vec<i64>) = sqlx::query_as(HELD)
            .bind(i64::from(self.class as u32))
            .fetch_one(&mut self.conn)
            .await?;
        let table = &self.sql.table;
        if pid != self.pid {
            let what = format!("backend pid {pid}, opened as {}", self.pid);
            return Err(lost_session(table, what));
        }
        let me = i64::from(self.member as u32);
        if members != [me] {
            let what = format!("member locks {members:?} on the backend, expected [{me}]");
            return Err(lost_session(table, what));
        }
        slots.sort_unstable();
        let mut expected: Vec<i64> = held.iter().map(|&s| i64::from(s)).collect();
        expected.sort_unstable();
        if slots != expected {
            let what = format!("slots {slots:?} on the backend, expected {expected:?}");
            return Err(lost_session(table, what));
        }
        Ok(())
    }

    async fn read<'a>(
        &'a mut self,
        slots: &'a [u32],
        start: u32,
        limit: usize,
    ) -> Result<Vec<PendingRow>, StoreError> {
        let (lo, hi) = runs(slots, start);
        let rows = sqlx::query(self.sql.read.clone())
            .bind(as_i32(slots))
            .bind(&lo)
            .bind(&hi)
            .bind(limit as i64)
            .fetch_all(&mut self.conn)
            .await?;
        rows.iter()
            .map(pending_row)
            .collect::<Result<_, _>>()
            .map_err(Into::into)
    }

    async fn next_due<'a>(&'a mut self, slots: &'a [u32]) -> Result<Option<Duration>, StoreError> {
        let secs: Option<f64> = sqlx::query_scalar(self.sql.next_due.clone())
            .bind(as_i32(slots))
            .fetch_one(&mut self.conn)
            .await?;
        Ok(secs.map(crate::relay::due_in))
    }

    async fn mark_published<'a>(&'a mut self, ids: &'a [Uuid]) -> Result<(), StoreError> {
        sqlx::query(self.sql.mark_published.clone())
            .bind(ids)
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }

    async fn record_failures<'a>(
        &'a mut self,
        failures: &'a [Failure<'a>],
    ) -> Result<(), StoreError> {
        let ids: Vec<Uuid> = failures.iter().map(|f| f.row.id).collect();
        let errors: Vec<&str> = failures.iter().map(|f| f.error).collect();
        let parks: Vec<bool> = failures.iter().map(|f| f.park).collect();
        let secs: Vec<f64> = failures.iter().map(|f| f.backoff.as_secs_f64()).collect();
        sqlx::query(self.sql.record_failures.clone())
            .bind(&ids)
            .bind(&errors)
            .bind(&parks)
            .bind(&secs)
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }

    async fn close(mut self) {
        // Closing the session releases every lock it holds, but the server ends the session a
        // moment after the client closed it: unlocking first frees the slots by the time
        // `close` returns (bounded, in case the connection is the reason for closing).
        let unlock = sqlx::query("SELECT pg_advisory_unlock_all()").execute(&mut self.conn);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), unlock).await;
        let _ = self.conn.close().await;
    }
}

impl RelayStore for PgRelayStore {
    type Session = PgRelaySession;

    fn slots(&self) -> u32 {
        SLOTS
    }

    async fn open(&self) -> Result<PgRelaySession, StoreError> {
        PgRelaySession::open(&self.pool, self.sql.clone()).await
    }

    async fn listen(&self) -> Result<(), StoreError> {
        let mut guard = self.listener.lock().await;
        if guard.is_none() {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(&self.channel).await?;
            *guard = Some(listener);
        }
        Ok(())
    }

    async fn wait(&self, timeout: Duration) {
        let mut guard = self.listener.lock().await;
        let Some(listener) = guard.as_mut() else {
            drop(guard);
            tokio::time::sleep(timeout).await;
            if let Err(e) = self.listen().await {
                tracing::warn!(target: "inoutbox::postgres", error = %e, "relay cannot LISTEN; polling only");
            }
            return;
        };
        if listener.next_buffered().is_none() {
            if let Ok(Err(e)) = tokio::time::timeout(timeout, listener.recv()).await {
                tracing::warn!(target: "inoutbox::postgres", error = %e, "relay lost its LISTEN connection; reconnecting");
                *guard = None;
                return;
            }
        }
        while listener.next_buffered().is_some() {}
    }

    async fn purge<'a>(&'a self, retention: &'a Retention) -> Result<u64, StoreError> {
        purge_published(&self.pool, &self.tables, retention).await
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        // Five scalar subqueries, each on a partial index of the rows it counts. Rows not yet
        // due are scheduled, not unpublished; a due scheduled row's age runs from its due time.
        let sql = format!(
            "SELECT (SELECT count(*) FROM {t} WHERE published_at IS NULL AND parked_at IS NULL \
                 AND (due_at IS NULL OR due_at <= now())), \
               (SELECT EXTRACT(EPOCH FROM now() - min(coalesce(due_at, created_at)))::float8 \
                 FROM {t} WHERE published_at IS NULL AND parked_at IS NULL \
                   AND (due_at IS NULL OR due_at <= now())), \
               (SELECT count(*) FROM {t} WHERE published_at IS NULL AND parked_at IS NOT NULL), \
               (SELECT count(*) FROM (SELECT DISTINCT topic, message_key FROM {t} \
                 WHERE published_at IS NULL AND parked_at IS NOT NULL \
                   AND message_key IS NOT NULL) AS k), \
               (SELECT count(*) FROM {t} WHERE due_at > now() AND published_at IS NULL \
                 AND parked_at IS NULL AND next_attempt_at IS NULL)",
            t = self.tables.outbox
        );
        let (unpublished, oldest, parked, held, scheduled): (i64, Option<f64>, i64, i64, i64) =
            sqlx::query_as(stmt(sql)).fetch_one(&self.pool).await?;
        Ok(Backlog::new(unpublished, oldest, parked)
            .with_held_keys(held)
            .with_scheduled(scheduled))
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
    let sql = stmt(format!(
        "DELETE FROM {t} WHERE id IN (\
           SELECT id FROM {t} \
           WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
           ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        t = tables.outbox
    ));
    let secs = retention.older_than.as_secs_f64();
    let sql = &sql;
    crate::store::delete_in_batches(retention.batch_size, |limit| async move {
        let done = sqlx::query(sql.clone())
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

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn slots_become_runs_starting_at_or_after_start() {
        assert_eq!(
            runs(&[3, 1, 2, 7, 8, 63], 0),
            (vec![1, 7, 63], vec![4, 9, 64])
        );
        assert_eq!(
            runs(&[3, 1, 2, 7, 8, 63], 4),
            (vec![7, 63, 1], vec![9, 64, 4])
        );
        assert_eq!(
            runs(&[3, 1, 2, 7, 8, 63], 64),
            (vec![1, 7, 63], vec![4, 9, 64])
        );
        assert_eq!(runs(&[], 5), (vec![], vec![]));
    }
}
