//! Effects after commit on SQLite: the insert that [`after_commit`] runs in a handler's
//! transaction, the drain's claims and settlements, and the counts and the purge of the effects
//! table (the gauge sampler, the retention task, `inoutbox status`).
//!
//! A claim is a lease (owner and expiry) taken by one `UPDATE ... RETURNING` on the group's
//! effects not done whose lease is free or expired: SQLite has one writer at a time, so two
//! drains never claim the same effect while its lease holds.
//!
//! [`after_commit`]: crate::effects::after_commit

use std::time::Duration;

use sqlx::{Row, Sqlite};

use super::{later, SqliteStore, NOW};
use crate::store::sql::{rendered_once, Stmt};
use crate::store::{text, EffectCounts, StoreError, StoredEffect};

crate::effects::schedule_effect_with!(Sqlite, |table| rendered(Which::Schedule, table));

/// The statements on the effects table, each rendered once per effects table (a process has
/// one per store).
#[derive(Clone, Copy, Debug)]
enum Which {
    Schedule,
    Claim,
    Done,
    Failed,
    Count,
    PurgeDone,
}

/// Seconds since the oldest `created_at` of the rows counted.
const OLDEST_AGE: &str = "(julianday('now') - julianday(min(created_at))) * 86400.0";

fn rendered(which: Which, effects: &str) -> Stmt {
    let failed = "coalesce(sum(CASE WHEN attempts > 0 THEN 1 ELSE 0 END), 0)";
    rendered_once("sqlite", which, effects, || {
        match which {
        // The same effect scheduled twice (a handler may call `after_commit` twice) is one.
        Which::Schedule => format!(
            "INSERT INTO {effects} (consumer_group, source, event_id, kind, idempotency_key, payload) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (idempotency_key) DO NOTHING"
        ),
        // The group's own effects only: a database shared by several services holds effects
        // whose executors only their own consumers have.
        Which::Claim => format!(
            "UPDATE {effects} SET lease_owner = $1, lease_until = {until} \
             WHERE id IN (SELECT id FROM {effects} WHERE consumer_group = $4 AND done_at IS NULL \
               AND (lease_until IS NULL OR lease_until < {NOW}) ORDER BY id LIMIT $3) \
             RETURNING id, consumer_group, event_id, kind, idempotency_key, payload, attempts",
            until = later("$2"),
        ),
        Which::Done => format!(
            "UPDATE {effects} SET done_at = {NOW}, lease_owner = NULL, lease_until = NULL \
             WHERE id = $1 AND lease_owner = $2"
        ),
        Which::Failed => format!(
            "UPDATE {effects} SET attempts = attempts + 1, last_error = $3, lease_until = {until} \
             WHERE id = $1 AND lease_owner = $2",
            until = later("$4"),
        ),
        Which::Count => format!(
            "SELECT count(*), {failed}, {OLDEST_AGE} \
             FROM {effects} WHERE consumer_group = $1 AND done_at IS NULL"
        ),
        // Oldest first, in batches: each statement a short transaction of its own.
        Which::PurgeDone => format!(
            "DELETE FROM {effects} WHERE id IN (SELECT id FROM {effects} \
               WHERE done_at IS NOT NULL AND done_at < {ago} ORDER BY done_at LIMIT $2)",
            ago = (super::DIALECT.ago)("$1"),
        ),
    }
    })
}

impl SqliteStore {
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
        let rows = sqlx::query(self.effects_sql(Which::Claim))
            .bind(owner)
            .bind(lease.as_secs_f64())
            .bind(i64::from(limit))
            .bind(group)
            .fetch_all(&self.pool)
            .await?;
        let mut claimed = rows
            .iter()
            .map(|row| {
                Ok(StoredEffect {
                    id: row.try_get("id")?,
                    group: row.try_get("consumer_group")?,
                    event_id: row.try_get("event_id")?,
                    kind: row.try_get("kind")?,
                    idempotency_key: row.try_get("idempotency_key")?,
                    payload: row.try_get("payload")?,
                    attempts: row.try_get::<i64, _>("attempts")?.max(0) as u32,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        // `RETURNING` gives no order: oldest first, as on PostgreSQL.
        claimed.sort_by_key(|e| e.id);
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
                .bind(id)
                .bind(owner)
                .bind(text::safe_text(error, text::MAX_ERROR_BYTES))
                .bind(retry_in.as_secs_f64()),
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
            .bind(older_than.as_secs_f64())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
