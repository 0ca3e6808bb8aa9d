//! Effects after commit on PostgreSQL: the insert that [`after_commit`] runs in a handler's
//! transaction. The drain's statements are in `two_phase` with the other leased claims.
//!
//! [`after_commit`]: crate::effects::after_commit

use std::collections::HashMap;
use std::future::Future;
use std::sync::{LazyLock, Mutex, PoisonError};

use sqlx::Postgres;

use crate::effects::{ScheduleEffect, ScheduledEffect};
use crate::store::sql::{stmt, Stmt};

impl ScheduleEffect for Postgres {
    fn schedule_effect<'t>(
        tx: &'t mut sqlx::Transaction<'_, Self>,
        table: &'t str,
        effect: ScheduledEffect<'t>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 't {
        let sql = schedule_sql(table);
        async move {
            sqlx::query(sql)
                .bind(effect.group)
                .bind(effect.source)
                .bind(effect.event_id)
                .bind(effect.kind)
                .bind(effect.idempotency_key)
                .bind(effect.payload)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }
    }
}

/// The statement that schedules an effect in a handler's transaction, rendered once per effects
/// table (a process has one per store): the same effect scheduled twice (a handler run again
/// after a rollback cannot have left one, but a handler may call it twice) is one effect.
fn schedule_sql(effects: &str) -> Stmt {
    static RENDERED: LazyLock<Mutex<HashMap<String, Stmt>>> = LazyLock::new(Default::default);
    let mut rendered = RENDERED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(sql) = rendered.get(effects) {
        return sql.clone();
    }
    let sql = stmt(format!(
        "INSERT INTO {effects} (consumer_group, source, event_id, kind, idempotency_key, payload) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (idempotency_key) DO NOTHING"
    ));
    rendered.insert(effects.to_owned(), sql.clone());
    sql
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
