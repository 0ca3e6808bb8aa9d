//! The MySQL/MariaDB backend: the inbox store ([`MySqlStore`]), the outbox writer, the relay
//! store and the migrations, with the semantics of the PostgreSQL store.
//!
//! Statements are those MariaDB >= 10.6 and MySQL >= 8.0 both accept: no `RETURNING` (a claim
//! marks the rows it inserts with a random token and reads them back), `ON DUPLICATE KEY
//! UPDATE` for upserts, `GET_LOCK` for the relay's hold on the outbox. Identifiers are the
//! validated names of [`Tables`], quoted with backticks; a configured schema is a database.
//! There is no LISTEN/NOTIFY: the relay polls.

use std::sync::Arc;

use sqlx::mysql::MySqlPool;
use sqlx::MySql;

use crate::ident::TableName;
use crate::store::migrate::{self, Migration, Migrator};
use crate::store::sql::{stmt, Stmt};
use crate::store::{StoreError, Tables, OWNED};

mod deferred;
mod effects;
mod inbox;
pub(crate) mod outbox;
pub(crate) mod relay;
mod two_phase;
mod tx;

pub use outbox::MySqlOutbox;
pub use relay::{MySqlRelaySession, MySqlRelayStore};
pub use tx::MySqlTx;

/// The migrations this backend ships, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        component: "inbox",
        version: 1,
        description: "inbox, attempts and dead-letter tables (business keys, deferred messages)",
        sql: include_str!("migrations/inbox_v1.sql"),
    },
    Migration {
        component: "outbox",
        version: 1,
        description: "outbox table (scheduled publishing)",
        sql: include_str!("migrations/outbox_v1.sql"),
    },
    Migration {
        component: "inbox",
        version: 2,
        description: "two-phase handlers (received rows claimed with leases, counted claims) \
                      and effects after commit",
        sql: include_str!("migrations/inbox_v2.sql"),
    },
    Migration {
        component: "inbox",
        version: 3,
        description: "two secondary indexes fewer on the inbox (the stuck count and the \
                      deferred claim read the indexes that remain)",
        sql: include_str!("migrations/inbox_v3.sql"),
    },
];

/// The connections of the pool [`MySqlStore::connect`] opens.
pub(crate) const POOL_CONNECTIONS: u32 = 10;

/// The current time, as stored (UTC: sqlx sets the session's time zone to `+00:00`).
pub(crate) const NOW: &str = "NOW(6)";

/// A time `?` microseconds before now.
pub(crate) const AGO: &str = "(NOW(6) - INTERVAL ? MICROSECOND)";

/// A time `?` microseconds after now.
pub(crate) const LATER: &str = "(NOW(6) + INTERVAL ? MICROSECOND)";

/// A duration in whole microseconds, for [`AGO`] and [`LATER`].
pub(crate) fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A statement written with double-quoted identifiers and `$n` placeholders, for MySQL: quoted
/// with backticks, bound with `?` (each placeholder is bound in the order it appears).
///
/// Every identifier of inoutbox's statements is a validated [`Ident`](crate::ident::Ident)
/// (letters, digits, `_`), so no double quote can be part of a name, and no statement of the
/// store holds a string literal with a double quote or a `$`.
pub(crate) fn adapt(sql: &str) -> String {
    crate::db::numbered_to_marks(sql).0.replace('"', "`")
}

/// A table name quoted for MySQL: `` `schema`.`name` ``.
pub(crate) fn quoted(table: &TableName) -> String {
    adapt(&table.to_string())
}

/// `adapt`, then [`stmt`].
fn my(sql: String) -> Stmt {
    stmt(adapt(&sql))
}

/// A random number marking the rows one statement inserts (MySQL has no `RETURNING`).
pub(crate) fn claim_token() -> i64 {
    i64::from_ne_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .expect("8 bytes"),
    )
}

/// `(?, ?), (?, ?), ...`: `n` pairs, for row constructors.
pub(crate) fn pairs(n: usize) -> String {
    vec!["(?, ?)"; n.max(1)].join(", ")
}

/// `?, ?, ...`: `n` placeholders.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n.max(1)].join(", ")
}

struct MySql8;

impl Migrator for MySql8 {
    type Db = MySql;
    const MIGRATIONS: &'static [Migration] = MIGRATIONS;

    fn begin(tables: &Tables) -> Vec<String> {
        // MySQL commits each DDL statement: the migrations exclude each other by the named
        // lock `MySqlStore::migrate` takes; `BEGIN` only groups the records.
        let mut statements = Vec::new();
        if let Some(schema) = tables.schema() {
            statements.push(adapt(&format!("CREATE DATABASE IF NOT EXISTS {schema}")));
        }
        // Inbox migration 2 alters the inbox only where `information_schema` shows the change
        // missing (MySQL 8.0 has no `ADD COLUMN IF NOT EXISTS`): the names it looks for. Both
        // are validated identifiers (letters, digits, `_`): safe in a literal.
        let schema = match tables.inbox.schema() {
            Some(schema) => format!("'{}'", schema.as_str()),
            None => "DATABASE()".to_owned(),
        };
        statements.push(format!("SET @inoutbox_schema = {schema}"));
        let inbox = tables.inbox.name().as_str();
        statements.push(format!("SET @inoutbox_inbox = '{inbox}'"));
        statements.push("BEGIN".to_owned());
        statements
    }

    fn migrations_table(tables: &Tables) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (component varchar(64) NOT NULL, version int NOT NULL, \
             description text NOT NULL, applied_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
             PRIMARY KEY (component, version)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            tables.migrations
        )
    }

    async fn rename_legacy(
        _conn: &mut sqlx::MySqlConnection,
        _tables: &Tables,
    ) -> Result<Vec<(String, String)>, StoreError> {
        // The backend is newer than the project's former name: nothing to rename.
        Ok(Vec::new())
    }

    fn adapt(sql: String) -> String {
        adapt(&sql)
    }
}

#[derive(Debug)]
struct Statements {
    clear_attempts: Stmt,
    mark_replayed: Stmt,
    delete_processed: Stmt,
    count_stuck: Stmt,
    count_dead_letters: Stmt,
    record_failure: Stmt,
    failures_of: Stmt,
    known_event: Stmt,
    dead_letter: Stmt,
    load_dead_letter: Stmt,
    inbox: String,
    attempts: String,
    leases: LeaseSql,
    deferred: DeferredSql,
}

impl Statements {
    fn new(t: &Tables) -> Self {
        let (inbox, attempts, dead) = (&t.inbox, &t.attempts, &t.dead_letters);
        Self {
            clear_attempts: my(format!(
                "DELETE FROM {attempts} WHERE consumer_group = $1 AND source = $2 AND event_id = $3"
            )),
            mark_replayed: my(format!("UPDATE {dead} SET replayed_at = {NOW} WHERE id = $1")),
            delete_processed: my(format!(
                "DELETE FROM {inbox} WHERE processed_at < {AGO} ORDER BY processed_at LIMIT $2"
            )),
            // Received and not processed for longer than the window, and not held by a live
            // claim, or claimed more than once (claims that keep failing or dying).
            count_stuck: my(format!(
                "SELECT count(*) FROM {inbox} i WHERE i.processed_at IS NULL AND i.received_at < {AGO} \
                   AND (i.due_at IS NULL OR i.due_at < {AGO}) \
                   AND (i.lease_until IS NULL OR i.lease_until < {NOW} OR i.claims > 1 \
                     OR EXISTS (SELECT 1 FROM {attempts} a WHERE a.consumer_group = i.consumer_group \
                       AND a.source = i.source AND a.event_id = i.event_id))"
            )),
            count_dead_letters: my(format!(
                "SELECT count(*) FROM {dead} WHERE consumer_group = $1 AND replayed_at IS NULL"
            )),
            record_failure: my(format!(
                "INSERT INTO {attempts} (consumer_group, source, event_id, attempts, last_error) \
                 VALUES ($1, $2, $3, 1, $4) \
                 ON DUPLICATE KEY UPDATE attempts = attempts + 1, last_error = $5, last_failed_at = {NOW}"
            )),
            failures_of: my(format!(
                "SELECT attempts FROM {attempts} WHERE consumer_group = $1 AND source = $2 AND event_id = $3"
            )),
            known_event: my(format!(
                "SELECT count(*) FROM {inbox} WHERE consumer_group = $1 AND source = $2 AND event_id = $3"
            )),
            // One letter per (group, source, event id): a redelivered or replayed message that
            // fails again updates its letter; `LAST_INSERT_ID(id)` reports the updated one's id.
            dead_letter: my(format!(
                "INSERT INTO {dead} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
                   message_key, headers, payload, error, attempts, first_failed_at, last_failed_at, \
                   payload_size, payload_sha256) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                   COALESCE((SELECT first_failed_at FROM {attempts} \
                             WHERE consumer_group = $13 AND source = $14 AND event_id = $15), {NOW}), \
                   {NOW}, $16, $17) \
                 ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id), \
                   event_type = VALUES(event_type), topic = VALUES(topic), \"partition\" = VALUES(\"partition\"), \
                   \"offset\" = VALUES(\"offset\"), message_key = VALUES(message_key), headers = VALUES(headers), \
                   payload = VALUES(payload), payload_size = VALUES(payload_size), \
                   payload_sha256 = VALUES(payload_sha256), error = VALUES(error), \
                   attempts = attempts + VALUES(attempts), last_failed_at = {NOW}, \
                   dead_lettered_at = {NOW}, times = times + 1, replayed_at = NULL"
            )),
            load_dead_letter: my(format!(
                "SELECT id, consumer_group, event_id, event_type, topic, \"partition\", \"offset\", message_key, \
                   headers, payload, error, attempts, CAST(replayed_at IS NOT NULL AS SIGNED) AS replayed \
                 FROM {dead} WHERE consumer_group = $1 AND id = $2"
            )),
            inbox: quoted(inbox),
            attempts: quoted(attempts),
            leases: LeaseSql::new(t),
            deferred: DeferredSql::new(t),
        }
    }
}

/// The columns of a claimed row that `store::received_row` reads (keys as text: they are
/// `varbinary`, written from Rust strings).
const RECEIVED_COLUMNS: &str = "CONVERT(c.source USING utf8mb4) AS source, \
     CONVERT(c.event_id USING utf8mb4) AS event_id, c.topic, c.\"partition\", c.\"offset\", \
     c.message_key, c.headers, c.payload";

/// The statements of leased rows (two-phase and deferred), rendered once per store.
#[derive(Debug)]
struct LeaseSql {
    /// The claim of received rows up to its event types (the lists vary per worker pool).
    claim_head: String,
    /// The per-key order condition of the claim, up to its list of ordered event types.
    ordered_head: String,
    lease: Stmt,
    renew_free: Stmt,
    renew: Stmt,
    held: Stmt,
    check: Stmt,
    finish: Stmt,
    release: Stmt,
    drop_row: Stmt,
}

impl LeaseSql {
    fn new(t: &Tables) -> Self {
        let inbox = &t.inbox;
        Self {
            // The group's received rows (no due time: deferred rows are the deferred worker's)
            // whose lease is free or expired, oldest first, by `{inbox}_received_idx`.
            claim_head: adapt(&format!(
                "SELECT {RECEIVED_COLUMNS} FROM {inbox} c \
                 WHERE c.consumer_group = ? AND c.processed_at IS NULL AND c.due_at IS NULL \
                   AND (c.lease_until IS NULL OR c.lease_until < NOW(6)) AND c.event_type IN "
            )),
            ordered_head: adapt(&format!(
                " AND NOT (c.event_type IN ({{ordered}}) AND EXISTS (SELECT 1 FROM {inbox} o \
                   WHERE o.consumer_group = c.consumer_group AND o.processed_at IS NULL \
                     AND o.due_at IS NULL AND o.topic = c.topic AND o.\"partition\" = c.\"partition\" \
                     AND o.message_key = c.message_key AND o.\"offset\" < c.\"offset\"))"
            )),
            lease: my(format!(
                "UPDATE {inbox} SET lease_owner = $1, lease_until = {LATER}, claims = claims + 1 \
                 WHERE consumer_group = $3 AND source = $4 AND event_id = $5"
            )),
            renew_free: my(format!(
                "SELECT 1 FROM {inbox} WHERE {OWNED} FOR UPDATE SKIP LOCKED"
            )),
            renew: my(format!(
                "UPDATE {inbox} SET lease_until = {LATER} WHERE {OWNED}"
            )),
            held: my(format!("SELECT count(*) FROM {inbox} WHERE {OWNED}")),
            // The row stays locked by the handler's transaction until it ends.
            check: my(format!("SELECT 1 FROM {inbox} WHERE {OWNED} FOR UPDATE")),
            finish: my(format!(
                "UPDATE {inbox} SET processed_at = NOW(6), lease_owner = NULL, lease_until = NULL \
                 WHERE {OWNED}"
            )),
            release: my(format!(
                "UPDATE {inbox} SET lease_owner = NULL, lease_until = NULL WHERE {OWNED}"
            )),
            drop_row: my(format!("DELETE FROM {inbox} WHERE {OWNED}")),
        }
    }

    /// The claim of a received row of `types`, `ordered` among them keeping per-key order.
    pub(super) fn claim(&self, types: usize, ordered: usize) -> Stmt {
        let ordered = match ordered {
            0 => String::new(),
            n => self.ordered_head.replace("{ordered}", &marks(n)),
        };
        stmt(format!(
            "{}({}){ordered} ORDER BY c.received_at LIMIT 1 FOR UPDATE SKIP LOCKED",
            self.claim_head,
            marks(types)
        ))
    }
}

/// The statements of deferred messages, rendered once per store.
#[derive(Debug)]
struct DeferredSql {
    defer: Stmt,
    deferrals: Stmt,
    claim: Stmt,
    count: Stmt,
}

impl DeferredSql {
    fn new(t: &Tables) -> Self {
        let inbox = &t.inbox;
        Self {
            // The row is held by the caller's transaction (its claim inserted it, or its lease
            // check locked it).
            defer: my(format!(
                "UPDATE {inbox} SET processed_at = NULL, due_at = {LATER}, deferrals = deferrals + 1, \
                   lease_owner = NULL, lease_until = NULL, message_key = $2, headers = $3, payload = $4 \
                 WHERE consumer_group = $5 AND source = $6 AND event_id = $7"
            )),
            deferrals: my(format!(
                "SELECT deferrals FROM {inbox} WHERE consumer_group = $1 AND source = $2 AND event_id = $3"
            )),
            // The group's earliest due row whose lease is free or expired; rows other workers
            // are claiming, or whose handler's transaction holds them, are skipped.
            claim: my(format!(
                "SELECT {RECEIVED_COLUMNS}, CONVERT(c.business_key USING utf8mb4) AS business_key \
                 FROM {inbox} c WHERE c.consumer_group = $1 AND c.processed_at IS NULL \
                   AND c.due_at <= NOW(6) AND (c.lease_until IS NULL OR c.lease_until < NOW(6)) \
                 ORDER BY c.due_at LIMIT 1 FOR UPDATE SKIP LOCKED"
            )),
            count: my(format!(
                "SELECT count(*) FROM {inbox} \
                 WHERE consumer_group = $1 AND processed_at IS NULL AND due_at IS NOT NULL"
            )),
        }
    }
}

/// The MySQL/MariaDB store of the inbox: inbox rows, attempt counts and dead letters.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    tables: Tables,
    sql: Arc<Statements>,
}

impl MySqlStore {
    /// A store on `pool` with the default table names (in the pool's database).
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store on `pool` with the given table names; a schema is a database (MySQL has no
    /// other kind of schema).
    pub fn with_tables(pool: MySqlPool, tables: Tables) -> Self {
        let sql = Arc::new(Statements::new(&tables));
        Self { pool, tables, sql }
    }

    /// Connects to `url` (`mysql://user:password@host:port/database`, MariaDB or MySQL) with a
    /// pool of up to 10 connections, failing within [`CONNECT_TIMEOUT`] with the target
    /// (password hidden) and the cause.
    /// Its sessions read committed data (`READ COMMITTED`, as PostgreSQL does by default), and
    /// on MariaDB end a transaction left idle for 30 s (`idle_transaction_timeout`, unless set
    /// already), so one whose connection went half-open does not hold its row locks for hours.
    ///
    /// [`CONNECT_TIMEOUT`]: crate::store::CONNECT_TIMEOUT
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_sized(url, POOL_CONNECTIONS).await
    }

    /// [`connect`](Self::connect) with a pool of up to `max_connections` (at least 1).
    pub(crate) async fn connect_sized(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        use crate::store::{bounded, check_scheme, CONNECT_TIMEOUT};
        check_scheme(url, &["mysql", "mariadb"], "MySqlStore")?;
        let options = connect_options(url)?;
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(CONNECT_TIMEOUT)
            .after_release(crate::store::release_ping)
            .after_connect(|conn, _| Box::pin(session_settings(conn)));
        let pool = bounded(url, pool.connect_with(options)).await?;
        Ok(Self::new(pool))
    }

    /// Applies inoutbox's migrations (inbox and outbox tables): idempotent, and safe to call from
    /// several processes at once (they take a named lock, `GET_LOCK`, one after the other).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?.detach();
        let name = format!("inoutbox.migrate.{}", self.tables.migrations);
        let lock = stmt(
            "SELECT GET_LOCK(CONCAT('inoutbox:', LEFT(SHA2(CONCAT(COALESCE(DATABASE(), ''), ?), 256), 40)), 60)"
                .to_owned(),
        );
        let got: Option<i64> = sqlx::query_scalar(lock)
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
        if got != Some(1) {
            return Err(StoreError::Config(
                "another process held the migration lock for 60 s: is a migration stuck?".into(),
            ));
        }
        let migrated = migrate::migrate::<MySql8>(&mut conn, &self.tables).await;
        // Closing the connection releases its lock.
        let _ = sqlx::Connection::close(conn).await;
        migrated
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table names.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }
}

/// How long MariaDB lets a session sit idle inside a transaction before it closes the session,
/// rolling the transaction back and releasing its row locks (`idle_transaction_timeout`), unless
/// the server or the user set a value already.
const IDLE_TRANSACTION_TIMEOUT_SECS: u32 = 30;

/// Each new connection's session: `READ COMMITTED`, and on MariaDB a bound on a transaction
/// whose client went silent. Without it, a transaction on a connection left half-open (a
/// middlebox that forgot the flow, a client host that vanished) keeps its row locks until
/// `wait_timeout` (8 hours by default), and every later claim of its messages waits on them.
/// MySQL 8.0 has no such setting: set `wait_timeout` on the server there (docs/deployment.md).
async fn session_settings(conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await?;
    if version.contains("MariaDB") {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET SESSION idle_transaction_timeout = IF(@@SESSION.idle_transaction_timeout = 0, \
             {IDLE_TRANSACTION_TIMEOUT_SECS}, @@SESSION.idle_transaction_timeout)"
        )))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The connect options of `url`, or a configuration error that hides its password.
pub(crate) fn connect_options(url: &str) -> Result<sqlx::mysql::MySqlConnectOptions, StoreError> {
    use std::str::FromStr;
    let url = url
        .strip_prefix("mariadb://")
        .map(|rest| format!("mysql://{rest}"))
        .unwrap_or_else(|| url.to_owned());
    sqlx::mysql::MySqlConnectOptions::from_str(&url).map_err(|e| {
        StoreError::Config(format!(
            "invalid MySQL URL `{}`: {e}",
            crate::redact::redact_url(&url)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::adapt;

    #[test]
    fn quotes_become_backticks_and_numbered_placeholders_become_marks() {
        assert_eq!(
            adapt("SELECT \"offset\" FROM \"app\".\"t\" WHERE a = $1 AND b = $12 AND c = '$x'"),
            "SELECT `offset` FROM `app`.`t` WHERE a = ? AND b = ? AND c = '$x'"
        );
    }
}
