//! Deferred messages on PostgreSQL (`HandlerError::defer`): the row kept with its due time and
//! message, claimed when due with a lease (`FOR UPDATE SKIP LOCKED`). The handler's run checks
//! and finishes it with the two-phase statements (`two_phase.rs`): a deferred row is an
//! unprocessed row with a lease, as a received one is.

use std::time::Duration;

use sqlx::{Postgres, Row};

use super::PgStore;
use crate::message::Delivery;
use crate::store::{text, InboxKey, ReceivedRow, StoreError};

type Tx = sqlx::Transaction<'static, Postgres>;

impl PgStore {
    pub(super) async fn defer_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        d: &Delivery,
        after: Duration,
    ) -> Result<u32, StoreError> {
        let names: Vec<String> = d
            .headers
            .iter()
            .map(|(n, _)| text::safe_text(n, text::MAX_LABEL_BYTES).into_owned())
            .collect();
        let values: Vec<Option<&[u8]>> = d.headers.iter().map(|(_, v)| v.as_deref()).collect();
        let deferrals: Option<i32> = sqlx::query_scalar(self.sql.deferred.defer.clone())
            .bind(&key.group)
            .bind(&key.source)
            .bind(&key.event_id)
            .bind(after.as_secs_f64())
            .bind(d.key.as_deref())
            .bind(&names)
            .bind(&values)
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
        let names: Vec<String> = row
            .try_get::<Option<Vec<String>>, _>("header_names")?
            .unwrap_or_default();
        let values: Vec<Option<Vec<u8>>> = row
            .try_get::<Option<Vec<Option<Vec<u8>>>>, _>("header_values")?
            .unwrap_or_default();
        Ok(Some(ReceivedRow {
            key: InboxKey {
                group: group.to_owned(),
                source: row.try_get("source")?,
                event_id: row.try_get("event_id")?,
                business_key: row.try_get("business_key")?,
            },
            delivery: Delivery {
                topic: row
                    .try_get::<Option<String>, _>("topic")?
                    .unwrap_or_default()
                    .into(),
                partition: row.try_get::<Option<i32>, _>("partition")?.unwrap_or(0),
                offset: row.try_get::<Option<i64>, _>("offset")?.unwrap_or(0),
                key: row.try_get("message_key")?,
                payload: row.try_get("payload")?,
                headers: names.into_iter().zip(values).collect(),
            },
        }))
    }

    pub(super) async fn count_deferred_rows(&self, group: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(self.sql.deferred.count.clone())
            .bind(group)
            .fetch_one(&self.pool)
            .await?)
    }
}
