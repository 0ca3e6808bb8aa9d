//! The time-partitioned inbox (opt-in, [`PgStore::partitioned_by_day`]): the inbox table is
//! partitioned by `received_day`, the UTC day a row was received; retention drops or detaches
//! whole days, and partitions are created ahead of time.
//!
//! PostgreSQL requires every unique key of a partitioned table to hold the partition column,
//! so the primary key is (group, source, event id, day) and alone it would only deduplicate
//! within a day. A claim therefore first takes a transaction-level advisory lock on each key
//! (event id, and business key when there is one; two-key form, so it never meets the
//! application's one-key locks), then inserts only the keys no partition holds. A concurrent
//! claim of the same key waits for the lock and, since each statement of a read-committed
//! transaction sees what committed before it, finds the winner's row. Rows of a day with no
//! partition land in the default partition; [`PgStore::maintain_partitions`] moves them into
//! the day's partition when it creates it.

use std::time::Duration;

use sqlx::Row;

use super::PgStore;
use crate::store::sql::stmt;
use crate::store::{legacy, migrate, StoreError};

/// How [`PgStore::partitioned_by_day`] lays out the inbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DailyPartitions {
    /// Days created ahead of today, besides today (default 3): maintenance must run at least
    /// once in this many days, or new rows land in the default partition.
    pub ahead: u32,
    /// What retention does with a partition whose every row is older than the window.
    pub retire: Retire,
}

impl Default for DailyPartitions {
    fn default() -> Self {
        Self {
            ahead: 3,
            retire: Retire::Drop,
        }
    }
}

impl DailyPartitions {
    /// Today's partition and 3 days ahead; expired partitions dropped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Days created ahead of today.
    pub fn ahead(mut self, days: u32) -> Self {
        self.ahead = days;
        self
    }

    /// Expired partitions are detached (kept as tables of their own, e.g. to archive them)
    /// rather than dropped.
    pub fn detach(mut self) -> Self {
        self.retire = Retire::Detach;
        self
    }
}

/// What retention does with an expired partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retire {
    /// `DROP TABLE` the partition.
    Drop,
    /// `ALTER TABLE .. DETACH PARTITION`: the table stays, outside the inbox.
    Detach,
}

/// What [`PgStore::maintain_partitions`] changed: partition names, unqualified.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionChanges {
    /// Partitions created (today and the days ahead that were missing).
    pub created: Vec<String>,
    /// Partitions dropped or detached.
    pub retired: Vec<String>,
    /// Expired partitions kept because they still hold unprocessed rows.
    pub kept: Vec<String>,
}

/// The text of an event id's lock key.
pub(super) fn event_lock_key(group: &str, source: &str, event_id: &str) -> String {
    format!("{group}\u{1f}{source}\u{1f}{event_id}")
}

/// The text of a business key's lock key.
pub(super) fn business_lock_key(group: &str, business_key: &str) -> String {
    format!("{group}\u{1e}{business_key}")
}

/// `YYYYMMDD` of a day, checked to be what PostgreSQL printed (it is interpolated).
fn day_suffix(day: &str) -> Result<String, StoreError> {
    let compact: String = day.chars().filter(|c| *c != '-').collect();
    match compact.len() == 8 && compact.bytes().all(|b| b.is_ascii_digit()) {
        true => Ok(compact),
        false => Err(StoreError::Config(format!("unexpected day `{day}`"))),
    }
}

impl PgStore {
    /// Turns the inbox table into the partitioned one (a no-op once it is), under the
    /// migrator's lock.
    pub(super) async fn partition_inbox(&self) -> Result<(), StoreError> {
        let sql = migrate::render(include_str!("partitioned.sql"), &self.tables)
            .map_err(StoreError::Migration)?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1 || $2))")
            .bind(legacy::LOCK_NAMESPACE)
            .bind(self.tables.migrations.name().as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(stmt(sql)).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Creates the partitions of today and of the days ahead that are missing (moving their
    /// rows out of the default partition), and, given a window, retires the partitions whose
    /// every row was received more than `older_than` ago: a partition of day D once
    /// `now - older_than` is past the end of D. A partition that still holds unprocessed rows
    /// is kept. Each change runs in its own short transaction with a 5 s lock timeout, so that
    /// a long transaction on the inbox delays it rather than the consumers queueing behind it.
    ///
    /// [`Inbox::purge_processed`](crate::engine::Inbox::purge_processed) on a partitioned
    /// store calls it with its window (and deletes old rows of the default partition).
    pub async fn maintain_partitions(
        &self,
        older_than: Option<Duration>,
    ) -> Result<PartitionChanges, StoreError> {
        let Some(layout) = self.partitions else {
            return Err(StoreError::Config(
                "the inbox is not partitioned: see PgStore::partitioned_by_day".into(),
            ));
        };
        let mut changes = PartitionChanges::default();
        let existing = self.partition_days().await?;
        let days: Vec<(String, String)> = sqlx::query_as(
            "SELECT d::text, (d + 1)::text FROM (SELECT (now() AT TIME ZONE 'UTC')::date + g AS d \
             FROM generate_series(0, $1) AS g) AS s",
        )
        .bind(i32::try_from(layout.ahead).unwrap_or(i32::MAX))
        .fetch_all(&self.pool)
        .await?;
        for (day, next) in days {
            let suffix = day_suffix(&day)?;
            if !existing.contains(&suffix) {
                changes
                    .created
                    .push(self.create_partition(&day, &next).await?);
            }
        }
        if let Some(older_than) = older_than {
            self.retire_expired(layout, older_than, &existing, &mut changes)
                .await?;
        }
        if !changes.created.is_empty() || !changes.retired.is_empty() {
            tracing::info!(target: "inoutbox::postgres", created = ?changes.created, retired = ?changes.retired,
                kept = ?changes.kept, "inoutbox inbox partitions maintained");
        }
        Ok(changes)
    }

    /// The days (`YYYYMMDD`) of the inbox's daily partitions.
    async fn partition_days(&self) -> Result<Vec<String>, StoreError> {
        let prefix = format!("{}_p", self.tables.inbox.name().as_str());
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = $1::regclass",
        )
        .bind(self.tables.inbox.to_string())
        .fetch_all(&self.pool)
        .await?;
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix(&prefix))
            .filter(|d| d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_owned)
            .collect())
    }

    /// A partition's name, unqualified and quoted, and qualified.
    fn partition_name(&self, suffix: &str) -> (String, String) {
        let name = self.tables.inbox.derived(&format!("p{suffix}"));
        let qualified = match self.tables.schema() {
            Some(schema) => format!("{schema}.{name}"),
            None => name.clone(),
        };
        (name, qualified)
    }

    /// Creates the partition of `day` (`YYYY-MM-DD`, up to `next`), moving that day's rows out
    /// of the default partition; returns its name.
    async fn create_partition(&self, day: &str, next: &str) -> Result<String, StoreError> {
        let (name, part) = self.partition_name(&day_suffix(day)?);
        let (_, default) = self.partition_name_default();
        let inbox = &self.tables.inbox;
        let mut tx = self.pool.begin().await?;
        let statements = [
            "SET LOCAL lock_timeout = '5s'".to_owned(),
            format!("CREATE TABLE {part} (LIKE {inbox} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"),
            format!(
                "WITH moved AS (DELETE FROM {default} WHERE received_day = '{day}' RETURNING *) \
                 INSERT INTO {part} SELECT * FROM moved"
            ),
            format!("ALTER TABLE {inbox} ATTACH PARTITION {part} FOR VALUES FROM ('{day}') TO ('{next}')"),
        ];
        for statement in statements {
            sqlx::query(stmt(statement)).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(name.trim_matches('"').to_owned())
    }

    /// The default partition's name, unqualified and qualified.
    fn partition_name_default(&self) -> (String, String) {
        let name = self.tables.inbox.derived("default");
        let qualified = match self.tables.schema() {
            Some(schema) => format!("{schema}.{name}"),
            None => name.clone(),
        };
        (name, qualified)
    }

    /// Drops or detaches the partitions of days before `now - older_than`'s day.
    async fn retire_expired(
        &self,
        layout: DailyPartitions,
        older_than: Duration,
        existing: &[String],
        changes: &mut PartitionChanges,
    ) -> Result<(), StoreError> {
        let cutoff: String = sqlx::query_scalar(
            "SELECT to_char(((now() - make_interval(secs => $1)) AT TIME ZONE 'UTC')::date, 'YYYYMMDD')",
        )
        .bind(older_than.as_secs_f64())
        .fetch_one(&self.pool)
        .await?;
        let inbox = &self.tables.inbox;
        for suffix in existing.iter().filter(|d| **d < cutoff) {
            let (name, part) = self.partition_name(suffix);
            let name = name.trim_matches('"').to_owned();
            let mut tx = self.pool.begin().await?;
            sqlx::query("SET LOCAL lock_timeout = '5s'")
                .execute(&mut *tx)
                .await?;
            let unprocessed = sqlx::query(stmt(format!(
                "SELECT EXISTS (SELECT 1 FROM {part} WHERE processed_at IS NULL) AS any"
            )))
            .fetch_one(&mut *tx)
            .await?
            .try_get::<bool, _>("any")?;
            if unprocessed {
                tracing::warn!(target: "inoutbox::postgres",
                    partition = name.as_str(),
                    "inoutbox inbox partition expired but holds unprocessed rows: kept"
                );
                changes.kept.push(name);
                continue;
            }
            let statement = match layout.retire {
                Retire::Drop => format!("DROP TABLE {part}"),
                Retire::Detach => format!("ALTER TABLE {inbox} DETACH PARTITION {part}"),
            };
            sqlx::query(stmt(statement)).execute(&mut *tx).await?;
            tx.commit().await?;
            changes.retired.push(name);
        }
        Ok(())
    }

    /// Retention on the partitioned inbox: retires expired partitions, then deletes at most
    /// `limit` old processed rows of the default partition; returns the rows deleted there.
    pub(super) async fn delete_processed_partitioned(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.maintain_partitions(Some(older_than)).await?;
        let (_, default) = self.partition_name_default();
        let deleted = sqlx::query(stmt(format!(
            "DELETE FROM {default} WHERE ctid IN (SELECT ctid FROM {default} \
             WHERE processed_at < now() - make_interval(secs => $1) LIMIT $2)"
        )))
        .bind(older_than.as_secs_f64())
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }

    /// Takes the advisory locks of the keys a claim is about to insert.
    pub(super) async fn lock_keys(
        &self,
        tx: &mut sqlx::PgConnection,
        keys: &[String],
    ) -> Result<(), StoreError> {
        sqlx::query(self.sql.lock_keys.clone())
            .bind(keys)
            .execute(tx)
            .await?;
        Ok(())
    }
}
