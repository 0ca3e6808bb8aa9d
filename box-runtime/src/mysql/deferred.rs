//! Deferred messages on MySQL/MariaDB (`HandlerError::defer`): the row kept with its due time
//! and message (the columns of inbox migration 1), claimed when due with a lease as a received
//! row is (`two_phase.rs`: a short transaction of `SELECT .. FOR UPDATE SKIP LOCKED` and the
//! lease's `UPDATE`), and checked, finished, released and dropped with the two-phase
//! statements: a deferred row is an unprocessed row with a lease, as a received one is.

use std::time::Duration;

use sqlx::{MySql, Row};

use super::two_phase::RECEIVED_COLUMNS;
use super::{micros, my, MySqlStore, LATER};
use crate::message::Delivery;
use crate::store::sql::Stmt;
use crate::store::text::encode_headers;
use crate::store::{received_row, InboxKey, ReceivedRow, StoreError, Tables};

type Tx = sqlx::Transaction<'static, MySql>;

/// The statements of deferred messages, rendered once per store.
#[derive(Debug)]
pub(super) struct DeferredSql {
    defer: Stmt,
    deferrals: Stmt,
    claim: Stmt,
    count: Stmt,
}

impl DeferredSql {
    pub(super) fn new(t: &Tables) -> Self {
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

impl MySqlStore {
    pub(super) async fn defer_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        d: &Delivery,
        after: Duration,
    ) -> Result<u32, StoreError> {
        let sql = &self.sql.deferred;
        sqlx::query(sql.defer.clone())
            .bind(micros(after))
            .bind(d.key.as_deref())
            .bind(encode_headers(&d.headers))
            .bind(d.payload.as_deref())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .execute(&mut **tx)
            .await?;
        let deferrals: Option<i32> = sqlx::query_scalar(sql.deferrals.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_optional(&mut **tx)
            .await?;
        match deferrals {
            Some(n) => Ok(u32::try_from(n).unwrap_or(0)),
            None => Err(StoreError::Config(format!(
                "no inbox row to defer for event `{}` of group `{}`",
                key.event_id, key.group
            ))),
        }
    }

    pub(super) async fn claim_deferred_row(
        &self,
        group: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let Some(row) = sqlx::query(self.sql.deferred.claim.clone())
            .bind(group)
            .fetch_optional(&mut *tx)
            .await?
        else {
            tx.rollback().await?;
            return Ok(None);
        };
        let business_key = row.try_get("business_key")?;
        let row = received_row(&row, group, business_key)?;
        self.lease_claimed(tx, &row.key, owner, lease).await?;
        Ok(Some(row))
    }

    pub(super) async fn count_deferred_rows(&self, group: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(self.sql.deferred.count.clone())
            .bind(group)
            .fetch_one(&self.pool)
            .await?)
    }
}
