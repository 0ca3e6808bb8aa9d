//! The PostgreSQL store (sqlx): inbox rows, attempt counts, dead letters and migrations.

use sqlx::postgres::PgPool;
use sqlx::{Postgres, Row};

use super::{Claim, DeadLetter, InboxKey, InboxStore, StoreError, StoredDeadLetter, Tables};
use crate::transport::Delivery;

/// One schema change: `(component, version)` is recorded once applied.
pub struct Migration {
    /// Which part of txbox it belongs to (`"inbox"`, `"outbox"`).
    pub component: &'static str,
    /// Increasing per component.
    pub version: i32,
    /// What it does.
    pub description: &'static str,
    /// The SQL, given the configured table names.
    pub sql: fn(&Tables) -> String,
}

fn inbox_v1(t: &Tables) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer_group text        NOT NULL,
    source         text        NOT NULL DEFAULT '',
    event_id       text        NOT NULL,
    event_type     text        NOT NULL,
    topic          text,
    "partition"    integer,
    "offset"       bigint,
    payload        bytea,
    received_at    timestamptz NOT NULL DEFAULT now(),
    processed_at   timestamptz,
    PRIMARY KEY (consumer_group, source, event_id)
);
CREATE INDEX IF NOT EXISTS {inbox_unprocessed} ON {inbox} (received_at) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS {inbox_processed} ON {inbox} (processed_at) WHERE processed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {attempts} (
    consumer_group  text        NOT NULL,
    source          text        NOT NULL,
    event_id        text        NOT NULL,
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, source, event_id)
);
CREATE TABLE IF NOT EXISTS {dead} (
    id               bigserial   PRIMARY KEY,
    consumer_group   text        NOT NULL,
    source           text,
    event_id         text,
    event_type       text,
    topic            text        NOT NULL,
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    message_key      bytea,
    header_names     text[]      NOT NULL,
    header_values    bytea[]     NOT NULL,
    payload          bytea,
    error            text        NOT NULL,
    attempts         integer     NOT NULL,
    first_failed_at  timestamptz NOT NULL,
    last_failed_at   timestamptz NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
    replayed_at      timestamptz
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

/// The migrations txbox ships, in order.
pub fn migrations() -> &'static [Migration] {
    static ALL: &[Migration] = &[
        Migration {
            component: "inbox",
            version: 1,
            description: "inbox, attempts and dead-letter tables",
            sql: inbox_v1,
        },
        Migration {
            component: "outbox",
            version: 1,
            description: "outbox table",
            sql: crate::outbox::migration::outbox_v1,
        },
    ];
    ALL
}

/// Applies every migration not yet applied. Idempotent, and safe to call from several
/// processes at once: they serialise on an advisory lock.
pub async fn migrate(pool: &PgPool, tables: &Tables) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("txbox:{}", tables.migrations))
        .execute(&mut *tx)
        .await?;
    if let Some(schema) = tables.schema() {
        sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS {} (component text NOT NULL, version integer NOT NULL, \
         description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (component, version))",
        tables.migrations
    ))
    .execute(&mut *tx)
    .await?;
    let applied: Vec<(String, i32)> = sqlx::query_as(&format!(
        "SELECT component, version FROM {}",
        tables.migrations
    ))
    .fetch_all(&mut *tx)
    .await?;
    for m in migrations() {
        if applied
            .iter()
            .any(|(c, v)| c == m.component && *v == m.version)
        {
            continue;
        }
        sqlx::raw_sql(&(m.sql)(tables)).execute(&mut *tx).await?;
        sqlx::query(&format!(
            "INSERT INTO {} (component, version, description) VALUES ($1, $2, $3)",
            tables.migrations
        ))
        .bind(m.component)
        .bind(m.version)
        .bind(m.description)
        .execute(&mut *tx)
        .await?;
        tracing::info!(
            component = m.component,
            version = m.version,
            "txbox migration applied"
        );
    }
    tx.commit().await?;
    Ok(())
}

/// The SQL the store runs, rendered once from the table names.
#[derive(Debug)]
struct Statements {
    claim: String,
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
        Self {
            claim: format!(
                "WITH ins AS (\
                   INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", processed_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, now()) ON CONFLICT DO NOTHING RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM ins) AS inserted, \
                   COALESCE((SELECT attempts FROM {attempts} \
                             WHERE consumer_group = $1 AND source = $2 AND event_id = $3), 0) AS attempts",
                inbox = t.inbox,
                attempts = t.attempts
            ),
            clear_attempts: format!(
                "DELETE FROM {} WHERE consumer_group = $1 AND source = $2 AND event_id = $3",
                t.attempts
            ),
            record_failure: format!(
                "INSERT INTO {a} AS a (consumer_group, source, event_id, attempts, last_error) \
                 VALUES ($1, $2, $3, 1, $4) \
                 ON CONFLICT (consumer_group, source, event_id) DO UPDATE \
                 SET attempts = a.attempts + 1, last_error = EXCLUDED.last_error, last_failed_at = now() \
                 RETURNING attempts",
                a = t.attempts
            ),
            dead_letter: format!(
                "INSERT INTO {dead} (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
                   message_key, header_names, header_values, payload, error, attempts, first_failed_at, last_failed_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
                   COALESCE(a.first_failed_at, now()), now() \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN {attempts} a ON a.consumer_group = $1 AND a.source = COALESCE($2, '') AND a.event_id = $3 \
                 RETURNING id",
                dead = t.dead_letters,
                attempts = t.attempts
            ),
            load_dead_letter: format!(
                "SELECT id, consumer_group, event_id, event_type, topic, \"partition\", \"offset\", message_key, \
                   header_names, header_values, payload, error, attempts, replayed_at IS NOT NULL AS replayed \
                 FROM {} WHERE consumer_group = $1 AND id = $2",
                t.dead_letters
            ),
            mark_replayed: format!("UPDATE {} SET replayed_at = now() WHERE id = $1", t.dead_letters),
            delete_processed: format!(
                "DELETE FROM {inbox} WHERE ctid IN (SELECT ctid FROM {inbox} \
                 WHERE processed_at < now() - make_interval(secs => $1) LIMIT $2)",
                inbox = t.inbox
            ),
            count_stuck: format!(
                "SELECT count(*) FROM {} WHERE processed_at IS NULL \
                 AND received_at < now() - make_interval(secs => $1)",
                t.inbox
            ),
        }
    }
}

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    tables: Tables,
    sql: std::sync::Arc<Statements>,
}

impl PgStore {
    /// A store on `pool` with the default table names.
    pub fn new(pool: PgPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store on `pool` with the given table names.
    pub fn with_tables(pool: PgPool, tables: Tables) -> Self {
        let sql = std::sync::Arc::new(Statements::new(&tables));
        Self { pool, tables, sql }
    }

    /// Applies txbox's migrations (see [`migrate`]).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate(&self.pool, &self.tables).await
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table names.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }
}

impl InboxStore for PgStore {
    type Tx = sqlx::Transaction<'static, Postgres>;

    const NAME: &'static str = "postgres";

    super::shared_store_methods!();

    async fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> Result<Claim, StoreError> {
        let row = sqlx::query(&self.sql.claim)
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(event_type)
            .bind(&delivery.topic)
            .bind(delivery.partition)
            .bind(delivery.offset)
            .fetch_one(&mut **tx)
            .await;
        let row = match row {
            Ok(row) => row,
            // A unique violation can only mean another transaction inserted the row first.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
                return Ok(Claim::Duplicate)
            }
            Err(e) => return Err(e.into()),
        };
        let inserted: bool = row.try_get("inserted")?;
        let attempts: i32 = row.try_get("attempts")?;
        Ok(if inserted {
            Claim::New {
                attempts: attempts.max(0) as u32,
            }
        } else {
            Claim::Duplicate
        })
    }

    async fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> Result<u32, StoreError> {
        let attempts: i32 = sqlx::query_scalar(&self.sql.record_failure)
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
        let names: Vec<&str> = d.headers.iter().map(|(n, _)| n.as_str()).collect();
        let values: Vec<Option<&[u8]>> = d.headers.iter().map(|(_, v)| v.as_deref()).collect();
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
            .bind(&names)
            .bind(&values)
            .bind(d.payload.as_deref())
            .bind(letter.error)
            .bind(letter.attempts as i32)
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
        let names: Vec<String> = row.try_get("header_names")?;
        let values: Vec<Option<Vec<u8>>> = row.try_get("header_values")?;
        let attempts: i32 = row.try_get("attempts")?;
        Ok(Some(StoredDeadLetter {
            id: row.try_get("id")?,
            group: row.try_get("consumer_group")?,
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            delivery: Delivery {
                topic: row.try_get("topic")?,
                partition: row.try_get("partition")?,
                offset: row.try_get("offset")?,
                key: row.try_get("message_key")?,
                payload: row.try_get("payload")?,
                headers: names.into_iter().zip(values).collect(),
            },
            error: row.try_get("error")?,
            attempts: attempts.max(0) as u32,
            replayed: row.try_get("replayed")?,
        }))
    }
}
