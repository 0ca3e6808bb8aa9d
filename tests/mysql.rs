//! The modes the MySQL/MariaDB store does not keep yet are refused clearly, never half-run: a
//! two-phase group fails its set-up naming the store, and a deferred message is dead-lettered
//! with the reason (see docs/modes.md, "What differs between the stores").
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use inoutbox::inbox::{Delivery, Inbox, InboxConfig};
use inoutbox::prelude::*;
use inoutbox::Outcome;
use serde::{Deserialize, Serialize};

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

async fn store(name: &str) -> inoutbox::MySqlStore {
    let (_db, url) = support::kit::mysql_database(name).await;
    let store = inoutbox::MySqlStore::connect(&url)
        .await
        .expect("connect to MariaDB");
    store.migrate().await.expect("migrate");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_phase_group_on_mysql_is_refused_at_start_up_naming_the_store() {
    let store = store("mytwophase").await;
    let Err(error) = Inbox::new(store, "my-two-phase", InboxConfig::default()) else {
        panic!("a two-phase group on MySQL must be refused");
    };
    let text = error.to_string();
    assert!(
        text.contains("two-phase") && text.contains("mysql"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_message_on_mysql_is_dead_lettered_with_the_reason() {
    let store = store("mydefer").await;
    let inbox = Inbox::new(store.clone(), "my-defer", InboxConfig::default()).expect("inbox");
    let d = Delivery {
        topic: "my-later".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(br#"{"id":"a"}"#.to_vec()),
        headers: vec![
            ("ce_id".to_owned(), Some(b"e-1".to_vec())),
            ("ce_type".to_owned(), Some(b"MyLater".to_vec())),
        ],
    };
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    match inbox.process(&d, &shutdown).await {
        Outcome::DeadLettered { reason, .. } => {
            assert!(
                reason.contains("deferred") && reason.contains("mysql"),
                "{reason}"
            )
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM inoutbox_dead_letters")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(letters, 1);
}
