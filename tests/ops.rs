//! Operations: the metrics a Prometheus scrape finds (served as `examples/ops.rs` serves them),
//! the health probes, and the store queries behind the gauges, on PostgreSQL and SQLite.
//!
//! The scrape test (feature `http`) installs the process-wide `metrics` recorder and serves
//! `inoutbox::ops::OpsEndpoint`: it is the only test of this binary that records metrics.

// Without `http` only the store queries behind the gauges are tested here.
#![cfg_attr(not(feature = "http"), allow(unused))]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use inoutbox::inbox::{Backoff, Delivery, Inbox, InboxConfig};
use inoutbox::kafka::InProcessKafka;
use inoutbox::prelude::*;
use inoutbox::relay::{Backlog, IntoRelayStore, RelayStore};
use inoutbox::store::{DeadLetter, InboxStore};
use inoutbox::telemetry::metric;
use inoutbox::{Consumer, Outcome, Relay, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::TestDb;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

const GROUP: &str = "ops-billing";
const ORDERS: i64 = 10;
/// While set, the order with a negative total fails for good (and is dead-lettered).
static POISON: AtomicBool = AtomicBool::new(true);

/// One invoice per order; a negative total is refused while [`POISON`] is set; the order of
/// 1005 cents fails once (a retry).
#[inbox_handler(event = "OrderCreated", group = "ops-billing")]
async fn bill(
    event: OrderCreated,
    tx: &mut PgTx<'_>,
    meta: &MessageMeta,
) -> Result<(), HandlerError> {
    if event.total_cents < 0 && POISON.load(Ordering::SeqCst) {
        return Err(HandlerError::permanent("negative total"));
    }
    if event.total_cents == 1005 && meta.attempt == 1 {
        return Err(HandlerError::transient("payment service timed out"));
    }
    sqlx::query("INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **tx)
        .await?;
    inoutbox::effects::after_commit(tx, meta, "receipt", &event.total_cents).await?;
    Ok(())
}

/// The value of the sample `name{labels...}` in a Prometheus text scrape (every label given
/// must be on the line).
fn value(scrape: &str, name: &str, labels: &[&str]) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let (series, v) = line.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|l| rest.contains(l)))
            .then(|| v.parse().ok())
            .flatten()
    })
}

/// Scrapes until `done` holds for the scrape (or 60 s pass); returns the last scrape.
async fn scrape_until(addr: SocketAddr, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let scrape = match support::http_get(addr, "/metrics").await {
            Ok((200, body)) => body,
            other => format!("{other:?}"),
        };
        if done(&scrape) || tokio::time::Instant::now() > deadline {
            return scrape;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrape_shows_what_the_inbox_and_outbox_did_and_health_follows_the_consumer() {
    let prometheus = inoutbox::ops::install_prometheus().expect("install the Prometheus recorder");
    let db = TestDb::new("ops").await;
    let store = db.migrated_store().await;
    let kafka = InProcessKafka::start().expect("in-process kafka");
    kafka.create_topic("orders", 3).expect("topic");

    let relay = Relay::builder(
        store.clone(),
        inoutbox::kafka::KafkaProducer::new(kafka.brokers()),
    )
    .poll_interval(Duration::from_millis(50))
    .sample_interval(Duration::from_millis(200))
    .retention(None)
    .build()
    .expect("relay");
    let kafka_config = kafka.consumer_config(["orders"]);
    let fast = Backoff::new(Duration::from_millis(10), Duration::from_millis(10));
    // Effects: the receipt of 1001 cents fails once (a retry); an effect another process
    // holds, failed twice, an hour old, is counted by the gauges.
    sqlx::raw_sql(
        "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, \
           payload, created_at, attempts, lease_owner, lease_until) \
         VALUES ('ops-billing', '', 'held', 'receipt', 'held', '1', now() - interval '1 hour', 2, \
           'another-process', now() + interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .expect("a held effect");
    let consumer = Consumer::builder(GROUP, store.clone(), kafka_config)
        .retry(RetryPolicy::default().max_attempts(3).backoff(fast))
        .effect("receipt", |effect: inoutbox::effects::Effect| async move {
            if effect.payload == b"1001" && effect.attempt == 1 {
                return Err(HandlerError::transient("receipt service timed out"));
            }
            Ok(())
        })
        .sample_interval(Duration::from_millis(200))
        .build()
        .expect("consumer");
    let (consumer_health, relay_health) = (consumer.health(), relay.health());
    assert!(
        !consumer_health.live() && !relay_health.live(),
        "not live before run"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (metrics_addr, health_addr) = (
        listener.local_addr().unwrap(),
        listener.local_addr().unwrap(),
    );
    let endpoint = inoutbox::ops::OpsEndpoint::new()
        .metrics(prometheus)
        .part("consumer", consumer_health.clone())
        .part("relay", relay_health.clone());
    tokio::spawn(endpoint.serve(listener, inoutbox::shutdown::CancellationToken::new()));
    let (stop_consumer, consumer_stopped) = tokio::sync::oneshot::channel::<()>();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(relay.run(async move {
        let _ = relay_stopped.await;
    }));
    let consumer_task = tokio::spawn(consumer.run(async move {
        let _ = consumer_stopped.await;
    }));

    for i in 0..ORDERS {
        let total_cents = if i == 3 { -1 } else { 1000 + i };
        let mut tx = db.pool.begin().await.unwrap();
        let event = OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents,
        };
        inoutbox::outbox::enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();
    }

    let by_type = [
        &*format!("group=\"{GROUP}\""),
        "event_type=\"OrderCreated\"",
    ];
    let orders = ["topic=\"orders\""];
    let group = [&*format!("group=\"{GROUP}\"")];
    let scrape = scrape_until(metrics_addr, |s| {
        value(s, metric::INBOX_PROCESSED, &by_type) == Some(9.0)
            && value(s, metric::INBOX_DEAD_LETTERED, &by_type) == Some(1.0)
            && value(s, metric::OUTBOX_PUBLISHED, &orders) == Some(10.0)
            && value(s, metric::OUTBOX_UNPUBLISHED, &[]) == Some(0.0)
            && value(s, metric::INBOX_DEAD_LETTERS, &group) == Some(1.0)
            && value(s, metric::EFFECTS_ATTEMPTS, &group) == Some(10.0)
            && value(s, metric::EFFECTS_PENDING, &group) == Some(1.0)
            && (0..3).all(|p| {
                let partition = format!("partition=\"{p}\"");
                value(s, metric::CONSUMER_LAG, &[&partition, orders[0]]) == Some(0.0)
            })
    })
    .await;
    for m in metric::ALL {
        assert!(
            scrape.contains(m.name),
            "{} missing from the scrape:\n{scrape}",
            m.name
        );
    }
    let expect = |name: &str, labels: &[&str], want: f64| {
        assert_eq!(
            value(&scrape, name, labels),
            Some(want),
            "{name} {labels:?} in:\n{scrape}"
        );
    };
    expect(metric::INBOX_PROCESSED, &by_type, 9.0);
    expect(metric::INBOX_DEAD_LETTERED, &by_type, 1.0);
    expect(metric::INBOX_RETRIES, &by_type, 1.0);
    expect(metric::INBOX_DUPLICATES, &by_type, 0.0);
    expect(metric::OUTBOX_PUBLISHED, &orders, 10.0);
    expect(metric::OUTBOX_PARKED, &orders, 0.0);
    expect(metric::OUTBOX_UNPUBLISHED, &[], 0.0);
    expect(metric::OUTBOX_PARKED_ROWS, &[], 0.0);
    expect(metric::INBOX_DEAD_LETTERS, &group, 1.0);
    expect(metric::INBOX_STUCK, &group, 0.0);
    // Nine receipts, one run twice; the held effect counted, not run.
    expect(metric::EFFECTS_ATTEMPTS, &group, 10.0);
    expect(metric::EFFECTS_RETRIES, &group, 1.0);
    expect(
        &format!("{}_count", metric::EFFECTS_RUN_DURATION),
        &group,
        10.0,
    );
    expect(metric::EFFECTS_PENDING, &group, 1.0);
    expect(metric::EFFECTS_FAILED, &group, 1.0);
    let oldest = value(&scrape, metric::EFFECTS_OLDEST_PENDING_AGE, &group);
    assert!(
        oldest.is_some_and(|age| (3600.0..7200.0).contains(&age)),
        "the held effect is an hour old: {oldest:?}"
    );
    expect(metric::INBOX_DEFERRED_PENDING, &group, 0.0);
    expect(metric::INBOX_DEFERRED, &by_type, 0.0);
    expect(&format!("{}_count", metric::INBOX_EVENT_AGE), &by_type, 9.0);
    expect(
        &format!("{}_count", metric::OUTBOX_PUBLISH_LATENCY),
        &orders,
        10.0,
    );
    let runs = value(
        &scrape,
        &format!("{}_count", metric::INBOX_HANDLER_DURATION),
        &by_type,
    );
    assert!(
        runs.is_some_and(|n| n >= 11.0),
        "9 successes, 1 retry, 1 poisoned: {runs:?}"
    );
    let batched = value(
        &scrape,
        &format!("{}_sum", metric::INBOX_BATCH_SIZE),
        &group,
    );
    assert!(
        batched.is_some_and(|n| n >= 10.0),
        "every message in a batch: {batched:?}"
    );

    // Health: both live and ready, over HTTP.
    let (status, body) = support::http_get(health_addr, "/readyz").await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"consumer\":{\"database\":true,\"joined\":true"),
        "{body}"
    );
    assert!(
        body.contains("\"relay\":{\"database\":true,\"joined\":true"),
        "{body}"
    );
    assert!(consumer_health.last_cycle().is_some() && relay_health.last_cycle().is_some());
    assert_eq!(
        support::http_get(health_addr, "/healthz").await.unwrap().0,
        200
    );

    // A replay counts as replayed, and the dead-letter gauge goes back to 0.
    POISON.store(false, Ordering::SeqCst);
    let id: i64 = sqlx::query_scalar("SELECT id FROM inoutbox_dead_letters")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let inbox = Inbox::new(store.clone(), GROUP, InboxConfig::default()).unwrap();
    let replayed = inbox.replay(id).await.expect("replay");
    assert!(
        matches!(replayed, Outcome::Processed { .. }),
        "{replayed:?}"
    );
    let scrape = scrape_until(metrics_addr, |s| {
        value(s, metric::INBOX_DEAD_LETTERS, &group) == Some(0.0)
    })
    .await;
    expect_in(&scrape, metric::INBOX_REPLAYED, &by_type, 1.0);
    expect_in(&scrape, metric::INBOX_PROCESSED, &by_type, 10.0);
    expect_in(&scrape, metric::INBOX_DEAD_LETTERS, &group, 0.0);

    // Stopped: no longer live, so neither probe passes.
    let _ = stop_consumer.send(());
    consumer_task.await.unwrap().expect("consumer run");
    assert!(!consumer_health.live() && !consumer_health.ready());
    let (status, body) = support::http_get(health_addr, "/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("\"consumer\":{\"database\":true,\"joined\":false"),
        "{body}"
    );
    assert_eq!(
        support::http_get(health_addr, "/healthz").await.unwrap().0,
        503
    );
    let _ = stop_relay.send(());
    relay_task.await.unwrap().expect("relay run");
    assert!(!relay_health.live());
}

fn expect_in(scrape: &str, name: &str, labels: &[&str], want: f64) {
    assert_eq!(
        value(scrape, name, labels),
        Some(want),
        "{name} {labels:?} in:\n{scrape}"
    );
}

/// What the gauges read, checked on one backend: three events, one parked, one published;
/// a dead letter of the group, then replayed; the group's effects not done (one failed, one
/// done not counted).
async fn backlog_and_dead_letters_are_counted<S>(store: S, exec: impl AsyncFn(&str))
where
    S: InboxStore + IntoRelayStore + Clone,
    S::Tx: inoutbox::outbox::OutboxTx,
{
    let relay = store.clone().into_relay_store();
    assert_eq!(relay.backlog().await.unwrap(), Backlog::new(0, None, 0));
    for i in 0..3 {
        let mut tx = store.begin().await.unwrap();
        let event = OrderCreated {
            order_id: Uuid::new_v4(),
            total_cents: i,
        };
        inoutbox::outbox::enqueue(&mut tx, &event).await.unwrap();
        store.commit(tx).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    exec("UPDATE inoutbox_outbox SET parked_at = published_at_now WHERE seq = (SELECT min(seq) FROM inoutbox_outbox)").await;
    exec("UPDATE inoutbox_outbox SET published_at = published_at_now WHERE seq = (SELECT max(seq) FROM inoutbox_outbox)").await;
    let backlog = relay.backlog().await.unwrap();
    assert_eq!((backlog.unpublished, backlog.parked), (1, 1), "{backlog:?}");
    let age = backlog
        .oldest_unpublished_age
        .expect("an unpublished row has an age");
    assert!(
        age >= Duration::from_millis(250) && age < Duration::from_secs(60),
        "{age:?}"
    );

    assert_eq!(store.count_dead_letters(GROUP).await.unwrap(), 0);
    let delivery = Delivery {
        topic: "orders".into(),
        partition: 0,
        offset: 7,
        key: None,
        payload: Some(b"{}".to_vec()),
        headers: Vec::new(),
    };
    let letter = DeadLetter {
        group: GROUP,
        key: None,
        event_type: Some("OrderCreated"),
        delivery: &delivery,
        error: "poisoned",
        attempts: 1,
        max_payload_bytes: 1024,
    };
    let id = store.dead_letter(&letter).await.unwrap();
    assert_eq!(store.count_dead_letters(GROUP).await.unwrap(), 1);
    assert_eq!(store.count_dead_letters("another-group").await.unwrap(), 0);
    store.mark_replayed(id).await.unwrap();
    assert_eq!(
        store.count_dead_letters(GROUP).await.unwrap(),
        0,
        "replayed letters are not counted"
    );

    exec(
        "INSERT INTO inoutbox_effects (consumer_group, source, event_id, kind, idempotency_key, \
            payload, created_at, attempts, done_at) VALUES \
          ('ops-billing', '', 'e-1', 'receipt', 'k-1', '1', published_at_now, 2, NULL), \
          ('ops-billing', '', 'e-2', 'receipt', 'k-2', '1', published_at_now, 0, published_at_now)",
    )
    .await;
    let effects = store.count_effects(GROUP).await.unwrap();
    assert_eq!((effects.pending, effects.failed), (1, 1), "{effects:?}");
    assert!(
        effects
            .oldest_pending_secs
            .is_some_and(|age| (0.0..60.0).contains(&age)),
        "{effects:?}"
    );
    let none = store.count_effects("another-group").await.unwrap();
    assert_eq!((none.pending, none.oldest_pending_secs), (0, None));
}

#[tokio::test]
async fn outbox_backlog_and_dead_letters_are_counted_on_postgres() {
    let db = TestDb::new("ops_counts").await;
    let store = db.migrated_store().await;
    let pool = db.pool.clone();
    backlog_and_dead_letters_are_counted(store, async |sql: &str| {
        let sql = sql.replace("published_at_now", "now()");
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .execute(&pool)
            .await
            .expect("update");
    })
    .await;
}

#[tokio::test]
async fn outbox_backlog_and_dead_letters_are_counted_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("inoutbox-ops-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("ops.db"))
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let store = inoutbox::SqliteStore::new(pool.clone());
    store.migrate().await.unwrap();
    backlog_and_dead_letters_are_counted(store, async |sql: &str| {
        let sql = sql.replace("published_at_now", "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')");
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .execute(&pool)
            .await
            .expect("update");
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every string of a JSON value, depth first.
fn strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The names `inoutbox_...` in `text`.
fn metric_names(text: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("inoutbox_") {
        let name = &rest[at..];
        let end = name
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(name.len());
        names.push(&name[..end]);
        rest = &name[end..];
    }
    names
}

/// Whether inoutbox records a series of this name: a metric of `metric::ALL`, or the
/// `_bucket`, `_sum` or `_count` series of one of its histograms.
fn recorded(name: &str) -> bool {
    metric::ALL.iter().any(|m| {
        m.name == name
            || (m.kind == metric::Kind::Histogram
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(m.name)))
    })
}

/// The Grafana dashboard in `docs/` names only metrics inoutbox records: a renamed or removed
/// metric fails here instead of leaving an empty panel.
#[test]
fn the_grafana_dashboard_names_only_metrics_that_exist() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let text = std::fs::read_to_string(path).expect("docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut texts = Vec::new();
    strings(&dashboard, &mut texts);
    let named: Vec<&str> = texts.iter().flat_map(|t| metric_names(t)).collect();
    assert!(
        panels.len() > 10 && named.len() > 20,
        "{} panels naming {} series",
        panels.len(),
        named.len()
    );
    for name in named {
        assert!(
            recorded(name),
            "the dashboard names `{name}`, which inoutbox does not record (see metric::ALL)"
        );
    }
    assert!(
        !recorded("inoutbox_inbox_processed_total_bucket"),
        "a counter has no buckets"
    );
}

/// The dashboard shows every metric inoutbox records: a metric added without a panel fails here.
#[test]
fn the_grafana_dashboard_shows_every_metric() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let text = std::fs::read_to_string(path).expect("docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mut texts = Vec::new();
    strings(&dashboard["panels"], &mut texts);
    let named: Vec<&str> = texts.iter().flat_map(|t| metric_names(t)).collect();
    let missing: Vec<&str> = metric::ALL
        .iter()
        .filter(|m| {
            !named.iter().any(|n| {
                *n == m.name
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| n.strip_suffix(suffix) == Some(m.name))
            })
        })
        .map(|m| m.name)
        .collect();
    assert!(missing.is_empty(), "no panel shows {missing:?}");
}
