//! Batch handlers (`#[inbox_handler(.., batch)]`): a run of new messages of one partition in one
//! call, written with one statement; a payload that does not decode fails the run, which then
//! goes one message at a time (one-element batches) and dead-letters only the bad message; the
//! metadata come one per event, in the events' order. Each test has its own broker, topic,
//! schema and consumer group.

mod support;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use inoutbox::inbox::Backoff;
use inoutbox::prelude::*;
use inoutbox::{Consumer, Outcome, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::{send, Broker, Msg, Running, TestDb};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

struct Setup {
    broker: Broker,
    db: TestDb,
    store: inoutbox::PgStore,
    topic: String,
    producer: rdkafka::producer::FutureProducer,
}

impl Setup {
    /// A broker, a schema and a topic of one partition.
    async fn new(name: &str) -> Self {
        let broker = Broker::start();
        let db = TestDb::new(name).await;
        let store = db.migrated_store().await;
        let topic = support::unique(name);
        broker.create_topic(&topic, 1).await;
        let producer = support::producer(&broker.brokers);
        Self {
            broker,
            db,
            store,
            topic,
            producer,
        }
    }

    /// A consumer whose batches wait long enough to gather a whole backlog.
    fn consumer(
        &self,
        group: &str,
    ) -> inoutbox::ConsumerBuilder<inoutbox::PgStore, inoutbox::KafkaConfig> {
        Consumer::builder(
            group,
            self.store.clone(),
            support::kafka(&self.broker.brokers, &self.topic),
        )
        .max_wait(Duration::from_millis(300))
        .retry(RetryPolicy::default().max_attempts(3).backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(1),
        )))
    }

    /// Sends `n` orders (totals `0..n`); returns each order id with the event id it was sent
    /// with.
    async fn send_orders(&self, n: i64) -> Vec<(Uuid, String)> {
        let mut sent = Vec::new();
        for i in 0..n {
            let (order, id) = (Uuid::new_v4(), Uuid::new_v4().to_string());
            send(&self.producer, &self.topic, Msg::order(&id, order, i)).await;
            sent.push((order, id));
        }
        sent
    }

    /// Sends a message whose payload is not JSON, with every header a good one has.
    async fn send_undecodable(&self) {
        let mut msg = Msg::order(&Uuid::new_v4().to_string(), Uuid::new_v4(), 0);
        msg.payload = b"not json".to_vec();
        send(&self.producer, &self.topic, msg).await;
    }

    async fn invoices_of(&self, order: Uuid) -> i64 {
        self.db
            .count(&format!(
                "SELECT count(*) FROM invoices WHERE order_id = '{order}'"
            ))
            .await
    }

    async fn dead_letters(&self) -> i64 {
        self.db
            .count(&format!(
                "SELECT count(*) FROM {}",
                self.db.tables.dead_letters
            ))
            .await
    }
}

/// Writes every event's invoice with one multi-row statement.
async fn insert_invoices(events: &[OrderCreated], tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    let orders: Vec<Uuid> = events.iter().map(|e| e.order_id).collect();
    let totals: Vec<i64> = events.iter().map(|e| e.total_cents).collect();
    sqlx::query(
        "INSERT INTO invoices (order_id, total_cents) \
         SELECT * FROM unnest($1::uuid[], $2::int8[])",
    )
    .bind(&orders)
    .bind(&totals)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A backlog of 50: a few calls, each writing its events with one statement.

static BACKLOG_CALLS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "batch-handler-backlog", batch)]
async fn create_invoices(events: Vec<OrderCreated>, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
    BACKLOG_CALLS.lock().unwrap().push(events.len());
    insert_invoices(&events, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_fifty_is_written_in_few_calls_and_each_event_once() {
    let s = Setup::new("batchhandlerbacklog").await;
    let sent = s.send_orders(50).await;
    let mut c = Running::start(s.consumer("batch-handler-backlog"));
    let reports = c.take(50).await;
    c.stop().await;

    assert!(
        reports
            .iter()
            .all(|r| r.outcome == Outcome::Processed { attempt: 1 }),
        "{reports:#?}"
    );
    for (order, _) in &sent {
        assert_eq!(s.invoices_of(*order).await, 1, "order {order} once");
    }
    assert_eq!(s.db.invoices().await, 50);
    let calls = BACKLOG_CALLS.lock().unwrap().clone();
    println!("handler calls (events per call): {calls:?}");
    assert_eq!(
        calls.iter().sum::<usize>(),
        50,
        "every event in one call: {calls:?}"
    );
    assert!(calls.len() < 50, "fewer calls than events: {calls:?}");
    assert!(
        calls.iter().any(|&n| n > 1),
        "at least one call with several events: {calls:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// One undecodable payload among 20 good ones: the run falls back to one message at a time.

static UNDECODABLE_CALLS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "batch-handler-undecodable", batch)]
async fn create_invoices_around_a_bad_payload(
    events: Vec<OrderCreated>,
    tx: &mut PgTx<'_>,
) -> Result<(), HandlerError> {
    UNDECODABLE_CALLS.lock().unwrap().push(events.len());
    insert_invoices(&events, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_payload_is_dead_lettered_and_the_other_twenty_apply_once() {
    let s = Setup::new("batchhandlerbad").await;
    let mut sent = s.send_orders(10).await;
    s.send_undecodable().await;
    sent.extend(s.send_orders(10).await);
    let mut c = Running::start(s.consumer("batch-handler-undecodable"));
    let reports = c.take(21).await;
    c.stop().await;

    // Each key has its lane (the default order): reports come as lanes finish, not in offset
    // order.
    for (i, r) in reports.iter().enumerate() {
        let undecodable = r.delivery.payload.as_deref() == Some(b"not json".as_slice());
        if undecodable {
            assert!(
                matches!(r.outcome, Outcome::DeadLettered { .. }),
                "message {i}: {reports:#?}"
            );
        } else {
            assert!(
                matches!(r.outcome, Outcome::Processed { .. }),
                "message {i}: {reports:#?}"
            );
        }
    }
    let undecodable = reports
        .iter()
        .filter(|r| r.delivery.payload.as_deref() == Some(b"not json".as_slice()))
        .count();
    assert_eq!(undecodable, 1, "the undecodable message reported once");
    for (order, _) in &sent {
        assert_eq!(s.invoices_of(*order).await, 1, "order {order} once");
    }
    assert_eq!(s.db.invoices().await, 20);
    assert_eq!(s.dead_letters().await, 1);
    let calls = UNDECODABLE_CALLS.lock().unwrap().clone();
    println!("handler calls (events per call): {calls:?}");
    assert_eq!(
        calls.iter().sum::<usize>(),
        20,
        "each good event handled once, by a committed call: {calls:?}"
    );
    assert!(
        calls.contains(&1),
        "the failed run fell back to one-element batches: {calls:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// `metas: &[MessageMeta]`: one per event, in the events' order.

/// Per call: (order id, event id of its metadata, offset) for each event.
static METAS_CALLS: Mutex<Vec<Vec<(Uuid, String, i64)>>> = Mutex::new(Vec::new());
/// Calls whose metadata did not match the events in number.
static METAS_MISCOUNTED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

#[inbox_handler(event = "OrderCreated", group = "batch-handler-metas", batch)]
async fn create_invoices_with_metas(
    events: Vec<OrderCreated>,
    tx: &mut PgTx<'_>,
    metas: &[MessageMeta],
) -> Result<(), HandlerError> {
    if metas.len() != events.len() {
        METAS_MISCOUNTED
            .lock()
            .unwrap()
            .push((events.len(), metas.len()));
    }
    let call = events
        .iter()
        .zip(metas)
        .map(|(e, m)| (e.order_id, m.event_id.clone(), m.offset))
        .collect();
    METAS_CALLS.lock().unwrap().push(call);
    insert_invoices(&events, tx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_gets_one_metadata_per_event_in_the_events_order() {
    let s = Setup::new("batchhandlermetas").await;
    let sent = s.send_orders(30).await;
    let mut c = Running::start(s.consumer("batch-handler-metas"));
    let reports = c.take(30).await;
    c.stop().await;

    assert!(
        reports
            .iter()
            .all(|r| r.outcome == Outcome::Processed { attempt: 1 }),
        "{reports:#?}"
    );
    assert_eq!(
        METAS_MISCOUNTED.lock().unwrap().clone(),
        Vec::<(usize, usize)>::new(),
        "calls whose metadata did not match the events (events, metas)"
    );
    let calls = METAS_CALLS.lock().unwrap().clone();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    println!("handler calls (events per call): {sizes:?}");
    assert!(
        sizes.iter().any(|&n| n > 1),
        "at least one call with several events: {sizes:?}"
    );
    let event_ids: HashMap<Uuid, String> = sent.into_iter().collect();
    let mut seen = 0;
    for call in &calls {
        for (order, event_id, _) in call {
            assert_eq!(
                Some(event_id),
                event_ids.get(order),
                "the metadata beside order {order} is its own"
            );
            seen += 1;
        }
        assert!(
            call.windows(2).all(|w| w[0].2 < w[1].2),
            "metadata in offset order: {call:?}"
        );
    }
    assert_eq!(seen, 30, "every event once");
    assert_eq!(s.db.invoices().await, 30);
}
