//! Inbox retention of a large expired backlog: row by row (`DELETE` in batches, the default
//! layout) against whole days (`DROP TABLE` of expired partitions, the partitioned layout),
//! in time and in WAL bytes (`pg_current_wal_lsn()` before and after).
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release --example retention_bench -- [rows, default 10000000] [batch, default 10000]
//! ```
//!
//! Each layout gets the same rows in a schema of its own: processed inbox rows spread over 10
//! days, all older than the 7-day window. A `CHECKPOINT` before each measurement puts both on
//! the same footing (retention runs long after the rows were written). The schemas are dropped
//! at the end.

use std::time::{Duration, Instant};

use inoutbox::postgres::DailyPartitions;
use inoutbox::store::InboxStore;
use inoutbox::{PgStore, Tables};
use sqlx::postgres::{PgPool, PgPoolOptions};

const WINDOW: Duration = Duration::from_secs(7 * 86_400);
const DAYS: i32 = 10;

struct Measured {
    rows_before: i64,
    rows_after: i64,
    elapsed: Duration,
    wal_bytes: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rows: i64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000_000);
    let batch: u32 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    println!("retention of {rows} expired inbox rows over {DAYS} days (PostgreSQL, {url})");

    let schema = format!("retention_delete_{suffix}");
    let store = PgStore::with_tables(admin.clone(), Tables::with_schema(&schema)?);
    store.migrate().await?;
    fill(&admin, &schema, rows, false).await?;
    let delete = measure(&admin, &schema, || async {
        let mut total = 0;
        loop {
            let n = store.delete_processed(WINDOW, batch).await?;
            total += n;
            if n < u64::from(batch) {
                return Ok::<u64, inoutbox::store::StoreError>(total);
            }
        }
    })
    .await?;
    drop_schema(&admin, &schema).await?;

    let schema = format!("retention_partitions_{suffix}");
    let store = PgStore::with_tables(admin.clone(), Tables::with_schema(&schema)?)
        .partitioned_by_day(DailyPartitions::new());
    store.migrate().await?;
    fill(&admin, &schema, rows, true).await?;
    let drop = measure(&admin, &schema, || async {
        let changes = store.maintain_partitions(Some(WINDOW)).await?;
        Ok::<u64, inoutbox::store::StoreError>(changes.retired.len() as u64)
    })
    .await?;
    drop_schema(&admin, &schema).await?;

    println!("| retention of {rows} rows | rows left | time | WAL written |");
    println!("| --- | --- | --- | --- |");
    for (name, m) in [
        (format!("DELETE in batches of {batch}"), &delete),
        (format!("DROP of {DAYS} daily partitions"), &drop),
    ] {
        println!(
            "| {name} | {} of {} | {:.2} s | {} |",
            m.rows_after,
            m.rows_before,
            m.elapsed.as_secs_f64(),
            bytes(m.wal_bytes)
        );
    }
    println!(
        "DROP PARTITION vs DELETE: {:.0}x faster, {:.0}x less WAL",
        delete.elapsed.as_secs_f64() / drop.elapsed.as_secs_f64().max(1e-6),
        delete.wal_bytes as f64 / (drop.wal_bytes.max(1)) as f64
    );
    Ok(())
}

/// Processed rows, `rows` of them, received 8 to 17 days ago (all outside the window).
async fn fill(
    pool: &PgPool,
    schema: &str,
    rows: i64,
    partitioned: bool,
) -> Result<(), sqlx::Error> {
    let started = Instant::now();
    if partitioned {
        for day in 8..8 + DAYS {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DO $$ DECLARE d date := (now() AT TIME ZONE 'UTC')::date - {day}; BEGIN \
                 EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.inoutbox_inbox FOR VALUES FROM (%L) TO (%L)', \
                 '{schema}', 'inoutbox_inbox_p' || to_char(d, 'YYYYMMDD'), '{schema}', d, d + 1); END $$"
            )))
            .execute(pool)
            .await?;
        }
    }
    let (day_column, day_value) = match partitioned {
        true => (", received_day", ", (t AT TIME ZONE 'UTC')::date"),
        false => ("", ""),
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".inoutbox_inbox (consumer_group, source, event_id, event_type, topic, \
           \"partition\", \"offset\", received_at, processed_at{day_column}) \
         SELECT 'billing', '', 'evt-' || g, 'OrderCreated', 'orders', (g % 12)::int, g, t, t{day_value} \
         FROM generate_series(1, $1) AS g, \
           LATERAL (SELECT now() - make_interval(days => 8 + (g % {DAYS})::int, secs => 60) AS t) AS x"
    )))
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE \"{schema}\".inoutbox_inbox"
    )))
    .execute(pool)
    .await?;
    println!(
        "  {schema}: {rows} rows written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn measure<F, Fut>(
    pool: &PgPool,
    schema: &str,
    retention: F,
) -> Result<Measured, Box<dyn std::error::Error>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<u64, inoutbox::store::StoreError>>,
{
    let count = format!("SELECT count(*) FROM \"{schema}\".inoutbox_inbox");
    let rows_before: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(&*count))
        .fetch_one(pool)
        .await?;
    sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    let done = retention().await?;
    let elapsed = started.elapsed();
    let wal_bytes: i64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint")
            .bind(&lsn)
            .fetch_one(pool)
            .await?;
    let rows_after: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(&*count))
        .fetch_one(pool)
        .await?;
    println!(
        "  {schema}: {done} (rows deleted or partitions retired) in {:.2} s, {} of WAL",
        elapsed.as_secs_f64(),
        bytes(wal_bytes)
    );
    Ok(Measured {
        rows_before,
        rows_after,
        elapsed,
        wal_bytes,
    })
}

async fn drop_schema(pool: &PgPool, schema: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

fn bytes(n: i64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
