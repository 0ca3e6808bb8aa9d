//! Two-phase handlers on MySQL/MariaDB (`mode = "two_phase"`), with the guarantees of
//! PostgreSQL: the receive step stores a message as a received row (key, headers and payload
//! kept; inbox migration 2 adds `claims` and the index the claims read), and the group's
//! workers, in any number of processes, claim received rows with a lease and run them in
//! parallel.
//!
//! MySQL has no `RETURNING` and does not let an `UPDATE` read its own table in a subquery: a
//! claim is a short transaction that picks the row with `SELECT .. FOR UPDATE SKIP LOCKED` (a
//! row another worker is claiming, or whose handler's transaction holds it, is skipped, not
//! waited for) and then writes the lease (owner, expiry, `claims + 1`). The handler's
//! transaction checks the lease with `SELECT .. FOR UPDATE` on the row and the owner: the row
//! stays locked until it ends, so no claim takes it even once the lease expired, and the
//! processed mark is made only while the owner still holds it. A row of an ordered handler
//! waits while an earlier row of its key is unprocessed (a plain read in the claim: it sees an
//! earlier row locked by a handler's transaction).
//!
//! InnoDB has no lock that lets an update go on beside a locked row (PostgreSQL's `KEY SHARE`):
//! a renewal does not wait for the handler's transaction. It extends the lease when the row is
//! free, and otherwise reads whether the owner still holds it: no claim can take a row while a
//! transaction holds it, so the lease needs no extension then.

use std::time::Duration;

use sqlx::mysql::MySqlArguments;
use sqlx::{MySql, Row};

use super::{micros, pairs, MySqlStore};
use crate::store::sql::{stmt, Stmt};
use crate::store::{
    received_row, text, ClaimRequest, InboxKey, LeaseRequest, ReceivedRow, StoreError,
};

type Tx = sqlx::Transaction<'static, MySql>;

/// `sql` bound with `key` and `owner` ([`OWNED`]'s four values).
fn bind_owned<'q>(
    sql: &Stmt,
    key: &'q InboxKey,
    owner: &'q str,
) -> sqlx::query::Query<'q, MySql, MySqlArguments> {
    sqlx::query(sql.clone())
        .bind(&key.group)
        .bind(&key.source)
        .bind(&key.event_id)
        .bind(owner)
}

impl MySqlStore {
    fn leases(&self) -> &super::LeaseSql {
        &self.sql.leases
    }

    pub(super) async fn receive_rows(
        &self,
        tx: &mut Tx,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let Some(first) = requests.first() else {
            return Ok(Vec::new());
        };
        // As a claim: the rows inserted carry this token (MySQL has no `RETURNING`).
        let token = super::claim_token();
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; requests.len()].join(", ");
        let insert = stmt(format!(
            "INSERT INTO {} (consumer_group, source, event_id, event_type, topic, `partition`, \
             `offset`, message_key, headers, payload, claim_token) VALUES {rows} \
             ON DUPLICATE KEY UPDATE claim_token = claim_token",
            self.sql.inbox
        ));
        let mut query = sqlx::query(insert);
        for r in requests {
            let d = r.delivery;
            query = query
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
                .bind(token);
        }
        query.execute(&mut **tx).await?;
        let select = stmt(format!(
            "SELECT CONVERT(source USING utf8mb4), CONVERT(event_id USING utf8mb4) FROM {} \
             WHERE consumer_group = ? AND claim_token = ? AND (source, event_id) IN ({})",
            self.sql.inbox,
            pairs(requests.len())
        ));
        let mut query = sqlx::query_as(select).bind(&first.key.group).bind(token);
        for r in requests {
            query = query.bind(&r.key.source).bind(&r.key.event_id);
        }
        let inserted: Vec<(String, String)> = query.fetch_all(&mut **tx).await?;
        Ok(requests
            .iter()
            .map(|r| {
                inserted
                    .iter()
                    .any(|(s, e)| *s == r.key.source && *e == r.key.event_id)
            })
            .collect())
    }

    pub(super) async fn claim_received_row(
        &self,
        request: &LeaseRequest<'_>,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        if request.event_types.is_empty() {
            return Ok(None);
        }
        let sql = self
            .leases()
            .claim(request.event_types.len(), request.ordered.len());
        let mut query = sqlx::query(sql).bind(request.group);
        for t in request.event_types.iter().chain(request.ordered) {
            query = query.bind(*t);
        }
        let mut tx = self.pool.begin().await?;
        let Some(row) = query.fetch_optional(&mut *tx).await? else {
            tx.rollback().await?;
            return Ok(None);
        };
        // Two-phase handlers have no business key (refused at set-up).
        let row = received_row(&row, request.group, None)?;
        self.lease_claimed(tx, &row.key, request.owner, request.lease)
            .await?;
        Ok(Some(row))
    }

    /// Writes the lease of `owner` on the row `tx` picked (and locked), and commits.
    pub(super) async fn lease_claimed(
        &self,
        mut tx: Tx,
        key: &InboxKey,
        owner: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(self.leases().lease.clone())
            .bind(owner)
            .bind(micros(lease))
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn renew_row(
        &self,
        key: &InboxKey,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let free = bind_owned(&self.leases().renew_free, key, owner)
            .fetch_optional(&mut *tx)
            .await?;
        if free.is_some() {
            sqlx::query(self.leases().renew.clone())
                .bind(micros(lease))
                .bind(&key.group)
                .bind(&key.source)
                .bind(&key.event_id)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(true);
        }
        tx.rollback().await?;
        // Held by a transaction (the handler's, most likely): whether `owner` still holds it.
        let held: i64 = bind_owned(&self.leases().held, key, owner)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(held > 0)
    }

    pub(super) async fn check_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        owner: &str,
    ) -> Result<Option<u32>, StoreError> {
        let held = bind_owned(&self.leases().check, key, owner)
            .fetch_optional(&mut **tx)
            .await?;
        if held.is_none() {
            return Ok(None);
        }
        let attempts: Option<i32> = sqlx::query_scalar(self.sql.failures_of.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(Some(u32::try_from(attempts.unwrap_or(0)).unwrap_or(0)))
    }

    pub(super) async fn finish_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        owner: &str,
        had_failures: bool,
    ) -> Result<bool, StoreError> {
        let done = bind_owned(&self.leases().finish, key, owner)
            .execute(&mut **tx)
            .await?;
        let finished = done.rows_affected() > 0;
        if finished && had_failures {
            self.clear_attempts(tx, key).await?;
        }
        Ok(finished)
    }

    pub(super) async fn release_row(&self, key: &InboxKey, owner: &str) -> Result<(), StoreError> {
        bind_owned(&self.leases().release, key, owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(super) async fn drop_row(&self, key: &InboxKey, owner: &str) -> Result<(), StoreError> {
        bind_owned(&self.leases().drop_row, key, owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
