//! The SQLite store (sqlx): the same inbox, attempts and dead-letter semantics as PostgreSQL,
//! for embedded services, tests and the zero-setup quickstart.
//!
//! SQLite has one writer at a time: transactions that write wait for each other (sqlx's busy
//! timeout), so partitions are handled in parallel but their transactions commit one by one.
//! Tables live in the main database: a configured schema is refused.

use sqlx::sqlite::SqlitePool;
use sqlx::{Row, Sqlite};

use super::{Claim, DeadLetter, InboxKey, InboxStore, StoreError, StoredDeadLetter, Tables};
use crate::transport::Delivery;

/// What went wrong setting up a SQLite store.
#[derive(Debug, thiserror::Error)]
#[error("SQLite keeps every table in one database: configure table names without a schema (got schema `{0}`)")]
pub struct SchemaNotSupported(String);

/// One SQLite migration.
struct Migration {
    component: &'static str,
    version: i32,
    description: &'static str,
    sql: fn(&Tables) -> String,
}

fn inbox_v1(t: &Tables) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer_group text    NOT NULL,
    source         text    NOT NULL DEFAULT '',
    event_id       text    NOT NULL,
    event_type     text    NOT NULL,
    topic          text,
    "partition"    integer,
    "offset"       integer,
    payload        blob,
    received_at    text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    processed_at   text,
    PRIMARY KEY (consumer_group, source, event_id)
);
CREATE INDEX IF NOT EXISTS {inbox_unprocessed} ON {inbox} (received_at) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS {inbox_processed} ON {inbox} (processed_at) WHERE processed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {attempts} (
    consumer_group  text    NOT NULL,
    source          text    NOT NULL,
    event_id        text    NOT NULL,
    attempts        integer NOT NULL,
    last_error      text    NOT NULL,
    first_failed_at text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_failed_at  text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer_group, source, event_id)
);
CREATE TABLE IF NOT EXISTS {dead} (
    id               integer PRIMARY KEY AUTOINCREMENT,
    consumer_group   text    NOT NULL,
    source           text,
    event_id         text,
    event_type       text,
    topic            text    NOT NULL,
    "partition"      integer NOT NULL,
    "offset"         integer NOT NULL,
    message_key      blob,
    headers          text    NOT NULL,
    payload          blob,
    error            text    NOT NULL,
    attempts         integer NOT NULL,
    first_failed_at  text    NOT NULL,
    last_failed_at   text    NOT NULL,
    dead_lettered_at text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    replayed_at      text
);
CREATE INDEX IF NOT EXISTS {dead_group} ON {dead} (consumer_group, dead_lettered_at);
"#,
        inbox = t.inbox,
        inbox_unprocessed = t.inbox.derived("unprocessed_idx"),
        inbox_processed = t.inbox.derived("processed_idx"),
        attempts = t.attempts,
        dead = t.dead_letters,
        dead_group = t.dead_letters.derived("group_idx"),
    )
}

static MIGRATIONS: &[Migration] = &[
    Migration {
        component: "inbox",
        version: 1,
        description: "inbox, attempts and dead-letter tables",
        sql: inbox_v1,
    },
    Migration {
        component: "outbox",
        version: 1,
        description: "outbox table and relay key leases",
        sql: crate::outbox::sqlite::outbox_v1,
    },
];

/// Applies every SQLite migration not yet applied, in one `BEGIN IMMEDIATE` transaction (which
/// makes concurrent callers wait for each other).
pub async fn migrate(pool: &SqlitePool, tables: &Tables) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let result = async {
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS {} (component text NOT NULL, version integer NOT NULL, \
             description text NOT NULL, applied_at text NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), \
             PRIMARY KEY (component, version))",
            tables.migrations
        ))
        .execute(&mut *conn)
        .await?;
        let applied: Vec<(String, i32)> =
            sqlx::query_as(&format!("SELECT component, version FROM {}", tables.migrations))
                .fetch_all(&mut *conn)
                .await?;
        for m in MIGRATIONS {
            if applied.iter().any(|(c, v)| c == m.component && *v == m.version) {
                continue;
            }
            sqlx::raw_sql(&(m.sql)(tables)).execute(&mut *conn).await?;
            sqlx::query(&format!(
                "INSERT INTO {} (component, version, description) VALUES ($1, $2, $3)",
                tables.migrations
            ))
            .bind(m.component)
            .bind(m.version)
            .bind(m.description)
            .execute(&mut *conn)
            .await?;
            tracing::info!(component = m.component, version = m.version, "txbox migration applied");
        }
        Ok::<(), sqlx::Error>(())
    }
    .await;
    match result {
        Ok(()) => {
            sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
            Ok(())
        }
        Err(e) => {
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            Err(e.into())
        }
    }
}

#[derive(Debug)]
struct Statements {
    claim: String,
    attempts: String,
    clear_attempts: String,
    record_failure: String,
    dead_letter: String,
    load_dead_letter: String,
    mark_replayed: String,
    delete_processed: String,
    count_stuck: String,
}

impl Statements {
    fn new(t: &Tables) -> Self {
        let now = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
        Self {
            claim: format!(
                "INSERT INTO {} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", processed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, {now}) ON CONFLICT DO NOTHING",
                t.inbox
            ),
            attempts: format!(
                "SELECT attempts FROM {} WHERE consumer_group = $1 AND source = $2 AND event_id = $3",
                t.attempts
            ),
            clear_attempts: format!(
                "DELETE FROM {} WHERE consumer_group = $1 AND source = $2 AND event_id = $3",
                t.attempts
            ),
            record_failure: format!(
                "INSERT INTO {a} (consumer_group, source, event_id, attempts, last_error) VALUES ($1, $2, $3, 1, $4) \
                 ON CONFLICT (consumer_group, source, event_id) DO UPDATE \
                 SET attempts = attempts + 1, last_error = excluded.last_error, last_failed_at = {now} \
                 RETURNING attempts",
                a = t.attempts
            ),
            dead_letter: format!(
                "INSERT INTO {dead} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
                   message_key, headers, payload, error, attempts, first_failed_at, last_failed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                   COALESCE((SELECT first_failed_at FROM {attempts} \
                             WHERE consumer_group = $1 AND source = COALESCE($2, '') AND event_id = $3), {now}), \
                   {now}) \
                 RETURNING id",
                dead = t.dead_letters,
                attempts = t.attempts
            ),
            load_dead_letter: format!(
                "SELECT id, consumer_group, event_id, event_type, topic, \"partition\", \"offset\", message_key, \
                   headers, payload, error, attempts, replayed_at IS NOT NULL AS replayed \
                 FROM {} WHERE consumer_group = $1 AND id = $2",
                t.dead_letters
            ),
            mark_replayed: format!("UPDATE {} SET replayed_at = {now} WHERE id = $1", t.dead_letters),
            delete_processed: format!(
                "DELETE FROM {inbox} WHERE rowid IN (SELECT rowid FROM {inbox} \
                 WHERE processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', $1)) LIMIT $2)",
                inbox = t.inbox
            ),
            count_stuck: format!(
                "SELECT count(*) FROM {} WHERE processed_at IS NULL \
                 AND received_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', $1))",
                t.inbox
            ),
        }
    }
}

/// Headers as JSON: `[[name, "hex" | null], ...]`, exact for any bytes.
fn encode_headers(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let list: Vec<(&str, Option<String>)> = headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str(),
                v.as_ref()
                    .map(|b| b.iter().map(|x| format!("{x:02x}")).collect()),
            )
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".to_owned())
}

fn decode_headers(text: &str) -> Vec<(String, Option<Vec<u8>>)> {
    let list: Vec<(String, Option<String>)> = serde_json::from_str(text).unwrap_or_default();
    list.into_iter()
        .map(|(n, v)| {
            let bytes = v.map(|hex| {
                (0..hex.len() / 2)
                    .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                    .collect()
            });
            (n, bytes)
        })
        .collect()
}

impl crate::handler::HandlerTx for sqlx::Transaction<'_, Sqlite> {
    type Static = sqlx::Transaction<'static, Sqlite>;
}

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    tables: Tables,
    sql: std::sync::Arc<Statements>,
}

impl SqliteStore {
    /// A store on `pool` with the default table names.
    pub fn new(pool: SqlitePool) -> Self {
        Self::build(pool, Tables::default())
    }

    /// A store on `pool` with the given table names (without a schema).
    pub fn with_tables(pool: SqlitePool, tables: Tables) -> Result<Self, SchemaNotSupported> {
        if let Some(schema) = tables.schema() {
            return Err(SchemaNotSupported(schema.as_str().to_owned()));
        }
        Ok(Self::build(pool, tables))
    }

    fn build(pool: SqlitePool, tables: Tables) -> Self {
        let sql = std::sync::Arc::new(Statements::new(&tables));
        Self { pool, tables, sql }
    }

    /// Applies txbox's migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate(&self.pool, &self.tables).await
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table names.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }
}

impl InboxStore for SqliteStore {
    type Tx = sqlx::Transaction<'static, Sqlite>;

    const NAME: &'static str = "sqlite";

    super::shared_store_methods!();

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> Result<Claim, StoreError> {
        let inserted = sqlx::query(&self.sql.claim)
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(event_type)
            .bind(&delivery.topic)
            .bind(delivery.partition)
            .bind(delivery.offset)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if inserted == 0 {
            return Ok(Claim::Duplicate);
        }
        let attempts: Option<i64> = sqlx::query_scalar(&self.sql.attempts)
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(Claim::New {
            attempts: attempts.unwrap_or(0).max(0) as u32,
        })
    }

    async fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> Result<u32, StoreError> {
        let attempts: i64 = sqlx::query_scalar(&self.sql.record_failure)
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(error)
            .fetch_one(&self.pool)
            .await?;
        Ok(attempts.max(0) as u32)
    }

    async fn dead_letter<'a>(&'a self, letter: &'a DeadLetter<'a>) -> Result<i64, StoreError> {
        let d = letter.delivery;
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(&self.sql.dead_letter)
            .bind(letter.group)
            .bind(
                letter
                    .key
                    .map(|k| k.source.as_str())
                    .filter(|s| !s.is_empty()),
            )
            .bind(letter.key.map(|k| k.event_id.as_str()))
            .bind(letter.event_type)
            .bind(&d.topic)
            .bind(d.partition)
            .bind(d.offset)
            .bind(d.key.as_deref())
            .bind(encode_headers(&d.headers))
            .bind(d.payload.as_deref())
            .bind(letter.error)
            .bind(letter.attempts as i64)
            .fetch_one(&mut *tx)
            .await?;
        if let Some(key) = letter.key {
            sqlx::query(&self.sql.clear_attempts)
                .bind(&key.group)
                .bind(&key.source)
                .bind(&key.event_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    async fn load_dead_letter<'a>(
        &'a self,
        group: &'a str,
        id: i64,
    ) -> Result<Option<StoredDeadLetter>, StoreError> {
        let Some(row) = sqlx::query(&self.sql.load_dead_letter)
            .bind(group)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let headers: String = row.try_get("headers")?;
        let attempts: i64 = row.try_get("attempts")?;
        let partition: i64 = row.try_get("partition")?;
        Ok(Some(StoredDeadLetter {
            id: row.try_get("id")?,
            group: row.try_get("consumer_group")?,
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            delivery: Delivery {
                topic: row.try_get("topic")?,
                partition: partition as i32,
                offset: row.try_get("offset")?,
                key: row.try_get("message_key")?,
                payload: row.try_get("payload")?,
                headers: decode_headers(&headers),
            },
            error: row.try_get("error")?,
            attempts: attempts.max(0) as u32,
            replayed: row.try_get("replayed")?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_headers, encode_headers};

    #[test]
    fn headers_round_trip_exactly() {
        let headers = vec![
            ("ce_id".to_owned(), Some(b"abc".to_vec())),
            ("bin".to_owned(), Some(vec![0, 255, 10, 34])),
            ("none".to_owned(), None),
            ("empty".to_owned(), Some(Vec::new())),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)), headers);
    }
}
