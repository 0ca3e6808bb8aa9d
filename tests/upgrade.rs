//! Upgrading txbox's own tables: a database created by the first release's schema (the
//! version 1 migrations only, as that release's migrator left it, with data in every table)
//! is upgraded by the current migrator, and everything keeps working on the old data:
//! processed events stay duplicates, an old dead letter replays, an old unpublished outbox row
//! is published, and new events flow.
//!
//! PostgreSQL in a schema of its own (DATABASE_URL), SQLite in a temporary file; Kafka in
//! process.

mod support;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use support::kit::TempDir;
use support::{read_topic, TestDb};
use txbox::kafka::InProcessKafka;
use txbox::prelude::*;
use txbox::testing::{delivery, TestInbox};
use txbox::{Outcome, Relay};

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
        sqlx::raw_sql(&sql).execute(&db.pool).await.expect(&sql);
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
        sqlx::raw_sql(&sql).execute(pool).await.expect(&sql);
    }
}

/// After the upgrade: the old processed event is a duplicate, the old dead letter replays,
/// a new event is processed, and the relay publishes the old unpublished row and the new one,
/// each with its payload's bytes (the published row of the first release is not sent again).
async fn works_on_the_old_data<S>(store: S, group: &str, dead_letter: i64, new_row: &str)
where
    S: txbox::store::InboxStore + txbox::relay::IntoRelayStore + Clone,
{
    let kit = TestInbox::new(store.clone(), group).expect("inbox");
    let mut old = delivery(&UpgradeOrder {
        order_id: "o-processed".into(),
    });
    old.headers[0].1 = Some(b"e-processed".to_vec());
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
        Relay::builder(store, kafka.brokers())
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
    let store = db.store();
    store
        .migrate()
        .await
        .expect("the current migrator upgrades the first release's tables");
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT component, version FROM txbox_migrations")
            .fetch_all(&db.pool)
            .await
            .expect("migrations");
    assert!(
        recorded(&rows, "inbox", 2) && recorded(&rows, "outbox", 3),
        "{rows:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM txbox_outbox").await,
        2,
        "rows kept"
    );
    let dead_letter: i64 = sqlx::query_scalar("SELECT id FROM txbox_dead_letters")
        .fetch_one(&db.pool)
        .await
        .expect("the old dead letter is kept");
    let mut tx = db.pool.begin().await.expect("begin");
    txbox::outbox::enqueue(
        &mut tx,
        &UpgradeOrder {
            order_id: "o-after-upgrade".into(),
        },
    )
    .await
    .expect("enqueue after the upgrade");
    tx.commit().await.expect("commit");
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
    let url = format!("sqlite:{}", dir.0.join("txbox.db").display());
    let store = txbox::SqliteStore::connect(&url).await.expect("open");
    first_release_sqlite(store.pool()).await;
    store
        .migrate()
        .await
        .expect("the current migrator upgrades the first release's tables");
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT component, version FROM txbox_migrations")
            .fetch_all(store.pool())
            .await
            .expect("migrations");
    assert!(recorded(&rows, "inbox", 2), "{rows:?}");
    let dead_letter: i64 = sqlx::query_scalar("SELECT id FROM txbox_dead_letters")
        .fetch_one(store.pool())
        .await
        .expect("the old dead letter is kept");
    let mut tx = store.pool().begin().await.expect("begin");
    txbox::outbox::enqueue(
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
