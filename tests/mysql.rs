//! The modes of the MySQL/MariaDB store beyond the contract suite's: a two-phase group starts
//! and its rows are run by its workers, a deferred message is kept (not dead-lettered) and run
//! again when due, and inbox migration 2, whose DDL MySQL commits statement by statement, runs
//! again whole after a crash half-way (see docs/modes.md, "What differs between the stores").
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use inoutbox::inbox::{Delivery, Inbox, InboxConfig};
use inoutbox::prelude::*;
use inoutbox::store::InboxStore;
use inoutbox::Outcome;
use serde::{Deserialize, Serialize};
use support::kit::{Kit, MySqlKit};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "MyLater", topic = "my-later", key = id)]
pub struct MyLater {
    pub id: String,
}

#[inbox_handler(event = "MyLater", group = "my-two-phase", mode = "two_phase")]
async fn long_one(_event: MyLater, _tx: &mut MySqlTx<'_>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(event = "MyLater", group = "my-defer")]
async fn not_yet(_event: MyLater, _tx: &mut MySqlTx<'_>) -> Result<(), HandlerError> {
    Err(HandlerError::defer(Duration::from_secs(30)))
}

fn later(id: &str) -> Delivery {
    Delivery {
        topic: "my-later".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(format!(r#"{{"id":"{id}"}}"#).into_bytes()),
        headers: vec![
            ("ce_id".to_owned(), Some(id.as_bytes().to_vec())),
            ("ce_type".to_owned(), Some(b"MyLater".to_vec())),
        ],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_phase_group_on_mysql_receives_its_messages_and_its_workers_run_them() {
    use support::memory::{MemoryBroker, MemoryTransport, Message, RunningConsumer};
    let kit = MySqlKit::new("mytwophase").await;
    let inbox = Inbox::new(kit.store(), "my-two-phase", InboxConfig::default())
        .expect("a two-phase group on MySQL starts");
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    assert_eq!(
        inbox.process(&later("e-1"), &shutdown).await,
        Outcome::Received
    );
    assert_eq!(
        inbox.process(&later("e-1"), &shutdown).await,
        Outcome::Duplicate,
        "a redelivery of a received message is a duplicate"
    );
    let broker = MemoryBroker::new();
    broker.create_topic("my-later", 1);
    broker.produce(
        "my-later",
        Some(0),
        Message::new(r#"{"id":"e-2"}"#)
            .header("ce_id", "e-2")
            .header("ce_type", "MyLater"),
    );
    let builder = inoutbox::Consumer::builder(
        "my-two-phase",
        kit.store(),
        MemoryTransport::new(&broker, ["my-later"]),
    )
    .two_phase_poll(Duration::from_millis(50));
    let running = RunningConsumer::start(builder);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while kit.processed().await < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the received rows never ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_message_on_mysql_is_kept_with_its_due_time_not_dead_lettered() {
    let kit = MySqlKit::new("mydefer").await;
    let store = kit.store();
    let inbox = Inbox::new(store.clone(), "my-defer", InboxConfig::default()).expect("inbox");
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    match inbox.process(&later("e-1"), &shutdown).await {
        Outcome::Deferred { deferrals: 1, .. } => {}
        other => panic!("expected a deferral, got {other:?}"),
    }
    assert_eq!(store.count_deferred("my-defer").await.unwrap(), 1);
    assert_eq!(kit.dead_letters().await, 0);
    assert_eq!(
        kit.count(
            "SELECT count(*) FROM inoutbox_inbox WHERE due_at > NOW(6) + INTERVAL 20 SECOND \
               AND processed_at IS NULL AND payload IS NOT NULL"
        )
        .await,
        1,
        "kept with its message, due in 30 s"
    );
}

/// MySQL commits each DDL statement: a migrator that dies half-way through inbox migration 2
/// leaves some of it applied and none of it recorded. The next run applies it again whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_migration_2_runs_again_after_a_crash_half_way() {
    let kit = MySqlKit::new("mymigrate").await;
    kit.exec("DELETE FROM inoutbox_migrations WHERE component = 'inbox' AND version = 2")
        .await;
    kit.store().migrate().await.expect("migration 2 runs again");
    assert_eq!(
        kit.count(
            "SELECT count(*) FROM inoutbox_migrations WHERE component = 'inbox' AND version = 2"
        )
        .await,
        1
    );
    // Its parts: the claims column, the index of received rows, the effects table.
    assert_eq!(
        kit.count(
            "SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() \
               AND table_name = 'inoutbox_inbox' AND index_name = 'inoutbox_inbox_received_idx'"
        )
        .await,
        4,
        "one index of four columns"
    );
    assert_eq!(
        kit.count("SELECT count(*) FROM inoutbox_inbox WHERE claims > 0")
            .await,
        0
    );
    assert_eq!(kit.count("SELECT count(*) FROM inoutbox_effects").await, 0);
}

/// Inbox migration 3 drops the two indexes the others cover; run again after a crash half-way
/// (one index dropped, nothing recorded), it drops the other and is recorded once. The inbox
/// keeps one index per reader: its key, the business keys, the purge's and stuck count's
/// `processed_at`, the workers' received rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_migration_3_leaves_one_index_per_reader_and_runs_again_after_a_crash() {
    let kit = MySqlKit::new("mymigrate3").await;
    let indexes = "SELECT count(DISTINCT index_name) FROM information_schema.statistics \
                   WHERE table_schema = DATABASE() AND table_name = 'inoutbox_inbox'";
    let named = |name: &str| {
        format!(
            "SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() \
               AND table_name = 'inoutbox_inbox' AND index_name = 'inoutbox_inbox_{name}'"
        )
    };
    assert_eq!(
        kit.count(indexes).await,
        4,
        "primary, business key, processed, received"
    );
    assert_eq!(kit.count(&named("unprocessed_idx")).await, 0);
    assert_eq!(kit.count(&named("due_idx")).await, 0);
    // Half-way: the first index back as migration 1 made it, migration 3 not recorded.
    kit.exec("CREATE INDEX inoutbox_inbox_due_idx ON inoutbox_inbox (consumer_group, due_at)")
        .await;
    kit.exec("DELETE FROM inoutbox_migrations WHERE component = 'inbox' AND version = 3")
        .await;
    kit.store().migrate().await.expect("migration 3 runs again");
    assert_eq!(kit.count(&named("due_idx")).await, 0);
    assert_eq!(kit.count(indexes).await, 4);
    assert_eq!(
        kit.count(
            "SELECT count(*) FROM inoutbox_migrations WHERE component = 'inbox' AND version = 3"
        )
        .await,
        1
    );
}

/// A batch claim whose rows meet each other (a later row with the business key of an earlier
/// new one, then the event id of that one again) and a row of an earlier claim: the claim's
/// own row stays its own (`New`), the others are duplicates, and the statement's row count
/// does not pass the batch off as all new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claim_whose_rows_meet_each_other_keeps_its_own_row_new() {
    use inoutbox::store::{Claim, ClaimRequest, InboxKey, InboxStore};
    let kit = MySqlKit::new("mybatchkey").await;
    let store = kit.store();
    let key = |event_id: &str, business_key: Option<&str>| InboxKey {
        group: "my-batch".to_owned(),
        source: "s".to_owned(),
        event_id: event_id.to_owned(),
        business_key: business_key.map(str::to_owned),
    };
    let delivery = |offset| Delivery {
        topic: "my-batch".into(),
        partition: 0,
        offset,
        key: None,
        payload: None,
        headers: Vec::new(),
    };
    let claim = async |keys: &[InboxKey]| {
        let ds: Vec<Delivery> = (0..keys.len() as i64).map(delivery).collect();
        let requests: Vec<ClaimRequest<'_>> = keys
            .iter()
            .zip(&ds)
            .map(|(key, delivery)| ClaimRequest {
                key,
                event_type: "MyLater",
                delivery,
            })
            .collect();
        let mut tx = store.begin().await.expect("begin");
        let claims = store.claim_batch(&mut tx, &requests).await.expect("claim");
        store.commit(tx).await.expect("commit");
        claims
    };
    assert_eq!(
        claim(&[key("old", None)]).await,
        [Claim::New { attempts: 0 }]
    );
    let batch = [
        key("a", Some("Order:1")),
        key("b", Some("Order:1")),
        key("c", None),
        key("old", None),
    ];
    let expected = [
        Claim::New { attempts: 0 },
        Claim::DuplicateBusinessKey,
        Claim::New { attempts: 0 },
        Claim::Duplicate,
    ];
    assert_eq!(claim(&batch).await, expected);
    // Only the business key meets (no row of an earlier claim): still not all new.
    let batch = [key("d", Some("Order:2")), key("e", Some("Order:2"))];
    let expected = [Claim::New { attempts: 0 }, Claim::DuplicateBusinessKey];
    assert_eq!(claim(&batch).await, expected);
    let rows = kit.count("SELECT count(*) FROM inoutbox_inbox").await;
    assert_eq!(rows, 4, "old, a, c, d");
}
