//! Stores: where inbox rows, attempt counts and dead letters live. The engine sees only
//! [`InboxStore`].

use std::any::Any;
use std::future::Future;

use crate::transport::Delivery;

/// The [`InboxStore`] methods whose code is the same for every sqlx store: the store has
/// `pool` and `sql` (its rendered statements: `clear_attempts`, `mark_replayed`,
/// `delete_processed`, `count_stuck`) fields.
macro_rules! shared_store_methods {
    () => {
        async fn begin(&self) -> Result<Self::Tx, StoreError> {
            Ok(self.pool.begin().await?)
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
            // `claim` inserted the row already marked processed: only recorded failures remain
            // to be cleared.
            if had_failures {
                sqlx::query(&self.sql.clear_attempts)
                    .bind(&key.group)
                    .bind(&key.source)
                    .bind(&key.event_id)
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(())
        }

        async fn mark_replayed(&self, id: i64) -> Result<(), StoreError> {
            sqlx::query(&self.sql.mark_replayed)
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
            let done = sqlx::query(&self.sql.delete_processed)
                .bind(older_than.as_secs_f64())
                .bind(i64::from(limit))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        }

        async fn count_stuck(&self, older_than: std::time::Duration) -> Result<i64, StoreError> {
            Ok(sqlx::query_scalar(&self.sql.count_stuck)
                .bind(older_than.as_secs_f64())
                .fetch_one(&self.pool)
                .await?)
        }
    };
}
use shared_store_methods;

pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod tables;

pub use tables::Tables;

/// The identity of a message in a consumer group's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InboxKey {
    /// Consumer group.
    pub group: String,
    /// Source, or `""` when the key has none.
    pub source: String,
    /// Event id.
    pub event_id: String,
}

/// What inserting the inbox row found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The row is new: run the handler. `attempts` is how many earlier runs failed.
    New {
        /// Earlier failed runs.
        attempts: u32,
    },
    /// The row existed: the message was already processed.
    Duplicate,
}

/// A message given up on, with everything needed to inspect or replay it.
#[derive(Clone, Debug)]
pub struct DeadLetter<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// The inbox key, when the message had a usable id.
    pub key: Option<&'a InboxKey>,
    /// The event type header, if present.
    pub event_type: Option<&'a str>,
    /// The raw message.
    pub delivery: &'a Delivery,
    /// Why, with the error chain.
    pub error: &'a str,
    /// Failed runs (0 when the message never reached a handler).
    pub attempts: u32,
}

/// A database error, classified by SQLSTATE where one exists.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database cannot be reached or the connection broke; retry after a backoff.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A serialization failure or deadlock (SQLSTATE 40001 / 40P01): retry the transaction.
    #[error("transaction conflict (SQLSTATE {code}): {source}")]
    Conflict {
        /// The SQLSTATE.
        code: String,
        /// The error.
        #[source]
        source: sqlx::Error,
    },
    /// Anything else.
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
    /// A configuration problem (invalid table name, ...).
    #[error(transparent)]
    Config(#[from] crate::ident::IdentError),
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Conflict { .. })
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        classify(error)
    }
}

/// Classifies an sqlx error by what it means, never by its text.
pub fn classify(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => StoreError::Unavailable(error),
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // SQLite reports numeric (extended) result codes: the low byte is the primary code.
            if let Ok(sqlite) = code.parse::<i32>() {
                return match sqlite & 0xff {
                    // SQLITE_BUSY, SQLITE_LOCKED: another writer holds the database.
                    5 | 6 => StoreError::Conflict {
                        code,
                        source: error,
                    },
                    // SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_FULL: the file is unusable now.
                    10 | 13 | 14 => StoreError::Unavailable(error),
                    _ => StoreError::Other(error),
                };
            }
            match code.as_str() {
                // serialization_failure, deadlock_detected
                "40001" | "40P01" => StoreError::Conflict {
                    code,
                    source: error,
                },
                // class 08: connection exception; 57P01..57P03: admin shutdown, crash shutdown,
                // cannot connect now; 53300: too many connections
                c if c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300") => {
                    StoreError::Unavailable(error)
                }
                _ => StoreError::Other(error),
            }
        }
        _ => StoreError::Other(error),
    }
}

/// Whether an sqlx error, e.g. one a handler returned, means the database went away.
pub fn is_unavailable(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(sqlx_error) = e.downcast_ref::<sqlx::Error>() {
            return match sqlx_error {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                    c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")
                }),
                _ => false,
            };
        }
        next = e.source();
    }
    false
}

/// Runs `delete_batch` (a statement deleting at most `batch` rows) until a run deletes fewer:
/// retention deletes in short statements, never one long one. Returns the rows deleted.
pub(crate) async fn delete_in_batches<F, Fut>(
    batch: u32,
    mut delete_batch: F,
) -> Result<u64, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = delete_batch(batch).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// The storage an inbox engine needs. PostgreSQL implements it ([`postgres::PgStore`]).
///
/// Every method that takes no transaction runs on its own (autocommit), so what it writes
/// survives the rollback of a handler's transaction.
pub trait InboxStore: Send + Sync + 'static {
    /// The transaction handed to handlers.
    type Tx: Any + Send;

    /// A short name for messages (`"postgres"`).
    const NAME: &'static str;

    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// Commits it.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls it back.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Inserts the inbox row unless it exists (`ON CONFLICT DO NOTHING`); reports which, and how
    /// many earlier runs of this message failed.
    ///
    /// The row may be written already marked processed: it becomes visible only when the
    /// transaction commits, which happens only after the handler succeeded, so nothing can tell
    /// the difference, and it saves the round trip of a separate update.
    fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send + 'a;

    /// Marks the inbox row processed (if `claim` did not already), in the same transaction;
    /// clears recorded failures when there were some.
    fn mark_processed<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        had_failures: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Records a failed run outside any transaction; returns the number of failed runs so far.
    fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> impl Future<Output = Result<u32, StoreError>> + Send + 'a;

    /// Stores a dead letter outside any transaction; returns its id.
    fn dead_letter<'a>(
        &'a self,
        letter: &'a DeadLetter<'a>,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a;

    /// Loads a dead letter of `group` by id.
    fn load_dead_letter<'a>(
        &'a self,
        group: &'a str,
        id: i64,
    ) -> impl Future<Output = Result<Option<StoredDeadLetter>, StoreError>> + Send + 'a;

    /// Records that a dead letter was replayed successfully.
    fn mark_replayed(&self, id: i64) -> impl Future<Output = Result<(), StoreError>> + Send + '_;

    /// Deletes at most `limit` inbox rows processed more than `older_than` ago; returns how many.
    fn delete_processed(
        &self,
        older_than: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + '_;

    /// Counts inbox rows received more than `older_than` ago and still not processed.
    fn count_stuck(
        &self,
        older_than: std::time::Duration,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + '_;
}

/// A dead letter as stored: the raw message and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDeadLetter {
    /// Its id in the dead-letter table.
    pub id: i64,
    /// The consumer group.
    pub group: String,
    /// The event id, when the message had one.
    pub event_id: Option<String>,
    /// The event type header, when present.
    pub event_type: Option<String>,
    /// The raw message (topic, partition, offset, key, headers, payload bytes).
    pub delivery: Delivery,
    /// The reason and error chain.
    pub error: String,
    /// Failed runs.
    pub attempts: u32,
    /// Whether it was replayed successfully.
    pub replayed: bool,
}
