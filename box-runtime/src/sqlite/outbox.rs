//! The outbox on SQLite: the same row (Debezium column names), with SQLite types.
//!
//! Per-key order needs no lock here: SQLite has one writer at a time, and a transaction holds
//! the write lock from its first write to its commit, so rows get their `seq` (an autoincrement
//! key) in commit order.

use serde_json::Value;
use sqlx::{Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::outbox::{EnqueueError, NewRow, OutboxTx};
use crate::store::sql::{stmt, Stmt};
use crate::store::Tables;

use super::NOW;

/// The outbox on a SQLite table.
#[derive(Clone, Debug)]
pub struct SqliteOutbox {
    table: String,
    insert: Stmt,
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
        // A due time (seconds since the epoch) in inoutbox's timestamp text; one that has
        // passed is stored as NULL: due at once (migration outbox v5).
        let due = "strftime('%Y-%m-%dT%H:%M:%fZ', $9, 'unixepoch')";
        let insert = format!(
            "INSERT INTO {table} \
               (id, aggregatetype, aggregateid, type, topic, message_key, payload, headers, due_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
               CASE WHEN {due} > {NOW} THEN {due} END)"
        );
        Self {
            table,
            insert: stmt(insert),
        }
    }

    /// Inserts rows in the given order in the transaction (or connection) `conn`.
    pub async fn insert_rows(
        &self,
        conn: &mut SqliteConnection,
        rows: Vec<NewRow>,
    ) -> Result<Vec<Uuid>, EnqueueError> {
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let due = row.due_epoch_seconds();
            sqlx::query::<Sqlite>(self.insert.clone())
                .bind(row.id.to_string())
                .bind(&row.aggregate_type)
                .bind(&row.aggregate_id)
                .bind(&row.event_type)
                .bind(&row.topic)
                .bind(&row.key)
                .bind(row.payload)
                .bind(Value::Object(row.headers).to_string())
                .bind(due)
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

fn default_sqlite_outbox() -> &'static SqliteOutbox {
    static DEFAULT: std::sync::OnceLock<SqliteOutbox> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(SqliteOutbox::default)
}

impl crate::sealed::Sealed for sqlx::SqliteConnection {}

impl OutboxTx for sqlx::SqliteConnection {
    async fn insert_rows(&mut self, rows: Vec<NewRow>) -> Result<Vec<Uuid>, EnqueueError> {
        default_sqlite_outbox().insert_rows(self, rows).await
    }
}

// A transaction's rows: see `impl<D: Db> OutboxTx for Transaction<'_, D>` in db.rs.
