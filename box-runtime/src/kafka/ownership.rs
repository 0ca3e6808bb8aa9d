//! Partition ownership: which partitions this member owns since which rebalance, and the
//! [`PartitionLink`] of one owned partition (commits only while owned).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::shutdown::CancellationToken;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::dead_letter::DeadLetterTopic;
use crate::message::Delivery;
use crate::telemetry::Health;
use crate::transport::PartitionLink;

pub(super) type PartitionKey = (Arc<str>, i32);

/// Which partitions this member owns, and since which rebalance.
#[derive(Default)]
pub(super) struct Ownership {
    generation: u64,
    pub(super) owned: HashMap<PartitionKey, u64>,
    /// The stop signal of each running partition task: turned on when the partition is
    /// revoked (the task stops retrying at once, so it never dead-letters a message the next
    /// owner is processing) and at shutdown.
    pub(super) stops: HashMap<PartitionKey, CancellationToken>,
    /// The last position each partition queued a commit of, and in which generation: what a
    /// stop makes sure the broker has (a queued commit can fail).
    pub(super) queued: HashMap<PartitionKey, (u64, i64)>,
}

impl Ownership {
    /// Signals every partition task to stop.
    pub(super) fn stop_all(&mut self) {
        for (_, stop) in self.stops.drain() {
            stop.cancel();
        }
    }

    /// The last queued position of each partition still owned in the generation that queued it.
    pub(super) fn final_positions(&self) -> Vec<(PartitionKey, i64)> {
        self.queued
            .iter()
            .filter(|(key, (generation, _))| self.owned.get(*key) == Some(generation))
            .map(|(key, (_, position))| (key.clone(), *position))
            .collect()
    }
}

/// Follows rebalances; the lock is also held while committing, so no commit for a partition
/// goes out after its revocation was seen.
pub(super) struct RebalanceContext {
    pub(super) ownership: Arc<Mutex<Ownership>>,
    /// Joined from the first assignment (even of no partition) until a rebalance fails.
    pub(super) health: Health,
}

impl ClientContext for RebalanceContext {}

impl ConsumerContext for RebalanceContext {
    /// The result of an asynchronous commit: a failure is logged (a later commit covers it
    /// while the partition runs; a stop checks and retries the last one).
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            for e in offsets.elements() {
                tracing::warn!(target: "inoutbox::kafka", topic = e.topic(), partition = e.partition(),
                    position = ?e.offset(), %error, "offset commit failed");
            }
        }
    }

    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut own = lock(&self.ownership);
            for e in tpl.elements() {
                let key: PartitionKey = (e.topic().into(), e.partition());
                own.owned.remove(&key);
                own.queued.remove(&key);
                if let Some(stop) = own.stops.remove(&key) {
                    stop.cancel();
                }
                tracing::info!(target: "inoutbox::kafka",
                    topic = e.topic(),
                    partition = e.partition(),
                    "partition revoked"
                );
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Error(error) = rebalance {
            self.health.set_joined(false);
            tracing::warn!(target: "inoutbox::kafka", %error, "rebalance failed");
        }
        if let Rebalance::Assign(tpl) = rebalance {
            self.health.set_joined(true);
            let mut own = lock(&self.ownership);
            own.generation += 1;
            let generation = own.generation;
            for e in tpl.elements() {
                own.owned
                    .insert((e.topic().into(), e.partition()), generation);
                tracing::info!(target: "inoutbox::kafka",
                    topic = e.topic(),
                    partition = e.partition(),
                    "partition assigned"
                );
            }
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One partition of one ownership generation: commits its offsets while it is owned, and
/// publishes its dead letters to the dead-letter topic.
pub(super) struct KafkaPartition {
    pub(super) consumer: Arc<StreamConsumer<RebalanceContext>>,
    pub(super) ownership: Arc<Mutex<Ownership>>,
    /// (topic, partition), built once: the ownership check runs for every message.
    pub(super) key: PartitionKey,
    pub(super) generation: u64,
    pub(super) dead_letters: Option<Arc<DeadLetterTopic>>,
}

impl KafkaPartition {
    fn owned_in(&self, own: &Ownership) -> bool {
        own.owned.get(&self.key) == Some(&self.generation)
    }

    fn offsets(&self, position: i64) -> Option<TopicPartitionList> {
        offsets([(&self.key, position)])
    }
}

impl PartitionLink for KafkaPartition {
    /// Whether the partition is still owned by this generation.
    fn owned(&self) -> bool {
        self.owned_in(&lock(&self.ownership))
    }

    /// Queues an asynchronous commit of `position` (the next offset to read) if the partition
    /// is still ours. Queueing does not block, and the ownership lock is held while it happens,
    /// so no commit is queued after the partition's revocation was seen. Closing the consumer
    /// waits for queued commits.
    fn commit(&self, position: i64) -> bool {
        let mut own = lock(&self.ownership);
        if !self.owned_in(&own) {
            tracing::debug!(target: "inoutbox::kafka", topic = %self.key.0, partition = self.key.1, position,
                "partition no longer owned; not committing");
            return false;
        }
        let Some(tpl) = self.offsets(position) else {
            return false;
        };
        match self.consumer.commit(&tpl, CommitMode::Async) {
            Ok(()) => {
                own.queued
                    .insert(self.key.clone(), (self.generation, position));
                true
            }
            Err(e) => {
                tracing::warn!(target: "inoutbox::kafka", topic = %self.key.0, partition = self.key.1, position, error = %e,
                    "offset commit failed; a later commit or the next owner covers it");
                false
            }
        }
    }

    /// Commits `position` and waits for the broker's answer, on a blocking thread (the
    /// at-most-once strategy commits before the handler runs). The lock is not held while
    /// waiting: the broker itself refuses a commit from a member whose generation is over.
    async fn commit_now(&self, position: i64) -> Result<(), String> {
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

    async fn dead_lettered(&self, delivery: &Delivery, reason: &str, id: i64) {
        if let Some(dlq) = &self.dead_letters {
            dlq.publish(delivery, reason, id).await;
        }
    }

    fn name(&self) -> String {
        format!("{}/{}", self.key.0, self.key.1)
    }
}

/// The offset list of these positions (`None`, logged, if librdkafka refuses one).
pub(super) fn offsets<'a>(
    positions: impl IntoIterator<Item = (&'a PartitionKey, i64)>,
) -> Option<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), position) in positions {
        if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(position)) {
            tracing::error!(target: "inoutbox::kafka", error = %e, "cannot build the offset list");
            return None;
        }
    }
    Some(tpl)
}
