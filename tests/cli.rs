//! The `inoutbox` command against real PostgreSQL (a schema per test) and SQLite: every
//! subcommand's output and exit code, replay through an application binary that has the
//! handlers linked in (this test binary, started again as a child), and no password printed.
//! Also the consumer's scheduled inbox purge, and the quickstart's wrong-scheme message.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use inoutbox::inbox::{Delivery, Inbox, InboxConfig, Outcome, RetryPolicy};
use inoutbox::prelude::*;
use inoutbox::{Consumer, KafkaConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use support::TestDb;
use tokio::sync::watch;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "CliOrder", topic = "cli-orders", key = order_id)]
pub struct CliOrder {
    pub order_id: Uuid,
    pub total_cents: i64,
}

/// Fails while `books_closed` has a row: a letter dead-lettered then can be replayed after.
#[inbox_handler(event = "CliOrder", group = "cli")]
async fn invoice(event: CliOrder, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    let closed: i64 = sqlx::query_scalar("SELECT count(*) FROM books_closed")
        .fetch_one(&mut **tx)
        .await?;
    if closed > 0 {
        return Err(HandlerError::permanent("the books are closed"));
    }
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "CliOrder", group = "cli-lite")]
async fn invoice_lite(event: CliOrder, tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)")
        .bind(event.order_id.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The handler of the MySQL/MariaDB test: fails while `books_closed` has a row.
#[cfg(feature = "mysql")]
#[inbox_handler(event = "CliOrder", group = "cli-my")]
async fn invoice_my(event: CliOrder, tx: &mut inoutbox::MySqlTx<'_>) -> Result<(), HandlerError> {
    let closed: i64 = sqlx::query_scalar("SELECT count(*) FROM books_closed")
        .fetch_one(&mut **tx)
        .await?;
    if closed > 0 {
        return Err(HandlerError::permanent("the books are closed"));
    }
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)")
        .bind(event.order_id.to_string())
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Not a test: the entry of the application binary that replay runs through. The test binary
/// is started again with `INOUTBOX_CLI_APP_ARGS` set; it then runs `inoutbox::cli::run_from` with
/// this binary's handlers and exits with its code.
#[test]
fn application_binary_entry() {
    let Ok(args) = std::env::var("INOUTBOX_CLI_APP_ARGS") else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).expect("args");
    let code = inoutbox::cli::run_from(args);
    let code = (0..=255u8)
        .find(|c| code == std::process::ExitCode::from(*c))
        .expect("an exit code");
    std::process::exit(i32::from(code));
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

fn finish(output: Output) -> Run {
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The standalone `inoutbox` binary (no handlers), with `DATABASE_URL` unset.
fn inoutbox(args: &[&str]) -> Run {
    finish(
        Command::new(env!("CARGO_BIN_EXE_inoutbox"))
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .expect("run inoutbox"),
    )
}

/// The application binary: this test binary, with the handlers above.
fn app(args: &[&str]) -> Run {
    let mut all = vec!["myservice"];
    all.extend_from_slice(args);
    let run = finish(
        Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "application_binary_entry", "--nocapture"])
            .env(
                "INOUTBOX_CLI_APP_ARGS",
                serde_json::to_string(&all).unwrap(),
            )
            .env_remove("DATABASE_URL")
            .output()
            .expect("run the application binary"),
    );
    // libtest's own lines come before the command's output.
    Run {
        stdout: run
            .stdout
            .lines()
            .filter(|l| !l.starts_with("running ") && !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        ..run
    }
}

/// The database options every command of a test starts with.
struct Target(Vec<String>);

impl Target {
    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        self.0
            .iter()
            .map(String::as_str)
            .chain(args.iter().copied())
            .collect()
    }

    fn inoutbox(&self, args: &[&str]) -> Run {
        inoutbox(&self.args(args))
    }

    fn app(&self, args: &[&str]) -> Run {
        app(&self.args(args))
    }
}

fn delivery(offset: i64, event_type: &str, payload: &str) -> Delivery {
    Delivery {
        topic: "cli-orders".into(),
        partition: 0,
        offset,
        key: Some(b"k".to_vec()),
        payload: Some(payload.as_bytes().to_vec()),
        headers: vec![
            (
                "ce_id".into(),
                Some(Uuid::new_v4().to_string().into_bytes()),
            ),
            ("ce_type".into(), Some(event_type.as_bytes().to_vec())),
            ("authorization".into(), Some(b"Bearer tok-secret".to_vec())),
        ],
    }
}

/// A payload that is not a `CliOrder`, its keys out of order and a number as the producer
/// wrote it (`1.50`): `show` must keep the order, `show --raw` every byte.
const MALFORMED: &str = "{\"zeta\": 1,  \"order_id\":\"not-a-uuid\", \"amount\": 1.50}";

fn order(total: i64) -> String {
    format!(
        r#"{{"order_id":"{}","total_cents":{total}}}"#,
        Uuid::new_v4()
    )
}

fn once() -> InboxConfig {
    let mut config = InboxConfig::default();
    config.retry = RetryPolicy::no_retries();
    config
}

async fn dead_letter_id<S: inoutbox::store::InboxStore>(inbox: &Inbox<S>, d: Delivery) -> i64 {
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    match inbox.process(&d, &shutdown).await {
        Outcome::DeadLettered { id, .. } => id,
        other => panic!("expected a dead letter, got {other:?}"),
    }
}

async fn seed_outbox(db: &TestDb) {
    for (key, parked, error, published) in [
        ("k-wait", false, None, None),
        ("k-bad", true, Some("first rejection"), None),
        ("k-bad", true, Some("Broker: Message size too large"), None),
        ("k-old", false, None, Some("now() - interval '10 days'")),
        ("k-new", false, None, Some("now() - interval '1 hour'")),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload, created_at, attempts, \
               last_error, parked_at, next_attempt_at, published_at) \
             VALUES ($1, 'CliOrder', 'cli-orders', $2, '{{}}', now() - interval '90 seconds', $3, $4, \
               CASE WHEN $5 THEN now() END, CASE WHEN $5 THEN now() END, {})",
            published.unwrap_or("NULL")
        )))
        .bind(Uuid::new_v4())
        .bind(key)
        .bind(if parked { 10 } else { 0 })
        .bind(error)
        .bind(parked)
        .execute(&db.pool)
        .await
        .expect("insert outbox row");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_works_on_postgres() {
    let db = TestDb::new("cli").await;
    let t = Target(vec![
        "--database-url".into(),
        db.url(),
        "--schema".into(),
        db.schema.clone(),
    ]);

    let run = t.inoutbox(&["migrate"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "migrations applied\n"),
        "{}",
        run.stderr
    );
    sqlx::raw_sql(
        "CREATE TABLE books_closed (since timestamptz); INSERT INTO books_closed VALUES (now());",
    )
    .execute(&db.pool)
    .await
    .expect("books_closed");
    let inbox = Inbox::new(db.store(), "cli", once()).expect("inbox");
    let malformed = dead_letter_id(&inbox, delivery(1, "CliOrder", MALFORMED)).await;
    let closed = dead_letter_id(&inbox, delivery(2, "CliOrder", &order(1200))).await;
    sqlx::raw_sql("DELETE FROM books_closed")
        .execute(&db.pool)
        .await
        .unwrap();
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let ok = inbox
        .process(&delivery(3, "CliOrder", &order(700)), &shutdown)
        .await;
    assert!(matches!(ok, Outcome::Processed { .. }), "{ok:?}");
    seed_outbox(&db).await;
    seed_effects(&db).await;

    status_on_postgres(&t).await;
    dead_letters_listed_shown_replayed_discarded(&t, "cli", malformed, closed, async || {
        db.invoices().await
    })
    .await;
    outbox_and_purge_on_postgres(&db, &t).await;
}

/// Effects of group `cli`: one failing for two minutes, one waiting, one done (not shown).
async fn seed_effects(db: &TestDb) {
    sqlx::raw_sql(
        "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, \
           payload, created_at, attempts, done_at) VALUES \
         ('cli', '', 'e-1', 'mail', 'k-1', '{}', now() - interval '2 minutes', 3, NULL), \
         ('cli', '', 'e-2', 'mail', 'k-2', '{}', now(), 0, NULL), \
         ('cli', '', 'e-3', 'mail', 'k-3', '{}', now() - interval '1 day', 1, now())",
    )
    .execute(&db.pool)
    .await
    .expect("seed effects");
}

/// The effects section of `status` (the same on both stores).
fn effects_in_status(t: &Target) {
    let run = t.inoutbox(&["status"]);
    let section = run
        .stdout
        .split("EFFECTS (not done yet)\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no effects section:\n{}", run.stdout));
    let line = section.lines().nth(1).unwrap_or_default();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[..3], ["cli", "2", "1"], "{}", run.stdout);
    assert!(line.contains("2m "), "the oldest, two minutes old: {line}");
    let s = t.inoutbox(&["status", "--json"]).json();
    let effects = &s["effects"][0];
    assert_eq!(
        (
            effects["group"].as_str(),
            effects["pending"].as_i64(),
            effects["failed"].as_i64()
        ),
        (Some("cli"), Some(2), Some(1))
    );
    let oldest = effects["oldest_pending_secs"].as_f64().expect("an age");
    assert!((115.0..600.0).contains(&oldest), "{oldest}");
}

async fn status_on_postgres(t: &Target) {
    effects_in_status(t);
    let run = t.inoutbox(&["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    println!("{}", run.stdout);
    for text in [
        "INBOX",
        "cli ",
        "OUTBOX",
        "unpublished: 1, oldest 1m",
        "parked: 2",
        "k-bad",
        "Message size too large",
    ] {
        assert!(
            run.stdout.contains(text),
            "`{text}` missing:\n{}",
            run.stdout
        );
    }
    assert!(
        !run.stdout.contains("first rejection"),
        "the latest error per key:\n{}",
        run.stdout
    );
    let s = t.inoutbox(&["status", "--json"]).json();
    let group = &s["groups"][0];
    assert_eq!(group["group"], "cli");
    assert_eq!(group["inbox_rows"], 1);
    assert_eq!(group["processed_last_minute"], 1);
    assert_eq!(group["dead_letters"], 2);
    assert_eq!(group["dead_letters_pending"], 2);
    assert_eq!(s["stuck"], 0);
    assert_eq!(s["outbox"]["unpublished"], 1);
    assert_eq!(s["outbox"]["parked"], 2);
    let oldest = s["outbox"]["oldest_unpublished_secs"]
        .as_f64()
        .expect("an age");
    assert!((85.0..600.0).contains(&oldest), "{oldest}");
    let key = &s["outbox"]["parked_keys"][0];
    assert_eq!(
        (key["key"].as_str(), key["rows"].as_i64()),
        (Some("k-bad"), Some(2))
    );
    assert_eq!(key["last_error"], "Broker: Message size too large");
}

/// The dead-letter subcommands on a store holding two dead letters of `group` (`seed_*`):
/// list (filters, newest first), show (text, JSON, the raw bytes), replay (refused by the
/// standalone binary, run by the application's; `invoices` counts what the handler wrote),
/// discard.
async fn dead_letters_listed_shown_replayed_discarded(
    t: &Target,
    group: &str,
    malformed: i64,
    closed: i64,
    invoices: impl AsyncFn() -> i64,
) {
    let list = t.inoutbox(&["dead-letters", "list", "--group", group, "--json"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    let letters = list.json();
    assert_eq!(letters[0]["group"], group);
    assert_eq!(letters[0]["topic"], "cli-orders");
    let ids: Vec<i64> = letters
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [closed, malformed], "newest first");
    let none = t
        .inoutbox(&["dead-letters", "list", "--event-type", "Other", "--json"])
        .json();
    assert_eq!(none, Value::Array(vec![]));
    let recent = t
        .inoutbox(&[
            "dead-letters",
            "list",
            "--since",
            "1h",
            "--limit",
            "1",
            "--json",
        ])
        .json();
    assert_eq!(recent.as_array().unwrap().len(), 1);
    let table = t.inoutbox(&["dead-letters", "list"]);
    assert!(
        table.stdout.starts_with("ID ") && table.stdout.contains("the books are closed"),
        "{}",
        table.stdout
    );

    let show = t.inoutbox(&["dead-letters", "show", &malformed.to_string()]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    println!("{}", show.stdout);
    for text in [
        "event type:    CliOrder",
        "ce_type: CliOrder",
        "attempts:      ",
        "\"order_id\": \"not-a-uuid\"",
        "error:\n  ",
    ] {
        assert!(
            show.stdout.contains(text),
            "`{text}` missing:\n{}",
            show.stdout
        );
    }
    assert!(
        !show.stdout.contains("tok-secret"),
        "a secret header is shown:\n{}",
        show.stdout
    );
    let show_json = t
        .inoutbox(&["dead-letters", "show", &malformed.to_string(), "--json"])
        .json();
    assert_eq!(show_json["payload"]["order_id"], "not-a-uuid");
    let at = |text: &str| show.stdout.find(text).unwrap_or(usize::MAX);
    assert!(
        at("\"zeta\": 1,") < at("\"order_id\"") && at("\"order_id\"") < at("\"amount\": 1.50"),
        "the payload's keys in their stored order:\n{}",
        show.stdout
    );
    let raw = t.inoutbox(&["dead-letters", "show", &malformed.to_string(), "--raw"]);
    assert_eq!(raw.code, 0, "{}", raw.stderr);
    assert_eq!(raw.stdout, MALFORMED, "the stored bytes, exactly");
    assert_eq!(t.inoutbox(&["dead-letters", "show", "999999"]).code, 3);

    let standalone = t.inoutbox(&["dead-letters", "replay", &closed.to_string()]);
    assert_eq!(standalone.code, 4, "{}", standalone.stderr);
    assert!(
        standalone.stderr.contains("inoutbox::cli::run()"),
        "{}",
        standalone.stderr
    );
    let replayed = t.app(&["dead-letters", "replay", &closed.to_string()]);
    assert_eq!(replayed.code, 0, "{}\n{}", replayed.stdout, replayed.stderr);
    assert!(
        replayed
            .stdout
            .contains(&format!("dead letter {closed}: replayed")),
        "{}",
        replayed.stdout
    );
    assert_eq!(invoices().await, 2, "the replay ran the handler");
    assert_eq!(
        t.app(&["dead-letters", "replay", &closed.to_string()]).code,
        3,
        "already replayed"
    );
    let again = t.app(&["dead-letters", "replay", &malformed.to_string()]);
    assert_eq!(again.code, 1, "a letter that fails again: {}", again.stdout);
    assert!(
        again.stdout.contains(&format!(
            "dead letter {malformed} was dead-lettered again: "
        )),
        "a sentence: {}",
        again.stdout
    );
    assert!(
        !again.stdout.contains("DeadLettered {"),
        "no Debug dump: {}",
        again.stdout
    );
    let s = t.inoutbox(&["status", "--json"]).json();
    assert_eq!(s["groups"][0]["dead_letters_pending"], 1);

    let refused = t.inoutbox(&["dead-letters", "discard", &malformed.to_string()]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    let discarded = t.inoutbox(&[
        "dead-letters",
        "discard",
        "--group",
        group,
        "--yes",
        "--json",
    ]);
    assert_eq!(discarded.code, 0, "{}", discarded.stderr);
    let mut gone: Vec<i64> = discarded.json()["discarded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    gone.sort();
    assert_eq!(gone, [malformed.min(closed), malformed.max(closed)]);
    assert_eq!(
        t.inoutbox(&["dead-letters", "discard", &closed.to_string(), "--yes"])
            .code,
        3
    );
}

async fn outbox_and_purge_on_postgres(db: &TestDb, t: &Target) {
    let unpark = t.inoutbox(&["outbox", "unpark", "k-bad"]);
    assert_eq!(
        (unpark.code, unpark.stdout.as_str()),
        (0, "unparked 2 row(s) of key `k-bad`\n"),
        "{}",
        unpark.stderr
    );
    let due = db
        .count("SELECT count(*) FROM inoutbox_outbox WHERE message_key = 'k-bad' AND parked_at IS NULL AND attempts = 0 AND next_attempt_at <= now()")
        .await;
    assert_eq!(due, 2, "unparked rows are due again with fresh attempts");
    assert_eq!(
        t.inoutbox(&["outbox", "unpark", "--all"]).code,
        3,
        "nothing parked any more"
    );
    assert_eq!(t.inoutbox(&["outbox", "unpark"]).code, 2, "a key or --all");

    sqlx::query("INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, processed_at) VALUES ('cli', 'old', 'CliOrder', now() - interval '8 days'), ('cli', 'unprocessed', 'CliOrder', NULL)")
        .execute(&db.pool)
        .await
        .expect("old inbox rows");
    let purge = t.inoutbox(&["purge", "--older-than", "7d", "--batch-size", "1", "--json"]);
    assert_eq!(purge.code, 0, "{}", purge.stderr);
    let purged = purge.json();
    assert_eq!(
        (
            purged["inbox_deleted"].as_i64(),
            purged["outbox_deleted"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_inbox").await,
        3,
        "recent (two processed, one replayed) and unprocessed rows stay"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_outbox").await,
        4,
        "the recent published row stays"
    );
    assert_eq!(t.inoutbox(&["purge"]).code, 2, "--older-than is required");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_works_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("inoutbox-cli-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("cli.db").display());
    let t = Target(vec!["--database-url".into(), url.clone()]);
    assert_eq!(t.inoutbox(&["migrate"]).code, 0);
    let store = inoutbox::SqliteStore::connect(&url).await.expect("sqlite");
    sqlx::raw_sql("CREATE TABLE invoices (order_id text NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let inbox = Inbox::new(store.clone(), "cli-lite", once()).expect("inbox");
    let bad = dead_letter_id(&inbox, delivery(1, "CliOrder", "not json at all")).await;
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    inbox
        .process(&delivery(2, "CliOrder", &order(5)), &shutdown)
        .await;
    sqlx::raw_sql(
        "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload, attempts, last_error, parked_at) \
         VALUES ('a', 'CliOrder', 't', 'k1', '{}', 10, 'rejected', strftime('%Y-%m-%dT%H:%M:%fZ','now')); \
         INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload, published_at) \
         VALUES ('b', 'CliOrder', 't', 'k2', '{}', '2000-01-01T00:00:00.000Z'); \
         INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, processed_at) \
         VALUES ('cli-lite', 'old', 'CliOrder', '2000-01-01T00:00:00.000Z');",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // The effects `seed_effects` writes on PostgreSQL.
    sqlx::raw_sql(
        "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, \
           payload, created_at, attempts, done_at) VALUES \
         ('cli', '', 'e-1', 'mail', 'k-1', '{}', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 minutes'), 3, NULL), \
         ('cli', '', 'e-2', 'mail', 'k-2', '{}', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 0, NULL), \
         ('cli', '', 'e-3', 'mail', 'k-3', '{}', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 day'), 1, \
          strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
    )
    .execute(store.pool())
    .await
    .expect("seed effects");

    let s = t.inoutbox(&["status", "--json"]);
    assert_eq!(s.code, 0, "{}", s.stderr);
    let s = s.json();
    assert_eq!(
        (
            s["groups"][0]["group"].as_str(),
            s["groups"][0]["inbox_rows"].as_i64()
        ),
        (Some("cli-lite"), Some(2))
    );
    assert_eq!(
        (
            s["groups"][0]["processed_last_minute"].as_i64(),
            s["groups"][0]["dead_letters"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        (
            s["outbox"]["parked"].as_i64(),
            s["outbox"]["parked_keys"][0]["last_error"].as_str()
        ),
        (Some(1), Some("rejected"))
    );
    effects_in_status(&t);
    let status = t.inoutbox(&["status"]);
    assert!(
        status.stdout.contains("cli-lite") && status.stdout.contains("parked: 1"),
        "{}",
        status.stdout
    );
    let list = t.inoutbox(&["dead-letters", "list", "--json"]).json();
    assert_eq!(list[0]["id"].as_i64(), Some(bad));
    let show = t.inoutbox(&["dead-letters", "show", &bad.to_string()]);
    assert!(
        show.code == 0
            && show
                .stdout
                .contains("payload (15 bytes):\n  not json at all"),
        "{}",
        show.stdout
    );
    assert_eq!(
        t.inoutbox(&["dead-letters", "replay", &bad.to_string()])
            .code,
        4
    );
    assert_eq!(
        t.app(&["dead-letters", "replay", &bad.to_string()]).code,
        1,
        "still not JSON"
    );
    let unpark = t.inoutbox(&["outbox", "unpark", "--all"]);
    assert_eq!(
        (unpark.code, unpark.stdout.as_str()),
        (0, "unparked 1 row(s) of every key\n")
    );
    let purged = t
        .inoutbox(&["purge", "--older-than", "7d", "--json"])
        .json();
    assert_eq!(
        (
            purged["inbox_deleted"].as_i64(),
            purged["outbox_deleted"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        t.inoutbox(&["dead-letters", "discard", &bad.to_string(), "--yes"])
            .code,
        0
    );
    assert_eq!(
        t.inoutbox(&["dead-letters", "list", "--json"]).json(),
        Value::Array(vec![])
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_command_never_prints_a_password() {
    let refused = inoutbox(&["--database-url", "oracle://app:hunter2-pw@db/x", "status"]);
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("oracle://app:***@db/x"),
        "{}",
        refused.stderr
    );
    let unreachable = inoutbox(&[
        "--database-url",
        "postgres://app:hunter2-pw@127.0.0.1:1/x",
        "status",
        "--json",
    ]);
    assert_eq!(unreachable.code, 1);
    assert!(unreachable.json()["error"]
        .as_str()
        .unwrap()
        .contains("app:***@127.0.0.1:1"));
    let help = finish(
        Command::new(env!("CARGO_BIN_EXE_inoutbox"))
            .arg("--help")
            .env("DATABASE_URL", "postgres://app:hunter2-pw@db/x")
            .output()
            .unwrap(),
    );
    assert_eq!(help.code, 0);
    for run in [&refused, &unreachable, &help] {
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(!all.contains("hunter2"), "a password is printed:\n{all}");
    }
    let missing = inoutbox(&["status"]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("DATABASE_URL"),
        "{}",
        missing.stderr
    );
}

/// The quickstart refuses a URL of another database without echoing its password.
#[test]
fn the_quickstart_does_not_echo_a_password() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let built = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "--example", "quickstart"])
        .status()
        .expect("cargo build");
    assert!(built.success());
    let exe: PathBuf = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/quickstart");
    let run = finish(
        Command::new(exe)
            .env("DATABASE_URL", "mysql://app:hunter2-pw@db/x")
            .output()
            .expect("run the quickstart"),
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("mysql://app:***@db/x"),
        "{}",
        run.stderr
    );
    assert!(
        !format!("{}{}", run.stdout, run.stderr).contains("hunter2"),
        "{}",
        run.stderr
    );
}

/// The consumer purges processed inbox rows past the retention window by itself, in batches:
/// old processed rows go; recent ones, and old rows not processed, stay.
#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_purges_old_inbox_rows_by_itself() {
    let db = TestDb::new("retention").await;
    let store = db.migrated_store().await;
    sqlx::raw_sql(
        "INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, processed_at) \
         SELECT 'cli', 'old-' || n, 'CliOrder', now() - interval '8 days' FROM generate_series(1, 5) n; \
         INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, processed_at) \
         SELECT 'cli', 'new-' || n, 'CliOrder', now() - interval '6 days' FROM generate_series(1, 3) n; \
         INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, received_at) \
         VALUES ('cli', 'stuck', 'CliOrder', now() - interval '9 days');",
    )
    .execute(&db.pool)
    .await
    .expect("seed the inbox");
    assert!(InboxConfig::default().retention.is_some(), "on by default");
    let kafka = inoutbox::kafka::InProcessKafka::start().expect("in-process Kafka");
    kafka.create_topic("cli-orders", 1).expect("topic");
    let consumer = Consumer::builder(
        "cli",
        store,
        KafkaConfig::new(kafka.brokers(), ["cli-orders"]),
    )
    .retention(Some(
        inoutbox::outbox::Retention::default()
            .older_than(Duration::from_secs(7 * 86_400))
            .batch_size(2)
            .interval(Duration::from_millis(100)),
    ))
    .build()
    .expect("consumer");
    let (stop, mut stopped) = watch::channel(false);
    let running = tokio::spawn(consumer.run(async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while db
        .count("SELECT count(*) FROM inoutbox_inbox WHERE event_id LIKE 'old-%'")
        .await
        > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "old processed rows were not purged within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send_replace(true);
    running.await.expect("join").expect("consumer");
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_inbox WHERE event_id LIKE 'new-%'")
            .await,
        3,
        "recent rows stay"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inoutbox_inbox WHERE event_id = 'stuck'")
            .await,
        1,
        "unprocessed rows stay"
    );
}

/// A consumer on a real broker meets a poisoned message: `status` shows the dead letter and,
/// with `--brokers`, each partition's lag from the broker's watermarks; `show` prints the
/// poisoned message.
#[tokio::test(flavor = "multi_thread")]
async fn status_shows_a_poisoned_message_and_the_kafka_lag() {
    let db = TestDb::new("cli_lag").await;
    let store = db.migrated_store().await;
    sqlx::raw_sql("CREATE TABLE books_closed (since timestamptz)")
        .execute(&db.pool)
        .await
        .unwrap();
    let broker = support::Broker::start();
    let topic = support::unique("cli-orders");
    broker.create_topic(&topic, 2).await;
    let producer = support::producer(&broker.brokers);
    let send = |n: i32, payload: Option<&str>| {
        let mut msg = support::Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 100)
            .on_partition(n % 2);
        msg.event_type = Some("CliOrder".into());
        if let Some(p) = payload {
            msg.payload = p.as_bytes().to_vec();
        }
        msg
    };
    for n in 0..3 {
        support::send(&producer, &topic, send(n, None)).await;
    }
    support::send(
        &producer,
        &topic,
        send(3, Some(r#"{"order_id": 42, "total_cents": "lots"}"#)),
    )
    .await;
    let mut running = support::Running::start(
        Consumer::builder("cli", store, support::kafka(&broker.brokers, &topic))
            .retry(RetryPolicy::no_retries()),
    );
    running.take(4).await;
    for p in 0..2 {
        support::wait_committed(&broker.brokers, "cli", &topic, p, 2).await;
    }
    running.stop().await;
    support::send(&producer, &topic, send(0, None)).await;
    // Partition 1 holds 2 messages; a committed offset of 1000 is past its end (a topic
    // deleted and created again looks like this).
    commit(&broker.brokers, "cli", &topic, 1, 1000);

    let t = Target(vec![
        "--database-url".into(),
        db.url(),
        "--schema".into(),
        db.schema.clone(),
    ]);
    let status = t.inoutbox(&["status", "--brokers", &broker.brokers]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    println!("{}", status.stdout);
    assert!(status.stdout.contains("KAFKA LAG"), "{}", status.stdout);
    let json = t
        .inoutbox(&["status", "--brokers", &broker.brokers, "--json"])
        .json();
    assert_eq!(json["groups"][0]["inbox_rows"], 3);
    assert_eq!(json["groups"][0]["dead_letters"], 1);
    let lags: Vec<(i64, i64)> = json["kafka_lag"]
        .as_array()
        .expect("kafka_lag")
        .iter()
        .filter_map(|l| Some((l["partition"].as_i64()?, l["lag"].as_i64()?)))
        .collect();
    assert_eq!(
        lags,
        [(0, 1)],
        "one message sent after the consumer stopped; partition 1 has no lag to show"
    );
    let impossible = &json["kafka_lag"][1];
    assert_eq!(
        (impossible["partition"].as_i64(), &impossible["lag"]),
        (Some(1), &Value::Null),
        "{json}"
    );
    let hint = format!("committed offset 1000 on {topic}/1, past its end (2)");
    assert!(
        impossible["impossible"]
            .as_str()
            .is_some_and(|h| h.contains(&hint)),
        "{json}"
    );
    assert!(
        status.stdout.contains(&format!("! group `cli` {hint}")),
        "{}",
        status.stdout
    );
    let id = t.inoutbox(&["dead-letters", "list", "--json"]).json()[0]["id"]
        .as_i64()
        .unwrap();
    let show = t.inoutbox(&["dead-letters", "show", &id.to_string()]);
    println!("{}", show.stdout);
    assert!(
        show.stdout.contains("\"total_cents\": \"lots\""),
        "{}",
        show.stdout
    );
}

/// Commits `offset` for `group` on `topic`/`partition`, as a member of no generation (the group
/// has no member).
fn commit(brokers: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut offsets = rdkafka::TopicPartitionList::new();
    offsets
        .add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .expect("offset");
    consumer
        .commit(&offsets, CommitMode::Sync)
        .expect("commit an offset past the end");
    assert_eq!(
        support::committed(brokers, group, topic, partition),
        Some(offset)
    );
}

/// The MySQL/MariaDB store's rows of the test: two dead letters (one not JSON, one refused
/// while the books are closed) and a processed event in group `cli-my`; the outbox rows
/// `seed_outbox` writes on PostgreSQL.
#[cfg(feature = "mysql")]
async fn seed_mysql(store: &inoutbox::MySqlStore) -> (i64, i64) {
    let pool = store.pool();
    sqlx::raw_sql(
        "CREATE TABLE books_closed (since datetime(6)); INSERT INTO books_closed VALUES (NOW(6)); \
         CREATE TABLE invoices (order_id varchar(64) NOT NULL, total_cents bigint);",
    )
    .execute(pool)
    .await
    .expect("books_closed");
    let inbox = Inbox::new(store.clone(), "cli-my", once()).expect("inbox");
    let malformed = dead_letter_id(&inbox, delivery(1, "CliOrder", MALFORMED)).await;
    let closed = dead_letter_id(&inbox, delivery(2, "CliOrder", &order(1200))).await;
    sqlx::raw_sql("DELETE FROM books_closed")
        .execute(pool)
        .await
        .unwrap();
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let ok = inbox
        .process(&delivery(3, "CliOrder", &order(700)), &shutdown)
        .await;
    assert!(matches!(ok, Outcome::Processed { .. }), "{ok:?}");
    for (key, parked, error, published) in [
        ("k-wait", false, None, None),
        ("k-bad", true, Some("first rejection"), None),
        ("k-bad", true, Some("Broker: Message size too large"), None),
        ("k-old", false, None, Some(10 * 86_400)),
        ("k-new", false, None, Some(3600)),
    ] {
        sqlx::query(
            "INSERT INTO inoutbox_outbox (id, type, topic, message_key, payload, headers, created_at, \
               attempts, last_error, parked_at, next_attempt_at, published_at) \
             VALUES (?, 'CliOrder', 'cli-orders', ?, '{}', '[]', NOW(6) - INTERVAL 90 SECOND, ?, ?, \
               IF(?, NOW(6), NULL), NOW(6), NOW(6) - INTERVAL ? SECOND)",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(key)
        .bind(if parked { 10 } else { 0 })
        .bind(error)
        .bind(parked)
        .bind(published)
        .execute(pool)
        .await
        .expect("insert outbox row");
    }
    // The effects `seed_effects` writes on PostgreSQL.
    sqlx::raw_sql(
        "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, \
           payload, created_at, attempts, done_at) VALUES \
         ('cli', '', 'e-1', 'mail', 'k-1', '{}', NOW(6) - INTERVAL 2 MINUTE, 3, NULL), \
         ('cli', '', 'e-2', 'mail', 'k-2', '{}', NOW(6), 0, NULL), \
         ('cli', '', 'e-3', 'mail', 'k-3', '{}', NOW(6) - INTERVAL 1 DAY, 1, NOW(6))",
    )
    .execute(pool)
    .await
    .expect("seed effects");
    (malformed, closed)
}

#[cfg(feature = "mysql")]
async fn mysql_count(store: &inoutbox::MySqlStore, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .expect(sql)
}

/// Every subcommand on MySQL/MariaDB (a database of its own), with what PostgreSQL prints.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_works_on_mysql() {
    let (name, url) = support::kit::mysql_database("cli").await;
    let t = Target(vec!["--database-url".into(), url.clone()]);
    let run = t.inoutbox(&["migrate"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "migrations applied\n"),
        "{}",
        run.stderr
    );
    let store = inoutbox::MySqlStore::connect(&url).await.expect("mysql");
    let (malformed, closed) = seed_mysql(&store).await;
    status_on_mysql(&t);
    dead_letters_listed_shown_replayed_discarded(&t, "cli-my", malformed, closed, async || {
        mysql_count(&store, "SELECT count(*) FROM invoices").await
    })
    .await;
    outbox_and_purge_on_mysql(&store, &t).await;
    // `--schema` names a database of its own, created by `migrate`.
    let other = format!("{name}_ops");
    let t = Target(vec![
        "--database-url".into(),
        url.clone(),
        "--schema".into(),
        other.clone(),
    ]);
    assert_eq!(t.inoutbox(&["migrate"]).code, 0);
    let s = t.inoutbox(&["status", "--json"]).json();
    assert_eq!(
        (
            s["groups"].as_array().map(Vec::len),
            s["outbox"]["unpublished"].as_i64()
        ),
        (Some(0), Some(0)),
        "the tables of database {other}, empty: {s}"
    );
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = ? \
         AND table_name = 'inoutbox_outbox'",
    )
    .bind(&other)
    .fetch_one(store.pool())
    .await
    .expect("information_schema");
    assert_eq!(tables, 1, "migrate created the outbox in database {other}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE `{other}`")))
        .execute(store.pool())
        .await
        .expect("drop the other database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE `{name}`")))
        .execute(store.pool())
        .await
        .expect("drop the database");
}

#[cfg(feature = "mysql")]
fn status_on_mysql(t: &Target) {
    effects_in_status(t);
    let run = t.inoutbox(&["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    println!("{}", run.stdout);
    for text in [
        "INBOX\nGROUP ",
        "cli-my ",
        "stuck rows (unprocessed for over 5m 0s): 0\n",
        "OUTBOX\nunpublished: 1, oldest 1m",
        "parked: 2\n",
        "held behind parked rows of their key (until unparked): 0\n",
        "scheduled (not due yet): 0\n",
        "Message size too large",
    ] {
        assert!(
            run.stdout.contains(text),
            "`{text}` missing:\n{}",
            run.stdout
        );
    }
    assert!(
        !run.stdout.contains("first rejection"),
        "the latest error per key:\n{}",
        run.stdout
    );
    let s = t.inoutbox(&["status", "--json"]).json();
    let group = &s["groups"][0];
    assert_eq!(group["group"], "cli-my");
    assert_eq!(
        (
            group["inbox_rows"].as_i64(),
            group["processed_last_minute"].as_i64(),
            group["dead_letters"].as_i64(),
            group["dead_letters_pending"].as_i64()
        ),
        (Some(1), Some(1), Some(2), Some(2)),
        "{s}"
    );
    assert_eq!(s["stuck"], 0);
    assert_eq!(
        (
            s["outbox"]["unpublished"].as_i64(),
            s["outbox"]["parked"].as_i64()
        ),
        (Some(1), Some(2))
    );
    let oldest = s["outbox"]["oldest_unpublished_secs"]
        .as_f64()
        .expect("an age");
    assert!((85.0..600.0).contains(&oldest), "{oldest}");
    let key = &s["outbox"]["parked_keys"][0];
    assert_eq!(
        (key["key"].as_str(), key["rows"].as_i64()),
        (Some("k-bad"), Some(2))
    );
    assert_eq!(key["last_error"], "Broker: Message size too large");
    let at = key["parked_at"].as_str().expect("parked at");
    assert!(
        at.len() == 20 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
        "{at}"
    );
}

#[cfg(feature = "mysql")]
async fn outbox_and_purge_on_mysql(store: &inoutbox::MySqlStore, t: &Target) {
    let unpark = t.inoutbox(&["outbox", "unpark", "k-bad", "--topic", "cli-orders"]);
    assert_eq!(
        (unpark.code, unpark.stdout.as_str()),
        (0, "unparked 2 row(s) of key `k-bad`\n"),
        "{}",
        unpark.stderr
    );
    let due = mysql_count(
        store,
        "SELECT count(*) FROM inoutbox_outbox WHERE message_key = 'k-bad' AND parked_at IS NULL \
         AND attempts = 0 AND next_attempt_at <= NOW(6)",
    )
    .await;
    assert_eq!(due, 2, "unparked rows are due again with fresh attempts");
    assert_eq!(
        t.inoutbox(&["outbox", "unpark", "--all"]).code,
        3,
        "nothing parked"
    );
    sqlx::raw_sql(
        "INSERT INTO inoutbox_inbox (consumer_group, event_id, event_type, processed_at) VALUES \
         ('cli-my', 'old', 'CliOrder', NOW(6) - INTERVAL 8 DAY), ('cli-my', 'unprocessed', 'CliOrder', NULL)",
    )
    .execute(store.pool())
    .await
    .expect("old inbox rows");
    let purge = t.inoutbox(&["purge", "--older-than", "7d", "--batch-size", "1", "--json"]);
    assert_eq!(purge.code, 0, "{}", purge.stderr);
    let purged = purge.json();
    assert_eq!(
        (
            purged["inbox_deleted"].as_i64(),
            purged["outbox_deleted"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        mysql_count(store, "SELECT count(*) FROM inoutbox_inbox").await,
        3
    );
    assert_eq!(
        mysql_count(store, "SELECT count(*) FROM inoutbox_outbox").await,
        4
    );
}

/// A wrong MySQL password: a clear error, exit code 1, the password hidden (text and JSON).
#[cfg(feature = "mysql")]
#[test]
fn a_wrong_mysql_password_is_a_clear_error_without_the_password() {
    let url = support::kit::mysql_url().replacen("mysql://root@", "mysql://root:hunter2-pw@", 1);
    assert!(
        url.contains("hunter2-pw"),
        "MYSQL_URL of root without a password: {url}"
    );
    for json in [false, true] {
        let mut args = vec!["--database-url", url.as_str(), "status"];
        if json {
            args.push("--json");
        }
        let run = inoutbox(&args);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(
            all.contains("cannot connect to mysql://root:***@") && all.contains("Access denied"),
            "{all}"
        );
        assert!(!all.contains("hunter2"), "a password is printed:\n{all}");
    }
}
