//! The Kafka transport (rdkafka): a consumer group member that hands each partition to its own
//! task, commits offsets only for resolved messages of partitions it still owns, follows
//! rebalances and shuts down gracefully.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::Delivery;
use crate::engine::{Inbox, OffsetTracker, Outcome};
use crate::store::InboxStore;

/// Settings of the Kafka consumer.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// The Kafka consumer group id; defaults to the inbox group.
    pub group_id: Option<String>,
    /// Extra librdkafka settings, applied last.
    pub settings: Vec<(String, String)>,
    /// Messages buffered per partition before the consumer waits for the partition's task.
    pub partition_buffer: usize,
    /// Where dead letters are also published (besides the dead-letter table), if anywhere.
    pub dead_letter_topic: Option<String>,
    /// librdkafka settings of the dead-letter producer (e.g. `enable.idempotence=false` for
    /// brokers without idempotent producers).
    pub producer_settings: Vec<(String, String)>,
}

impl KafkaConfig {
    /// Consume `topics` from `brokers`.
    pub fn new(
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            brokers: brokers.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            group_id: None,
            settings: Vec::new(),
            partition_buffer: 64,
            dead_letter_topic: None,
            producer_settings: Vec::new(),
        }
    }

    /// Also publishes dead letters to `topic`: the original key, payload and headers, plus
    /// `txbox_dlq_*` headers saying where the message came from and why it was given up.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// Sets a librdkafka setting of the dead-letter producer.
    pub fn set_producer(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_settings.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka setting (e.g. `session.timeout.ms`).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Overrides the Kafka group id.
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }
}

/// A failure of the Kafka consumer itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaTransportError {
    /// Creating or subscribing the consumer failed.
    #[error("kafka consumer setup failed: {0}")]
    Setup(#[source] KafkaError),
    /// A partition task died.
    #[error("partition task for {topic}/{partition} failed: {message}")]
    Task {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// What happened.
        message: String,
    },
}

type PartitionKey = (String, i32);

/// Which partitions this member owns, and since which rebalance.
#[derive(Default)]
struct Ownership {
    generation: u64,
    owned: HashMap<PartitionKey, u64>,
}

/// Follows rebalances; the lock is also held while committing, so no commit for a partition
/// goes out after its revocation was seen.
struct RebalanceContext {
    ownership: Arc<Mutex<Ownership>>,
}

impl ClientContext for RebalanceContext {}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut own = lock(&self.ownership);
            for e in tpl.elements() {
                own.owned.remove(&(e.topic().to_owned(), e.partition()));
                tracing::info!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "partition revoked"
                );
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let mut own = lock(&self.ownership);
            own.generation += 1;
            let generation = own.generation;
            for e in tpl.elements() {
                own.owned
                    .insert((e.topic().to_owned(), e.partition()), generation);
                tracing::info!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "partition assigned"
                );
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Commits offsets of one partition for one ownership generation.
struct Committer {
    consumer: Arc<StreamConsumer<RebalanceContext>>,
    ownership: Arc<Mutex<Ownership>>,
    /// (topic, partition), built once: the ownership check runs for every message.
    key: PartitionKey,
    generation: u64,
}

impl Committer {
    fn owned_in(&self, own: &Ownership) -> bool {
        own.owned.get(&self.key) == Some(&self.generation)
    }

    /// Whether the partition is still owned by this generation.
    fn owned(&self) -> bool {
        self.owned_in(&lock(&self.ownership))
    }

    fn offsets(&self, position: i64) -> Option<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        match tpl.add_partition_offset(&self.key.0, self.key.1, Offset::Offset(position)) {
            Ok(()) => Some(tpl),
            Err(e) => {
                tracing::error!(error = %e, "cannot build the offset list");
                None
            }
        }
    }

    /// Queues an asynchronous commit of `position` (the next offset to read) if the partition
    /// is still ours. Queueing does not block, and the ownership lock is held while it happens,
    /// so no commit is queued after the partition's revocation was seen. Closing the consumer
    /// waits for queued commits.
    fn commit_async(&self, position: i64) -> bool {
        let own = lock(&self.ownership);
        if !self.owned_in(&own) {
            tracing::debug!(topic = %self.key.0, partition = self.key.1, position,
                "partition no longer owned; not committing");
            return false;
        }
        let Some(tpl) = self.offsets(position) else {
            return false;
        };
        match self.consumer.commit(&tpl, CommitMode::Async) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(topic = %self.key.0, partition = self.key.1, position, error = %e,
                    "offset commit failed; a later commit or the next owner covers it");
                false
            }
        }
    }

    /// Commits `position` and waits for the broker's answer, on a blocking thread (the
    /// at-most-once strategy commits before the handler runs). The lock is not held while
    /// waiting: the broker itself refuses a commit from a member whose generation is over.
    async fn commit_sync(&self, position: i64) -> Result<(), String> {
        if !self.owned() {
            return Err("partition no longer owned".to_owned());
        }
        let Some(tpl) = self.offsets(position) else {
            return Err("bad offset list".to_owned());
        };
        let consumer = self.consumer.clone();
        match tokio::task::spawn_blocking(move || consumer.commit(&tpl, CommitMode::Sync)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What a partition task reports for each message.
#[derive(Clone, Debug)]
pub struct Report {
    /// The message.
    pub delivery: Arc<Delivery>,
    /// What became of it.
    pub outcome: Outcome,
    /// The offset position committed after it, if one was.
    pub committed: Option<i64>,
}

struct PartitionTask {
    generation: u64,
    sender: mpsc::Sender<Arc<Delivery>>,
    handle: JoinHandle<()>,
}

fn to_delivery(m: &BorrowedMessage<'_>) -> Delivery {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    Delivery {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// Runs `inbox` on Kafka until `shutdown` becomes true: then finishes the message each partition
/// has in hand, commits what is resolved, and leaves the group.
pub async fn run<S: InboxStore>(
    inbox: Arc<Inbox<S>>,
    config: KafkaConfig,
    mut shutdown: watch::Receiver<bool>,
    reports: Option<mpsc::UnboundedSender<Report>>,
) -> Result<(), KafkaTransportError> {
    let ownership = Arc::new(Mutex::new(Ownership::default()));
    let group_id = config
        .group_id
        .clone()
        .unwrap_or_else(|| inbox.group().to_owned());
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", &group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (k, v) in &config.settings {
        client.set(k, v);
    }
    let consumer: StreamConsumer<RebalanceContext> = client
        .create_with_context(RebalanceContext {
            ownership: ownership.clone(),
        })
        .map_err(KafkaTransportError::Setup)?;
    let consumer = Arc::new(consumer);
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(KafkaTransportError::Setup)?;
    tracing::info!(group = inbox.group(), kafka_group = %group_id, topics = ?topics, "consumer started");

    let dead_letters = match &config.dead_letter_topic {
        Some(topic) => {
            let mut producer = ClientConfig::new();
            producer
                .set("bootstrap.servers", &config.brokers)
                .set("acks", "all");
            for (k, v) in &config.producer_settings {
                producer.set(k, v);
            }
            let producer: FutureProducer = producer.create().map_err(KafkaTransportError::Setup)?;
            Some(Arc::new(DeadLetterTopic {
                producer,
                topic: topic.clone(),
                group: group_id.clone(),
            }))
        }
        None => None,
    };
    let mut tasks: HashMap<PartitionKey, PartitionTask> = HashMap::new();
    // Partition tasks stop after their message in hand when this turns true; the consumer's
    // own shutdown signal is only read by this loop.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut first_error: Option<KafkaTransportError> = None;

    loop {
        let message = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => break,
            m = consumer.recv() => m,
        };
        let delivery = match message {
            Ok(m) => Arc::new(to_delivery(&m)),
            Err(e) => {
                tracing::warn!(error = %e, "kafka consumer error");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let pk = (delivery.topic.clone(), delivery.partition);
        let generation = lock(&ownership).owned.get(&pk).copied();
        let Some(generation) = generation else {
            // Delivered for a partition we no longer own: the next owner reads it again.
            continue;
        };
        let stale = tasks
            .get(&pk)
            .is_none_or(|t| t.generation != generation || t.handle.is_finished());
        if stale {
            if let Some(PartitionTask { sender, handle, .. }) = tasks.remove(&pk) {
                // Its partition was revoked since: it finishes its message without committing.
                drop(sender);
                reap(handle, &pk, &mut first_error).await;
            }
            let (tx, rx) = mpsc::channel(config.partition_buffer.max(1));
            let committer = Committer {
                consumer: consumer.clone(),
                ownership: ownership.clone(),
                key: pk.clone(),
                generation,
            };
            let handle = tokio::spawn(partition_task(
                inbox.clone(),
                rx,
                committer,
                stop_rx.clone(),
                reports.clone(),
                dead_letters.clone(),
            ));
            tasks.insert(
                pk.clone(),
                PartitionTask {
                    generation,
                    sender: tx,
                    handle,
                },
            );
        }
        let task = tasks.get(&pk).expect("task inserted above");
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => break,
            sent = task.sender.send(delivery) => {
                if sent.is_err() {
                    tracing::warn!(topic = %pk.0, partition = pk.1, "partition task ended early");
                }
            }
        }
    }

    tracing::info!(
        group = inbox.group(),
        "shutting down: finishing messages in hand"
    );
    let _ = stop_tx.send(true);
    for (pk, PartitionTask { sender, handle, .. }) in tasks.drain() {
        drop(sender);
        reap(handle, &pk, &mut first_error).await;
    }
    consumer.unsubscribe();
    drop(consumer);
    tracing::info!(group = inbox.group(), "consumer stopped");
    first_error.map_or(Ok(()), Err)
}

async fn reap(
    handle: JoinHandle<()>,
    pk: &PartitionKey,
    first_error: &mut Option<KafkaTransportError>,
) {
    if let Err(e) = handle.await {
        let error = KafkaTransportError::Task {
            topic: pk.0.clone(),
            partition: pk.1,
            message: e.to_string(),
        };
        tracing::error!(%error);
        first_error.get_or_insert(error);
    }
}

async fn partition_task<S: InboxStore>(
    inbox: Arc<Inbox<S>>,
    mut rx: mpsc::Receiver<Arc<Delivery>>,
    committer: Committer,
    stop: watch::Receiver<bool>,
    reports: Option<mpsc::UnboundedSender<Report>>,
    dead_letters: Option<Arc<DeadLetterTopic>>,
) {
    let mut tracker = OffsetTracker::default();
    let before = inbox.acknowledges_before_processing();
    while let Some(d) = rx.recv().await {
        if *stop.borrow() || !committer.owned() {
            // Shutting down, or the partition was revoked: leave the rest to the next owner.
            break;
        }
        let mut committed = None;
        if before {
            // At most once: the offset is committed before the handler runs; a message whose
            // commit cannot be made is left to the partition's next owner, unprocessed.
            let Some(position) = tracker.resolve(d.offset) else {
                continue;
            };
            let mut wait = Duration::from_millis(100);
            loop {
                match committer.commit_sync(position).await {
                    Ok(()) => break,
                    Err(error) if committer.owned() && !*stop.borrow() => {
                        tracing::warn!(topic = %committer.key.0, partition = committer.key.1, %error,
                            "commit before processing failed; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                    Err(_) => return,
                }
            }
            committed = Some(position);
        }
        let outcome = inbox.process(&d, &stop).await;
        if outcome == Outcome::Abandoned {
            break;
        }
        if let (Some(dlq), Outcome::DeadLettered { reason, id }) = (&dead_letters, &outcome) {
            dlq.publish(&d, reason, *id).await;
        }
        if !before {
            let position = if outcome.acknowledges() {
                tracker.resolve(d.offset)
            } else {
                tracker.hold(d.offset)
            };
            if let Some(position) = position {
                if committer.commit_async(position) {
                    committed = Some(position);
                }
            }
        }
        if let Some(reports) = &reports {
            let _ = reports.send(Report {
                delivery: d.clone(),
                outcome,
                committed,
            });
        }
    }
    // Re-queue the last position: closing the consumer waits for queued commits before it
    // leaves the group.
    if let Some(position) = tracker.position() {
        committer.commit_async(position);
    }
}

/// Publishes dead letters to a topic, besides the dead-letter table.
struct DeadLetterTopic {
    producer: FutureProducer,
    topic: String,
    group: String,
}

impl DeadLetterTopic {
    async fn publish(&self, d: &Delivery, reason: &str, id: i64) {
        let mut headers = OwnedHeaders::new_with_capacity(d.headers.len() + 6);
        for (name, value) in &d.headers {
            headers = headers.insert(Header {
                key: name.as_str(),
                value: value.as_deref(),
            });
        }
        let partition = d.partition.to_string();
        let offset = d.offset.to_string();
        let id = id.to_string();
        for (key, value) in [
            ("txbox_dlq_reason", reason),
            ("txbox_dlq_group", self.group.as_str()),
            ("txbox_dlq_topic", d.topic.as_str()),
            ("txbox_dlq_partition", partition.as_str()),
            ("txbox_dlq_offset", offset.as_str()),
            ("txbox_dlq_id", id.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut wait = Duration::from_millis(100);
        // The dead-letter table already holds the message: the topic is a copy, so a broker that
        // refuses it for long is logged, not waited on forever.
        for attempt in 1..=5 {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&self.topic).headers(headers.clone());
            if let Some(key) = &d.key {
                record = record.key(key.as_slice());
            }
            if let Some(payload) = &d.payload {
                record = record.payload(payload.as_slice());
            }
            match self.producer.send(record, Duration::from_secs(10)).await {
                Ok(_) => return,
                Err((e, _)) => {
                    tracing::warn!(topic = %self.topic, attempt, error = %e, "publishing a dead letter failed");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        }
        tracing::error!(topic = %self.topic, at = %d.coordinates(),
            "dead letter not published to the topic after 5 attempts; it is in the dead-letter table");
    }
}
