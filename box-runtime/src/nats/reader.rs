//! One partition's reading: a durable pull consumer per lease, started where the previous
//! leases' consumers were acknowledged up to, and the task that hands its messages to the
//! partition's run in order.

use std::sync::Arc;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::stream::Stream;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::lease::Lease;
use super::{headers, token, NatsConfig, HEADER_KEY};
use crate::message::Delivery;
use crate::shutdown::CancellationToken;

/// The names of one (group, topic, partition)'s consumers start with this; the lease's
/// revision follows.
fn prefix(group: &str, topic: &str, partition: u32) -> String {
    format!("{}_p{partition}_", token(&format!("{group}-{topic}")))
}

/// Creates the consumer of a new lease (revision `revision`) on `stream` for one partition,
/// starting after the highest acknowledgement floor of its predecessors, and deletes them: an
/// acknowledgement still on its way to one of them is dropped by the server.
pub(super) async fn consumer(
    stream: &Stream,
    config: &NatsConfig,
    group: &str,
    topic: &str,
    partition: u32,
    revision: u64,
) -> Result<PullConsumer, String> {
    let prefix = prefix(group, topic, partition);
    let mut old = Vec::new();
    let mut names = stream.consumer_names();
    while let Some(name) = names.next().await {
        let name = name.map_err(|e| format!("consumer names: {e}"))?;
        if name.starts_with(&prefix) {
            old.push(name);
        }
    }
    let mut floor = 0;
    for name in &old {
        let info = stream
            .consumer_info(name)
            .await
            .map_err(|e| format!("consumer {name}: {e}"))?;
        floor = floor.max(info.ack_floor.stream_sequence);
    }
    let name = format!("{prefix}{revision}");
    let deliver_policy = if floor == 0 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: floor + 1,
        }
    };
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: super::subject(topic, partition),
            ack_policy: AckPolicy::All,
            ack_wait: config.ack_wait,
            deliver_policy,
            max_ack_pending: 100_000,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("consumer {name}: {e}"))?;
    for name in old.iter().filter(|n| **n != name) {
        if let Err(e) = stream.delete_consumer(name).await {
            tracing::warn!(target: "inoutbox::nats", consumer = %name, error = %e, "deleting a previous lease's consumer failed");
        }
    }
    tracing::debug!(target: "inoutbox::nats", consumer = %name, after = floor, "partition consumer created");
    Ok(consumer)
}

/// What one pull asks for: at most this many messages, and at most [`FETCH_BYTES`] of them
/// (the client holds what a pull returned until the partition's run takes it, besides the
/// `partition_buffer` messages on their way to the run). Small pulls are slow: with pulls of
/// 256 messages the server delivered about a tenth of what it delivers with pulls of 10 000
/// (nats-server 2.9.10).
const FETCH_MESSAGES: usize = 10_000;

/// The bytes one pull asks for at most (4 MiB a partition).
const FETCH_BYTES: usize = 4 << 20;

/// Why a reader ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Its stop token was cancelled, or the run stopped taking messages.
    Stopped,
    /// A delivery was lost on the way (the consumer's delivery sequence skipped one, after a
    /// reconnection): the partition restarts from its acknowledgement floor, so that nothing
    /// is read out of order.
    Gap,
    /// The pull failed (a server restart, a deleted consumer).
    Failed(String),
}

/// Where a partition is read from, and where its messages go.
pub(super) struct Reader {
    pub(super) consumer: PullConsumer,
    pub(super) lease: Arc<Lease>,
    pub(super) deliveries: mpsc::Sender<Arc<Delivery>>,
    pub(super) stop: CancellationToken,
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) batch: usize,
}

impl Reader {
    /// Hands the partition's messages to its run in stream order, each once (JetStream's
    /// repeats after its acknowledgement wait are dropped), until stopped or until a delivery
    /// was lost.
    pub(super) async fn run(self) -> Ended {
        let mut messages = match self
            .consumer
            .stream()
            .max_messages_per_batch(FETCH_MESSAGES.max(self.batch))
            .max_bytes_per_batch(FETCH_BYTES)
            .heartbeat(std::time::Duration::from_secs(5))
            .messages()
            .await
        {
            Ok(messages) => messages,
            Err(e) => return Ended::Failed(e.to_string()),
        };
        let (mut last_stream, mut last_delivery) = (0u64, 0u64);
        loop {
            let next = tokio::select! {
                () = self.stop.cancelled() => return Ended::Stopped,
                next = messages.next() => next,
            };
            let message = match next {
                None => return Ended::Failed("the pull ended".to_owned()),
                Some(Err(e)) => return Ended::Failed(e.to_string()),
                Some(Ok(message)) => message,
            };
            let Ok(info) = message.info() else {
                continue;
            };
            let (stream_seq, delivery_seq) = (info.stream_sequence, info.consumer_sequence);
            if last_delivery != 0 && delivery_seq > last_delivery + 1 {
                return Ended::Gap;
            }
            last_delivery = delivery_seq;
            if stream_seq <= last_stream {
                continue;
            }
            last_stream = stream_seq;
            let offset = i64::try_from(stream_seq).unwrap_or(i64::MAX);
            let (message, acker) = message.split();
            self.lease.delivered(offset, acker);
            let delivery = Arc::new(self.delivery(message, offset));
            tokio::select! {
                () = self.stop.cancelled() => return Ended::Stopped,
                sent = self.deliveries.send(delivery) => if sent.is_err() {
                    return Ended::Stopped;
                },
            }
        }
    }

    fn delivery(&self, message: async_nats::Message, offset: i64) -> Delivery {
        let headers = headers::incoming(message.headers.as_ref());
        let key = headers
            .iter()
            .find(|(name, _)| name == HEADER_KEY)
            .and_then(|(_, value)| value.clone());
        Delivery {
            topic: self.topic.clone(),
            partition: self.partition,
            offset,
            key,
            payload: Some(message.payload.to_vec()),
            headers,
        }
    }
}
