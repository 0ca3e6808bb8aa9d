//! Operating a inoutbox database: what the `inoutbox` command shows and does. The state of every
//! consumer group's inbox and of the outbox, dead letters (list, show, replay, discard), parked
//! outbox rows, purges, and Kafka consumer lag; on PostgreSQL or SQLite.
//!
//! ```no_run
//! # async fn demo() -> Result<(), inoutbox::admin::AdminError> {
//! use std::time::Duration;
//! use inoutbox::admin::Admin;
//!
//! let admin = Admin::connect("postgres://app@db/app", None).await?;
//! let status = admin.status(Duration::from_secs(300)).await?;
//! println!("{} rows waiting in the outbox", status.outbox.unpublished);
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::Row;

use crate::engine::{Inbox, InboxConfig, ReplayError, SetupError};
use crate::message::Outcome;
use crate::outbox::Retention;
use crate::postgres::PgStore;
#[cfg(feature = "sqlite")]
use crate::relay::RelayStore;
#[cfg(feature = "sqlite")]
use crate::sqlite::{SqliteRelayStore, SqliteStore};
use crate::store::{self, InboxStore, StoreError, StoredDeadLetter, Tables};

mod lag;
mod sql;

pub use crate::kafka::PartitionLag;
pub use lag::{consumer_lag, impossible_lag};

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The database failed, or refused the URL.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A setting is wrong (an unknown URL scheme, a schema on SQLite, ...).
    #[error("{0}")]
    Config(String),
    /// No dead letter with that id.
    #[error("no dead letter with id {0}")]
    NotFound(i64),
    /// The dead letter was replayed successfully before.
    #[error("dead letter {0} was already replayed")]
    AlreadyReplayed(i64),
    /// This binary cannot run the handler of the letter's group (the standalone `inoutbox`
    /// binary has no handlers).
    #[error(
        "cannot replay dead letter {id} of group `{group}` from this binary: {reason}. Replaying \
         runs the group's handler, so it must run in the application's own binary: call \
         `inoutbox::cli::run()` from it (e.g. `myservice inoutbox dead-letters replay {id}`)"
    )]
    NoHandlers {
        /// The letter.
        id: i64,
        /// Its group.
        group: String,
        /// What the registry said.
        reason: String,
    },
    /// Kafka could not be asked.
    #[error("kafka: {0}")]
    Kafka(String),
}

/// The state of every consumer group and of the outbox.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Status {
    /// One line per consumer group with inbox rows or dead letters, by name.
    pub groups: Vec<GroupStatus>,
    /// Inbox rows (all groups) received more than `stuck_after` ago and still not processed
    /// ([`InboxStore::count_stuck`]).
    pub stuck: i64,
    /// The age from which an unprocessed inbox row counts as stuck.
    pub stuck_after: Duration,
    /// The outbox.
    pub outbox: OutboxStatus,
    /// One line per consumer group with effects not done, by name.
    pub effects: Vec<EffectsStatus>,
}

/// One consumer group's effects after commit not done yet.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EffectsStatus {
    /// The group.
    pub group: String,
    /// Its effects not done.
    pub pending: i64,
    /// Those whose runs failed at least once (`attempts > 0`): retried after a backoff.
    pub failed: i64,
    /// Seconds since the oldest of them was scheduled.
    pub oldest_pending_secs: Option<f64>,
}

/// One consumer group's inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group.
    pub group: String,
    /// Its inbox rows (kept until the retention purge deletes them).
    pub inbox_rows: i64,
    /// Rows processed in the last minute.
    pub processed_last_minute: i64,
    /// Its dead letters, replayed or not.
    pub dead_letters: i64,
    /// Its dead letters not replayed yet.
    pub dead_letters_pending: i64,
}

/// The outbox: what waits to be published, and what was given up on.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// Rows not published yet that are due (parked rows, and scheduled rows not yet due,
    /// excepted).
    pub unpublished: i64,
    /// Seconds since the oldest of them was written, if any.
    pub oldest_unpublished_secs: Option<f64>,
    /// Parked rows: given up on by the relay until unparked.
    pub parked: i64,
    /// Rows held behind a parked row of their key: per-key order keeps them unpublished until
    /// it is unparked.
    pub held: i64,
    /// The keys with parked rows (the 50 with the most), with the last error of each.
    pub parked_keys: Vec<ParkedKey>,
    /// Scheduled rows not yet due (`outbox::enqueue_at`).
    pub scheduled: i64,
}

/// The parked rows of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedKey {
    /// The topic.
    pub topic: String,
    /// The key (`None` for rows without one).
    pub key: Option<String>,
    /// Parked rows of the key.
    pub rows: i64,
    /// The error of its latest parked row.
    pub last_error: Option<String>,
    /// When that row was parked (UTC, `YYYY-MM-DDTHH:MM:SSZ`).
    pub parked_at: Option<String>,
    /// Later rows of the key held behind its parked rows (unpublished until they are unparked).
    pub held: i64,
}

/// Which dead letters to list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Only this consumer group.
    pub group: Option<String>,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only those dead-lettered less than this long ago.
    pub since: Option<Duration>,
    /// At most this many, newest first (0: 50).
    pub limit: u32,
}

impl DeadLetterFilter {
    /// Every dead letter, up to `limit`.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Only this group.
    #[must_use]
    pub fn group(mut self, group: Option<String>) -> Self {
        self.group = group;
        self
    }

    /// Only this event type.
    #[must_use]
    pub fn event_type(mut self, event_type: Option<String>) -> Self {
        self.event_type = event_type;
        self
    }

    /// Only those dead-lettered less than `age` ago.
    #[must_use]
    pub fn since(mut self, age: Option<Duration>) -> Self {
        self.since = age;
        self
    }
}

/// A dead letter as listed: where it came from and why it was given up on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterRow {
    /// Its id.
    pub id: i64,
    /// The consumer group.
    pub group: String,
    /// The event id, when the message had one.
    pub event_id: Option<String>,
    /// The event type, when the message had one.
    pub event_type: Option<String>,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Failed runs.
    pub attempts: i32,
    /// The reason and error chain.
    pub error: String,
    /// When (UTC, `YYYY-MM-DDTHH:MM:SSZ`).
    pub dead_lettered_at: String,
    /// When it was replayed successfully, if it was.
    pub replayed_at: Option<String>,
}

/// What a purge deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// Processed inbox rows.
    pub inbox: u64,
    /// Published outbox rows.
    pub outbox: u64,
}

enum Backend {
    Postgres(PgStore),
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
}

/// The same code on each backend's store and pool (the queries type-check per backend).
macro_rules! on_backend {
    ($self:expr, $store:ident => $body:expr) => {
        match &$self.backend {
            Backend::Postgres($store) => $body,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite($store) => $body,
        }
    };
}

/// Operations on a inoutbox database (PostgreSQL or SQLite), for the `inoutbox` command and tools.
pub struct Admin {
    backend: Backend,
    sql: sql::AdminSql,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = on_backend!(self, s => store_name(s));
        f.debug_struct("Admin").field("backend", &name).finish()
    }
}

/// A row of the parked-keys query: topic, key, rows, last error, parked at, rows held.
type ParkedKeyRow = (
    String,
    Option<String>,
    i64,
    Option<String>,
    Option<String>,
    i64,
);

fn store_name<S: InboxStore>(_: &S) -> &'static str {
    S::NAME
}

impl Admin {
    /// Connects to `url` (`postgres://...` or `sqlite:...`); on PostgreSQL the tables are in
    /// `schema` when given (as [`Tables::with_schema`]).
    pub async fn connect(url: &str, schema: Option<&str>) -> Result<Self, AdminError> {
        let tables = match schema {
            Some(schema) => Tables::with_schema(schema)
                .map_err(|e| AdminError::Config(format!("--schema: {e}")))?,
            None => Tables::default(),
        };
        if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let store = PgStore::connect(url, 2).await?;
            return Ok(Self::postgres(PgStore::with_tables(
                store.pool().clone(),
                tables,
            )));
        }
        #[cfg(feature = "sqlite")]
        if url.starts_with("sqlite:") {
            let store = SqliteStore::connect(url).await?;
            let store = SqliteStore::with_tables(store.pool().clone(), tables)
                .map_err(|e| AdminError::Config(e.to_string()))?;
            return Ok(Self::sqlite(store));
        }
        Err(AdminError::Config(format!(
            "the database URL must start with `postgres://` or `sqlite:`, got `{}`",
            store::redact_url(url)
        )))
    }

    /// On a PostgreSQL store (its table names).
    pub fn postgres(store: PgStore) -> Self {
        let sql = sql::AdminSql::new(store.tables(), sql::POSTGRES);
        Self {
            backend: Backend::Postgres(store),
            sql,
        }
    }

    /// On a SQLite store (its table names).
    #[cfg(feature = "sqlite")]
    pub fn sqlite(store: SqliteStore) -> Self {
        let sql = sql::AdminSql::new(store.tables(), sql::SQLITE);
        Self {
            backend: Backend::Sqlite(store),
            sql,
        }
    }

    /// Applies inoutbox's migrations.
    pub async fn migrate(&self) -> Result<(), AdminError> {
        Ok(on_backend!(self, s => s.migrate().await)?)
    }

    /// Every group's inbox and dead letters, stuck inbox rows, and the outbox.
    pub async fn status(&self, stuck_after: Duration) -> Result<Status, AdminError> {
        let sql = &self.sql;
        let (groups, stuck, outbox, parked_keys) = on_backend!(self, s => {
            let groups: Vec<(String, i64, i64, i64, i64)> =
                sqlx::query_as(sql.groups.clone()).fetch_all(s.pool()).await.map_err(StoreError::from)?;
            let stuck = s.count_stuck(stuck_after).await?;
            let outbox: (i64, Option<f64>, i64, i64, i64) =
                sqlx::query_as(sql.outbox.clone()).fetch_one(s.pool()).await.map_err(StoreError::from)?;
            let keys: Vec<ParkedKeyRow> =
                sqlx::query_as(sql.parked_keys.clone()).fetch_all(s.pool()).await.map_err(StoreError::from)?;
            (groups, stuck, outbox, keys)
        });
        let effects = self.effects_status().await?;
        Ok(Status {
            effects,
            groups: groups
                .into_iter()
                .map(|(group, rows, recent, dead, pending)| GroupStatus {
                    group,
                    inbox_rows: rows,
                    processed_last_minute: recent,
                    dead_letters: dead,
                    dead_letters_pending: pending,
                })
                .collect(),
            stuck,
            stuck_after,
            outbox: OutboxStatus {
                unpublished: outbox.0,
                oldest_unpublished_secs: outbox.1.map(|s| s.max(0.0)),
                parked: outbox.2,
                held: outbox.3,
                scheduled: outbox.4,
                parked_keys: parked_keys
                    .into_iter()
                    .map(
                        |(topic, key, rows, last_error, parked_at, held)| ParkedKey {
                            topic,
                            key,
                            rows,
                            last_error,
                            parked_at,
                            held,
                        },
                    )
                    .collect(),
            },
        })
    }

    /// Every group's effects not done.
    async fn effects_status(&self) -> Result<Vec<EffectsStatus>, AdminError> {
        let rows = match &self.backend {
            Backend::Postgres(s) => s.effects_by_group().await?,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => s.effects_by_group().await?,
        };
        Ok(rows
            .into_iter()
            .map(
                |(group, pending, failed, oldest_pending_secs)| EffectsStatus {
                    group,
                    pending,
                    failed,
                    oldest_pending_secs,
                },
            )
            .collect())
    }

    /// Dead letters matching `filter`, newest first.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetterRow>, AdminError> {
        let limit = if filter.limit == 0 { 50 } else { filter.limit };
        let since = filter.since.map(|d| d.as_secs_f64());
        let rows = on_backend!(self, s => {
            let rows = sqlx::query(self.sql.list.clone())
                .bind(filter.group.as_deref())
                .bind(filter.event_type.as_deref())
                .bind(since)
                .bind(i64::from(limit))
                .fetch_all(s.pool())
                .await
                .map_err(StoreError::from)?;
            rows.iter().map(letter_row).collect::<Result<Vec<_>, sqlx::Error>>()
        });
        Ok(rows.map_err(StoreError::from)?)
    }

    /// The dead letter `id`: as listed, and as stored (headers, payload).
    pub async fn dead_letter(
        &self,
        id: i64,
    ) -> Result<(DeadLetterRow, StoredDeadLetter), AdminError> {
        let row = on_backend!(self, s => {
            let row = sqlx::query(self.sql.by_id.clone())
                .bind(id)
                .fetch_optional(s.pool())
                .await
                .map_err(StoreError::from)?;
            row.as_ref().map(letter_row).transpose()
        })
        .map_err(StoreError::from)?
        .ok_or(AdminError::NotFound(id))?;
        let stored = on_backend!(self, s => s.load_dead_letter(&row.group, id).await)?
            .ok_or(AdminError::NotFound(id))?;
        Ok((row, stored))
    }

    /// Deletes the dead letter `id`; `false` if there was none.
    pub async fn discard(&self, id: i64) -> Result<bool, AdminError> {
        let deleted = on_backend!(self, s => sqlx::query(self.sql.discard.clone())
            .bind(id)
            .execute(s.pool())
            .await
            .map(|r| r.rows_affected()))
        .map_err(StoreError::from)?;
        Ok(deleted > 0)
    }

    /// Runs the dead letter `id` through its group's handler again, in the inbox transaction
    /// (see [`Inbox::replay`]), with `config` (the group's usual configuration; retries as it
    /// says). The handler must be linked into this binary.
    pub async fn replay(&self, id: i64, config: InboxConfig) -> Result<Outcome, AdminError> {
        let (row, _) = self.dead_letter(id).await?;
        let group = row.group;
        let no_handlers = |e: SetupError| match e {
            SetupError::Registry(reason) => AdminError::NoHandlers {
                id,
                group: group.clone(),
                reason: reason.to_string(),
            },
            other => AdminError::Config(other.to_string()),
        };
        let replayed = on_backend!(self, s => {
            let inbox = Inbox::new(s.clone(), &group, config).map_err(no_handlers)?;
            inbox.replay(id).await
        });
        match replayed {
            Ok(outcome) => Ok(outcome),
            Err(ReplayError::NotFound { .. }) => Err(AdminError::NotFound(id)),
            Err(ReplayError::AlreadyReplayed { .. }) => Err(AdminError::AlreadyReplayed(id)),
            Err(ReplayError::Store(e)) => Err(e.into()),
        }
    }

    /// Puts parked outbox rows back on the relay's path (due now, attempts reset): those of
    /// `key` (and `topic`, when given), or every parked row when `key` is `None`. Returns how
    /// many rows.
    pub async fn unpark(&self, key: Option<&str>, topic: Option<&str>) -> Result<u64, AdminError> {
        let n = on_backend!(self, s => sqlx::query(self.sql.unpark.clone())
            .bind(key)
            .bind(topic)
            .execute(s.pool())
            .await
            .map(|r| r.rows_affected()))
        .map_err(StoreError::from)?;
        Ok(n)
    }

    /// Deletes inbox rows processed, and outbox rows published, more than `older_than` ago,
    /// `batch` rows per statement (each its own short transaction).
    pub async fn purge(&self, older_than: Duration, batch: u32) -> Result<Purged, AdminError> {
        let retention = Retention::default()
            .older_than(older_than)
            .batch_size(batch);
        let purged = match &self.backend {
            Backend::Postgres(s) => Purged {
                inbox: purge_inbox(s, &retention).await?,
                outbox: crate::postgres::relay::purge_published(s.pool(), s.tables(), &retention)
                    .await?,
            },
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => Purged {
                inbox: purge_inbox(s, &retention).await?,
                outbox: SqliteRelayStore::new(s.pool().clone(), s.tables())
                    .purge(&retention)
                    .await?,
            },
        };
        Ok(purged)
    }
}

async fn purge_inbox<S: InboxStore>(store: &S, retention: &Retention) -> Result<u64, StoreError> {
    store::delete_in_batches(retention.batch_size, |limit| {
        store.delete_processed(retention.older_than, limit)
    })
    .await
}

fn letter_row<R: Row>(row: &R) -> Result<DeadLetterRow, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(DeadLetterRow {
        id: row.try_get(0)?,
        group: row.try_get(1)?,
        event_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        topic: row.try_get(4)?,
        partition: row.try_get(5)?,
        offset: row.try_get(6)?,
        attempts: row.try_get(7)?,
        error: row.try_get(8)?,
        dead_lettered_at: row.try_get::<Option<String>, _>(9)?.unwrap_or_default(),
        replayed_at: row.try_get(10)?,
    })
}
