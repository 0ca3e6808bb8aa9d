//! Operating a inoutbox database: what the `inoutbox` command shows and does. The state of every
//! consumer group's inbox and of the outbox, dead letters (list, show, replay, discard), parked
//! outbox rows, purges, and Kafka consumer lag; on PostgreSQL, SQLite or MySQL/MariaDB.
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

use crate::db::{self, Db};
use crate::engine::{Inbox, InboxConfig, ReplayError, SetupError};
use crate::message::Outcome;
#[cfg(feature = "mysql")]
use crate::mysql::{MySqlRelayStore, MySqlStore};
use crate::outbox::Retention;
use crate::postgres::PgStore;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
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
    #[cfg(feature = "mysql")]
    MySql(MySqlStore),
}

/// The same code on each backend's store and pool (the queries type-check per backend).
macro_rules! on_backend {
    ($self:expr, $store:ident => $body:expr) => {
        match &$self.backend {
            Backend::Postgres($store) => $body,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite($store) => $body,
            #[cfg(feature = "mysql")]
            Backend::MySql($store) => $body,
        }
    };
}

/// Operations on a inoutbox database (PostgreSQL, SQLite or MySQL/MariaDB), for the `inoutbox`
/// command and tools.
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

fn store_name<S: InboxStore>(_: &S) -> &'static str {
    S::NAME
}

impl Admin {
    /// Connects to `url` (`postgres://...`, `sqlite:...`, or `mysql://...` / `mariadb://...`
    /// with the `mysql` feature); the tables are in `schema` when given (as
    /// [`Tables::with_schema`]: a schema on PostgreSQL, a database on MySQL, refused on SQLite).
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
        #[cfg(feature = "mysql")]
        if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            let store = MySqlStore::connect(url).await?;
            return Ok(Self::mysql(MySqlStore::with_tables(
                store.pool().clone(),
                tables,
            )));
        }
        Err(AdminError::Config(format!(
            "the database URL must start with {}, got `{}`",
            SCHEMES,
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

    /// On a MySQL/MariaDB store (its table names).
    #[cfg(feature = "mysql")]
    pub fn mysql(store: MySqlStore) -> Self {
        let sql = sql::AdminSql::new(store.tables(), sql::MYSQL);
        Self {
            backend: Backend::MySql(store),
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
        let (groups, stuck, outbox, parked_keys) = on_backend!(self, s => (
            fetch(s.pool(), db::sql(sql.groups.clone())).await?,
            s.count_stuck(stuck_after).await?,
            fetch(s.pool(), db::sql(sql.outbox.clone())).await?,
            fetch(s.pool(), db::sql(sql.parked_keys.clone())).await?,
        ));
        let outbox = outbox
            .first()
            .ok_or(StoreError::from(sqlx::Error::RowNotFound))?;
        let effects = self.effects_status().await?;
        Ok(Status {
            effects,
            groups: groups.iter().map(group_row).collect::<Result<_, _>>()?,
            stuck,
            stuck_after,
            outbox: OutboxStatus {
                unpublished: get(outbox, 0)?,
                oldest_unpublished_secs: get::<Option<f64>>(outbox, 1)?.map(|s| s.max(0.0)),
                parked: get(outbox, 2)?,
                held: get(outbox, 3)?,
                scheduled: get(outbox, 4)?,
                parked_keys: parked_keys
                    .iter()
                    .map(parked_key_row)
                    .collect::<Result<_, _>>()?,
            },
        })
    }

    /// Every group's effects not done.
    async fn effects_status(&self) -> Result<Vec<EffectsStatus>, AdminError> {
        let query = db::sql(self.sql.effects.clone());
        let rows = on_backend!(self, s => fetch(s.pool(), query).await?);
        let effects = rows.iter().map(|row| {
            Ok(EffectsStatus {
                group: text_not_null(row, 0)?,
                pending: get(row, 1)?,
                failed: get(row, 2)?,
                oldest_pending_secs: get::<Option<f64>>(row, 3)?.map(|s| s.max(0.0)),
            })
        });
        effects
            .collect::<Result<_, StoreError>>()
            .map_err(AdminError::from)
    }

    /// Dead letters matching `filter`, newest first.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetterRow>, AdminError> {
        let limit = if filter.limit == 0 { 50 } else { filter.limit };
        let since = filter.since.map(|d| d.as_secs_f64());
        let query = db::sql(self.sql.list.clone())
            .bind(filter.group.as_deref())
            .bind(filter.event_type.as_deref())
            .bind(since)
            .bind(i64::from(limit));
        let rows = on_backend!(self, s => fetch(s.pool(), query).await?);
        Ok(rows.iter().map(letter_row).collect::<Result<_, _>>()?)
    }

    /// The dead letter `id`: as listed, and as stored (headers, payload).
    pub async fn dead_letter(
        &self,
        id: i64,
    ) -> Result<(DeadLetterRow, StoredDeadLetter), AdminError> {
        let query = db::sql(self.sql.by_id.clone()).bind(id);
        let rows = on_backend!(self, s => fetch(s.pool(), query).await?);
        let row = rows
            .first()
            .map(letter_row)
            .transpose()?
            .ok_or(AdminError::NotFound(id))?;
        let stored = on_backend!(self, s => s.load_dead_letter(&row.group, id).await)?
            .ok_or(AdminError::NotFound(id))?;
        Ok((row, stored))
    }

    /// Deletes the dead letter `id`; `false` if there was none.
    pub async fn discard(&self, id: i64) -> Result<bool, AdminError> {
        let query = db::sql(self.sql.discard.clone()).bind(id);
        let deleted = on_backend!(self, s => execute(s.pool(), query).await?);
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
        let query = db::sql(self.sql.unpark.clone()).bind(key).bind(topic);
        let n = on_backend!(self, s => execute(s.pool(), query).await?);
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
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => Purged {
                inbox: purge_inbox(s, &retention).await?,
                outbox: MySqlRelayStore::new(s.pool().clone(), s.tables())
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

/// The URL schemes [`Admin::connect`] takes, for its error.
#[cfg(all(feature = "sqlite", feature = "mysql"))]
const SCHEMES: &str = "`postgres://`, `sqlite:` or `mysql://`";
#[cfg(all(feature = "sqlite", not(feature = "mysql")))]
const SCHEMES: &str = "`postgres://` or `sqlite:`";
#[cfg(all(not(feature = "sqlite"), feature = "mysql"))]
const SCHEMES: &str = "`postgres://` or `mysql://`";
#[cfg(not(any(feature = "sqlite", feature = "mysql")))]
const SCHEMES: &str = "`postgres://`";

/// The rows of `query`, on a connection of `pool`.
async fn fetch<D: Db>(pool: &sqlx::Pool<D>, query: db::Sql) -> Result<Vec<db::Row>, StoreError> {
    let mut conn = pool.acquire().await?;
    Ok(query.fetch_all(&mut conn).await?)
}

/// Runs `query` on a connection of `pool`; the rows it changed.
async fn execute<D: Db>(pool: &sqlx::Pool<D>, query: db::Sql) -> Result<u64, StoreError> {
    let mut conn = pool.acquire().await?;
    Ok(query.execute(&mut conn).await?)
}

/// Column `index` of `row`.
fn get<T: db::FromColumn>(row: &db::Row, index: usize) -> Result<T, StoreError> {
    Ok(row.get(index)?)
}

/// Column `index` of `row` as text: MySQL reports its binary-collated text columns (and the
/// `varbinary` keys) as bytes.
fn text(row: &db::Row, index: usize) -> Result<Option<String>, StoreError> {
    match row.get::<Option<String>>(index) {
        Ok(text) => Ok(text),
        Err(e) => match row.get::<Option<Vec<u8>>>(index) {
            Ok(bytes) => Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned())),
            Err(_) => Err(e.into()),
        },
    }
}

/// Column `index` of `row` as text, not `NULL`.
fn text_not_null(row: &db::Row, index: usize) -> Result<String, StoreError> {
    text(row, index)?.ok_or_else(|| {
        StoreError::from(sqlx::Error::ColumnDecode {
            index: index.to_string(),
            source: "unexpected NULL".into(),
        })
    })
}

fn group_row(row: &db::Row) -> Result<GroupStatus, StoreError> {
    Ok(GroupStatus {
        group: text_not_null(row, 0)?,
        inbox_rows: get(row, 1)?,
        processed_last_minute: get(row, 2)?,
        dead_letters: get(row, 3)?,
        dead_letters_pending: get(row, 4)?,
    })
}

/// A row of the parked-keys query: topic, key, rows, last error, parked at, rows held.
fn parked_key_row(row: &db::Row) -> Result<ParkedKey, StoreError> {
    Ok(ParkedKey {
        topic: text_not_null(row, 0)?,
        key: text(row, 1)?,
        rows: get(row, 2)?,
        last_error: text(row, 3)?,
        parked_at: text(row, 4)?,
        held: get(row, 5)?,
    })
}

fn letter_row(row: &db::Row) -> Result<DeadLetterRow, StoreError> {
    Ok(DeadLetterRow {
        id: get(row, 0)?,
        group: text_not_null(row, 1)?,
        event_id: text(row, 2)?,
        event_type: text(row, 3)?,
        topic: text_not_null(row, 4)?,
        partition: get(row, 5)?,
        offset: get(row, 6)?,
        attempts: get(row, 7)?,
        error: text_not_null(row, 8)?,
        dead_lettered_at: text(row, 9)?.unwrap_or_default(),
        replayed_at: text(row, 10)?,
    })
}
