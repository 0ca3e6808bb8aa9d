//! Effects after commit on MySQL/MariaDB (the effects table of inbox migration 2): the insert
//! that [`after_commit`] runs in a handler's transaction, the drain's claims and settlements,
//! and the counts and the purge of the effects table.
//!
//! A claim is a short transaction: `SELECT .. FOR UPDATE SKIP LOCKED` picks the group's effects
//! not done whose lease is free or expired (effects other drains are claiming are skipped, not
//! waited for), and an `UPDATE` writes the lease (owner and expiry) on them.
//!
//! [`after_commit`]: crate::effects::after_commit

use std::time::Duration;

use sqlx::{MySql, Row};

use super::{marks, micros, MySqlStore, AGO, LATER};
use crate::store::sql::{rendered_once, stmt, Stmt};
use crate::store::{text, EffectCounts, StoreError, StoredEffect};

crate::effects::schedule_effect_with!(MySql, |table| rendered(Which::Schedule, table));

/// The statements on the effects table, each rendered once per effects table.
#[derive(Clone, Copy, Debug)]
enum Which {
    Schedule,
    Pick,
    Done,
    Failed,
    Count,
    PurgeDone,
}

/// `table` is the effects table as [`Tables`](crate::store::Tables) writes it (double quotes),
/// as `after_commit` hands it over.
fn rendered(which: Which, table: &str) -> Stmt {
    rendered_once("mysql", which, table, || {
        let effects = super::adapt(table);
        match which {
            // The same effect scheduled twice (a handler may call `after_commit` twice) is one.
            Which::Schedule => format!(
                "INSERT INTO {effects} (consumer_group, source, event_id, kind, idempotency_key, payload) \
                 VALUES (?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE id = id"
            ),
            // The group's own effects only: a database shared by several services holds
            // effects whose executors only their own consumers have.
            Which::Pick => format!(
                "SELECT id, CONVERT(consumer_group USING utf8mb4) AS consumer_group, \
                   CONVERT(event_id USING utf8mb4) AS event_id, kind, idempotency_key, payload, attempts \
                 FROM {effects} WHERE consumer_group = ? AND done_at IS NULL \
                   AND (lease_until IS NULL OR lease_until < NOW(6)) \
                 ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            Which::Done => format!(
                "UPDATE {effects} SET done_at = NOW(6), lease_owner = NULL, lease_until = NULL \
                 WHERE id = ? AND lease_owner = ?"
            ),
            Which::Failed => format!(
                "UPDATE {effects} SET attempts = attempts + 1, last_error = ?, lease_until = {LATER} \
                 WHERE id = ? AND lease_owner = ?"
            ),
            Which::Count => format!(
                "SELECT count(*), CAST(COALESCE(SUM(attempts > 0), 0) AS SIGNED), \
                   TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)) / 1e6 \
                 FROM {effects} WHERE consumer_group = ? AND done_at IS NULL"
            ),
            // Oldest first, in batches: each statement a short transaction of its own.
            Which::PurgeDone => format!(
                "DELETE FROM {effects} WHERE done_at < {AGO} ORDER BY done_at LIMIT ?"
            ),
        }
    })
}

impl MySqlStore {
    fn effects_sql(&self, which: Which) -> Stmt {
        rendered(which, &self.tables.effects.to_string())
    }

    pub(super) async fn claim_effect_rows(
        &self,
        group: &str,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<StoredEffect>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(self.effects_sql(Which::Pick))
            .bind(group)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        let claimed = rows
            .iter()
            .map(|row| {
                Ok(StoredEffect {
                    id: row.try_get("id")?,
                    group: row.try_get("consumer_group")?,
                    event_id: row.try_get("event_id")?,
                    kind: row.try_get("kind")?,
                    idempotency_key: row.try_get("idempotency_key")?,
                    payload: row.try_get("payload")?,
                    attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        if claimed.is_empty() {
            tx.rollback().await?;
            return Ok(claimed);
        }
        let lease_sql = stmt(format!(
            "UPDATE {} SET lease_owner = ?, lease_until = {LATER} WHERE id IN ({})",
            super::quoted(&self.tables.effects),
            marks(claimed.len())
        ));
        let mut query = sqlx::query(lease_sql).bind(owner).bind(micros(lease));
        for effect in &claimed {
            query = query.bind(effect.id);
        }
        query.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    pub(super) async fn settle_effect_row(
        &self,
        id: i64,
        owner: &str,
        error: Option<&str>,
        retry_in: Duration,
    ) -> Result<(), StoreError> {
        let query = match error {
            None => sqlx::query(self.effects_sql(Which::Done))
                .bind(id)
                .bind(owner),
            Some(error) => sqlx::query(self.effects_sql(Which::Failed))
                .bind(text::safe_text(error, text::MAX_ERROR_BYTES))
                .bind(micros(retry_in))
                .bind(id)
                .bind(owner),
        };
        query.execute(&self.pool).await?;
        Ok(())
    }

    pub(super) async fn count_effect_rows(&self, group: &str) -> Result<EffectCounts, StoreError> {
        let row: (i64, i64, Option<f64>) = sqlx::query_as(self.effects_sql(Which::Count))
            .bind(group)
            .fetch_one(&self.pool)
            .await?;
        Ok(EffectCounts::from_row(row))
    }

    pub(super) async fn delete_done_effect_rows(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(self.effects_sql(Which::PurgeDone))
            .bind(micros(older_than))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
