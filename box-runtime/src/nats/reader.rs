//! One partition's reading: a durable pull consumer per lease, started where the previous
//! leases' consumers were acknowledged up to, and the task that hands its messages to the
//! partition's run in order (those async-nats does not hand on read from the stream: `lost`).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::Context;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::headers::{self, Headers};
use super::lease::Lease;
use super::{lost, token, NatsConfig, HEADER_KEY};
use crate::message::Delivery;
use crate::shutdown::CancellationToken;

/// The names of one (group, topic, partition)'s consumers start with this; the lease's
/// revision follows.
fn prefix(group: &str, topic: &str, partition: u32) -> String {
    format!("{}_p{partition}_", token(&format!("{group}-{topic}")))
}

/// Creates the consumer of a new lease (revision `revision`) on a partition's `stream`,
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
        floor = floor.max(acknowledged_through(&info));
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

/// How far a previous lease's consumer stands acknowledged: its floor, or, if it acknowledged
/// nothing, where it started (nats-server reports a floor of 0 for a consumer that has
/// acknowledged nothing, even one created to start after its predecessors' floor; taken as it
/// is, the next lease would read the partition again from the stream's beginning).
fn acknowledged_through(info: &async_nats::jetstream::consumer::Info) -> u64 {
    let started_after = match info.config.deliver_policy {
        DeliverPolicy::ByStartSequence { start_sequence } => start_sequence.saturating_sub(1),
        _ => 0,
    };
    info.ack_floor.stream_sequence.max(started_after)
}

/// What one pull asks for: at most this many messages, and at most [`FETCH_BYTES`] of them
/// (the client holds what a pull returned until the partition's run takes it, besides the
/// `partition_buffer` messages on their way to the run). Pulls of 256 messages were slow with
/// the filtered consumers of one stream per topic (the server delivered about a tenth of what
/// it delivers with pulls of 10 000, nats-server 2.9.10); on a partition's own stream pulls of
/// 1 000 run as fast as pulls of 10 000 did, with a third of the memory (docs/nats.md, Speed).
const FETCH_MESSAGES: usize = 1_000;

/// The bytes one pull asks for at most (1 MiB a partition), unless the server takes larger
/// messages: see [`pull_bytes`].
const FETCH_BYTES: usize = 1 << 20;

/// Room for what the server counts of a message besides what its publisher sent (the subject,
/// the reply subject).
const PULL_MARGIN: usize = 64 << 10;

/// The bytes a pull asks for: [`FETCH_BYTES`], or more when the server takes messages that
/// large (its `max_payload`, headers and payload, plus [`PULL_MARGIN`]). A message larger than
/// a pull may return is never delivered: the server answers `409 Message Size Exceeds
/// MaxBytes`, async-nats pulls again with the same limit, and the partition stalls.
fn pull_bytes(server_max_payload: usize) -> usize {
    FETCH_BYTES.max(server_max_payload.saturating_add(PULL_MARGIN))
}

/// Why a reader ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Its stop token was cancelled, or the run stopped taking messages.
    Stopped,
    /// A delivery was lost on the way (the consumer's delivery sequence skipped one, after a
    /// reconnection) and every lost message was one async-nats can read: the partition
    /// restarts from its acknowledgement floor, so that nothing is read out of order.
    Gap,
    /// The pull failed (a server restart, a deleted consumer).
    Failed(String),
}

/// How long the reader waits for a message before it looks whether the connection was
/// established again meanwhile (a local counter; the server is asked only then).
const IDLE: Duration = Duration::from_secs(1);

/// The most lost messages read from the stream at once; beyond, the partition restarts from
/// its acknowledgement floor, which brings fewer.
const MOST_LOST: usize = 1_000;

/// Where a partition is read from, and where its messages go.
pub(super) struct Reader {
    pub(super) consumer: PullConsumer,
    /// For what it reads from the stream itself and its acknowledgements (see `lost`).
    pub(super) js: Context,
    pub(super) lease: Arc<Lease>,
    pub(super) deliveries: mpsc::Sender<Arc<Delivery>>,
    pub(super) stop: CancellationToken,
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) batch: usize,
}

/// What the reader has handed on: the last stream sequence, and the last delivery sequence of
/// its consumer it received.
struct Seen {
    stream: u64,
    delivery: u64,
}

impl Reader {
    /// Hands the partition's messages to its run in stream order, each once (JetStream's
    /// repeats after its acknowledgement wait are dropped), until stopped or until a delivery
    /// was lost. A message async-nats cannot read never arrives (raw bytes in its headers drop
    /// the connection; a status in its header block makes it one of the server's own): when
    /// the consumer delivered past what the reader received (a delivery sequence skipped, or,
    /// idle after a reconnection or after an error of the pull, the consumer's last delivery),
    /// the lost messages are read from the stream (`lost`) and handed on in order, their
    /// headers as they are.
    pub(super) async fn run(self) -> Ended {
        let mut messages = match self
            .consumer
            .stream()
            .max_messages_per_batch(FETCH_MESSAGES.max(self.batch))
            .max_bytes_per_batch(pull_bytes(self.js.client().server_info().max_payload))
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await
        {
            Ok(messages) => messages,
            Err(e) => return Ended::Failed(e.to_string()),
        };
        let mut seen = Seen {
            stream: self.start().saturating_sub(1),
            delivery: 0,
        };
        let mut connects = self.connects();
        loop {
            let next = tokio::select! {
                () = self.stop.cancelled() => return Ended::Stopped,
                next = messages.next() => next,
                () = tokio::time::sleep(IDLE) => {
                    let now = self.connects();
                    if now != connects {
                        match self.check_delivered(&mut seen).await {
                            Ok(true) => connects = now,
                            Ok(false) => {}
                            Err(ended) => return ended,
                        }
                    }
                    continue;
                }
            };
            let message = match next {
                None => return Ended::Failed("the pull ended".to_owned()),
                // A message whose header block holds a status (`NATS/1.0 503`) is an error
                // of the pull: read from the stream, it is handed on and the pull goes on.
                Some(Err(e)) => {
                    let before = seen.stream;
                    match self.check_delivered(&mut seen).await {
                        Ok(true) if seen.stream > before => continue,
                        Err(ended) => return ended,
                        _ => return Ended::Failed(e.to_string()),
                    }
                }
                Some(Ok(message)) => message,
            };
            let Ok(info) = message.info() else {
                continue;
            };
            let (stream_seq, delivery_seq) = (info.stream_sequence, info.consumer_sequence);
            if delivery_seq > seen.delivery + 1 {
                if let Err(ended) = self.recover(&mut seen, stream_seq.saturating_sub(1)).await {
                    return ended;
                }
            }
            seen.delivery = delivery_seq;
            if stream_seq <= seen.stream {
                continue;
            }
            let (message, acker) = message.split();
            let (headers, payload) = (headers::incoming(message.headers.as_ref()), message.payload);
            let delivery = self.delivery(stream_seq, headers, payload.to_vec());
            if let Err(ended) = self.hand_on(&mut seen, acker, delivery).await {
                return ended;
            }
        }
    }

    /// The first stream sequence of the consumer.
    fn start(&self) -> u64 {
        match self.consumer.cached_info().config.deliver_policy {
            DeliverPolicy::ByStartSequence { start_sequence } => start_sequence,
            _ => 1,
        }
    }

    /// How many times the client connected (the first time included).
    fn connects(&self) -> u64 {
        self.js
            .client()
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Idle after a reconnection, or after an error of the pull: what the consumer delivered
    /// past what the reader received was lost on the way. `false`: the server did not answer
    /// (asked again at the next idle moment).
    async fn check_delivered(&self, seen: &mut Seen) -> Result<bool, Ended> {
        let info = match self.consumer.get_info().await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(target: "inoutbox::nats", topic = %self.topic, partition = self.partition, error = %e,
                    "consumer info failed; asking again");
                return Ok(false);
            }
        };
        if info.delivered.stream_sequence > seen.stream {
            self.recover(seen, info.delivered.stream_sequence).await?;
        }
        seen.delivery = seen.delivery.max(info.delivered.consumer_sequence);
        Ok(true)
    }

    /// Deliveries were lost up to the stream sequence `until`: when one of them is a message
    /// async-nats cannot read, they are read from the stream and handed on in order (each
    /// acknowledged with the lowest delivery sequence it can have had); otherwise the
    /// partition restarts from its acknowledgement floor.
    async fn recover(&self, seen: &mut Seen, until: u64) -> Result<(), Ended> {
        let info = self.consumer.cached_info();
        let subject = super::subject(&self.topic, u32::try_from(self.partition).unwrap_or(0));
        let lost = lost::read(
            &self.js,
            &info.stream_name,
            &subject,
            seen.stream,
            until,
            MOST_LOST,
        );
        let lost = match lost.await {
            Ok(Some(lost)) if lost.iter().any(|m| !m.readable) => lost,
            Ok(_) => return Err(Ended::Gap),
            Err(e) => return Err(Ended::Failed(e)),
        };
        let first_delivery = seen.delivery;
        for (n, message) in (1u64..).zip(lost) {
            if !message.readable {
                tracing::warn!(target: "inoutbox::nats", topic = %self.topic, partition = self.partition,
                    offset = message.sequence, "a message async-nats does not hand on (raw bytes in its headers, a status in its header block) was read from the stream");
            }
            let acker = lost::acker(
                &self.js,
                &info.stream_name,
                &info.name,
                message.sequence,
                first_delivery + n,
            );
            let delivery = self.delivery(message.sequence, message.headers, message.payload);
            self.hand_on(seen, acker, delivery).await?;
        }
        Ok(())
    }

    /// Hands one message on to the run; its acknowledgement waits in the lease for a commit
    /// past it.
    async fn hand_on(
        &self,
        seen: &mut Seen,
        acker: Acker,
        delivery: Delivery,
    ) -> Result<(), Ended> {
        seen.stream = u64::try_from(delivery.offset).unwrap_or(0);
        self.lease.delivered(delivery.offset, acker);
        tokio::select! {
            () = self.stop.cancelled() => Err(Ended::Stopped),
            sent = self.deliveries.send(Arc::new(delivery)) => sent.map_err(|_| Ended::Stopped),
        }
    }

    fn delivery(&self, sequence: u64, headers: Headers, payload: Vec<u8>) -> Delivery {
        let key = headers
            .iter()
            .find(|(name, _)| name == HEADER_KEY)
            .and_then(|(_, value)| value.clone());
        Delivery {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: i64::try_from(sequence).unwrap_or(i64::MAX),
            key,
            payload: Some(payload),
            headers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pull_bytes, FETCH_BYTES, PULL_MARGIN};

    #[test]
    fn a_pull_has_room_for_the_largest_message_the_server_takes() {
        assert_eq!(pull_bytes(0), FETCH_BYTES);
        // nats-server's default: 1 MiB, headers and payload; the subjects come on top.
        assert!(pull_bytes(1 << 20) >= (1 << 20) + PULL_MARGIN);
        assert_eq!(pull_bytes(8 << 20), (8 << 20) + PULL_MARGIN);
        assert_eq!(pull_bytes(usize::MAX), usize::MAX);
    }
}
