//! The benches' NATS JetStream side (feature `nats`): a JetStream context on `NATS_URL`, a
//! topic's streams as inoutbox makes them, and raw publishing of keyed `OrderCreated` messages,
//! shaped as the relay publishes them, in windows of acknowledgements.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use async_nats::HeaderMap;
use inoutbox::kafka as names;
use inoutbox::nats::{partition_for, stream_name, subject, HEADER_KEY};
use inoutbox::prelude::*;
use uuid::Uuid;

use super::{BoxError, OrderCreated};

/// A JetStream context on the server at `url` (a URL without credentials: async-nats does not
/// send a URL's own).
pub async fn jetstream(url: &str) -> Result<jetstream::Context, BoxError> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("cannot connect to NATS at {url}: {e} (start `nats-server -js`)"))?;
    Ok(jetstream::new(client))
}

/// `topic`'s streams as inoutbox creates them (one a partition, of the one subject
/// `<topic>.<partition>`, file storage, JetStream's defaults otherwise), empty: streams of those
/// names are deleted first.
pub async fn fresh_stream(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
) -> Result<(), BoxError> {
    remove_stream(js, topic, partitions).await;
    for partition in 0..partitions {
        js.create_stream(jetstream::stream::Config {
            name: stream_name(topic, partition),
            subjects: vec![subject(topic, partition)],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream of {topic} partition {partition}: {e}"))?;
    }
    Ok(())
}

/// Deletes `topic`'s streams (what a run left), those that exist.
pub async fn remove_stream(js: &jetstream::Context, topic: &str, partitions: u32) {
    for partition in 0..partitions {
        let _ = js.delete_stream(stream_name(topic, partition)).await;
    }
}

/// A new `OrderCreated` as the relay publishes it on `partitions` partitions: to the subject of
/// its key's partition, with its CloudEvents headers, its key in [`HEADER_KEY`] and
/// `Nats-Msg-Id` = its event id.
pub fn order_created(topic: &str, partitions: u32, source: &str) -> (String, PublishMessage) {
    let event = OrderCreated {
        order_id: Uuid::new_v4(),
        total_cents: 1200,
    };
    let id = Uuid::now_v7().to_string();
    let key = event.order_id.to_string();
    let mut headers = HeaderMap::new();
    headers.append(names::HEADER_ID, id.as_str());
    headers.append(
        names::HEADER_TYPE,
        <OrderCreated as OutboxEvent>::EVENT_TYPE,
    );
    headers.append(names::HEADER_SOURCE, source);
    headers.append(names::HEADER_SPECVERSION, names::SPECVERSION);
    headers.append(names::HEADER_CONTENT_TYPE, names::CONTENT_TYPE_JSON);
    headers.append(HEADER_KEY, key.as_str());
    let payload = serde_json::to_vec(&event).expect("an OrderCreated serializes");
    let message = PublishMessage::build()
        .payload(payload.into())
        .headers(headers)
        .message_id(id);
    (
        subject(topic, partition_for(key.as_bytes(), partitions)),
        message,
    )
}

/// Publishes `count` messages of `topic` (on `partitions` partitions) on one connection, from
/// `tasks` tasks side by side, each in windows of `window`: a window's messages published
/// without waiting (async-nats's `send_publish`), then its acknowledgements awaited, then the
/// next window. Returns the time from the first publish to the last acknowledgement.
pub async fn publish_windows(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
    count: usize,
    window: usize,
    tasks: usize,
) -> Result<Duration, BoxError> {
    let (window, tasks) = (window.max(1), tasks.max(1));
    let started = Instant::now();
    let mut running = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let share = count / tasks + usize::from(task < count % tasks);
        let (js, topic) = (js.clone(), topic.to_owned());
        running.push(tokio::spawn(async move {
            let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(window);
            let mut sent = 0;
            while sent < share {
                for _ in 0..window.min(share - sent) {
                    let (subject, message) = order_created(&topic, partitions, "bench");
                    acks.push(js.send_publish(subject, message).await?);
                    sent += 1;
                }
                for ack in acks.drain(..) {
                    ack.await?;
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in running {
        task.await??;
    }
    Ok(started.elapsed())
}
