//! The SQLite backend: the inbox store ([`SqliteStore`]), the outbox writer, the relay store
//! and the migrations, with the same semantics as PostgreSQL, for embedded services, tests and
//! the zero-setup quickstart.
//!
//! SQLite has one writer at a time: transactions that write wait for each other (sqlx's busy
//! timeout), so partitions are handled in parallel but their transactions commit one by one.
//! Tables live in the main database: a configured schema is refused.

use std::sync::Arc;

use sqlx::sqlite::SqlitePool;
use sqlx::Sqlite;

use crate::store::migrate::{self, Migration, Migrator};
use crate::store::sql::{stmt, Dialect, InboxSql, Shared, Stmt};
use crate::store::{StoreError, Tables, OWNED};

mod deferred;
mod effects;
mod inbox;
mod legacy;
pub(crate) mod outbox;
pub(crate) mod relay;
mod two_phase;
mod tx;

pub use outbox::SqliteOutbox;
pub use relay::SqliteRelayStore;
pub use tx::SqliteTx;

/// What went wrong setting up a SQLite store.
#[derive(Debug, thiserror::Error)]
#[error("SQLite keeps every table in one database: configure table names without a schema (got schema `{0}`)")]
pub struct SchemaNotSupported(String);

/// The migrations this backend ships, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        component: "inbox",
        version: 1,
        description: "inbox, attempts and dead-letter tables",
        sql: include_str!("migrations/inbox_v1.sql"),
    },
    Migration {
        component: "outbox",
        version: 1,
        description: "outbox table and relay key leases",
        sql: include_str!("migrations/outbox_v1.sql"),
    },
    Migration {
        component: "inbox",
        version: 2,
        description: "dead letters deduplicated by event, payload size and digest",
        sql: include_str!("migrations/inbox_v2.sql"),
    },
    Migration {
        component: "inbox",
        version: 4,
        description: "business keys: a second unique key per group",
        sql: include_str!("migrations/inbox_v4.sql"),
    },
    Migration {
        component: "inbox",
        version: 5,
        description: "business keys scoped by event type (or a shared dedup_scope)",
        sql: include_str!("migrations/inbox_v5.sql"),
    },
    Migration {
        component: "outbox",
        version: 5,
        description: "scheduled publishing: a due time per row",
        sql: include_str!("migrations/outbox_v5.sql"),
    },
    Migration {
        component: "inbox",
        version: 6,
        description: "deferred messages: due time and deferral count (kept message and lease)",
        sql: include_str!("migrations/inbox_v6.sql"),
    },
    Migration {
        component: "inbox",
        version: 7,
        description: "effects after commit (leased by the drain, done ones purged oldest first)",
        sql: include_str!("migrations/inbox_v7.sql"),
    },
    Migration {
        component: "inbox",
        version: 8,
        description: "two-phase handlers: received rows claimed with leases, counted claims",
        sql: include_str!("migrations/inbox_v8.sql"),
    },
];

/// SQLite's current time in inoutbox's timestamp format.
pub(crate) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

pub(super) const DIALECT: Dialect = Dialect {
    now: NOW,
    ago: |secs| format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', {secs}))"),
    row_id: "rowid",
    json_strings: |array| format!("SELECT value FROM json_each({array})"),
};

struct Sqlite3;

impl Migrator for Sqlite3 {
    type Db = Sqlite;
    const MIGRATIONS: &'static [Migration] = MIGRATIONS;

    fn begin(_tables: &Tables) -> Vec<String> {
        // One writer at a time: concurrent migrators wait for each other.
        vec!["BEGIN IMMEDIATE".to_owned()]
    }

    fn migrations_table(tables: &Tables) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (component text NOT NULL, version integer NOT NULL, \
             description text NOT NULL, applied_at text NOT NULL DEFAULT ({NOW}), \
             PRIMARY KEY (component, version))",
            tables.migrations
        )
    }

    async fn rename_legacy(
        conn: &mut sqlx::SqliteConnection,
        tables: &Tables,
    ) -> Result<Vec<(String, String)>, StoreError> {
        legacy::rename(conn, tables).await
    }
}

#[derive(Debug)]
struct Statements {
    shared: InboxSql,
    claim: Stmt,
    claim_batch: Stmt,
    release_claims: Stmt,
    batch_attempts: Stmt,
    attempts: Stmt,
    dead_letter: Stmt,
    load_dead_letter: Stmt,
    deferred: DeferredSql,
}

impl Statements {
    fn new(t: &Tables) -> Self {
        let now = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
        Self {
            shared: InboxSql::new(t, DIALECT),
            deferred: DeferredSql::new(t),
            // `WHERE true` keeps SQLite from reading `ON CONFLICT` as a join constraint.
            release_claims: stmt(format!(
                "DELETE FROM {inbox} WHERE consumer_group = $1 AND EXISTS (SELECT 1 FROM json_each($2) AS j \
                 WHERE j.value ->> 0 = {inbox}.source AND j.value ->> 1 = {inbox}.event_id)",
                inbox = t.inbox,
            )),
            claim_batch: stmt(format!(
                "INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", processed_at, business_key) \
                 SELECT $1, j.value ->> 0, j.value ->> 1, j.value ->> 2, $2, j.value ->> 3, j.value ->> 4, {now}, j.value ->> 5 \
                 FROM json_each($3) AS j WHERE true \
                 ON CONFLICT DO NOTHING RETURNING source, event_id",
                inbox = t.inbox,
            )),
            batch_attempts: stmt(format!(
                "SELECT a.source, a.event_id, a.attempts FROM {attempts} a \
                 JOIN json_each($2) AS j ON a.source = j.value ->> 0 AND a.event_id = j.value ->> 1 \
                 WHERE a.consumer_group = $1",
                attempts = t.attempts,
            )),
            claim: stmt(format!(
                "INSERT INTO {} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", processed_at, business_key) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, {now}, $8) ON CONFLICT DO NOTHING",
                t.inbox
            )),
            attempts: stmt(format!(
                "SELECT attempts FROM {} WHERE consumer_group = $1 AND source = $2 AND event_id = $3",
                t.attempts
            )),
            // One letter per (group, source, event id): a redelivered or replayed message that
            // fails again updates its letter.
            dead_letter: stmt(format!(
                "INSERT INTO {dead} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
                   message_key, headers, payload, error, attempts, first_failed_at, last_failed_at, \
                   payload_size, payload_sha256) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                   COALESCE((SELECT first_failed_at FROM {attempts} \
                             WHERE consumer_group = $1 AND source = $2 AND event_id = $3), {now}), \
                   {now}, $13, $14) \
                 ON CONFLICT (consumer_group, source, event_id) WHERE event_id IS NOT NULL DO UPDATE SET \
                   event_type = excluded.event_type, topic = excluded.topic, \"partition\" = excluded.\"partition\", \
                   \"offset\" = excluded.\"offset\", message_key = excluded.message_key, headers = excluded.headers, \
                   payload = excluded.payload, payload_size = excluded.payload_size, \
                   payload_sha256 = excluded.payload_sha256, error = excluded.error, \
                   attempts = {dead}.attempts + excluded.attempts, last_failed_at = {now}, \
                   dead_lettered_at = {now}, times = {dead}.times + 1, replayed_at = NULL \
                 RETURNING id",
                dead = t.dead_letters,
                attempts = t.attempts
            )),
            load_dead_letter: stmt(format!(
                "SELECT id, consumer_group, event_id, event_type, topic, \"partition\", \"offset\", message_key, \
                   headers, payload, error, attempts, replayed_at IS NOT NULL AS replayed \
                 FROM {} WHERE consumer_group = $1 AND id = $2",
                t.dead_letters
            )),
        }
    }
}

/// `now` plus `secs` seconds, in inoutbox's timestamp format.
pub(super) fn later(secs: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('+%f seconds', {secs}))")
}

/// The statements of deferred messages, rendered once from the table names.
#[derive(Debug)]
pub(super) struct DeferredSql {
    pub(super) defer: Stmt,
    pub(super) claim: Stmt,
    pub(super) count: Stmt,
    pub(super) check: Stmt,
    pub(super) finish: Stmt,
    pub(super) release: Stmt,
    pub(super) drop_row: Stmt,
}

impl DeferredSql {
    fn new(t: &Tables) -> Self {
        let inbox = &t.inbox;
        Self {
            defer: stmt(format!(
                "UPDATE {inbox} SET processed_at = NULL, due_at = {due}, deferrals = deferrals + 1, \
                   lease_owner = NULL, lease_until = NULL, message_key = $5, headers = $6, payload = $7 \
                 WHERE consumer_group = $1 AND source = $2 AND event_id = $3 RETURNING deferrals",
                due = later("$4"),
            )),
            claim: stmt(format!(
                "UPDATE {inbox} SET lease_owner = $2, lease_until = {until} \
                 WHERE rowid = (SELECT rowid FROM {inbox} \
                   WHERE consumer_group = $1 AND processed_at IS NULL AND due_at <= {NOW} \
                     AND (lease_until IS NULL OR lease_until < {NOW}) \
                   ORDER BY due_at LIMIT 1) \
                 RETURNING source, event_id, business_key, topic, \"partition\", \"offset\", \
                   message_key, headers, payload",
                until = later("$3"),
            )),
            count: stmt(format!(
                "SELECT count(*) FROM {inbox} \
                 WHERE consumer_group = $1 AND processed_at IS NULL AND due_at IS NOT NULL"
            )),
            // A write: the transaction takes the write lock here, before the handler runs.
            check: stmt(format!(
                "UPDATE {inbox} SET lease_until = lease_until WHERE {OWNED} RETURNING 1"
            )),
            finish: stmt(format!(
                "UPDATE {inbox} SET processed_at = {NOW}, lease_owner = NULL, lease_until = NULL \
                 WHERE {OWNED} RETURNING 1"
            )),
            release: stmt(format!(
                "UPDATE {inbox} SET lease_owner = NULL, lease_until = NULL WHERE {OWNED}"
            )),
            drop_row: stmt(format!("DELETE FROM {inbox} WHERE {OWNED}")),
        }
    }
}

/// The SQLite store of the inbox: inbox rows, attempt counts and dead letters.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    tables: Tables,
    sql: Arc<Statements>,
}

impl SqliteStore {
    /// A store on `pool` with the default table names.
    pub fn new(pool: SqlitePool) -> Self {
        Self::build(pool, Tables::default())
    }

    /// Opens (creating it if missing) the SQLite database at `url` (`sqlite:path`), in WAL mode
    /// with a busy timeout, failing within [`CONNECT_TIMEOUT`] with the target and the cause.
    ///
    /// [`CONNECT_TIMEOUT`]: crate::store::CONNECT_TIMEOUT
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        use crate::store::{bounded, check_scheme, CONNECT_TIMEOUT};
        use std::str::FromStr;
        check_scheme(url, &["sqlite"], "SqliteStore")?;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Config(format!("invalid SQLite URL `{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(CONNECT_TIMEOUT);
        let pool = bounded(url, pool.connect_with(options)).await?;
        Ok(Self::new(pool))
    }

    /// A store on `pool` with the given table names (without a schema).
    pub fn with_tables(pool: SqlitePool, tables: Tables) -> Result<Self, SchemaNotSupported> {
        if let Some(schema) = tables.schema() {
            return Err(SchemaNotSupported(schema.as_str().to_owned()));
        }
        Ok(Self::build(pool, tables))
    }

    fn build(pool: SqlitePool, tables: Tables) -> Self {
        let sql = Arc::new(Statements::new(&tables));
        Self { pool, tables, sql }
    }

    /// Applies inoutbox's migrations (inbox and outbox tables): idempotent, and safe to call from
    /// several processes at once (`BEGIN IMMEDIATE` makes them wait for each other).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        migrate::migrate::<Sqlite3>(&mut conn, &self.tables).await
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table names.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    fn shared(&self) -> Shared<'_, Sqlite> {
        Shared {
            pool: &self.pool,
            sql: &self.sql.shared,
        }
    }
}
