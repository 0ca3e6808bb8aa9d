//! Deferred messages on SQLite (`HandlerError::defer`): the row kept with its due time and
//! message, claimed when due with a lease. Every statement that decides who runs a row writes,
//! and SQLite has one writer at a time: a claim is one `UPDATE ... RETURNING`, and the
//! handler's transaction opens with a write to the row it checks, so it holds the database's
//! write lock until it ends and no other claim or run can touch the row meanwhile.

use std::time::Duration;

use sqlx::{Row, Sqlite};

use super::SqliteStore;
use crate::message::Delivery;
use crate::store::sql::Stmt;
use crate::store::text::encode_headers;
use crate::store::{received_row, InboxKey, ReceivedRow, StoreError};

type Tx = sqlx::Transaction<'static, Sqlite>;

fn bind_owned<'q>(
    sql: &Stmt,
    key: &'q InboxKey,
    owner: &'q str,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments> {
    sqlx::query(sql.clone())
        .bind(&key.group)
        .bind(&key.source)
        .bind(&key.event_id)
        .bind(owner)
}

impl SqliteStore {
    pub(super) async fn defer_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        d: &Delivery,
        after: Duration,
    ) -> Result<u32, StoreError> {
        let deferrals: Option<i64> = sqlx::query_scalar(self.sql.deferred.defer.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(after.as_secs_f64())
            .bind(d.key.as_deref())
            .bind(encode_headers(&d.headers))
            .bind(d.payload.as_deref())
            .fetch_optional(&mut **tx)
            .await?;
        match deferrals {
            Some(n) => Ok(n.max(0) as u32),
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
        let Some(row) = sqlx::query(self.sql.deferred.claim.clone())
            .bind(group)
            .bind(owner)
            .bind(lease.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let business_key = row.try_get("business_key")?;
        Ok(Some(received_row(&row, group, business_key)?))
    }

    pub(super) async fn count_deferred_rows(&self, group: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(self.sql.deferred.count.clone())
            .bind(group)
            .fetch_one(&self.pool)
            .await?)
    }

    /// In the handler's transaction: whether `owner` still holds the row (`Some(earlier
    /// failed runs)`); the check is a write, so the transaction holds the write lock from here.
    pub(super) async fn check_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        owner: &str,
    ) -> Result<Option<u32>, StoreError> {
        let held = bind_owned(&self.sql.deferred.check, key, owner)
            .fetch_optional(&mut **tx)
            .await?;
        if held.is_none() {
            return Ok(None);
        }
        let attempts: Option<i64> = sqlx::query_scalar(self.sql.attempts.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(Some(attempts.unwrap_or(0).max(0) as u32))
    }

    pub(super) async fn finish_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        owner: &str,
        had_failures: bool,
    ) -> Result<bool, StoreError> {
        let row = bind_owned(&self.sql.deferred.finish, key, owner)
            .fetch_optional(&mut **tx)
            .await?;
        if row.is_some() && had_failures {
            self.shared().clear_attempts(tx, key).await?;
        }
        Ok(row.is_some())
    }

    pub(super) async fn release_row(&self, key: &InboxKey, owner: &str) -> Result<(), StoreError> {
        bind_owned(&self.sql.deferred.release, key, owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(super) async fn drop_row(&self, key: &InboxKey, owner: &str) -> Result<(), StoreError> {
        bind_owned(&self.sql.deferred.drop_row, key, owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
