//! The time-partitioned inbox on PostgreSQL (`PgStore::partitioned_by_day`): deduplication
//! across the partitions of the window (a redelivery after midnight, two claims of one event on
//! two days), retention by whole partitions (and the window rule: an event whose partition was
//! dropped is processed again), the default partition, and turning an existing inbox into a
//! partitioned one. Each test works in its own schema on the real PostgreSQL.

mod support;

use std::time::Duration;

use inoutbox::inbox::{Delivery, Inbox, InboxConfig};
use inoutbox::postgres::DailyPartitions;
use inoutbox::prelude::*;
use inoutbox::store::{InboxKey, InboxStore};
use inoutbox::Outcome;
use serde::{Deserialize, Serialize};
use support::TestDb;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "Payment", topic = "payments", key = order_id, idempotency_key = operation_id)]
pub struct Payment {
    pub order_id: Uuid,
    pub operation_id: String,
    pub total_cents: i64,
}

#[inbox_handler(event = "Payment", group = "partitioned")]
async fn record_payment(event: Payment, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn payment(offset: i64, event_id: &str, operation_id: &str) -> Delivery {
    let payload = serde_json::to_vec(&Payment {
        order_id: Uuid::new_v4(),
        operation_id: operation_id.into(),
        total_cents: 100,
    })
    .unwrap();
    Delivery {
        topic: "payments".into(),
        partition: 0,
        offset,
        key: None,
        payload: Some(payload),
        headers: vec![
            ("ce_id".into(), Some(event_id.as_bytes().to_vec())),
            ("ce_type".into(), Some(b"Payment".to_vec())),
        ],
    }
}

/// A migrated store with the partitioned inbox (today and 2 days ahead).
async fn partitioned(db: &TestDb) -> inoutbox::PgStore {
    let store = db
        .store()
        .partitioned_by_day(DailyPartitions::new().ahead(2));
    store.migrate().await.expect("migrate (partitioned)");
    store
}

/// The inbox's partitions, by name.
async fn partitions(db: &TestDb) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'inoutbox_inbox'::regclass ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .expect("partitions")
}

/// Creates the partition of the day `days` from today (UTC), named as the store names them.
async fn create_day(db: &TestDb, days: i32) -> String {
    let name: String = sqlx::query_scalar(
        "SELECT 'inoutbox_inbox_p' || to_char((now() AT TIME ZONE 'UTC')::date + $1, 'YYYYMMDD')",
    )
    .bind(days)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{name}\" PARTITION OF inoutbox_inbox FOR VALUES \
         FROM ((now() AT TIME ZONE 'UTC')::date + {days}) TO ((now() AT TIME ZONE 'UTC')::date + {days} + 1)"
    )))
    .execute(&db.pool)
    .await
    .expect("create a partition");
    name
}

/// Moves the inbox rows of `event_id` to the day `days` from today, as if received then.
async fn receive_on(db: &TestDb, event_id: &str, days: i32) {
    let moved = sqlx::query(
        "UPDATE inoutbox_inbox SET received_day = (now() AT TIME ZONE 'UTC')::date + $2, \
         received_at = now() + make_interval(days => $2), processed_at = now() + make_interval(days => $2) \
         WHERE event_id = $1",
    )
    .bind(event_id)
    .bind(days)
    .execute(&db.pool)
    .await
    .expect("move a row");
    assert_eq!(moved.rows_affected(), 1, "one row of {event_id}");
}

async fn day_of(db: &TestDb, event_id: &str) -> String {
    sqlx::query_scalar("SELECT tableoid::regclass::text FROM inoutbox_inbox WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(&db.pool)
        .await
        .expect("the row's partition")
}

fn no_shutdown() -> inoutbox::shutdown::CancellationToken {
    inoutbox::shutdown::CancellationToken::new()
}

#[tokio::test]
async fn an_event_received_before_midnight_and_redelivered_after_it_is_a_duplicate() {
    let db = TestDb::new("part_midnight").await;
    let store = partitioned(&db).await;
    let yesterday = create_day(&db, -1).await;
    let inbox = Inbox::new(store, "partitioned", InboxConfig::default()).unwrap();
    let shutdown = no_shutdown();
    let first = payment(0, "evt-midnight", "op-midnight");
    assert_eq!(
        inbox.process(&first, &shutdown).await,
        Outcome::Processed { attempt: 1 }
    );
    // Received yesterday at 23:59 (its row in yesterday's partition) ...
    receive_on(&db, "evt-midnight", -1).await;
    assert_eq!(day_of(&db, "evt-midnight").await, yesterday);
    // ... and delivered again today: the claim inserts into today's partition, whose unique key
    // does not hold yesterday's row; only the look-up across partitions finds it.
    let again = payment(1, "evt-midnight", "op-midnight-2");
    assert_eq!(inbox.process(&again, &shutdown).await, Outcome::Duplicate);
    // The same for a row that sits in the default partition (a day without a partition).
    let old = payment(2, "evt-default", "op-default");
    inbox.process(&old, &shutdown).await;
    receive_on(&db, "evt-default", -3).await;
    assert_eq!(day_of(&db, "evt-default").await, "inoutbox_inbox_default");
    assert_eq!(
        inbox
            .process(&payment(3, "evt-default", "op-x"), &shutdown)
            .await,
        Outcome::Duplicate
    );
    assert_eq!(db.invoices().await, 2, "each event applied once");
}

#[tokio::test]
async fn two_claims_of_one_event_on_two_days_wait_for_each_other_and_apply_it_once() {
    let db = TestDb::new("part_race").await;
    let store = partitioned(&db).await;
    create_day(&db, -1).await;
    let inbox = std::sync::Arc::new(
        Inbox::new(store.clone(), "partitioned", InboxConfig::default()).unwrap(),
    );
    let d = payment(0, "evt-race", "op-race");
    let key = InboxKey {
        group: "partitioned".into(),
        source: String::new(),
        event_id: "evt-race".into(),
        business_key: None,
    };
    // Claim A, still open, holds the event's row in yesterday's partition (claimed just before
    // midnight) ...
    let mut a = store.begin().await.unwrap();
    let claim = store.claim(&mut a, &key, "Payment", &d).await.unwrap();
    assert!(
        matches!(claim, inoutbox::store::Claim::New { .. }),
        "{claim:?}"
    );
    sqlx::query(
        "UPDATE inoutbox_inbox SET received_day = received_day - 1 WHERE event_id = 'evt-race'",
    )
    .execute(&mut *a)
    .await
    .unwrap();
    // ... when claim B of the same event comes today: it must wait for A, not insert into
    // today's partition beside it.
    let b = {
        let inbox = inbox.clone();
        let d = payment(1, "evt-race", "op-race");
        tokio::spawn(async move { inbox.process(&d, &no_shutdown()).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!b.is_finished(), "claim B ran beside claim A");
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, 1)")
        .bind(Uuid::new_v4())
        .execute(&mut *a)
        .await
        .unwrap();
    a.commit().await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("claim B ends once A commits")
        .unwrap();
    assert_eq!(b, Outcome::Duplicate);
    assert_eq!(db.invoices().await, 1, "the event applied once");
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_inbox").await,
        1,
        "one inbox row"
    );
}

#[tokio::test]
async fn retention_drops_expired_partitions_and_an_event_whose_partition_was_dropped_is_processed_again(
) {
    let db = TestDb::new("part_retention").await;
    let store = partitioned(&db).await;
    let expired = create_day(&db, -10).await;
    let unfinished = create_day(&db, -9).await;
    let recent = create_day(&db, -6).await;
    let inbox = Inbox::new(store.clone(), "partitioned", InboxConfig::default()).unwrap();
    let shutdown = no_shutdown();
    for (i, (id, days)) in [("evt-10", -10), ("evt-9", -9), ("evt-6", -6)]
        .into_iter()
        .enumerate()
    {
        let outcome = inbox
            .process(&payment(i as i64, id, &format!("op-{id}")), &shutdown)
            .await;
        assert_eq!(outcome, Outcome::Processed { attempt: 1 });
        receive_on(&db, id, days).await;
    }
    // A received row never processed (as a two-phase inbox leaves them) keeps its partition.
    sqlx::query("UPDATE inoutbox_inbox SET processed_at = NULL WHERE event_id = 'evt-9'")
        .execute(&db.pool)
        .await
        .unwrap();
    let deleted = inbox
        .purge_processed(Duration::from_secs(7 * 86_400), 1000)
        .await
        .expect("retention");
    assert_eq!(deleted, 0, "nothing deleted row by row");
    let left = partitions(&db).await;
    assert!(!left.contains(&expired), "{expired} dropped: {left:?}");
    assert!(left.contains(&unfinished), "{unfinished} kept: {left:?}");
    assert!(left.contains(&recent), "{recent} kept: {left:?}");
    assert_eq!(left.len(), 6, "default, -9, -6, today, +1, +2: {left:?}");
    let tables: i64 = db
        .count(&format!(
            "SELECT count(*) FROM pg_class WHERE relname = '{expired}' \
             AND relnamespace = current_schema()::regnamespace"
        ))
        .await;
    assert_eq!(tables, 0, "dropped, not detached");
    // The window rule: a redelivery of an event whose partition was dropped runs again.
    assert_eq!(
        inbox
            .process(&payment(10, "evt-10", "op-evt-10-again"), &shutdown)
            .await,
        Outcome::Processed { attempt: 1 }
    );
    assert_eq!(
        inbox
            .process(&payment(11, "evt-6", "op-evt-6-again"), &shutdown)
            .await,
        Outcome::Duplicate,
        "an event of a kept partition is still a duplicate"
    );
}

#[tokio::test]
async fn detached_partitions_stay_as_tables_outside_the_inbox() {
    let db = TestDb::new("part_detach").await;
    let store = db
        .store()
        .partitioned_by_day(DailyPartitions::new().ahead(1).detach());
    store.migrate().await.expect("migrate");
    let expired = create_day(&db, -30).await;
    let changes = store
        .maintain_partitions(Some(Duration::from_secs(7 * 86_400)))
        .await
        .expect("maintain");
    assert_eq!(changes.retired, vec![expired.clone()]);
    assert!(!partitions(&db).await.contains(&expired));
    let tables = db
        .count(&format!(
            "SELECT count(*) FROM pg_class WHERE relname = '{expired}' \
             AND relnamespace = current_schema()::regnamespace"
        ))
        .await;
    assert_eq!(tables, 1, "detached, not dropped");
}

#[tokio::test]
async fn rows_of_a_day_without_a_partition_wait_in_the_default_one_and_move_when_it_is_created() {
    let db = TestDb::new("part_default").await;
    let store = partitioned(&db).await;
    let inbox = Inbox::new(store, "partitioned", InboxConfig::default()).unwrap();
    inbox
        .process(&payment(0, "evt-late", "op-late"), &no_shutdown())
        .await;
    // As if the store had not been maintained for a week: its day had no partition.
    receive_on(&db, "evt-late", 5).await;
    assert_eq!(day_of(&db, "evt-late").await, "inoutbox_inbox_default");
    let wider = db
        .store()
        .partitioned_by_day(DailyPartitions::new().ahead(6));
    let changes = wider.maintain_partitions(None).await.expect("maintain");
    assert_eq!(changes.created.len(), 4, "+3 to +6: {changes:?}");
    let day = day_of(&db, "evt-late").await;
    assert!(
        changes.created.contains(&day),
        "the row moved to its day's partition {day}: {changes:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM ONLY inoutbox_inbox_default")
            .await,
        0
    );
}

#[tokio::test]
async fn migrate_partitions_an_existing_inbox_and_keeps_its_rows_and_their_dedup() {
    let db = TestDb::new("part_convert").await;
    let plain = db.migrated_store().await;
    let inbox = Inbox::new(plain, "partitioned", InboxConfig::default()).unwrap();
    let shutdown = no_shutdown();
    for i in 0..3 {
        let d = payment(i, &format!("evt-{i}"), &format!("op-{i}"));
        assert_eq!(
            inbox.process(&d, &shutdown).await,
            Outcome::Processed { attempt: 1 }
        );
    }
    let store = partitioned(&db).await;
    let kind: String = sqlx::query_scalar(
        "SELECT relkind::text FROM pg_class WHERE oid = 'inoutbox_inbox'::regclass",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(kind, "p", "the inbox is partitioned");
    assert_eq!(db.count("SELECT count(*) FROM inoutbox_inbox").await, 3);
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'inoutbox_inbox'::regclass ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            "inoutbox_inbox_business_key_idx",
            "inoutbox_inbox_due_idx",
            "inoutbox_inbox_pkey",
            "inoutbox_inbox_processed_idx",
            "inoutbox_inbox_received_idx",
            "inoutbox_inbox_received_key_idx",
            "inoutbox_inbox_unprocessed_idx"
        ]
    );
    let inbox = Inbox::new(store.clone(), "partitioned", InboxConfig::default()).unwrap();
    assert_eq!(
        inbox
            .process(&payment(5, "evt-1", "op-new"), &shutdown)
            .await,
        Outcome::Duplicate,
        "a row moved by the migration still deduplicates"
    );
    assert_eq!(
        inbox
            .process(&payment(6, "evt-new", "op-2"), &shutdown)
            .await,
        Outcome::DuplicateBusinessKey {
            key: "Payment:op-2".into()
        },
        "and so does its business key"
    );
    store.migrate().await.expect("migrate again: a no-op");
    assert_eq!(db.invoices().await, 3);
}

#[tokio::test]
async fn a_business_key_taken_in_another_partition_refuses_a_second_event() {
    let db = TestDb::new("part_business").await;
    let store = partitioned(&db).await;
    create_day(&db, -1).await;
    let inbox = Inbox::new(store, "partitioned", InboxConfig::default()).unwrap();
    let shutdown = no_shutdown();
    inbox
        .process(&payment(0, "evt-credit-1", "op-credit"), &shutdown)
        .await;
    receive_on(&db, "evt-credit-1", -1).await;
    assert_eq!(
        inbox
            .process(&payment(1, "evt-credit-2", "op-credit"), &shutdown)
            .await,
        Outcome::DuplicateBusinessKey {
            key: "Payment:op-credit".into()
        }
    );
    assert_eq!(db.invoices().await, 1);
}
