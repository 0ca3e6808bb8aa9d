//! The PostgreSQL outbox writer: one statement per enqueue (the insert, the key's lock id added
//! to the locks its transaction takes at commit, a coalesced `NOTIFY`), in the caller's
//! transaction. Why the lock, and why at commit: see the outbox module's docs.
//!
//! **Wake-ups that do not serialise writers.** PostgreSQL commits the transactions that queued a
//! `NOTIFY` one at a time, under one cluster-wide lock held through the commit's WAL flush: if
//! every enqueue notified, the outbox would cap the application's own commit rate. So an
//! enqueue notifies only if it takes the table's *wake lock* (`pg_try_advisory_xact_lock`,
//! never waiting, held until commit): at most one transaction in flight notifies, the others
//! ride on its notification (or on the next one, or on the relays' poll), and notifying commits
//! never queue behind each other.

use std::collections::BTreeSet;

use serde_json::Value;
use sqlx::{PgConnection, Postgres};
use uuid::Uuid;

use crate::event::OutboxEvent;
use crate::outbox::{EnqueueError, NewRow, OutboxTx};
use crate::store::sql::{stmt, Stmt};
use crate::store::{legacy, Tables};
use crate::util::fnv1a64;

/// The outbox on a given table; [`enqueue`](crate::outbox::enqueue) and
/// [`enqueue_all`](crate::outbox::enqueue_all) use the default table name
/// (resolved through the connection's `search_path`).
#[derive(Clone, Debug)]
pub struct Outbox {
    table: String,
    channel: String,
    lock_scope: String,
    wake_lock: i64,
    insert_one: Stmt,
    insert_many: Stmt,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new(&Tables::default())
    }
}

/// The transaction-local setting that lists the key locks (ids, comma-separated) its
/// transaction takes at commit (migration outbox v4 reads it).
pub(crate) const KEYS_SETTING: &str = "inoutbox.enqueue_keys";

/// Migration outbox v6: the current definition of the commit trigger's function, which reads
/// [`KEYS_SETTING`] and names its table (the legacy rename defines it again for a new name).
pub(crate) const ORDER_FUNCTION: &str = include_str!("migrations/outbox_v6.sql");

/// The advisory lock id that serialises enqueues of one `(topic, key)` on a table.
pub(crate) fn enqueue_lock_id(scope: &str, topic: &str, key: &str) -> i64 {
    fnv1a64(&[
        legacy::ENQUEUE_LOCK,
        scope.as_bytes(),
        topic.as_bytes(),
        key.as_bytes(),
    ])
}

/// The advisory lock that elects the one transaction in flight that sends the wake-up `NOTIFY`.
pub(crate) fn wake_lock_id(scope: &str) -> i64 {
    fnv1a64(&[legacy::WAKE_LOCK, scope.as_bytes()])
}

/// The slot of a row with key `key` and id `id` (SQL expressions): the key's hash, `0..64`
/// (`postgres::relay::SLOTS`); a keyless row hashes its id. Migration outbox v2 has the same
/// expression in the trigger that fills `slot` for rows inserted by other means.
pub(crate) fn slot_expr(key: &str, id: &str) -> String {
    format!("(hashtextextended(coalesce({key}, {id}::text), 0) & 63)::int2")
}

/// The NOTIFY channel of an outbox table: its unqualified name, so an enqueue through the
/// `search_path` and a relay configured with a schema-qualified name meet on one channel.
pub fn notify_channel(tables: &Tables) -> String {
    tables.outbox.name().as_str().to_owned()
}

impl Outbox {
    /// The outbox on `tables.outbox`.
    pub fn new(tables: &Tables) -> Self {
        let table = tables.outbox.to_string();
        // The quals have no column in them, so PostgreSQL checks them once, before the first
        // row is produced. `seq` is 0: the row draws it at commit, after its transaction has
        // taken the listed key locks in ascending order (migration outbox v4). The wake lock
        // ($11) decides whether this transaction notifies.
        let wake = "(NOT pg_try_advisory_xact_lock($11) OR pg_notify($1, '')::text = '')";
        let columns =
            "id, aggregatetype, aggregateid, type, topic, message_key, payload, headers, \
                       slot, seq, due_at";
        // A due time (seconds since the epoch) that has passed is stored as NULL: due at once,
        // and the row is read from the ready index like any other (migration outbox v5).
        let due = |secs: &str| {
            format!("CASE WHEN to_timestamp({secs}) > now() THEN to_timestamp({secs}) END")
        };
        // Appends lock ids (text, comma-separated) to the transaction's list.
        let listed = |ids: &str| {
            format!(
                "set_config('{KEYS_SETTING}', concat_ws(',', \
                   nullif(current_setting('{KEYS_SETTING}', true), ''), {ids}), true) IS NOT NULL"
            )
        };
        let lock_scope = tables.outbox.name().as_str().to_owned();
        Self {
            channel: notify_channel(tables),
            wake_lock: wake_lock_id(&lock_scope),
            lock_scope,
            insert_one: stmt(format!(
                "INSERT INTO {table} ({columns}) \
                 SELECT $3, $4, $5, $6, $7, $8, $9::text::json, $10, {slot}, 0, {due} \
                 WHERE ($2::int8 IS NULL OR {key}) AND {wake}",
                slot = slot_expr("$8::text", "$3::uuid"),
                key = listed("$2::int8::text"),
                due = due("$12::float8"),
            )),
            // `seq` is drawn per row in the order the rows come; ORDER BY the ordinality makes
            // that the caller's order.
            insert_many: stmt(format!(
                "INSERT INTO {table} ({columns}) \
                 SELECT r.id, r.aggregatetype, r.aggregateid, r.type, r.topic, r.message_key, \
                        r.payload::json, r.headers, {slot}, 0, {due} \
                 FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[], $7::text[], \
                             $8::text[], $9::text[], $10::jsonb[], $12::float8[]) WITH ORDINALITY \
                   AS r(id, aggregatetype, aggregateid, type, topic, message_key, payload, headers, \
                        due, ord) \
                 WHERE (cardinality($2::int8[]) = 0 OR {keys}) AND {wake} \
                 ORDER BY r.ord",
                slot = slot_expr("r.message_key", "r.id"),
                keys = listed("array_to_string($2::int8[], ',')"),
                due = due("r.due"),
            )),
            table,
        }
    }

    fn store_error(&self, e: sqlx::Error) -> EnqueueError {
        EnqueueError::Store {
            table: self.table.clone(),
            source: e.into(),
        }
    }

    /// Inserts `event` in the transaction (or connection) `conn`; returns the event id.
    pub async fn enqueue<E: OutboxEvent>(
        &self,
        conn: &mut PgConnection,
        event: &E,
    ) -> Result<Uuid, EnqueueError> {
        self.insert_row(conn, NewRow::from_event(event)?).await
    }

    /// Inserts a prepared row (see [`NewRow`]); returns its id.
    pub async fn insert_row(
        &self,
        conn: &mut PgConnection,
        row: NewRow,
    ) -> Result<Uuid, EnqueueError> {
        let lock = row
            .key
            .as_deref()
            .map(|k| enqueue_lock_id(&self.lock_scope, &row.topic, k));
        let due = row.due_epoch_seconds();
        sqlx::query::<Postgres>(self.insert_one.clone())
            .bind(&self.channel)
            .bind(lock)
            .bind(row.id)
            .bind(&row.aggregate_type)
            .bind(&row.aggregate_id)
            .bind(&row.event_type)
            .bind(&row.topic)
            .bind(&row.key)
            .bind(&row.payload)
            .bind(Value::Object(row.headers))
            .bind(self.wake_lock)
            .bind(due)
            .execute(conn)
            .await
            .map_err(|e| self.store_error(e))?;
        Ok(row.id)
    }

    /// Inserts several events in the given order (events of one key are published in this
    /// order); returns their ids.
    pub async fn enqueue_all<'e, E: OutboxEvent>(
        &self,
        conn: &mut PgConnection,
        events: impl IntoIterator<Item = &'e E>,
    ) -> Result<Vec<Uuid>, EnqueueError> {
        let rows = events
            .into_iter()
            .map(NewRow::from_event)
            .collect::<Result<Vec<_>, _>>()?;
        self.insert_rows(conn, rows).await
    }

    /// Inserts prepared rows in the given order; returns their ids.
    pub async fn insert_rows(
        &self,
        conn: &mut PgConnection,
        rows: Vec<NewRow>,
    ) -> Result<Vec<Uuid>, EnqueueError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        // Sorted and deduplicated: the list stays short (the commit sorts the whole list).
        let locks: Vec<i64> = rows
            .iter()
            .filter_map(|r| {
                r.key
                    .as_deref()
                    .map(|k| enqueue_lock_id(&self.lock_scope, &r.topic, k))
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut ids = Vec::with_capacity(rows.len());
        let mut agg_types = Vec::with_capacity(rows.len());
        let mut agg_ids = Vec::with_capacity(rows.len());
        let mut types = Vec::with_capacity(rows.len());
        let mut topics = Vec::with_capacity(rows.len());
        let mut keys = Vec::with_capacity(rows.len());
        let mut payloads = Vec::with_capacity(rows.len());
        let mut headers = Vec::with_capacity(rows.len());
        let mut dues = Vec::with_capacity(rows.len());
        for r in rows {
            dues.push(r.due_epoch_seconds());
            ids.push(r.id);
            agg_types.push(r.aggregate_type);
            agg_ids.push(r.aggregate_id);
            types.push(r.event_type);
            topics.push(r.topic);
            keys.push(r.key);
            payloads.push(r.payload);
            headers.push(Value::Object(r.headers));
        }
        sqlx::query::<Postgres>(self.insert_many.clone())
            .bind(&self.channel)
            .bind(&locks)
            .bind(&ids)
            .bind(&agg_types)
            .bind(&agg_ids)
            .bind(&types)
            .bind(&topics)
            .bind(&keys)
            .bind(&payloads)
            .bind(&headers)
            .bind(self.wake_lock)
            .bind(&dues)
            .execute(conn)
            .await
            .map_err(|e| self.store_error(e))?;
        Ok(ids)
    }
}

fn default_outbox() -> &'static Outbox {
    static DEFAULT: std::sync::OnceLock<Outbox> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(Outbox::default)
}

impl crate::sealed::Sealed for PgConnection {}

impl OutboxTx for PgConnection {
    async fn insert_rows(&mut self, rows: Vec<NewRow>) -> Result<Vec<Uuid>, EnqueueError> {
        if rows.len() == 1 {
            let row = rows.into_iter().next().expect("one row");
            return Ok(vec![default_outbox().insert_row(self, row).await?]);
        }
        default_outbox().insert_rows(self, rows).await
    }
}

// A transaction's rows: see `impl<D: Db> OutboxTx for Transaction<'_, D>` in db.rs.

#[cfg(test)]
mod tests {
    use super::*;

    /// The advisory-lock ids are those every earlier release computed (fixed numbers, from the
    /// release before the rename): a process of either version serialises the same key's
    /// enqueues and elects the same wake-up sender, so a rolling upgrade keeps per-key order.
    #[test]
    fn lock_ids_are_those_of_the_releases_before_the_rename() {
        assert_eq!(
            enqueue_lock_id("orders_outbox", "orders", "k-1"),
            -9_139_328_509_684_213_252
        );
        assert_eq!(wake_lock_id("orders_outbox"), -5_544_806_197_818_906_198);
    }

    #[test]
    fn the_migration_computes_slots_as_the_writer_does() {
        let migration = include_str!("migrations/outbox_v2.sql");
        for (key, id) in [("message_key", "id"), ("NEW.message_key", "NEW.id")] {
            let expr = slot_expr(key, id);
            assert!(
                migration.contains(&expr),
                "{expr} missing from outbox_v2.sql"
            );
        }
    }

    #[test]
    fn the_commit_trigger_reads_the_list_the_writer_fills() {
        for migration in [include_str!("migrations/outbox_v4.sql"), ORDER_FUNCTION] {
            assert!(
                migration.contains(&format!("''{KEYS_SETTING}''")),
                "{KEYS_SETTING} missing from a migration that defines the commit trigger"
            );
        }
    }

    #[test]
    fn lock_ids_separate_parts() {
        assert_ne!(
            enqueue_lock_id("t", "ab", "c"),
            enqueue_lock_id("t", "a", "bc")
        );
        assert_eq!(
            enqueue_lock_id("t", "a", "b"),
            enqueue_lock_id("t", "a", "b")
        );
    }
}
