//! Retention: published rows are deleted in small batches after a window.

use std::time::Duration;

use sqlx::PgPool;

use crate::store::StoreError;
use crate::store::Tables;

/// How long published rows are kept, and how many are deleted per statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Rows published longer ago than this are deleted (default 7 days).
    pub older_than: Duration,
    /// Rows per `DELETE` (default 1000); each batch is its own short transaction.
    pub batch_size: u32,
    /// How often the relay runs the purge (default every minute).
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            older_than: Duration::from_secs(7 * 24 * 3600),
            batch_size: 1000,
            interval: Duration::from_secs(60),
        }
    }
}

/// Deletes rows published more than `retention.older_than` ago, `batch_size` rows per
/// statement, until none is left; returns how many were deleted.
///
/// Only published rows are touched, and rows another session has locked are skipped
/// (`FOR UPDATE SKIP LOCKED`), so the purge never waits for, nor blocks, enqueues and the relay.
/// Unpublished and parked rows stay.
pub async fn purge_published(
    pool: &PgPool,
    tables: &Tables,
    retention: &Retention,
) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM {t} WHERE id IN (\
           SELECT id FROM {t} \
           WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
           ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        t = tables.outbox
    );
    let secs = retention.older_than.as_secs_f64();
    let sql = &sql;
    crate::store::delete_in_batches(retention.batch_size, |limit| async move {
        let done = sqlx::query(sql)
            .bind(secs)
            .bind(i64::from(limit))
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    })
    .await
}
