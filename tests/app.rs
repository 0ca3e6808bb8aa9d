//! `inoutbox::App`: its parts run under one shutdown token; the first error of any part stops the
//! others and is returned; a group that cannot be set up fails the start.

mod support;

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
    let error = App::connect(Some("mssql://localhost/db"), None)
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, AppError::Config(_)), "{error}");
    assert!(error.to_string().contains("postgres://"), "{error}");
}

/// `DATABASE_URL=mysql://...` (feature `mysql`): the app opens MariaDB's store, migrated.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_database_url_opens_the_mysql_store_migrated() {
    let (_db, url) = support::kit::mysql_database("app").await;
    let brokers = format!("127.0.0.1:{}", closed_port());
    let app = App::connect(Some(&url), Some(&brokers))
        .await
        .expect("app on MariaDB");
    assert!(matches!(app.store(), Store::MySql(_)), "the MySQL store");
    assert!(
        app.describe().contains("MySQL/MariaDB"),
        "{}",
        app.describe()
    );
    let Store::MySql(store) = app.store() else {
        unreachable!()
    };
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name IN ('inoutbox_inbox', 'inoutbox_outbox', 'inoutbox_dead_letters')",
    )
    .fetch_one(store.pool())
    .await
    .expect("count tables");
    assert_eq!(tables, 3, "migrated");
}

/// Not a test: `App::from_env` in a child process (this binary started again with
/// `INOUTBOX_APP_FROM_ENV` set and the environment of a case), so no test changes the
/// environment of the others. Prints `started: <describe>` or `refused <variable>: <error>`;
/// its log lines go to stderr.
#[test]
fn from_env_in_a_child() {
    if std::env::var_os("INOUTBOX_APP_FROM_ENV").is_none() {
        return;
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    match runtime.block_on(App::from_env()) {
        Ok(app) => {
            println!("started: {}", app.describe());
            let pool = match app.store() {
                Store::Postgres(store) => Some(store.pool().options().get_max_connections()),
                #[cfg(feature = "mysql")]
                Store::MySql(store) => Some(store.pool().options().get_max_connections()),
                _ => None,
            };
            if let Some(pool) = pool {
                println!("pool: {pool} connections");
            }
        }
        Err(error @ AppError::Env { variable, .. }) => println!("refused {variable}: {error}"),
        Err(error) => println!("failed: {error}"),
    }
}

/// `App::from_env` in a child with `env` (and nothing else of inoutbox's); its stdout and stderr.
fn from_env(env: &[(&str, &str)]) -> (String, String) {
    let mut command = std::process::Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([
            "from_env_in_a_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .env_remove("NATS_URL")
        .env("INOUTBOX_APP_FROM_ENV", "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run the child");
    assert!(output.status.success(), "the child failed: {output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (stdout, stderr)
}

#[test]
fn database_pool_size_sizes_the_pool_and_a_bad_one_refuses_to_start() {
    let database = std::env::var("DATABASE_URL").expect("DATABASE_URL (scripts/test sets it)");
    // The broker is only connected to on first use: a closed port starts.
    let brokers = format!("127.0.0.1:{}", closed_port());
    let with = |size: Option<&str>| {
        let mut env = vec![
            ("DATABASE_URL", database.as_str()),
            ("KAFKA_BROKERS", brokers.as_str()),
        ];
        env.extend(size.map(|s| ("DATABASE_POOL_SIZE", s)));
        from_env(&env)
    };
    let (stdout, stderr) = with(None);
    assert!(
        stdout.contains("pool: 16 connections"),
        "the default:\n{stdout}\n{stderr}"
    );
    let (stdout, stderr) = with(Some("48"));
    assert!(
        stdout.contains("pool: 48 connections"),
        "{stdout}\n{stderr}"
    );
    for bad in ["", "3", "many", "-8"] {
        let (stdout, stderr) = with(Some(bad));
        assert!(
            stdout.contains("refused DATABASE_POOL_SIZE: DATABASE_POOL_SIZE is"),
            "{bad:?}: expected a refusal naming the variable, got:\n{stdout}\n{stderr}"
        );
        assert!(!stdout.contains("started"), "{bad:?}: {stdout}");
    }
    let (stdout, stderr) = from_env(&[("DATABASE_POOL_SIZE", "32")]);
    assert!(
        stdout.contains("refused DATABASE_POOL_SIZE") && stdout.contains("SQLite"),
        "the zero-setup store sizes its own pool:\n{stdout}\n{stderr}"
    );
}

/// The same variable sizes the MySQL/MariaDB pool (default 10).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_pool_size_sizes_the_mysql_pool_too() {
    let (_db, url) = support::kit::mysql_database("app_pool").await;
    let brokers = format!("127.0.0.1:{}", closed_port());
    for (size, expected) in [
        (None, "pool: 10 connections"),
        (Some("12"), "pool: 12 connections"),
    ] {
        let mut env = vec![
            ("DATABASE_URL", url.as_str()),
            ("KAFKA_BROKERS", brokers.as_str()),
        ];
        env.extend(size.map(|s| ("DATABASE_POOL_SIZE", s)));
        // A child process, waited for on this worker thread (the other runs the runtime).
        let (stdout, stderr) = from_env(&env);
        assert!(stdout.contains(expected), "{size:?}:\n{stdout}\n{stderr}");
    }
}

#[test]
fn one_of_database_url_and_kafka_brokers_without_the_other_refuses_to_start_naming_it() {
    let database = "postgres://app:hunter2-secret@127.0.0.1:5432/test";
    let brokers = format!("127.0.0.1:{}", closed_port());
    for (env, missing) in [
        (vec![("DATABASE_URL", database)], "KAFKA_BROKERS"),
        (
            vec![("DATABASE_URL", database), ("KAFKA_BROKERS", "")],
            "KAFKA_BROKERS",
        ),
        (
            vec![("DATABASE_URL", database), ("KAFKA_BROKERS", " \t")],
            "KAFKA_BROKERS",
        ),
        (vec![("KAFKA_BROKERS", brokers.as_str())], "DATABASE_URL"),
        (
            vec![("DATABASE_URL", ""), ("KAFKA_BROKERS", brokers.as_str())],
            "DATABASE_URL",
        ),
        (vec![("DATABASE_URL", " ")], "DATABASE_URL"),
        (vec![("KAFKA_BROKERS", "")], "KAFKA_BROKERS"),
    ] {
        let (stdout, stderr) = from_env(&env);
        assert!(
            stdout.contains(&format!("refused {missing}: {missing} ")),
            "{env:?}: expected a refusal naming {missing}, got:\n{stdout}\n{stderr}"
        );
        assert!(!stdout.contains("started"), "{env:?}: {stdout}");
        assert!(
            !format!("{stdout}{stderr}").contains("hunter2"),
            "{stdout}{stderr}"
        );
    }
}

#[test]
fn the_embedded_parts_are_chosen_only_when_neither_variable_is_set_and_say_so() {
    let (stdout, stderr) = from_env(&[]);
    assert!(
        stdout.contains("started: SQLite (") && stdout.contains("in-process Kafka"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("INFO") && stderr.contains("running on the embedded parts"),
        "the start-up says it runs on the embedded parts:\n{stderr}"
    );

    // Both set: the parts they name, and no word of embedded ones.
    let dir = std::env::temp_dir().join(format!("inoutbox-app-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let database = format!("sqlite:{}?mode=rwc", dir.join("app.db").display());
    let brokers = format!("127.0.0.1:{}", closed_port());
    let (stdout, stderr) = from_env(&[("DATABASE_URL", &database), ("KAFKA_BROKERS", &brokers)]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        stdout.contains("started: SQLite (") && stdout.contains(&format!("Kafka at {brokers}")),
        "{stdout}\n{stderr}"
    );
    assert!(
        !stderr.contains("embedded") && !stderr.contains("in-process"),
        "{stderr}"
    );
}

#[test]
fn nats_url_stands_for_kafka_brokers_never_beside_it_and_never_shows_its_password() {
    let dir = std::env::temp_dir().join(format!("inoutbox-app-nats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let database = format!("sqlite:{}?mode=rwc", dir.join("app.db").display());
    // Nothing listens there: the app connects to NATS only when it runs.
    let nats = format!("nats://app:hunter2-nats@127.0.0.1:{}", closed_port());
    let brokers = format!("127.0.0.1:{}", closed_port());
    let (stdout, stderr) = from_env(&[("DATABASE_URL", &database), ("NATS_URL", &nats)]);
    #[cfg(feature = "nats")]
    assert!(
        stdout.contains("started: SQLite (")
            && stdout.contains("+ NATS JetStream at nats://app:***@127.0.0.1:"),
        "{stdout}\n{stderr}"
    );
    #[cfg(not(feature = "nats"))]
    assert!(
        stdout.contains("refused NATS_URL: NATS_URL is set, but this build has no NATS")
            && stdout.contains("feature `nats`"),
        "{stdout}\n{stderr}"
    );
    let mut outputs = format!("{stdout}{stderr}");
    for (env, refused) in [
        (
            vec![
                ("DATABASE_URL", database.as_str()),
                ("KAFKA_BROKERS", brokers.as_str()),
                ("NATS_URL", nats.as_str()),
            ],
            "NATS_URL",
        ),
        (vec![("NATS_URL", nats.as_str())], "DATABASE_URL"),
        (
            vec![("DATABASE_URL", database.as_str()), ("NATS_URL", " ")],
            "NATS_URL",
        ),
        (vec![("NATS_URL", "")], "NATS_URL"),
    ] {
        let (stdout, stderr) = from_env(&env);
        assert!(
            stdout.contains(&format!("refused {refused}: {refused} ")),
            "{env:?}: expected a refusal naming {refused}, got:\n{stdout}\n{stderr}"
        );
        outputs.push_str(&stdout);
        outputs.push_str(&stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Two brokers: the refusal names both.
    assert!(
        outputs.contains("NATS_URL is set, and so is KAFKA_BROKERS"),
        "{outputs}"
    );
    assert!(!outputs.contains("hunter2"), "{outputs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_value_given_to_connect_is_refused_not_taken_for_none() {
    for (database, brokers, variable) in [
        (Some(""), None, "DATABASE_URL"),
        (None, Some(" "), "KAFKA_BROKERS"),
    ] {
        match App::connect(database, brokers).await {
            Err(AppError::Env {
                variable: named, ..
            }) => assert_eq!(named, variable),
            Err(other) => panic!("expected an error naming {variable}, got {other}"),
            Ok(app) => panic!("started on {}", app.describe()),
        }
    }
}

/// SECURITY.md: the `Debug` of every configuration that takes a secret hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_of_every_configuration_that_takes_a_secret_hides_it() {
    let kafka = inoutbox::KafkaConfig::new("sasl://u:pw-brokers@b:9092", ["t"])
        .set("sasl.password", "pw-sasl")
        .set("ssl.key.password", "pw-key")
        .set_producer("sasl.oauthbearer.client.secret", "pw-oauth");
    let producer = inoutbox::kafka::KafkaProducer::new("b:9092")
        .set("sasl.password", "pw-relay")
        .set("ssl.keystore.password", "pw-store");
    // A password the server does not ask for (trust), in the URL and as a parameter.
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL (scripts/test sets it)");
    let url = base.replacen(
        "postgres://postgres@",
        "postgres://postgres:pw-database@",
        1,
    );
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}password=pw-param");
    let store = inoutbox::PgStore::connect(&url, 1).await.expect("connect");
    let app_store = Store::Postgres(store.clone());
    let admin = inoutbox::admin::Admin::connect(&url, None)
        .await
        .expect("admin");
    let shown = format!("{kafka:?} {kafka:#?} {producer:?} {store:?} {app_store:?} {admin:?}");
    assert!(url.contains("pw-database"), "{url}");
    assert!(!shown.contains("pw-"), "a secret in Debug output:\n{shown}");
}

/// The handler of the ops test's own group (the other tests run `app-test` at the same time).
#[inbox_handler(event = "AppPing", group = "app-ops", stores(postgres, sqlite))]
async fn pinged_ops<D: Db>(_event: AppPing, _tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
    Ok(())
}

/// Log events of the process, as (level, target, fields) with the message in `message`.
#[cfg(feature = "http")]
mod captured {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, Layer};

    /// One event: its level and its fields as `name=value` (Debug of the value).
    #[derive(Clone, Debug)]
    pub struct Event {
        pub level: tracing::Level,
        pub fields: Vec<(String, String)>,
    }

    impl Event {
        pub fn field(&self, name: &str) -> Option<&str> {
            self.fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// A layer that keeps every event.
    #[derive(Clone, Default)]
    pub struct Events(pub Arc<Mutex<Vec<Event>>>);

    struct Fields(Vec<(String, String)>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_owned(), value.to_owned()));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Events {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut fields = Fields(Vec::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(Event {
                level: *event.metadata().level(),
                fields: fields.0,
            });
        }
    }

    impl Events {
        /// The events of `group` whose message is `message`.
        pub fn of(&self, group: &str, message: &str) -> Vec<Event> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.field("group") == Some(group) && e.field("message") == Some(message))
                .cloned()
                .collect()
        }
    }
}

/// Waits (at most 60 s) until `done` holds for the answer to `GET path`; returns the last one.
#[cfg(feature = "http")]
async fn get_until(
    addr: std::net::SocketAddr,
    path: &str,
    done: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = support::http_get(addr, path)
            .await
            .unwrap_or((0, "not listening".to_owned()));
        if done(status, &body) || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An app with `ops_endpoint` serves `/metrics` (what its consumer did), `/healthz` and
/// `/readyz` (the health of its parts, which `ConsumerSpec::health` hands out beforehand) over
/// HTTP; each message is logged at debug, and the group's summary at info.
#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ops_endpoint_serves_metrics_and_probes_and_the_log_summarises_each_group() {
    use inoutbox::app::RelaySpec;
    use tracing_subscriber::layer::SubscriberExt;

    let events = captured::Events::default();
    let subscriber = tracing_subscriber::registry().with(events.clone());
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let app = App::connect(None, None).await.expect("zero-setup app");
    app.create_topic("app-pings", 1).await.expect("topic");
    let Store::Sqlite(store) = app.store().clone() else {
        panic!("zero-setup store")
    };
    let spec = ConsumerSpec::new("app-ops", ["app-pings"])
        .summary_interval(Duration::from_millis(200))
        .sample_interval(Duration::from_millis(200));
    let health = spec.health();
    let relay = RelaySpec::new()
        .poll_interval(Duration::from_millis(50))
        .sample_interval(Duration::from_millis(200));
    let mut app = app.consumer_with(spec).relay_with(relay).ops_endpoint(addr);
    assert_eq!(app.health().len(), 2, "the consumer and the relay");
    let stop = app.shutdown_token();
    let running = tokio::spawn(async move { app.run().await });
    for id in 0..3 {
        let mut tx = store.pool().begin().await.expect("begin");
        inoutbox::outbox::enqueue(&mut tx, &AppPing { id })
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    }

    // Every metric of an app's endpoint says its transport.
    let processed = r#"inoutbox_inbox_processed_total{transport="kafka",group="app-ops",event_type="AppPing"} 3"#;
    let (status, scrape) = get_until(addr, "/metrics", |_, b| b.contains(processed)).await;
    assert_eq!(status, 200);
    assert!(scrape.contains(processed), "{scrape}");
    assert!(
        scrape.contains("# HELP inoutbox_inbox_processed_total"),
        "{scrape}"
    );
    let (status, body) = get_until(addr, "/readyz", |s, _| s == 200).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""app-ops":{"database":true,"joined":true"#),
        "{body}"
    );
    assert!(body.contains(r#""relay":{"#), "{body}");
    assert_eq!(get_until(addr, "/healthz", |_, _| true).await.0, 200);
    assert_eq!(get_until(addr, "/nothing", |_, _| true).await.0, 404);
    assert!(health.ready(), "the spec's handle is the consumer's");

    // Each message at debug, never at info; the summary at info counts all three.
    let deadline = Instant::now() + Duration::from_secs(30);
    let summarised = || -> u64 {
        events
            .of("app-ops", "summary")
            .iter()
            .filter(|e| e.level == tracing::Level::INFO)
            .filter_map(|e| e.field("processed")?.parse::<u64>().ok())
            .sum()
    };
    while summarised() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(summarised(), 3, "the summaries count the three messages");
    let lines = events.of("app-ops", "processed");
    assert_eq!(lines.len(), 3, "one line per message: {lines:?}");
    assert!(
        lines.iter().all(|e| e.level == tracing::Level::DEBUG),
        "per-message lines at debug: {lines:?}"
    );

    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(40), running)
        .await
        .expect("run returned")
        .expect("join");
    assert!(result.is_ok(), "{result:?}");
    assert!(!health.live(), "stopped");
}

/// Schedules an effect `app-ping-seen` carrying the ping's id.
#[inbox_handler(event = "AppPing", group = "app-effects")]
async fn ping_seen(
    event: AppPing,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    inoutbox::effects::after_commit(tx, meta, "app-ping-seen", &event.id).await?;
    Ok(())
}

/// An effect executor given to a `ConsumerSpec` runs in the app's consumer (PostgreSQL, where
/// effects are kept, and the in-process Kafka).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_spec_takes_the_effect_executors_of_its_group() {
    let db = support::TestDb::new("app_effects").await;
    let app = App::connect(Some(&db.url()), None).await.expect("app");
    app.create_topic("app-pings", 1).await.expect("topic");
    let Store::Postgres(store) = app.store().clone() else {
        panic!("a PostgreSQL store")
    };
    let (seen, mut executed) = tokio::sync::mpsc::unbounded_channel::<i64>();
    let spec = ConsumerSpec::new("app-effects", ["app-pings"]).effect(
        "app-ping-seen",
        move |effect: inoutbox::effects::Effect| {
            let seen = seen.clone();
            async move {
                let _ = seen.send(effect.payload_as::<i64>()?);
                Ok(())
            }
        },
    );
    let mut app = app.consumer_with(spec).relay();
    let stop = app.shutdown_token();
    let running = tokio::spawn(async move { app.run().await });
    for id in [7, 8] {
        let mut tx = store.pool().begin().await.expect("begin");
        inoutbox::outbox::enqueue(&mut tx, &AppPing { id })
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    }
    let mut ids = Vec::new();
    while ids.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(60), executed.recv()).await {
            Ok(Some(id)) => ids.push(id),
            other => panic!("the executor ran for {ids:?}, then {other:?}"),
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, [7, 8], "the spec's executor ran each effect");
    stop.cancel();
    let result = running.await.expect("join");
    assert!(result.is_ok(), "{result:?}");
}
