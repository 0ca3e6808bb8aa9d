//! Hostile input: any bytes in any header name or value, key or payload end as processed or
//! dead-lettered with the reason; nothing a producer sends crashes the consumer or stalls a
//! partition, and nothing it sends forges a log line.
//!
//! - `hostile_messages_end_processed_or_dead_lettered_and_never_crash_the_consumer`: every case
//!   goes to a real consumer process (the `billing` example) over a real broker (Tansu), one
//!   case per partition between two valid messages;
//! - the property tests run random headers, keys and payloads through the real inbox path
//!   (`Inbox::process`) on SQLite and PostgreSQL, without a broker.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inoutbox::inbox::{Delivery, Inbox, InboxConfig, OnExhausted};
use inoutbox::prelude::*;
use inoutbox::{Outcome, RetryPolicy};
use inoutbox_runtime::store::text::{inbox_id, sha256_hex};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde::{Deserialize, Serialize};
use support::child::ChildProcess;
use support::raw::{self, RawMsg};
use support::{Broker, TestDb};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

/// What a message must come to.
#[derive(Clone, Debug)]
enum Fate {
    Processed,
    /// Dead-lettered with a reason containing one of these.
    DeadLettered(&'static [&'static str]),
}

/// One hostile case: the messages sent between two valid ones on a partition of its own.
struct Case {
    name: &'static str,
    messages: Vec<(RawMsg, Fate)>,
}

const MIB: usize = 1024 * 1024;
/// The text a forged log line would start with.
const FORGED: &str = "FORGED";

fn order_json(order_id: Uuid, extra: Option<(&str, serde_json::Value)>) -> Vec<u8> {
    let mut value = serde_json::json!({"order_id": order_id, "total_cents": 100});
    if let Some((k, v)) = extra {
        value[k] = v;
    }
    serde_json::to_vec(&value).expect("json")
}

fn valid() -> RawMsg {
    RawMsg::cloudevent(
        Uuid::new_v4().to_string().as_bytes(),
        b"OrderCreated",
        order_json(Uuid::new_v4(), None),
    )
}

fn valid_with_id(id: &[u8]) -> RawMsg {
    RawMsg::cloudevent(id, b"OrderCreated", order_json(Uuid::new_v4(), None))
}

fn unique_id(prefix: &str) -> Vec<u8> {
    format!("{prefix}-{}", Uuid::new_v4()).into_bytes()
}

fn cases(big_payload: usize) -> Vec<Case> {
    use Fate::{DeadLettered, Processed};
    const NO_HANDLER: &[&str] = &["no handler for event type"];
    let case = |name, msg, fate| Case {
        name,
        messages: vec![(msg, fate)],
    };
    let nul_id = [unique_id("nul"), b"\0after-nul".to_vec()].concat();
    let newline_id = [
        unique_id("newline"),
        format!("\n{FORGED} inoutbox: processed order").into_bytes(),
    ]
    .concat();
    // A valid order, padded with a long string to `big_payload` bytes.
    let mut big = format!(
        r#"{{"order_id":"{}","total_cents":1,"pad":""#,
        Uuid::new_v4()
    )
    .into_bytes();
    big.resize(big_payload - 2, b'x');
    big.extend_from_slice(b"\"}");
    vec![
        case(
            "header name not UTF-8 (x-\\xff\\xfe)",
            valid().header(b"x-\xff\xfe", Some(b"v")),
            Processed,
        ),
        case(
            "header name not UTF-8, dead-lettered",
            RawMsg::cloudevent(&unique_id("hn"), b"NoSuchEvent", b"{}".to_vec())
                .header(b"x-\xff\xfe", Some(b"v")),
            DeadLettered(NO_HANDLER),
        ),
        case(
            "empty header name",
            valid().header(b"", Some(b"v")),
            Processed,
        ),
        case("ce_id containing NUL", valid_with_id(&nul_id), Processed),
        case(
            "ce_type containing NUL",
            RawMsg::cloudevent(&unique_id("t"), b"OrderCreated\0evil", b"{}".to_vec()),
            DeadLettered(NO_HANDLER),
        ),
        case(
            "JSON string with \\u0000 (a field the event ignores)",
            RawMsg::cloudevent(
                &unique_id("j"),
                b"OrderCreated",
                order_json(Uuid::new_v4(), Some(("note", "a\u{0}b".into()))),
            ),
            Processed,
        ),
        case(
            "JSON string with \\u0000 (the order id)",
            RawMsg::cloudevent(
                &unique_id("j"),
                b"OrderCreated",
                br#"{"order_id":"\u0000","total_cents":1}"#.to_vec(),
            ),
            DeadLettered(&["payload does not decode"]),
        ),
        case(
            "ce_id of 5000 bytes",
            valid_with_id(&[unique_id("long"), vec![b'L'; 5000 - 41]].concat()),
            Processed,
        ),
        Case {
            name: "ce_id \"  X  \" and \"X\"",
            messages: vec![
                (valid_with_id(b"  X  "), Processed),
                (valid_with_id(b"X"), Processed),
            ],
        },
        case(
            "newline in ce_type",
            RawMsg::cloudevent(
                &unique_id("nt"),
                format!("OrderCreated\n{FORGED} inoutbox: processed order").as_bytes(),
                b"{}".to_vec(),
            ),
            DeadLettered(NO_HANDLER),
        ),
        case("newline in ce_id", valid_with_id(&newline_id), Processed),
        case(
            "ce_id not UTF-8",
            valid_with_id(b"\xff\xfe\xfd-not-utf8"),
            DeadLettered(&["is not valid UTF-8"]),
        ),
        case(
            "payload over the 1 MiB limit",
            RawMsg::cloudevent(&unique_id("big"), b"OrderCreated", big),
            DeadLettered(&["exceeds the limit of 1048576 bytes"]),
        ),
        case(
            "empty payload",
            RawMsg::cloudevent(&unique_id("empty"), b"OrderCreated", Vec::new()),
            DeadLettered(&["payload does not decode", "message has no payload"]),
        ),
        case(
            "no payload (tombstone)",
            RawMsg::cloudevent(&unique_id("tomb"), b"OrderCreated", Vec::new()).payload(None),
            DeadLettered(&["message has no payload"]),
        ),
        case(
            "no headers at all",
            RawMsg::default().payload(Some(order_json(Uuid::new_v4(), None))),
            DeadLettered(&["missing or empty event id header `ce_id`"]),
        ),
        case(
            "key of arbitrary bytes",
            valid().key(b"\0\xff\xfe\n\"\\\x7f key"),
            Processed,
        ),
        case(
            "header value of arbitrary bytes (ce_source)",
            valid().header(b"ce_source", Some(b"\0\xff\n\xc3")),
            Processed,
        ),
    ]
}

/// What the database says became of one message.
#[derive(Debug)]
struct Letter {
    event_id: Option<String>,
    event_type: Option<String>,
    error: String,
    header_names: Vec<String>,
    stored_len: Option<i64>,
    payload_size: Option<i64>,
    payload_sha256: Option<String>,
    times: i32,
}

/// A dead-letter row: partition, offset, event id, event type, error, header names, stored
/// payload length, payload size, payload digest, times.
type LetterRow = (
    i32,
    i64,
    Option<String>,
    Option<String>,
    String,
    Vec<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    i32,
);

async fn letters(db: &TestDb) -> BTreeMap<(i32, i64), Letter> {
    let rows: Vec<LetterRow> = sqlx::query_as(
        "SELECT \"partition\", \"offset\", event_id, event_type, error, header_names, \
         octet_length(payload)::bigint, payload_size, payload_sha256, times FROM inoutbox_dead_letters",
    )
    .fetch_all(&db.pool)
    .await
    .expect("dead letters");
    rows.into_iter()
        .map(|r| {
            (
                (r.0, r.1),
                Letter {
                    event_id: r.2,
                    event_type: r.3,
                    error: r.4,
                    header_names: r.5,
                    stored_len: r.6,
                    payload_size: r.7,
                    payload_sha256: r.8,
                    times: r.9,
                },
            )
        })
        .collect()
}

async fn processed(db: &TestDb) -> BTreeMap<(i32, i64), String> {
    let rows: Vec<(i32, i64, String)> = sqlx::query_as(
        "SELECT \"partition\", \"offset\", event_id FROM inoutbox_inbox WHERE processed_at IS NOT NULL",
    )
    .fetch_all(&db.pool)
    .await
    .expect("inbox rows");
    rows.into_iter().map(|(p, o, id)| ((p, o), id)).collect()
}

async fn invoices_for(db: &TestDb, payload: &[u8]) -> i64 {
    let order: OrderCreated = serde_json::from_slice(payload).expect("a valid order");
    db.count(&format!(
        "SELECT count(*) FROM invoices WHERE order_id = '{}'",
        order.order_id
    ))
    .await
}

/// Sends the over-limit payload at 5 MiB, or at the largest size above 1 MiB the broker takes.
async fn big_payload_size(broker: &Broker) -> usize {
    let topic = support::unique("probe");
    broker.create_topic(&topic, 1).await;
    let producer = raw::producer(&broker.brokers, 8 * MIB);
    for size in [5 * MIB, 4 * MIB, 3 * MIB, 2 * MIB, MIB + MIB / 2] {
        let msg = RawMsg::default().payload(Some(vec![b'x'; size]));
        match raw::send(&producer, &topic, 0, &msg).await {
            Ok(_) => return size,
            Err(e) => println!("the broker refuses a payload of {size} bytes: {e}"),
        }
    }
    panic!("the broker accepts no payload above 1 MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_messages_end_processed_or_dead_lettered_and_never_crash_the_consumer() {
    let broker = Broker::start();
    let db = TestDb::new("hostile").await;
    db.migrated_store().await;
    let big = big_payload_size(&broker).await;
    let cases = cases(big);
    let topic = support::unique("hostile");
    broker.create_topic(&topic, cases.len() as i32).await;
    let producer = raw::producer(&broker.brokers, 8 * MIB);

    // Partition p: a valid message, the case's message(s), a valid message.
    let mut sent: Vec<Vec<(i64, RawMsg, Fate)>> = Vec::new();
    for (p, case) in cases.iter().enumerate() {
        let partition = p as i32;
        let mut list = vec![(valid(), Fate::Processed)];
        list.extend(case.messages.iter().cloned());
        list.push((valid(), Fate::Processed));
        let mut on_partition = Vec::new();
        for (msg, fate) in list {
            let offset = raw::send(&producer, &topic, partition, &msg)
                .await
                .unwrap_or_else(|e| panic!("{}: produce: {e}", case.name));
            on_partition.push((offset, msg, fate));
        }
        sent.push(on_partition);
    }
    let total: usize = sent.iter().map(Vec::len).sum();

    let mut child = ChildProcess::start_with_env(
        "billing",
        &db,
        &broker.brokers,
        &["--topic", &topic],
        None,
        &[("RUST_LOG", "info")],
    );
    let started = Instant::now();
    let resolved_sql =
        "SELECT (SELECT count(*) FROM inoutbox_inbox WHERE processed_at IS NOT NULL) \
                        + (SELECT count(*) FROM inoutbox_dead_letters)";
    while db.count(resolved_sql).await < total as i64 {
        assert!(
            child.is_running(),
            "the consumer died:\n{}",
            child.lines().join("\n")
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "only {} of {total} messages resolved in 120 s:\n{}",
            db.count(resolved_sql).await,
            child.lines().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut committed = Vec::new();
    for (p, on_partition) in sent.iter().enumerate() {
        let end = on_partition.last().expect("messages").0 + 1;
        let at = support::wait_committed(&broker.brokers, "billing", &topic, p as i32, end).await;
        committed.push((end, at));
    }

    let (inbox, dead) = (processed(&db).await, letters(&db).await);
    let mut failures = Vec::new();
    println!(
        "\nhostile input: {} cases, {total} messages on {} partitions, payload over the limit {big} bytes",
        cases.len(),
        cases.len()
    );
    for (p, (case, on_partition)) in cases.iter().zip(&sent).enumerate() {
        let partition = p as i32;
        for (i, (offset, msg, fate)) in on_partition.iter().enumerate() {
            let at = (partition, *offset);
            let role = if i == 0 || i == on_partition.len() - 1 {
                "valid"
            } else {
                case.name
            };
            let observed = match (inbox.get(&at), dead.get(&at)) {
                (Some(id), None) => format!("processed (inbox id {})", shorten(id)),
                (None, Some(l)) => format!("dead-lettered: {}", shorten(&l.error)),
                (None, None) => "nothing recorded".to_owned(),
                (Some(_), Some(_)) => "processed AND dead-lettered".to_owned(),
            };
            if role != "valid" {
                println!("  p{partition:<2} {role:<52} {observed}");
            }
            let ok = match fate {
                Fate::Processed => {
                    inbox.contains_key(&at)
                        && !dead.contains_key(&at)
                        && invoices_for(&db, msg.payload.as_deref().unwrap_or_default()).await == 1
                }
                Fate::DeadLettered(reasons) => {
                    !inbox.contains_key(&at)
                        && dead
                            .get(&at)
                            .is_some_and(|l| reasons.iter().any(|r| l.error.contains(r)))
                }
            };
            if !ok {
                failures.push(format!(
                    "p{partition} @{offset} ({role}): expected {fate:?}, observed {observed}"
                ));
            }
        }
        let (end, at) = committed[p];
        if at != Some(end) {
            failures.push(format!(
                "p{partition} ({}): committed {at:?}, expected {end}",
                case.name
            ));
        }
    }

    // What the stored rows say about the text and bytes they were given.
    let case_at = |name: &str| {
        let p = cases
            .iter()
            .position(|c| c.name.starts_with(name))
            .expect(name);
        (p as i32, &sent[p])
    };
    let (p, msgs) = case_at("ce_id containing NUL");
    let id = header(&msgs[1].1, b"ce_id");
    let stored = inbox.get(&(p, msgs[1].0)).cloned().unwrap_or_default();
    check(
        &mut failures,
        stored == inbox_id(std::str::from_utf8(&id).unwrap()),
        || format!("NUL id keyed as {stored:?}"),
    );
    check(&mut failures, stored.starts_with("sha256:"), || {
        format!("NUL id keyed as {stored:?}")
    });
    let (p, msgs) = case_at("ce_id of 5000 bytes");
    let id = header(&msgs[1].1, b"ce_id");
    let stored = inbox.get(&(p, msgs[1].0)).cloned().unwrap_or_default();
    check(
        &mut failures,
        stored == inbox_id(std::str::from_utf8(&id).unwrap()) && stored.len() == 71,
        || format!("5000-byte id keyed as {stored:?}"),
    );
    let (p, msgs) = case_at("ce_id \"  X  \"");
    let ids: HashSet<_> = [msgs[1].0, msgs[2].0]
        .iter()
        .filter_map(|o| inbox.get(&(p, *o)).cloned())
        .collect();
    check(
        &mut failures,
        ids == HashSet::from(["  X  ".to_owned(), "X".to_owned()]),
        || format!("\"  X  \" and \"X\" keyed as {ids:?}: ids must be taken verbatim"),
    );
    let (p, msgs) = case_at("ce_type containing NUL");
    let t = dead
        .get(&(p, msgs[1].0))
        .and_then(|l| l.event_type.clone())
        .unwrap_or_default();
    check(&mut failures, t == "OrderCreated\u{FFFD}evil", || {
        format!("a NUL in the type stored as {t:?}")
    });
    let (p, msgs) = case_at("header name not UTF-8, dead-lettered");
    let names = dead
        .get(&(p, msgs[1].0))
        .map(|l| l.header_names.clone())
        .unwrap_or_default();
    check(
        &mut failures,
        names.contains(&"x-\\xff\\xfe".to_owned()),
        || format!("header names stored as {names:?}"),
    );
    let (p, msgs) = case_at("payload over the 1 MiB limit");
    let payload = msgs[1].1.payload.clone().unwrap_or_default();
    match dead.get(&(p, msgs[1].0)) {
        Some(l) => check(
            &mut failures,
            l.stored_len == Some(MIB as i64)
                && l.payload_size == Some(payload.len() as i64)
                && l.payload_sha256.as_deref() == Some(sha256_hex(&payload).as_str())
                && l.times == 1,
            || format!("the over-limit payload's letter: {l:?}"),
        ),
        None => failures.push("the over-limit payload has no dead letter".into()),
    }
    let (p, msgs) = case_at("no headers at all");
    let event_id = dead.get(&(p, msgs[1].0)).map(|l| l.event_id.clone());
    check(&mut failures, event_id == Some(None), || {
        format!("a message without id stored with event id {event_id:?}")
    });

    // No crash, no forged line, a clean stop.
    assert!(
        child.is_running(),
        "the consumer died:\n{}",
        child.lines().join("\n")
    );
    let panics: Vec<_> = child
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("panicked"))
        .collect();
    check(&mut failures, panics.is_empty(), || {
        format!("the consumer panicked: {panics:#?}")
    });
    let lines = child.lines();
    let forged: Vec<_> = lines.iter().filter(|l| l.starts_with(FORGED)).collect();
    check(&mut failures, forged.is_empty(), || {
        format!("a producer forged log lines: {forged:#?}")
    });
    let escaped = lines.iter().any(|l| l.contains(&format!("\\n{FORGED}")));
    check(&mut failures, escaped, || {
        "the newline ids and types should be logged escaped (`\\n`)".into()
    });
    let status = child.terminate();
    check(&mut failures, status.success(), || {
        format!("graceful stop exited with {status}")
    });
    println!(
        "{} messages resolved in {:.1} s; {} log lines, none forged; consumer alive until SIGTERM",
        total,
        started.elapsed().as_secs_f64(),
        lines.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn header(msg: &RawMsg, name: &[u8]) -> Vec<u8> {
    msg.headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn check(failures: &mut Vec<String>, ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        failures.push(what());
    }
}

fn shorten(s: &str) -> String {
    let escaped = format!("{s:?}");
    if escaped.len() <= 90 {
        escaped
    } else {
        let mut end = 90;
        while !escaped.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &escaped[..end])
    }
}

// =============================================================================================
// The inbox path without a broker: `Inbox::process` on random deliveries.

static META_IDS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "hostile-meta")]
async fn records_the_id(
    event: OrderCreated,
    tx: &mut inoutbox::SqliteTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    let _ = (event, tx);
    META_IDS.lock().unwrap().push(meta.event_id.clone());
    Ok(())
}

#[inbox_handler(event = "OrderCreated", group = "hostile-prop")]
async fn prop_sqlite(
    event: OrderCreated,
    tx: &mut inoutbox::SqliteTx<'_>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[inbox_handler(event = "OrderCreated", group = "hostile-prop")]
async fn prop_postgres(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A fresh SQLite database in a temporary directory, migrated, with an invoices table.
async fn sqlite_store(dir: &support::kit::TempDir) -> inoutbox::SqliteStore {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let options = SqliteConnectOptions::new()
        .filename(dir.0.join("hostile.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Off)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("open SQLite");
    sqlx::raw_sql(
        "CREATE TABLE invoices (id integer PRIMARY KEY AUTOINCREMENT, order_id blob NOT NULL, \
         total_cents integer NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("invoices");
    let store = inoutbox::SqliteStore::new(pool);
    store.migrate().await.expect("migrate");
    store
}

fn delivery(offset: i64, headers: Vec<(String, Option<Vec<u8>>)>, payload: &[u8]) -> Delivery {
    Delivery {
        topic: "hostile".into(),
        partition: 0,
        offset,
        key: None,
        payload: Some(payload.to_vec()),
        headers,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_sees_the_raw_id_while_the_inbox_keys_on_its_digest() {
    let dir = support::kit::TempDir::new("hostile-meta");
    let store = sqlite_store(&dir).await;
    let inbox = Inbox::new(store.clone(), "hostile-meta", InboxConfig::default()).unwrap();
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let ids = [
        "nul\0inside".to_owned(),
        "L".repeat(5000),
        "  X  ".to_owned(),
        "X".to_owned(),
        "new\nline".to_owned(),
    ];
    let payload = order_json(Uuid::new_v4(), None);
    for (i, id) in ids.iter().enumerate() {
        let headers = vec![
            ("ce_id".to_owned(), Some(id.as_bytes().to_vec())),
            ("ce_type".to_owned(), Some(b"OrderCreated".to_vec())),
        ];
        let d = delivery(i as i64, headers, &payload);
        assert_eq!(
            inbox.process(&d, &shutdown).await,
            Outcome::Processed { attempt: 1 },
            "{id:?}"
        );
        assert_eq!(inbox.process(&d, &shutdown).await, Outcome::Duplicate);
    }
    assert_eq!(
        *META_IDS.lock().unwrap(),
        ids,
        "the handler sees ids as sent"
    );
    let pool = store.pool().clone();
    let mut keyed: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM inoutbox_inbox ORDER BY \"offset\"")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<String> = ids.iter().map(|id| inbox_id(id).into_owned()).collect();
    assert_eq!(keyed, expected);
    keyed.truncate(2);
    assert!(keyed
        .iter()
        .all(|k| k.starts_with("sha256:") && k.len() == 71));
}

/// A header name as a transport hands it over: any bytes, invalid UTF-8 escaped.
fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("ce_id".to_owned()),
        4 => Just("ce_type".to_owned()),
        1 => Just("ce_source".to_owned()),
        2 => proptest::collection::vec(any::<u8>(), 0..12)
            .prop_map(|b| inoutbox_runtime::store::text::header_name(&b)),
    ]
}

/// Header values: text with NUL and newlines, invalid UTF-8, long runs, nothing at all.
fn header_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        2 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some),
        2 => "[a-zA-Z0-9 \\x00\\n\\r\\t\"'\\\\é€]{0,30}".prop_map(|s| Some(s.into_bytes())),
        1 => (190usize..6000).prop_map(|n| Some(vec![b'L'; n])),
        1 => Just(None),
        1 => Just(Some(Vec::new())),
    ]
}

/// An event id: mostly from a small pool (so duplicates happen), or anything.
fn id_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        3 => (0u8..6).prop_map(|n| Some(format!("id-{n}").into_bytes())),
        2 => any::<u64>().prop_map(|n| Some(format!("id-{n}").into_bytes())),
        3 => header_value(),
    ]
}

/// An event type: mostly the handled one.
fn type_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        4 => Just(Some(b"OrderCreated".to_vec())),
        2 => header_value(),
    ]
}

fn payload() -> impl Strategy<Value = Option<Vec<u8>>> {
    let json_string = "[a-z\\x00\\n\"\\\\é]{0,12}";
    prop_oneof![
        8 => (any::<u128>(), any::<i64>()).prop_map(|(u, c)| Some(
            serde_json::to_vec(&serde_json::json!({"order_id": Uuid::from_u128(u), "total_cents": c})).unwrap()
        )),
        3 => (any::<u128>(), json_string).prop_map(|(u, s)| Some(
            serde_json::to_vec(&serde_json::json!({"order_id": Uuid::from_u128(u), "total_cents": 1, "note": s})).unwrap()
        )),
        1 => json_string.prop_map(|s| Some(
            serde_json::to_vec(&serde_json::json!({"order_id": s, "total_cents": 1})).unwrap()
        )),
        3 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Some),
        1 => (4000usize..6000).prop_map(|n| Some(vec![b'{'; n])),
        1 => Just(None),
        1 => Just(Some(Vec::new())),
    ]
}

/// A delivery: usually a `ce_id` and a `ce_type` header, with random headers before or after
/// them (a random header of the same name may come first and win), a random payload and key.
fn deliveries() -> impl Strategy<Value = Delivery> {
    (
        proptest::option::weighted(0.85, id_value()),
        proptest::option::weighted(0.85, type_value()),
        proptest::collection::vec((header_name(), header_value()), 0..4),
        any::<bool>(),
        payload(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
    )
        .prop_map(|(id, event_type, extra, extra_first, payload, key)| {
            let mut headers: Vec<(String, Option<Vec<u8>>)> = Vec::new();
            if let Some(id) = id {
                headers.push(("ce_id".to_owned(), id));
            }
            if let Some(event_type) = event_type {
                headers.push(("ce_type".to_owned(), event_type));
            }
            if extra_first {
                headers.splice(0..0, extra);
            } else {
                headers.extend(extra);
            }
            Delivery {
                topic: "hostile".into(),
                partition: 0,
                offset: 0,
                key,
                payload,
                headers,
            }
        })
}

/// Runs `cases` random deliveries through `inbox`; returns how many ended in each outcome.
fn envelope_property<S: inoutbox::store::InboxStore>(
    rt: &tokio::runtime::Handle,
    inbox: &Inbox<S>,
    cases: u32,
) -> BTreeMap<&'static str, usize> {
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let offsets = AtomicUsize::new(0);
    let outcomes = Mutex::new(BTreeMap::new());
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&deliveries(), |mut d| {
            d.offset = offsets.fetch_add(1, Ordering::SeqCst) as i64;
            let outcome = rt.block_on(inbox.process(&d, &shutdown));
            prop_assert!(
                matches!(
                    outcome,
                    Outcome::Processed { .. }
                        | Outcome::Duplicate
                        | Outcome::DeadLettered { .. }
                        | Outcome::Skipped { .. }
                ),
                "{outcome:?} for {d:?}"
            );
            *outcomes.lock().unwrap().entry(outcome.label()).or_insert(0) += 1;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let outcomes = outcomes.into_inner().unwrap();
    let runs: usize = outcomes.values().sum();
    assert!(runs >= cases as usize, "{runs} runs for {cases} cases");
    outcomes
}

fn prop_config() -> InboxConfig {
    let mut config = InboxConfig::default();
    config.retry = RetryPolicy::no_retries();
    config.on_exhausted = OnExhausted::DeadLetter;
    config.max_payload_bytes = 4096;
    config.dead_letter_payload_bytes = 1024;
    config
}

#[test]
fn random_envelopes_through_the_sqlite_inbox_end_in_an_outcome() {
    const CASES: u32 = 2000;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = support::kit::TempDir::new("hostile-prop");
    let store = rt.block_on(sqlite_store(&dir));
    let inbox = Inbox::new(store, "hostile-prop", prop_config()).unwrap();
    let outcomes = envelope_property(rt.handle(), &inbox, CASES);
    println!("sqlite: {CASES} random envelopes through Inbox::process: {outcomes:?}");
    assert!(outcomes.contains_key("processed") && outcomes.contains_key("dead-lettered"));
}

#[test]
fn random_envelopes_through_the_postgres_inbox_end_in_an_outcome() {
    const CASES: u32 = 1000;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::new("hostileprop"));
    let store = rt.block_on(db.migrated_store());
    let inbox = Inbox::new(store, "hostile-prop", prop_config()).unwrap();
    let outcomes = envelope_property(rt.handle(), &inbox, CASES);
    println!("postgres: {CASES} random envelopes through Inbox::process: {outcomes:?}");
    assert!(outcomes.contains_key("processed") && outcomes.contains_key("dead-lettered"));
}

// MySQL/MariaDB: the same property, and keys that differ only by trailing spaces.

#[cfg(feature = "mysql")]
#[inbox_handler(event = "OrderCreated", group = "hostile-prop")]
async fn prop_mysql(
    event: OrderCreated,
    tx: &mut inoutbox::MySqlTx<'_>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[cfg(feature = "mysql")]
#[inbox_handler(event = "OrderCreated", group = "hostile-mykeys")]
async fn mysql_keys(
    event: OrderCreated,
    tx: &mut inoutbox::MySqlTx<'_>,
) -> Result<(), HandlerError> {
    let _ = (event, tx);
    Ok(())
}

/// A fresh MariaDB database, migrated, with an invoices table.
#[cfg(feature = "mysql")]
async fn mysql_store(name: &str) -> inoutbox::MySqlStore {
    let (_db, url) = support::kit::mysql_database(name).await;
    let store = inoutbox::MySqlStore::connect(&url)
        .await
        .expect("connect to MariaDB");
    sqlx::raw_sql(
        "CREATE TABLE invoices (id bigint AUTO_INCREMENT PRIMARY KEY, order_id binary(16) NOT NULL, \
         total_cents bigint NOT NULL)",
    )
    .execute(store.pool())
    .await
    .expect("invoices");
    store.migrate().await.expect("migrate");
    store
}

#[cfg(feature = "mysql")]
#[test]
fn random_envelopes_through_the_mysql_inbox_end_in_an_outcome() {
    const CASES: u32 = 1000;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(mysql_store("hostileprop"));
    let inbox = Inbox::new(store, "hostile-prop", prop_config()).unwrap();
    let outcomes = envelope_property(rt.handle(), &inbox, CASES);
    println!("mysql: {CASES} random envelopes through Inbox::process: {outcomes:?}");
    assert!(outcomes.contains_key("processed") && outcomes.contains_key("dead-lettered"));
}

/// MySQL's text collations ignore trailing spaces: the inbox keys are bytes, so `X` and `X `
/// are two events, and an over-long id or one with NUL keys on its digest.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_inbox_keys_are_exact_bytes() {
    let store = mysql_store("hostilekeys").await;
    let inbox = Inbox::new(store.clone(), "hostile-mykeys", InboxConfig::default()).unwrap();
    let shutdown = inoutbox::shutdown::CancellationToken::new();
    let ids = [
        "X".to_owned(),
        "X ".to_owned(),
        "x".to_owned(),
        " X".to_owned(),
        "nul\0inside".to_owned(),
        "L".repeat(5000),
        "é€\u{1F600}".to_owned(),
    ];
    let payload = order_json(Uuid::new_v4(), None);
    for (i, id) in ids.iter().enumerate() {
        let headers = vec![
            ("ce_id".to_owned(), Some(id.as_bytes().to_vec())),
            ("ce_type".to_owned(), Some(b"OrderCreated".to_vec())),
        ];
        let d = delivery(i as i64, headers, &payload);
        assert_eq!(
            inbox.process(&d, &shutdown).await,
            Outcome::Processed { attempt: 1 },
            "{id:?}"
        );
        assert_eq!(
            inbox.process(&d, &shutdown).await,
            Outcome::Duplicate,
            "{id:?}"
        );
    }
    let keyed: Vec<String> =
        sqlx::query_scalar("SELECT CAST(event_id AS CHAR) FROM inoutbox_inbox ORDER BY `offset`")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let expected: Vec<String> = ids.iter().map(|id| inbox_id(id).into_owned()).collect();
    assert_eq!(keyed, expected);
}
