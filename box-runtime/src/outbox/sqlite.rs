//! The outbox on SQLite: the same row (Debezium column names), with SQLite types.
//!
//! Per-key order needs no lock here: SQLite has one writer at a time, and a transaction holds
//! the write lock from its first write to its commit, so rows get their `seq` (an autoincrement
//! key) in commit order.

use serde_json::Value;
use sqlx::{Sqlite, SqliteConnection};
use uuid::Uuid;

use super::{EnqueueError, NewRow};
use crate::store::Tables;

/// SQL of the SQLite migration `("outbox", 1)`.
pub fn outbox_v1(t: &Tables) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {outbox} (
    seq             integer PRIMARY KEY AUTOINCREMENT,
    id              text    NOT NULL UNIQUE,
    aggregatetype   text,
    aggregateid     text,
    type            text    NOT NULL,
    topic           text    NOT NULL,
    message_key     text,
    payload         text    NOT NULL,
    headers         text    NOT NULL DEFAULT '{{}}',
    created_at      text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    published_at    text,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at text    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    parked_at       text
);
CREATE INDEX IF NOT EXISTS {pending} ON {outbox} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS {pending_key} ON {outbox} (topic, message_key, seq)
    WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS {published} ON {outbox} (published_at)
    WHERE published_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {locks} (
    topic      text NOT NULL,
    lock_key   text NOT NULL,
    owner      text NOT NULL,
    expires_at text NOT NULL,
    PRIMARY KEY (topic, lock_key)
);
"#,
        outbox = t.outbox,
        pending = t.outbox.derived("pending_idx"),
        pending_key = t.outbox.derived("pending_key_idx"),
        published = t.outbox.derived("published_idx"),
        locks = t.outbox.derived("relay_locks"),
    )
}

/// The outbox on a SQLite table.
#[derive(Clone, Debug)]
pub struct SqliteOutbox {
    table: String,
    insert: String,
}

impl Default for SqliteOutbox {
    fn default() -> Self {
        Self::new(&Tables::default())
    }
}

impl SqliteOutbox {
    /// The outbox on `tables.outbox`.
    pub fn new(tables: &Tables) -> Self {
        let table = tables.outbox.to_string();
        let insert = format!(
            "INSERT INTO {table} (id, aggregatetype, aggregateid, type, topic, message_key, payload, headers) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        );
        Self { table, insert }
    }

    /// Inserts rows in the given order in the transaction (or connection) `conn`.
    pub async fn insert_rows(
        &self,
        conn: &mut SqliteConnection,
        rows: Vec<NewRow>,
    ) -> Result<Vec<Uuid>, EnqueueError> {
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            sqlx::query::<Sqlite>(&self.insert)
                .bind(row.id.to_string())
                .bind(&row.aggregate_type)
                .bind(&row.aggregate_id)
                .bind(&row.event_type)
                .bind(&row.topic)
                .bind(&row.key)
                .bind(row.payload.to_string())
                .bind(Value::Object(row.headers).to_string())
                .execute(&mut *conn)
                .await
                .map_err(|e| EnqueueError::Store {
                    table: self.table.clone(),
                    source: e.into(),
                })?;
            ids.push(row.id);
        }
        Ok(ids)
    }
}
