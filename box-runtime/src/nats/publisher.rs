//! The relay's publisher on JetStream: each message to the subject of its key's partition, with
//! its CloudEvents headers, its key in [`HEADER_KEY`], and `Nats-Msg-Id` = its event id
//! (JetStream drops a republish of the same id within the stream's duplicate window: a second
//! line of defence after the relay's own marking). A receipt is JetStream's publish
//! acknowledgement.
//!
//! Order: one task publishes the messages it is handed in the order it is handed them, on one
//! connection, so the server stores the messages of one key (one subject) in that order.

use std::collections::HashSet;
use std::future::Future;

use async_nats::jetstream::{self, context::PublishAckFuture, context::PublishErrorKind};
use tokio::sync::{mpsc, oneshot};

use super::headers::outgoing;
use super::{partition_for, subject, HEADER_KEY};
use crate::transport::{OutgoingMessage, PublishError, Publisher, Receipt};

/// Messages handed to the publishing task and not yet published.
const QUEUE: usize = 10_000;

type Queued = Result<PublishAckFuture, PublishError>;

struct Job {
    topic: String,
    subject: String,
    id: String,
    headers: async_nats::HeaderMap,
    payload: Vec<u8>,
    queued: oneshot::Sender<Queued>,
}

/// The relay's publisher on NATS JetStream (see the module docs). Create it with
/// [`NatsPublisher::connect`]; the streams of the topics it publishes to are created when
/// missing.
pub struct NatsPublisher {
    jobs: mpsc::Sender<Job>,
    partitions: u32,
}

impl std::fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl NatsPublisher {
    /// Connects to the server at `url` (waiting at most 30 s); messages go to `partitions`
    /// partitions per topic (the consumers' [`NatsConfig::partitions`](super::NatsConfig)).
    pub async fn connect(url: &str, partitions: u32) -> Result<Self, PublishError> {
        let client = super::connect(url, std::time::Duration::from_secs(30))
            .await
            .map_err(PublishError::unavailable)?;
        let (jobs, queue) = mpsc::channel(QUEUE);
        let partitions = partitions.max(1);
        tokio::spawn(pump(jetstream::new(client), queue, partitions));
        Ok(Self { jobs, partitions })
    }
}

/// Publishes the jobs in order; creates the streams of a topic's `partitions` before its first
/// message.
async fn pump(js: jetstream::Context, mut queue: mpsc::Receiver<Job>, partitions: u32) {
    let mut streams: HashSet<String> = HashSet::new();
    while let Some(job) = queue.recv().await {
        if !streams.contains(&job.topic) {
            match super::ensure_streams(&js, &job.topic, partitions).await {
                Ok(_) => {
                    streams.insert(job.topic.clone());
                }
                Err(e) => {
                    let _ = job.queued.send(Err(PublishError::unavailable(e)));
                    continue;
                }
            }
        }
        let publish = jetstream::message::PublishMessage::build()
            .payload(job.payload.into())
            .headers(job.headers)
            .message_id(job.id);
        let queued = js
            .send_publish(job.subject, publish)
            .await
            .map_err(classify);
        let _ = job.queued.send(queued);
    }
}

/// A refusal of the message itself (too large, a subject no stream takes) is rejected; the
/// rest (no server, a timeout) is unavailable.
fn classify(e: jetstream::context::PublishError) -> PublishError {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::rejected(e),
        _ => PublishError::unavailable(e),
    }
}

impl Publisher for NatsPublisher {
    fn send(
        &self,
        message: &OutgoingMessage<'_>,
    ) -> Result<
        impl Future<Output = Result<Receipt, PublishError>> + Send + 'static + use<>,
        PublishError,
    > {
        let routing = message.key.unwrap_or(message.id);
        let partition = partition_for(routing.as_bytes(), self.partitions);
        let key = message.key.map(|k| (HEADER_KEY, k));
        let headers = outgoing(message.headers().chain(key));
        let (queued, answer) = oneshot::channel();
        self.jobs
            .try_send(Job {
                topic: message.topic.to_owned(),
                subject: subject(message.topic, partition),
                id: message.id.to_owned(),
                headers,
                payload: message.payload.to_vec(),
                queued,
            })
            .map_err(|e| PublishError::unavailable(format!("publisher queue: {e}")))?;
        let partition = i32::try_from(partition).unwrap_or(0);
        Ok(async move {
            let ack = answer
                .await
                .map_err(|_| PublishError::unavailable("the publishing task ended"))??
                .await
                .map_err(classify)?;
            Ok(Receipt::new(
                partition,
                i64::try_from(ack.sequence).unwrap_or(i64::MAX),
            ))
        })
    }
}
