//! The outbox on MySQL/MariaDB: the same row (Debezium column names), the payload kept as the
//! exact text the producer serialised.
//!
//! Per-key order needs no lock: one relay at a time reads the whole table in `seq` order (see
//! `relay.rs`), and MySQL makes transactions visible in commit order, so the rows of a key are
//! published in the order their transactions committed.

use serde_json::Value;
use sqlx::{MySql, MySqlConnection};
use uuid::Uuid;

use crate::outbox::{EnqueueError, NewRow, OutboxTx};
use crate::store::sql::{stmt, Stmt};
use crate::store::Tables;

/// The outbox on a MySQL/MariaDB table.
#[derive(Clone, Debug)]
pub struct MySqlOutbox {
    table: String,
    insert: Stmt,
}

impl Default for MySqlOutbox {
    fn default() -> Self {
        Self::new(&Tables::default())
    }
}

impl MySqlOutbox {
    /// The outbox on `tables.outbox`.
    pub fn new(tables: &Tables) -> Self {
        let table = super::quoted(&tables.outbox);
        // A due time (seconds since the epoch); one that has passed is stored as NULL: due at
        // once.
        let insert = format!(
            "INSERT INTO {table} \
               (id, aggregatetype, aggregateid, type, topic, message_key, payload, headers, due_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, \
               CASE WHEN FROM_UNIXTIME(?) > NOW(6) THEN FROM_UNIXTIME(?) END)"
        );
        Self {
            table,
            insert: stmt(insert),
        }
    }

    /// Inserts rows in the given order in the transaction (or connection) `conn`.
    pub async fn insert_rows(
        &self,
        conn: &mut MySqlConnection,
        rows: Vec<NewRow>,
    ) -> Result<Vec<Uuid>, EnqueueError> {
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let due = row.due_epoch_seconds();
            sqlx::query::<MySql>(self.insert.clone())
                .bind(row.id.to_string())
                .bind(&row.aggregate_type)
                .bind(&row.aggregate_id)
                .bind(&row.event_type)
                .bind(&row.topic)
                .bind(&row.key)
                .bind(row.payload)
                .bind(Value::Object(row.headers).to_string())
                .bind(due)
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

fn default_mysql_outbox() -> &'static MySqlOutbox {
    static DEFAULT: std::sync::OnceLock<MySqlOutbox> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(MySqlOutbox::default)
}

impl crate::sealed::Sealed for sqlx::MySqlConnection {}

impl OutboxTx for sqlx::MySqlConnection {
    async fn insert_rows(&mut self, rows: Vec<NewRow>) -> Result<Vec<Uuid>, EnqueueError> {
        default_mysql_outbox().insert_rows(self, rows).await
    }
}

// A transaction's rows: see `impl<D: Db> OutboxTx for Transaction<'_, D>` in db.rs.
