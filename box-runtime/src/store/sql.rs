//! SQL that both sqlx backends share: the statements that differ only in dialect, rendered
//! once from the table names, and the functions that run them on any sqlx database.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use sqlx::{AssertSqlSafe, Database, Executor, IntoArguments, Pool, SqlSafeStr, SqlStr};

use super::{InboxKey, StoreError, Tables};

/// A statement rendered once and run many times.
///
/// sqlx runs only strings marked as audited: every statement of the stores is built from
/// [`Ident`](crate::ident::Ident)s (validated, double-quoted table names) and fixed text, never
/// from a value (values are bound), and this is where that is asserted. Cloning one for a query
/// counts a reference instead of copying the text.
pub(crate) type Stmt = SqlStr;

/// Marks `sql`, rendered from validated identifiers and fixed text, as a [`Stmt`].
pub(crate) fn stmt(sql: String) -> Stmt {
    AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str()
}

/// The statement `render` writes, rendered once per backend, statement and table for the life
/// of the process: for the statements a backend runs with only a table name in hand (the
/// insert of `after_commit`, the effects table's counts; a process has one effects table per
/// store).
pub(crate) fn rendered_once(
    backend: &'static str,
    statement: impl std::fmt::Debug,
    table: &str,
    render: impl FnOnce() -> String,
) -> Stmt {
    static RENDERED: LazyLock<Mutex<HashMap<String, Stmt>>> = LazyLock::new(Default::default);
    let key = format!("{backend} {statement:?} {table}");
    let mut rendered = RENDERED.lock().unwrap_or_else(PoisonError::into_inner);
    rendered
        .entry(key)
        .or_insert_with(|| stmt(render()))
        .clone()
}

/// How a backend writes the few things that differ between PostgreSQL and SQLite.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect {
    /// The current time, as stored in inoutbox's timestamp columns.
    pub(crate) now: &'static str,
    /// A time `secs` seconds before now, given the SQL expression `secs`.
    pub(crate) ago: fn(&str) -> String,
    /// The physical row id, for batched deletes.
    pub(crate) row_id: &'static str,
    /// The strings of a JSON array, as a set to match with `IN`, given the SQL expression of
    /// the array's text.
    pub(crate) json_strings: fn(&str) -> String,
}

/// The inbox statements whose text is the same up to the [`Dialect`].
#[derive(Debug)]
pub(crate) struct InboxSql {
    pub(crate) clear_attempts: Stmt,
    pub(crate) mark_replayed: Stmt,
    pub(crate) delete_processed: Stmt,
    pub(crate) count_stuck: Stmt,
    pub(crate) count_dead_letters: Stmt,
    pub(crate) record_failure: Stmt,
    pub(crate) expire_business_key: Stmt,
    pub(crate) known_event: Stmt,
}

impl InboxSql {
    pub(crate) fn new(t: &Tables, d: Dialect) -> Self {
        Self {
            clear_attempts: stmt(format!(
                "DELETE FROM {} WHERE consumer_group = $1 AND source = $2 AND event_id = $3",
                t.attempts
            )),
            mark_replayed: stmt(format!(
                "UPDATE {} SET replayed_at = {} WHERE id = $1",
                t.dead_letters, d.now
            )),
            delete_processed: stmt(format!(
                "DELETE FROM {inbox} WHERE {id} IN (SELECT {id} FROM {inbox} \
                 WHERE processed_at < {before} LIMIT $2) RETURNING 1",
                inbox = t.inbox,
                id = d.row_id,
                before = (d.ago)("$1"),
            )),
            count_stuck: stmt(format!(
                "SELECT count(*) FROM {} WHERE processed_at IS NULL AND received_at < {ago} \
                 AND (due_at IS NULL OR due_at < {ago})",
                t.inbox,
                ago = (d.ago)("$1")
            )),
            count_dead_letters: stmt(format!(
                "SELECT count(*) FROM {} WHERE consumer_group = $1 AND replayed_at IS NULL",
                t.dead_letters
            )),
            record_failure: stmt(format!(
                "INSERT INTO {a} AS a (consumer_group, source, event_id, attempts, last_error) \
                 VALUES ($1, $2, $3, 1, $4) \
                 ON CONFLICT (consumer_group, source, event_id) DO UPDATE \
                 SET attempts = a.attempts + 1, last_error = excluded.last_error, \
                     last_failed_at = {now} \
                 RETURNING CAST(attempts AS bigint) AS attempts",
                a = t.attempts,
                now = d.now
            )),
            expire_business_key: stmt(format!(
                "UPDATE {} SET business_key = NULL \
                 WHERE consumer_group = $1 AND business_key IN ({}) AND received_at < {}",
                t.inbox,
                (d.json_strings)("$2"),
                (d.ago)("$3")
            )),
            known_event: stmt(format!(
                "SELECT count(*) FROM {} WHERE consumer_group = $1 AND source = $2 AND event_id = $3",
                t.inbox
            )),
        }
    }
}

/// Runs the shared inbox statements on any sqlx database whose types inoutbox uses.
pub(crate) struct Shared<'a, DB: Database> {
    pub(crate) pool: &'a Pool<DB>,
    pub(crate) sql: &'a InboxSql,
}

impl<DB> Shared<'_, DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    for<'q> f64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    /// Opens a transaction on the pool.
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// Deletes the attempt count of `key` (after success or dead-lettering), in `conn`.
    pub(crate) async fn clear_attempts(
        &self,
        conn: &mut DB::Connection,
        key: &InboxKey,
    ) -> Result<(), StoreError> {
        sqlx::query(self.sql.clear_attempts.clone())
            .bind(key.group.as_str())
            .bind(key.source.as_str())
            .bind(key.event_id.as_str())
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Frees the business keys of `keys` held by rows received more than `older_than` ago:
    /// one statement per group (a consumer's batch has one).
    pub(crate) async fn expire_business_keys(
        &self,
        conn: &mut DB::Connection,
        keys: &[&InboxKey],
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
            let business_keys =
                serde_json::to_string(&business_keys).expect("a list of strings serializes");
            sqlx::query(self.sql.expire_business_key.clone())
                .bind(group)
                .bind(business_keys.as_str())
                .bind(older_than.as_secs_f64())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// What a claim that inserted nothing for `key` met: the event id (a duplicate), or, when
    /// no row holds the id, the business key.
    pub(crate) async fn duplicate_of(
        &self,
        conn: &mut DB::Connection,
        key: &InboxKey,
    ) -> Result<super::Claim, StoreError> {
        if key.business_key.is_none() {
            return Ok(super::Claim::Duplicate);
        }
        let (known,): (i64,) = sqlx::query_as(self.sql.known_event.clone())
            .bind(key.group.as_str())
            .bind(key.source.as_str())
            .bind(key.event_id.as_str())
            .fetch_one(conn)
            .await?;
        Ok(match known {
            0 => super::Claim::DuplicateBusinessKey,
            _ => super::Claim::Duplicate,
        })
    }

    /// Counts one more failed run of `key`, outside any transaction; returns the count.
    pub(crate) async fn record_failure(
        &self,
        key: &InboxKey,
        error: &str,
    ) -> Result<u32, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let (attempts,): (i64,) = sqlx::query_as(self.sql.record_failure.clone())
            .bind(key.group.as_str())
            .bind(key.source.as_str())
            .bind(key.event_id.as_str())
            .bind(super::text::safe_text(error, super::text::MAX_ERROR_BYTES).as_ref())
            .fetch_one(&mut *conn)
            .await?;
        Ok(u32::try_from(attempts).unwrap_or(0))
    }

    pub(crate) async fn mark_replayed(&self, id: i64) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query(self.sql.mark_replayed.clone())
            .bind(id)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    pub(crate) async fn delete_processed(
        &self,
        older_than: std::time::Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        // `RETURNING 1` counts the rows portably (the row count of a query result is not part
        // of sqlx's generic API); at most `limit` tiny rows come back.
        let deleted = sqlx::query(self.sql.delete_processed.clone())
            .bind(older_than.as_secs_f64())
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
        Ok(deleted.len() as u64)
    }

    pub(crate) async fn count_stuck(
        &self,
        older_than: std::time::Duration,
    ) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let (count,): (i64,) = sqlx::query_as(self.sql.count_stuck.clone())
            .bind(older_than.as_secs_f64())
            .fetch_one(&mut *conn)
            .await?;
        Ok(count)
    }

    pub(crate) async fn count_dead_letters(&self, group: &str) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let (count,): (i64,) = sqlx::query_as(self.sql.count_dead_letters.clone())
            .bind(group)
            .fetch_one(&mut *conn)
            .await?;
        Ok(count)
    }
}
