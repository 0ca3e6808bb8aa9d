//! Deferred messages on MySQL/MariaDB (`HandlerError::defer`): the row kept with its due time
//! and message (the columns of inbox migration 1), claimed when due with a lease as a received
//! row is (`two_phase.rs`: a short transaction of `SELECT .. FOR UPDATE SKIP LOCKED` and the
//! lease's `UPDATE`), and checked, finished, released and dropped with the two-phase
//! statements: a deferred row is an unprocessed row with a lease, as a received one is.

use std::time::Duration;

use sqlx::{MySql, Row};

use super::{micros, MySqlStore};
use crate::message::Delivery;
use crate::store::text::encode_headers;
use crate::store::{received_row, InboxKey, ReceivedRow, StoreError};

type Tx = sqlx::Transaction<'static, MySql>;

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
