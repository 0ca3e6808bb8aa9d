//! Upgrading the project's own tables: a database created by the first release's schema (the
//! version 1 migrations only, as that release's migrator left it, with data in every table,
//! under the project's former default names `txbox_*`) is upgraded by the current migrator:
//! the tables are renamed to today's defaults (`inoutbox_*`) with their indexes, and everything
//! keeps working on the old data: processed events stay duplicates, an old dead letter
//! replays, an old unpublished outbox row is published, and new events flow. A database
//! migrated by the last release under the former name (every migration, the partitioned
//! inbox) upgrades the same way; a table named explicitly keeps its name; and when a table
//! exists under both names the migrator refuses, renaming nothing.
//!
//! Business keys stored before inbox migration 5 (held per group, across event types) take
//! their row's event type as scope: they keep refusing events of their own type, and an event
//! of another type with the same key runs (the refund case).
//!
//! PostgreSQL in a schema of its own (DATABASE_URL), SQLite in a temporary file; Kafka in
//! process.

mod support;

use std::time::Duration;

use inoutbox::kafka::InProcessKafka;
use inoutbox::postgres::DailyPartitions;
use inoutbox::prelude::*;
use inoutbox::store::Tables;
use inoutbox::testing::{delivery, TestInbox};
use inoutbox::{Outcome, PgStore, Relay};
use serde::{Deserialize, Serialize};
use support::kit::TempDir;
use support::{read_topic, TestDb};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "UpgradeOrder", topic = "upgrade", key = order_id)]
pub struct UpgradeOrder {
    pub order_id: String,
}

#[inbox_handler(event = "UpgradeOrder", group = "upgrade-pg")]
async fn record_pg(event: UpgradeOrder, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO handled (order_id) VALUES ($1)")
        .bind(&event.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "UpgradeOrder", group = "upgrade-sqlite")]
async fn record_sqlite(event: UpgradeOrder, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO handled (order_id) VALUES ($1)")
        .bind(&event.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A version 1 migration as the first release rendered it, with the default table names
/// (unqualified: PostgreSQL finds them through the test schema's `search_path`).
fn render_v1(template: &str) -> String {
    let table = |name: &str| match name {
        "inbox" => "txbox_inbox",
        "attempts" => "txbox_inbox_attempts",
        "dead_letters" => "txbox_dead_letters",
        "outbox" => "txbox_outbox",
        "migrations" => "txbox_migrations",
        other => panic!("unknown table `{other}` in a v1 migration"),
    };
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').expect("closing brace");
        let inner = &after[..close];
        if inner.is_empty()
            || !inner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        {
            out.push('{');
            rest = after;
            continue;
        }
        match inner.split_once(':') {
            Some((t, suffix)) => out.push_str(&format!("{}_{suffix}", table(t))),
            None => out.push_str(table(inner)),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

const PG_V1: [&str; 2] = [
    include_str!("../box-runtime/src/postgres/migrations/inbox_v1.sql"),
    include_str!("../box-runtime/src/postgres/migrations/outbox_v1.sql"),
];
const SQLITE_V1: [&str; 2] = [
    include_str!("../box-runtime/src/sqlite/migrations/inbox_v1.sql"),
    include_str!("../box-runtime/src/sqlite/migrations/outbox_v1.sql"),
];

/// The payload a first-release producer stored (PostgreSQL kept it as `jsonb`).
const OLD_PAYLOAD: &str = r#"{"order_id": "o-unpublished"}"#;

async fn first_release_postgres(db: &TestDb) {
    let mut statements = vec![
        "CREATE TABLE txbox_migrations (component text NOT NULL, version integer NOT NULL, \
         description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (component, version))"
            .to_owned(),
    ];
    statements.extend(PG_V1.iter().map(|sql| render_v1(sql)));
    statements.extend([
        "INSERT INTO txbox_migrations (component, version, description) VALUES \
         ('inbox', 1, 'inbox, attempts and dead-letter tables'), ('outbox', 1, 'outbox table')"
            .to_owned(),
        "CREATE TABLE handled (order_id text NOT NULL)".to_owned(),
        "INSERT INTO txbox_inbox (consumer_group, event_id, event_type, topic, \"partition\", \"offset\", processed_at) \
         VALUES ('upgrade-pg', 'e-processed', 'UpgradeOrder', 'upgrade', 0, 0, now())"
            .to_owned(),
        "INSERT INTO txbox_inbox_attempts (consumer_group, source, event_id, attempts, last_error) \
         VALUES ('upgrade-pg', '', 'e-dead', 5, 'handler failed')"
            .to_owned(),
        "INSERT INTO txbox_dead_letters (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
           message_key, header_names, header_values, payload, error, attempts, first_failed_at, last_failed_at) \
         VALUES ('upgrade-pg', NULL, 'e-dead', 'UpgradeOrder', 'upgrade', 0, 1, convert_to('o-dead', 'UTF8'), \
           ARRAY['ce_id', 'ce_type'], ARRAY[convert_to('e-dead', 'UTF8'), convert_to('UpgradeOrder', 'UTF8')], \
           convert_to('{\"order_id\":\"o-dead\"}', 'UTF8'), 'handler failed', 5, now(), now())"
            .to_owned(),
        "INSERT INTO txbox_outbox (id, type, topic, message_key, payload, published_at) VALUES \
         (gen_random_uuid(), 'UpgradeOrder', 'upgrade', 'o-published', '{\"order_id\": \"o-published\"}', now())"
            .to_owned(),
        format!(
            "INSERT INTO txbox_outbox (id, type, topic, message_key, payload) VALUES \
             ('018f0000-0000-7000-8000-000000000001', 'UpgradeOrder', 'upgrade', 'o-unpublished', '{OLD_PAYLOAD}')"
        ),
    ]);
    for sql in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*sql))
            .execute(&db.pool)
            .await
            .expect(&sql);
    }
}

async fn first_release_sqlite(pool: &sqlx::SqlitePool) {
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let headers = format!(
        r#"[["ce_id","{}"],["ce_type","{}"]]"#,
        hex("e-dead"),
        hex("UpgradeOrder")
    );
    let mut statements = vec![
        "CREATE TABLE txbox_migrations (component text NOT NULL, version integer NOT NULL, \
         description text NOT NULL, applied_at text NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), \
         PRIMARY KEY (component, version))"
            .to_owned(),
    ];
    statements.extend(SQLITE_V1.iter().map(|sql| render_v1(sql)));
    statements.extend([
        "INSERT INTO txbox_migrations (component, version, description) VALUES \
         ('inbox', 1, 'inbox, attempts and dead-letter tables'), ('outbox', 1, 'outbox table and relay key leases')"
            .to_owned(),
        "CREATE TABLE handled (order_id text NOT NULL)".to_owned(),
        "INSERT INTO txbox_inbox (consumer_group, event_id, event_type, topic, \"partition\", \"offset\", processed_at) \
         VALUES ('upgrade-sqlite', 'e-processed', 'UpgradeOrder', 'upgrade', 0, 0, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
            .to_owned(),
        format!(
            "INSERT INTO txbox_dead_letters (consumer_group, source, event_id, event_type, topic, \"partition\", \"offset\", \
               message_key, headers, payload, error, attempts, first_failed_at, last_failed_at) \
             VALUES ('upgrade-sqlite', NULL, 'e-dead', 'UpgradeOrder', 'upgrade', 0, 1, X'{}', '{headers}', \
               X'{}', 'handler failed', 5, '2024-01-01T00:00:00.000Z', '2024-01-01T00:00:00.000Z')",
            hex("o-dead"),
            hex(r#"{"order_id":"o-dead"}"#)
        ),
        "INSERT INTO txbox_outbox (id, type, topic, message_key, payload, published_at) VALUES \
         ('018f0000-0000-7000-8000-000000000002', 'UpgradeOrder', 'upgrade', 'o-published', \
          '{\"order_id\":\"o-published\"}', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
            .to_owned(),
        format!(
            "INSERT INTO txbox_outbox (id, type, topic, message_key, payload) VALUES \
             ('018f0000-0000-7000-8000-000000000001', 'UpgradeOrder', 'upgrade', 'o-unpublished', '{OLD_PAYLOAD}')"
        ),
    ]);
    for sql in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*sql))
            .execute(pool)
            .await
            .expect(&sql);
    }
}

/// The delivery of the event the first release's inbox recorded as processed (`e-processed`).
fn processed_in_the_first_release() -> inoutbox::inbox::Delivery {
    let mut old = delivery(&UpgradeOrder {
        order_id: "o-processed".into(),
    });
    old.headers[0].1 = Some(b"e-processed".to_vec());
    old
}

/// Enqueues an order event on PostgreSQL into the outbox of `tables`, in a transaction.
async fn enqueue_pg(db: &TestDb, tables: &Tables, order_id: &str) {
    let mut tx = db.pool.begin().await.expect("begin");
    inoutbox::outbox::PgOutbox::new(tables)
        .enqueue(
            &mut tx,
            &UpgradeOrder {
                order_id: order_id.into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("enqueue {order_id} into {}: {e}", tables.outbox));
    tx.commit().await.expect("commit");
}

/// After the upgrade: the old processed event is a duplicate, the old dead letter replays,
/// a new event is processed, and the relay publishes the old unpublished row and the new one,
/// each with its payload's bytes (the published row of the first release is not sent again).
async fn works_on_the_old_data<S>(store: S, group: &str, dead_letter: i64, new_row: &str)
where
    S: inoutbox::store::InboxStore + inoutbox::relay::IntoRelayStore + Clone,
{
    let kit = TestInbox::new(store.clone(), group).expect("inbox");
    let old = processed_in_the_first_release();
    assert_eq!(
        kit.deliver_raw(old).await,
        Outcome::Duplicate,
        "processed before the upgrade"
    );
    assert_eq!(
        kit.deliver(&UpgradeOrder {
            order_id: "o-new".into()
        })
        .await,
        Outcome::Processed { attempt: 1 }
    );
    // a new dead letter uses the columns added since (times, payload size and digest)
    let mut bad = delivery(&UpgradeOrder {
        order_id: "o-bad".into(),
    });
    bad.payload = Some(b"not json".to_vec());
    let outcome = tokio::time::timeout(Duration::from_secs(30), kit.deliver_raw(bad))
        .await
        .expect("a bad message is dead-lettered within 30 s (the store accepts the letter)");
    assert!(
        matches!(outcome, Outcome::DeadLettered { .. }),
        "{outcome:?}"
    );
    let replayed = kit.inbox().replay(dead_letter).await.expect("replay");
    assert!(
        matches!(replayed, Outcome::Processed { .. }),
        "a dead letter of the first release replays: {replayed:?}"
    );

    let kafka = InProcessKafka::start().expect("in-process kafka");
    kafka.create_topic("upgrade", 1).expect("topic");
    tokio::time::timeout(
        Duration::from_secs(60),
        Relay::builder(store, inoutbox::kafka::KafkaProducer::new(kafka.brokers()))
            .build()
            .expect("relay")
            .drain(),
    )
    .await
    .expect("drained within 60 s")
    .expect("drain");
    let mut payloads: Vec<String> =
        read_topic(kafka.brokers(), "upgrade", 1, 2, Duration::from_secs(30))
            .await
            .into_iter()
            .map(|m| String::from_utf8_lossy(&m.bytes).into_owned())
            .collect();
    payloads.sort();
    let mut expected = [new_row, OLD_PAYLOAD];
    expected.sort();
    assert_eq!(payloads, expected);
}

const NEW_PAYLOAD: &str = r#"{"order_id":"o-after-upgrade"}"#;

fn recorded(rows: &[(String, i32)], component: &str, version: i32) -> bool {
    rows.iter().any(|(c, v)| c == component && *v == version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_database_of_the_first_release_upgrades_and_keeps_working() {
    let db = TestDb::new("upgrade").await;
    first_release_postgres(&db).await;
    let before = pg_objects(&db).await;
    let store = db.store();
    store
        .migrate()
        .await
        .expect("the current migrator upgrades the first release's tables");
    each_renamed(
        &before,
        &pg_objects(&db).await,
        &["txbox_outbox_pending_idx", "txbox_outbox_pending_key_idx"],
    );
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT component, version FROM inoutbox_migrations")
            .fetch_all(&db.pool)
            .await
            .expect("migrations");
    assert!(
        recorded(&rows, "inbox", 2) && recorded(&rows, "outbox", 3),
        "{rows:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox").await,
        2,
        "rows kept"
    );
    let dead_letter: i64 = sqlx::query_scalar("SELECT id FROM inoutbox_dead_letters")
        .fetch_one(&db.pool)
        .await
        .expect("the old dead letter is kept");
    enqueue_pg(&db, &db.tables, "o-after-upgrade").await;
    works_on_the_old_data(store, "upgrade-pg", dead_letter, NEW_PAYLOAD).await;
    assert_eq!(
        db.count("SELECT count(*) FROM handled").await,
        2,
        "o-new and o-dead"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_of_the_first_release_upgrades_and_keeps_working() {
    let dir = TempDir::new("upgrade");
    let url = format!("sqlite:{}", dir.0.join("upgrade.db").display());
    let store = inoutbox::SqliteStore::connect(&url).await.expect("open");
    first_release_sqlite(store.pool()).await;
    let before = sqlite_objects(store.pool()).await;
    store
        .migrate()
        .await
        .expect("the current migrator upgrades the first release's tables");
    each_renamed(&before, &sqlite_objects(store.pool()).await, &[]);
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT component, version FROM inoutbox_migrations")
            .fetch_all(store.pool())
            .await
            .expect("migrations");
    assert!(recorded(&rows, "inbox", 2), "{rows:?}");
    let dead_letter: i64 = sqlx::query_scalar("SELECT id FROM inoutbox_dead_letters")
        .fetch_one(store.pool())
        .await
        .expect("the old dead letter is kept");
    let mut tx = store.pool().begin().await.expect("begin");
    inoutbox::outbox::enqueue(
        &mut tx,
        &UpgradeOrder {
            order_id: "o-after-upgrade".into(),
        },
    )
    .await
    .expect("enqueue after the upgrade");
    tx.commit().await.expect("commit");
    works_on_the_old_data(store.clone(), "upgrade-sqlite", dead_letter, NEW_PAYLOAD).await;
    let handled: i64 = sqlx::query_scalar("SELECT count(*) FROM handled")
        .fetch_one(store.pool())
        .await
        .expect("handled");
    assert_eq!(handled, 2, "o-new and o-dead");
}

/// Every table, index, sequence, trigger and function in the test's schema, by name.
async fn pg_objects(db: &TestDb) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT name FROM ( \
           SELECT c.relname::text AS name FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 \
           UNION ALL SELECT t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT t.tgisinternal \
           UNION ALL SELECT p.proname::text FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1) o ORDER BY 1",
    )
    .bind(&db.schema)
    .fetch_all(&db.pool)
    .await
    .expect("catalog")
}

/// Every table and index of a SQLite database (but SQLite's own), by name.
async fn sqlite_objects(pool: &sqlx::SqlitePool) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY 1")
        .fetch_all(pool)
        .await
        .expect("catalog")
}

/// Every object named after a former default table is found again under today's name (but
/// those a later migration drops), and nothing of the former name is left. A name too long for
/// PostgreSQL's 63 bytes keeps its start and its last `_suffix`.
fn each_renamed(before: &[String], after: &[String], dropped_since: &[&str]) {
    let old: Vec<&String> = before.iter().filter(|n| n.starts_with("txbox_")).collect();
    assert!(
        !old.is_empty(),
        "the old schema had no former names: {before:?}"
    );
    eprintln!("before the upgrade: {before:?}\nafter the upgrade:  {after:?}");
    for name in old
        .into_iter()
        .filter(|n| !dropped_since.contains(&n.as_str()))
    {
        let new = format!("inoutbox_{}", &name["txbox_".len()..]);
        let found = match new.len() {
            0..=63 => after.contains(&new),
            _ => {
                let suffix = &new[new.rfind('_').expect("a suffix")..];
                after
                    .iter()
                    .any(|n| n.len() == 63 && n.ends_with(suffix) && new.starts_with(&n[..50]))
            }
        };
        assert!(found, "`{name}` was not renamed to `{new}`: {after:?}");
    }
    let left: Vec<&String> = after.iter().filter(|n| n.contains("txbox")).collect();
    assert!(
        left.is_empty(),
        "former names left after the upgrade: {left:?}"
    );
}

/// The default tables of `schema` under the project's former names, as the last release
/// before the rename named them.
fn former_names(schema: &str) -> Tables {
    Tables::with_schema(schema)
        .and_then(|t| t.inbox("txbox_inbox"))
        .and_then(|t| t.attempts("txbox_inbox_attempts"))
        .and_then(|t| t.dead_letters("txbox_dead_letters"))
        .and_then(|t| t.outbox("txbox_outbox"))
        .and_then(|t| t.migrations("txbox_migrations"))
        .and_then(|t| t.effects("txbox_effects"))
        .expect("valid names")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_postgres_database_of_the_last_release_upgrades_with_every_object() {
    let db = TestDb::new("upgrade_last").await;
    db.exec("CREATE TABLE handled (order_id text NOT NULL)")
        .await;
    let layout = DailyPartitions::new().ahead(2);
    let last =
        PgStore::with_tables(db.pool.clone(), former_names(&db.schema)).partitioned_by_day(layout);
    last.migrate()
        .await
        .expect("every migration under the former names");
    let kit = TestInbox::new(last, "upgrade-pg").expect("inbox");
    let before_rename = delivery(&UpgradeOrder {
        order_id: "o-before".into(),
    });
    assert_eq!(
        kit.deliver_raw(before_rename.clone()).await,
        Outcome::Processed { attempt: 1 }
    );
    enqueue_pg(&db, &former_names(&db.schema), "o-unpublished").await;
    let before = pg_objects(&db).await;
    assert!(
        before.iter().any(|n| n.starts_with("txbox_inbox_p"))
            && before.contains(&"txbox_outbox_slot".to_owned()),
        "the last release's schema has daily partitions and the slot trigger: {before:?}"
    );

    let store = db.store().partitioned_by_day(layout);
    store.migrate().await.expect("the rename");
    let after = pg_objects(&db).await;
    each_renamed(&before, &after, &[]);
    let partitions = |names: &[String], prefix: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(prefix) && !n.ends_with("_pkey"))
            .count()
    };
    assert_eq!(
        partitions(&after, "inoutbox_inbox_p"),
        partitions(&before, "txbox_inbox_p"),
        "maintenance after the rename found the renamed daily partitions (created none again)"
    );
    store
        .migrate()
        .await
        .expect("migrating again changes nothing");

    let kit = TestInbox::new(store.clone(), "upgrade-pg").expect("inbox");
    assert_eq!(
        kit.deliver_raw(before_rename).await,
        Outcome::Duplicate,
        "processed before the rename"
    );
    enqueue_pg(&db, &db.tables, "o-after").await;
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox WHERE slot IS NOT NULL")
            .await,
        2,
        "both rows, each with its slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_named_explicitly_keeps_its_name_and_the_others_are_renamed() {
    let db = TestDb::new("upgrade_named").await;
    first_release_postgres(&db).await;
    let tables = Tables::with_schema(&db.schema)
        .and_then(|t| t.inbox("txbox_inbox"))
        .expect("valid");
    let store = PgStore::with_tables(db.pool.clone(), tables);
    store.migrate().await.expect("upgrade");
    let after = pg_objects(&db).await;
    for kept in [
        "txbox_inbox",
        "txbox_inbox_pkey",
        "txbox_inbox_processed_idx",
    ] {
        assert!(after.contains(&kept.to_owned()), "`{kept}` kept: {after:?}");
    }
    for renamed in [
        "inoutbox_outbox",
        "inoutbox_dead_letters",
        "inoutbox_migrations",
    ] {
        assert!(
            after.contains(&renamed.to_owned()),
            "`{renamed}`: {after:?}"
        );
    }
    assert!(!after.contains(&"inoutbox_inbox".to_owned()), "{after:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox").await,
        2,
        "the first release's outbox rows, in the renamed table"
    );
    let kit = TestInbox::new(store, "upgrade-pg").expect("inbox");
    let old = processed_in_the_first_release();
    assert_eq!(kit.deliver_raw(old).await, Outcome::Duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_under_both_names_is_refused_and_nothing_is_renamed() {
    let db = TestDb::new("upgrade_both").await;
    first_release_postgres(&db).await;
    db.exec("CREATE TABLE inoutbox_outbox (id uuid)").await;
    let before = pg_objects(&db).await;
    let err = db
        .store()
        .migrate()
        .await
        .expect_err("two outbox tables")
        .to_string();
    assert!(
        err.contains("txbox_outbox")
            && err.contains("inoutbox_outbox")
            && err.contains("Tables::outbox"),
        "{err}"
    );
    assert_eq!(
        pg_objects(&db).await,
        before,
        "the transaction renamed nothing"
    );

    let dir = TempDir::new("upgrade-both");
    let url = format!("sqlite:{}", dir.0.join("both.db").display());
    let store = inoutbox::SqliteStore::connect(&url).await.expect("open");
    first_release_sqlite(store.pool()).await;
    sqlx::raw_sql("CREATE TABLE inoutbox_dead_letters (id integer)")
        .execute(store.pool())
        .await
        .expect("create");
    let before = sqlite_objects(store.pool()).await;
    let err = store
        .migrate()
        .await
        .expect_err("two dead-letter tables")
        .to_string();
    assert!(err.contains("txbox_dead_letters"), "{err}");
    assert_eq!(
        sqlite_objects(store.pool()).await,
        before,
        "renamed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rename_waits_for_a_first_release_migrator_running_at_the_same_time() {
    let db = TestDb::new("upgrade_lock").await;
    first_release_postgres(&db).await;
    // A first-release migrator holds the lock it took on its (unqualified) migrations table.
    let mut old = db.pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('txbox:txbox_migrations'))")
        .execute(&mut *old)
        .await
        .expect("lock");
    let store = db.store();
    let migrating = tokio::spawn(async move { store.migrate().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !migrating.is_finished(),
        "the rename ran while a first-release migrator held its lock"
    );
    old.commit().await.expect("release");
    tokio::time::timeout(Duration::from_secs(30), migrating)
        .await
        .expect("the rename goes on once the old migrator is done")
        .expect("task")
        .expect("migrate");
    assert_eq!(db.count("SELECT count(*) FROM inoutbox_outbox").await, 2);
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "UpgradePlaced", topic = "upgrade", key = order_id)]
pub struct UpgradePlaced {
    pub order_id: String,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "UpgradeCancelled", topic = "upgrade", key = order_id)]
pub struct UpgradeCancelled {
    pub order_id: String,
}

async fn handled_pg(tx: &mut PgTx<'_>, order_id: &str) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO handled (order_id) VALUES ($1)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn handled_sqlite(tx: &mut SqliteTx<'_>, order_id: &str) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO handled (order_id) VALUES ($1)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "UpgradePlaced", group = "upgrade-bk", dedup_by = order_id)]
async fn capture_pg(event: UpgradePlaced, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    handled_pg(tx, &event.order_id).await
}

#[inbox_handler(event = "UpgradeCancelled", group = "upgrade-bk", dedup_by = order_id)]
async fn refund_pg(event: UpgradeCancelled, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    handled_pg(tx, &event.order_id).await
}

#[inbox_handler(event = "UpgradePlaced", group = "upgrade-bk", dedup_by = order_id)]
async fn capture_sqlite(event: UpgradePlaced, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    handled_sqlite(tx, &event.order_id).await
}

#[inbox_handler(event = "UpgradeCancelled", group = "upgrade-bk", dedup_by = order_id)]
async fn refund_sqlite(event: UpgradeCancelled, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    handled_sqlite(tx, &event.order_id).await
}

/// Puts a migrated inbox back at version 4 with two business keys as version 4 stored them:
/// `o-1` of a placed order, and a key that already reads like a scoped one (so the update
/// meets the index mid-way unless the migration takes the index away first).
const AT_VERSION_4: &str = "DELETE FROM inoutbox_migrations WHERE component = 'inbox' AND version = 5; \
    INSERT INTO inoutbox_inbox (consumer_group, source, event_id, event_type, processed_at, business_key) \
    VALUES ('upgrade-bk', '', 'e-1', 'UpgradePlaced', '2026-01-01T00:00:00Z', 'o-1'); \
    INSERT INTO inoutbox_inbox (consumer_group, source, event_id, event_type, processed_at, business_key) \
    VALUES ('upgrade-bk', '', 'e-2', 'UpgradePlaced', '2026-01-01T00:00:00Z', 'UpgradePlaced:o-1');";

const KEYS_AFTER: &str = "SELECT business_key FROM inoutbox_inbox ORDER BY event_id";

/// After the upgrade: the old key refuses a second placed order, and the cancel runs.
async fn old_business_keys_keep_their_type<S: inoutbox::store::InboxStore>(store: S) {
    let inbox = TestInbox::new(store, "upgrade-bk").expect("set up");
    let order_id = "o-1".to_owned();
    assert_eq!(
        inbox
            .deliver(&UpgradePlaced {
                order_id: order_id.clone()
            })
            .await,
        Outcome::DuplicateBusinessKey {
            key: "UpgradePlaced:o-1".into()
        },
        "a key stored before the upgrade still refuses its own event type"
    );
    assert_eq!(
        inbox.deliver(&UpgradeCancelled { order_id }).await,
        Outcome::Processed { attempt: 1 },
        "and no longer an event of another type"
    );
}

#[tokio::test]
async fn postgres_business_keys_of_version_4_take_their_event_type_as_scope() {
    let db = TestDb::new("upgrade_bk").await;
    let store = db.migrated_store().await;
    db.exec("CREATE TABLE handled (order_id text NOT NULL)")
        .await;
    sqlx::raw_sql(AT_VERSION_4)
        .execute(&db.pool)
        .await
        .expect("back to version 4");
    store.migrate().await.expect("inbox migration 5");
    let keys: Vec<String> = sqlx::query_scalar(KEYS_AFTER)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        keys,
        ["UpgradePlaced:o-1", "UpgradePlaced:UpgradePlaced:o-1"]
    );
    old_business_keys_keep_their_type(store).await;
    assert_eq!(db.count("SELECT count(*) FROM handled").await, 1);
}

#[tokio::test]
async fn sqlite_business_keys_of_version_4_take_their_event_type_as_scope() {
    let store = inoutbox::testing::sqlite_memory().await.expect("SQLite");
    let pool = store.pool().clone();
    sqlx::raw_sql("CREATE TABLE handled (order_id text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(AT_VERSION_4)
        .execute(&pool)
        .await
        .expect("back to version 4");
    store.migrate().await.expect("inbox migration 5");
    let keys: Vec<String> = sqlx::query_scalar(KEYS_AFTER)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        keys,
        ["UpgradePlaced:o-1", "UpgradePlaced:UpgradePlaced:o-1"]
    );
    old_business_keys_keep_their_type(store).await;
    let handled: i64 = sqlx::query_scalar("SELECT count(*) FROM handled")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(handled, 1);
}

// MySQL/MariaDB: a database of the backend's first schema (its version 1 migrations, applied
// as they were shipped, with data in every table) is migrated by the current migrator and
// keeps working on the old data.

#[cfg(feature = "mysql")]
#[inbox_handler(event = "UpgradeOrder", group = "upgrade-mysql")]
async fn record_mysql(
    event: UpgradeOrder,
    tx: &mut inoutbox::MySqlTx<'_>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO handled (order_id) VALUES (?)")
        .bind(&event.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A MySQL version 1 migration with the default table names, backticks for double quotes.
#[cfg(feature = "mysql")]
fn render_mysql_v1(template: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').expect("closing brace");
        let (table, suffix) = match after[..close].split_once(':') {
            Some((t, s)) => (t, Some(s)),
            None => (&after[..close], None),
        };
        let table = match table {
            "inbox" => "inoutbox_inbox",
            "attempts" => "inoutbox_inbox_attempts",
            "dead_letters" => "inoutbox_dead_letters",
            "outbox" => "inoutbox_outbox",
            other => panic!("unknown table `{other}` in a MySQL v1 migration"),
        };
        match suffix {
            Some(suffix) => out.push_str(&format!("`{table}_{suffix}`")),
            None => out.push_str(&format!("`{table}`")),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out.replace('"', "`")
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_database_of_the_first_schema_upgrades_and_keeps_working() {
    let (_db, url) = support::kit::mysql_database("upgrade").await;
    let pool = sqlx::MySqlPool::connect(&url)
        .await
        .expect("connect to MariaDB");
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let headers = format!(
        r#"[["ce_id","{}"],["ce_type","{}"]]"#,
        hex("e-dead"),
        hex("UpgradeOrder")
    );
    let mut statements = vec![
        "CREATE TABLE inoutbox_migrations (component varchar(64) NOT NULL, version int NOT NULL, \
         description text NOT NULL, applied_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         PRIMARY KEY (component, version))"
            .to_owned(),
        render_mysql_v1(include_str!("../box-runtime/src/mysql/migrations/inbox_v1.sql")),
        render_mysql_v1(include_str!("../box-runtime/src/mysql/migrations/outbox_v1.sql")),
        "INSERT INTO inoutbox_migrations (component, version, description) VALUES \
         ('inbox', 1, 'inbox'), ('outbox', 1, 'outbox')"
            .to_owned(),
        "CREATE TABLE handled (order_id text NOT NULL)".to_owned(),
        "INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, topic, `partition`, `offset`, processed_at) \
         VALUES ('upgrade-mysql', 'e-processed', 'UpgradeOrder', 'upgrade', 0, 0, NOW(6))"
            .to_owned(),
        "INSERT INTO inoutbox_inbox_attempts (consumer_group, source, event_id, attempts, last_error) \
         VALUES ('upgrade-mysql', '', 'e-dead', 5, 'handler failed')"
            .to_owned(),
        format!(
            "INSERT INTO inoutbox_dead_letters (consumer_group, source, event_id, event_type, topic, `partition`, `offset`, \
               message_key, headers, payload, error, attempts, first_failed_at, last_failed_at) \
             VALUES ('upgrade-mysql', '', 'e-dead', 'UpgradeOrder', 'upgrade', 0, 1, X'{}', '{headers}', \
               X'{}', 'handler failed', 5, '2024-01-01 00:00:00', '2024-01-01 00:00:00')",
            hex("o-dead"),
            hex(r#"{"order_id":"o-dead"}"#)
        ),
        "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload, headers, published_at) VALUES \
         ('018f0000-0000-7000-8000-000000000002', 'UpgradeOrder', 'upgrade', 'o-published', \
          '{\"order_id\":\"o-published\"}', '{}', NOW(6))"
            .to_owned(),
        format!(
            "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload, headers) VALUES \
             ('018f0000-0000-7000-8000-000000000001', 'UpgradeOrder', 'upgrade', 'o-unpublished', '{OLD_PAYLOAD}', '{{}}')"
        ),
    ];
    statements.retain(|s| !s.is_empty());
    for sql in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(&*sql))
            .execute(&pool)
            .await
            .expect(&sql);
    }
    let store = inoutbox::MySqlStore::connect(&url).await.expect("connect");
    store
        .migrate()
        .await
        .expect("the current migrator upgrades the first schema");
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT component, version FROM inoutbox_migrations")
            .fetch_all(&pool)
            .await
            .expect("migrations");
    assert!(
        recorded(&rows, "inbox", 1) && recorded(&rows, "outbox", 1),
        "{rows:?}"
    );
    let dead_letter: i64 = sqlx::query_scalar("SELECT id FROM inoutbox_dead_letters")
        .fetch_one(&pool)
        .await
        .expect("the old dead letter is kept");
    let mut tx = pool.begin().await.expect("begin");
    inoutbox::outbox::enqueue(
        &mut tx,
        &UpgradeOrder {
            order_id: "o-after-upgrade".into(),
        },
    )
    .await
    .expect("enqueue after the upgrade");
    tx.commit().await.expect("commit");
    works_on_the_old_data(store, "upgrade-mysql", dead_letter, NEW_PAYLOAD).await;
    let handled: i64 = sqlx::query_scalar("SELECT count(*) FROM handled")
        .fetch_one(&pool)
        .await
        .expect("handled");
    assert_eq!(handled, 2, "o-new and o-dead");
}
