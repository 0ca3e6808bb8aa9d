//! OpenTelemetry (feature `otel`): one trace from the producing request through the outbox and
//! the relay to the handler. The producer enqueues inside a span; the outbox stores its W3C
//! `traceparent`, the relay publishes it as a header, and the consumer's message span continues
//! it, so the handler's span is in the producer's trace. Spans are exported to an in-memory
//! exporter; SQLite and the in-process Kafka need no setup.
#![cfg(feature = "otel")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use inoutbox::kafka::InProcessKafka;
use inoutbox::prelude::*;
use inoutbox::{Consumer, Relay, SqliteStore};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderPlaced", topic = "placed", key = order_id)]
pub struct OrderPlaced {
    pub order_id: Uuid,
}

static HANDLED: AtomicUsize = AtomicUsize::new(0);

#[inbox_handler(event = "OrderPlaced", group = "otel-billing")]
async fn bill(event: OrderPlaced, _tx: &mut SqliteTx<'_>) -> Result<(), HandlerError> {
    tracing::info_span!("bill_order", order = %event.order_id).in_scope(|| {
        HANDLED.fetch_add(1, Ordering::SeqCst);
    });
    Ok(())
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_handler_span_continues_the_producer_trace_through_outbox_and_relay() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("inoutbox-tests"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .expect("the only subscriber of this test binary");

    let dir = std::env::temp_dir().join(format!("inoutbox-otel-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("otel.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.unwrap();
    let kafka = InProcessKafka::start().expect("in-process kafka");
    kafka.create_topic("placed", 1).unwrap();

    // The producing request: a span of its own, the enqueue inside it.
    let request = tracing::info_span!("place_order");
    let producer = request.context().span().span_context().clone();
    assert!(
        producer.is_valid(),
        "the OpenTelemetry layer gives the span a context"
    );
    async {
        let mut tx = pool.begin().await.unwrap();
        let event = OrderPlaced {
            order_id: Uuid::new_v4(),
        };
        inoutbox::outbox::enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();
    }
    .instrument(request.clone())
    .await;
    drop(request);
    // A control: an event enqueued outside any span carries no trace context.
    let mut tx = pool.begin().await.unwrap();
    let untraced = OrderPlaced {
        order_id: Uuid::new_v4(),
    };
    inoutbox::outbox::enqueue(&mut tx, &untraced).await.unwrap();
    tx.commit().await.unwrap();

    let relay = Relay::builder(
        store.clone(),
        inoutbox::kafka::KafkaProducer::new(kafka.brokers()),
    )
    .poll_interval(Duration::from_millis(50))
    .retention(None)
    .build()
    .unwrap();
    let config = kafka.consumer_config(["placed"]);
    let consumer = Consumer::builder("otel-billing", store, config)
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relay = tokio::spawn(relay.run(until(stopped.clone())));
    let consumer = tokio::spawn(consumer.run(until(stopped.clone())));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while HANDLED.load(Ordering::SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler did not run within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    consumer.await.unwrap().unwrap();
    relay.await.unwrap().unwrap();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    let messages: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "inoutbox.message")
        .collect();
    assert_eq!(messages.len(), 2, "one span per message: {messages:#?}");
    let (continued, fresh): (Vec<&SpanData>, Vec<&SpanData>) = messages
        .into_iter()
        .partition(|s| s.span_context.trace_id() == producer.trace_id());
    let [message] = continued[..] else {
        panic!(
            "exactly one message span in the producer's trace {}: {continued:#?}",
            producer.trace_id()
        );
    };
    assert_eq!(
        message.parent_span_id,
        producer.span_id(),
        "child of the producer's span"
    );
    assert!(
        message.parent_span_is_remote,
        "its parent came from the message headers"
    );
    assert_eq!(
        attribute(message, "group").map(|v| v.as_str()),
        Some("otel-billing".into())
    );
    assert_eq!(
        attribute(message, "outcome").map(|v| v.as_str()),
        Some("processed".into())
    );
    let [control] = fresh[..] else {
        panic!("the untraced event's span: {fresh:#?}");
    };
    assert_ne!(control.span_context.trace_id(), TraceId::INVALID);
    // No trace to continue: a root, or the child of the batch span it was handled in.
    if control.parent_span_id != SpanId::INVALID {
        let parent = spans
            .iter()
            .find(|s| s.span_context.span_id() == control.parent_span_id);
        assert_eq!(
            parent.map(|p| &*p.name),
            Some("inoutbox.batch"),
            "{control:#?}"
        );
    }

    let handler = spans
        .iter()
        .find(|s| s.name == "bill_order" && s.span_context.trace_id() == producer.trace_id())
        .unwrap_or_else(|| panic!("the handler's span in the producer's trace: {spans:#?}"));
    assert_eq!(
        handler.parent_span_id,
        message.span_context.span_id(),
        "the handler runs in the message's span"
    );
}
