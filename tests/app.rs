//! `inoutbox::App`: its parts run under one shutdown token; the first error of any part stops the
//! others and is returned; a group that cannot be set up fails the start.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use inoutbox::app::{ConsumerSpec, Store};
use inoutbox::prelude::*;
use inoutbox::{App, AppError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "AppPing", topic = "app-pings", key = id)]
pub struct AppPing {
    pub id: i64,
}

#[inbox_handler(event = "AppPing", group = "app-test", stores(postgres, sqlite))]
async fn pinged<D: Db>(_event: AppPing, _tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    Ok(())
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_error_of_a_part_stops_the_others_and_is_returned() {
    // Zero-setup SQLite and a broker nobody answers: the consumer fails at start-up after its
    // timeout; the relay would retry for ever, so `run` returns only if it is stopped.
    let brokers = format!("127.0.0.1:{}", closed_port());
    let app = App::connect(None, Some(&brokers)).await.expect("app");
    assert!(matches!(app.store(), Store::Sqlite(_)), "zero-setup store");
    let spec = ConsumerSpec::new("app-test", ["app-pings"]).startup_timeout(Duration::from_secs(2));
    let mut app = app.consumer_with(spec).relay();
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(40), app.run())
        .await
        .expect("run returned: the relay was stopped after the consumer failed");
    match result {
        Err(AppError::Consumer { group, source }) => {
            assert_eq!(group, "app-test");
            assert!(source.to_string().contains(&brokers), "{source}");
        }
        other => panic!("expected the consumer's start-up error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "stopped after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_shutdown_token_stops_every_part_and_run_returns_ok() {
    let app = App::connect(None, None).await.expect("zero-setup app");
    assert!(app.is_in_process());
    app.create_topic("app-pings", 1).await.expect("topic");
    let mut app = app.consumer("app-test", ["app-pings"]).relay();
    let stop = app.shutdown_token();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.cancel();
    });
    let result = tokio::time::timeout(Duration::from_secs(40), app.run())
        .await
        .expect("run returned after the token was cancelled");
    assert!(result.is_ok(), "{result:?}");
    stopper.await.expect("stopper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_without_handlers_fails_the_start_naming_it() {
    let app = App::connect(None, None).await.expect("zero-setup app");
    let mut app = app.consumer("app-nobody", ["app-pings"]).relay();
    let result = tokio::time::timeout(Duration::from_secs(20), app.run())
        .await
        .expect("run returned");
    match result {
        Err(error @ AppError::Setup { .. }) => {
            assert!(error.to_string().contains("app-nobody"), "{error}")
        }
        other => panic!("expected a set-up error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_url_of_another_scheme_is_refused() {
    let error = App::connect(Some("mysql://localhost/db"), None)
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, AppError::Config(_)), "{error}");
    assert!(error.to_string().contains("postgres://"), "{error}");
}
