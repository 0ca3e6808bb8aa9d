//! The two-phase inbox and the effects table on PostgreSQL: received rows claimed with
//! leases (`FOR UPDATE SKIP LOCKED`), and effects drained after commit.

use std::time::Duration;

use sqlx::{Postgres, Row};

use super::PgStore;
use crate::message::Delivery;
use crate::store::sql::Stmt;
use crate::store::{
    text, ClaimRequest, InboxKey, LeaseRequest, ReceivedRow, StoreError, StoredEffect,
};

type Tx = sqlx::Transaction<'static, Postgres>;

fn bind_owned<'q>(
    sql: &Stmt,
    key: &'q InboxKey,
    owner: &'q str,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql.clone())
        .bind(&key.group)
        .bind(&key.source)
        .bind(&key.event_id)
        .bind(owner)
}

impl PgStore {
    pub(super) async fn receive_rows(
        &self,
        tx: &mut Tx,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let mut inserted = Vec::with_capacity(requests.len());
        for r in requests {
            let d = r.delivery;
            let names: Vec<String> = d
                .headers
                .iter()
                .map(|(n, _)| text::safe_text(n, text::MAX_LABEL_BYTES).into_owned())
                .collect();
            let values: Vec<Option<&[u8]>> = d.headers.iter().map(|(_, v)| v.as_deref()).collect();
            let row = sqlx::query(self.sql.two_phase.receive.clone())
                .bind(&r.key.group)
                .bind(&r.key.source)
                .bind(&r.key.event_id)
                .bind(text::safe_text(r.event_type, text::MAX_LABEL_BYTES))
                .bind(&*d.topic)
                .bind(d.partition)
                .bind(d.offset)
                .bind(d.key.as_deref())
                .bind(&names)
                .bind(&values)
                .bind(d.payload.as_deref())
                .fetch_optional(&mut **tx)
                .await?;
            inserted.push(row.is_some());
        }
        Ok(inserted)
    }

    pub(super) async fn claim_row(
        &self,
        request: &LeaseRequest<'_>,
    ) -> Result<Option<ReceivedRow>, StoreError> {
        let Some(row) = sqlx::query(self.sql.two_phase.claim.clone())
            .bind(request.group)
            .bind(request.owner)
            .bind(request.lease.as_secs_f64())
            .bind(request.event_types)
            .bind(request.ordered)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let names: Vec<String> = row.try_get("header_names")?;
        let values: Vec<Option<Vec<u8>>> = row.try_get("header_values")?;
        Ok(Some(ReceivedRow {
            key: InboxKey {
                group: request.group.to_owned(),
                source: row.try_get("source")?,
                event_id: row.try_get("event_id")?,
                // Two-phase handlers have no business key (refused at set-up).
                business_key: None,
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

    pub(super) async fn renew_row(
        &self,
        key: &InboxKey,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let row = bind_owned(&self.sql.two_phase.renew, key, owner)
            .bind(lease.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    pub(super) async fn release_row(&self, key: &InboxKey, owner: &str) -> Result<(), StoreError> {
        bind_owned(&self.sql.two_phase.release, key, owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(super) async fn drop_row(&self, key: &InboxKey, owner: &str) -> Result<(), StoreError> {
        bind_owned(&self.sql.two_phase.drop_row, key, owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(super) async fn check_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        owner: &str,
    ) -> Result<Option<u32>, StoreError> {
        let row = bind_owned(&self.sql.two_phase.check, key, owner)
            .fetch_optional(&mut **tx)
            .await?;
        match row {
            Some(row) => Ok(Some(row.try_get::<i32, _>("attempts")?.max(0) as u32)),
            None => Ok(None),
        }
    }

    pub(super) async fn finish_row(
        &self,
        tx: &mut Tx,
        key: &InboxKey,
        owner: &str,
        had_failures: bool,
    ) -> Result<bool, StoreError> {
        let row = bind_owned(&self.sql.two_phase.finish, key, owner)
            .fetch_optional(&mut **tx)
            .await?;
        if row.is_some() && had_failures {
            self.shared().clear_attempts(tx, key).await?;
        }
        Ok(row.is_some())
    }

    pub(super) async fn count_stuck_rows(&self, older_than: Duration) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(self.sql.two_phase.count_stuck.clone())
            .bind(older_than.as_secs_f64())
            .fetch_one(&self.pool)
            .await?)
    }

    pub(super) async fn claim_effect_rows(
        &self,
        group: &str,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<StoredEffect>, StoreError> {
        let rows = sqlx::query(self.sql.two_phase.claim_effects.clone())
            .bind(owner)
            .bind(lease.as_secs_f64())
            .bind(i64::from(limit))
            .bind(group)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(StoredEffect {
                    id: row.try_get("id")?,
                    group: row.try_get("consumer_group")?,
                    event_id: row.try_get("event_id")?,
                    kind: row.try_get("kind")?,
                    idempotency_key: row.try_get("idempotency_key")?,
                    payload: row.try_get("payload")?,
                    attempts: row.try_get::<i32, _>("attempts")?.max(0) as u32,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    pub(super) async fn settle_effect_row(
        &self,
        id: i64,
        owner: &str,
        error: Option<&str>,
        retry_in: Duration,
    ) -> Result<(), StoreError> {
        let query = match error {
            None => sqlx::query(self.sql.two_phase.effect_done.clone())
                .bind(id)
                .bind(owner),
            Some(error) => sqlx::query(self.sql.two_phase.effect_failed.clone())
                .bind(id)
                .bind(owner)
                .bind(text::safe_text(error, text::MAX_ERROR_BYTES))
                .bind(retry_in.as_secs_f64()),
        };
        query.execute(&self.pool).await?;
        Ok(())
    }
}
