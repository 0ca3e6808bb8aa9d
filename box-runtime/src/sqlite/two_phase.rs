//! Two-phase handlers on SQLite (`mode = "two_phase"`): the receive step stores a message as a
//! received row (key, headers and payload kept), and the group's workers claim received rows
//! with a lease (`lease_owner`, `lease_until`; inbox migration 8 adds `claims`).
//!
//! SQLite has one writer at a time and no `SKIP LOCKED`: a claim is one `UPDATE ... RETURNING`
//! on the group's oldest received row whose lease is free or expired, so two workers never
//! claim one row while its lease holds. The handler's transaction checks the lease with a write
//! (`deferred.rs`: `check_row`), so it holds the database's write lock from its check to its
//! end: no claim of any worker (each a write) can take the row while the handler runs, even once
//! its lease expired, and the processed mark (`finish_row`, under the same lock) is made only
//! while the worker still holds the lease. The lease check, the processed mark, the release and
//! the drop are those of deferred rows (`deferred.rs`): their condition is the same.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use sqlx::Sqlite;

use super::{later, SqliteStore, NOW, OWNED};
use crate::store::sql::{stmt, Stmt};
use crate::store::{
    received_row, text, ClaimRequest, InboxKey, LeaseRequest, ReceivedRow, StoreError, Tables,
};

type Tx = sqlx::Transaction<'static, Sqlite>;

/// The statements of the two-phase inbox, rendered once per inbox table (a process has one
/// per store).
#[derive(Debug)]
struct TwoPhaseSql {
    receive: Stmt,
    claim: Stmt,
    renew: Stmt,
}

impl TwoPhaseSql {
    fn of(t: &Tables) -> Arc<Self> {
        static RENDERED: LazyLock<Mutex<HashMap<String, Arc<TwoPhaseSql>>>> =
            LazyLock::new(Default::default);
        let mut rendered = RENDERED.lock().unwrap_or_else(PoisonError::into_inner);
        let inbox = t.inbox.to_string();
        if let Some(sql) = rendered.get(&inbox) {
            return sql.clone();
        }
        let sql = Arc::new(Self::new(t));
        rendered.insert(inbox, sql.clone());
        sql
    }

    fn new(t: &Tables) -> Self {
        let inbox = &t.inbox;
        Self {
            receive: stmt(format!(
                "INSERT INTO {inbox} (consumer_group, source, event_id, event_type, topic, \"partition\", \
                   \"offset\", message_key, headers, payload) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING RETURNING 1"
            )),
            // The group's oldest received row of a two-phase type whose lease is free or
            // expired ($4 and $5: JSON arrays of event types); a row of an ordered handler
            // waits while an earlier row of its key is unprocessed. Deferred rows (a due time)
            // are the deferred worker's.
            claim: stmt(format!(
                "UPDATE {inbox} SET lease_owner = $2, lease_until = {until}, claims = claims + 1 \
                 WHERE rowid = (SELECT c.rowid FROM {inbox} c \
                   WHERE c.consumer_group = $1 AND c.processed_at IS NULL AND c.due_at IS NULL \
                     AND c.event_type IN (SELECT value FROM json_each($4)) \
                     AND (c.lease_until IS NULL OR c.lease_until < {NOW}) \
                     AND (c.event_type NOT IN (SELECT value FROM json_each($5)) OR NOT EXISTS ( \
                       SELECT 1 FROM {inbox} o WHERE o.consumer_group = c.consumer_group \
                         AND o.processed_at IS NULL AND o.due_at IS NULL \
                         AND o.topic = c.topic AND o.\"partition\" = c.\"partition\" \
                         AND o.message_key = c.message_key AND o.\"offset\" < c.\"offset\")) \
                   ORDER BY c.received_at LIMIT 1) \
                 RETURNING source, event_id, topic, \"partition\", \"offset\", message_key, headers, payload",
                until = later("$3"),
            )),
            renew: stmt(format!(
                "UPDATE {inbox} SET lease_until = {until} WHERE {OWNED} RETURNING 1",
                until = later("$5"),
            )),
        }
    }
}

impl SqliteStore {
    pub(super) async fn receive_rows(
        &self,
        tx: &mut Tx,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let sql = TwoPhaseSql::of(&self.tables);
        let mut inserted = Vec::with_capacity(requests.len());
        for r in requests {
            let d = r.delivery;
            let row: Option<i64> = sqlx::query_scalar(sql.receive.clone())
                .bind(&r.key.group)
                .bind(&r.key.source)
                .bind(&r.key.event_id)
                .bind(text::safe_text(r.event_type, text::MAX_LABEL_BYTES))
                .bind(&*d.topic)
                .bind(d.partition)
                .bind(d.offset)
                .bind(d.key.as_deref())
                .bind(text::encode_headers(&d.headers))
                .bind(d.payload.as_deref())
                .fetch_optional(&mut **tx)
                .await?;
            inserted.push(row.is_some());
        }
        Ok(inserted)
    }

    pub(super) async fn claim_received_row(
        &self,
        request: &LeaseRequest<'_>,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        let json = |types: &[&str]| {
            serde_json::to_string(types).map_err(|e| StoreError::Config(e.to_string()))
        };
        let Some(row) = sqlx::query(TwoPhaseSql::of(&self.tables).claim.clone())
            .bind(request.group)
            .bind(request.owner)
            .bind(request.lease.as_secs_f64())
            .bind(json(request.event_types)?)
            .bind(json(request.ordered)?)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        // Two-phase handlers have no business key (refused at set-up).
        Ok(Some(received_row(&row, request.group, None)?))
    }

    pub(super) async fn renew_row(
        &self,
        key: &InboxKey,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let row: Option<i64> = sqlx::query_scalar(TwoPhaseSql::of(&self.tables).renew.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(owner)
            .bind(lease.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }
}
