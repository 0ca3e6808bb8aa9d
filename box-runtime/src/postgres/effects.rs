//! Effects after commit on PostgreSQL: the insert that [`after_commit`] runs in a handler's
//! transaction, and the counts and the purge of the effects table (the gauge sampler, the
//! retention task, `inoutbox status`). The drain's claims are in `two_phase` with the other
//! leased claims.
//!
//! [`after_commit`]: crate::effects::after_commit

use std::time::Duration;

use sqlx::Postgres;

use super::PgStore;
use crate::store::sql::{rendered_once, Stmt};
use crate::store::{EffectCounts, StoreError};

crate::effects::schedule_effect_with!(Postgres, schedule_sql);

/// The statement that schedules an effect in a handler's transaction: the same effect scheduled
/// twice (a handler run again after a rollback cannot have left one, but a handler may call it
/// twice) is one effect.
fn schedule_sql(effects: &str) -> Stmt {
    rendered(Which::Schedule, effects)
}

/// The statements on the effects table, each rendered once per effects table (a process has
/// one per store).
#[derive(Clone, Copy, Debug)]
enum Which {
    Schedule,
    Count,
    PurgeDone,
}

fn rendered(which: Which, effects: &str) -> Stmt {
    rendered_once("postgres", which, effects, || {
        match which {
        Which::Schedule => format!(
            "INSERT INTO {effects} (consumer_group, source, event_id, kind, idempotency_key, payload) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (idempotency_key) DO NOTHING"
        ),
        Which::Count => format!(
            "SELECT count(*), count(*) FILTER (WHERE attempts > 0), \
               CAST(extract(epoch FROM now() - min(created_at)) AS float8) \
             FROM {effects} WHERE consumer_group = $1 AND done_at IS NULL"
        ),
        // Oldest first, in batches: each statement a short transaction of its own.
        Which::PurgeDone => format!(
            "DELETE FROM {effects} WHERE id IN (SELECT id FROM {effects} \
               WHERE done_at < now() - make_interval(secs => $1) ORDER BY done_at LIMIT $2)"
        ),
    }
    })
}

impl PgStore {
    pub(super) async fn count_effect_rows(&self, group: &str) -> Result<EffectCounts, StoreError> {
        let row: (i64, i64, Option<f64>) =
            sqlx::query_as(rendered(Which::Count, &self.tables().effects.to_string()))
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
        let done = sqlx::query(rendered(
            Which::PurgeDone,
            &self.tables().effects.to_string(),
        ))
        .bind(older_than.as_secs_f64())
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::schedule_sql;

    #[test]
    fn the_insert_is_rendered_once_per_effects_table() {
        let first = schedule_sql("\"app\".\"inoutbox_effects\"");
        let again = schedule_sql("\"app\".\"inoutbox_effects\"");
        let other = schedule_sql("\"inoutbox_effects\"");
        assert!(std::ptr::eq(first.as_str(), again.as_str()));
        assert!(other
            .as_str()
            .starts_with("INSERT INTO \"inoutbox_effects\" (consumer_group, "));
    }
}
