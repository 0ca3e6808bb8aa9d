//! The end of a member: its last commits made sure of, then librdkafka's close (the queued
//! commits flushed, the group left), both within what is left of the shutdown grace.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::Offset;
use tokio::time::Instant;

use super::ownership::{lock, offsets, Ownership, PartitionKey, RebalanceContext};

type KafkaConsumer = StreamConsumer<RebalanceContext>;

/// The longest a look at the committed offsets waits for the coordinator.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Makes sure the broker has the last position each partition still owned queued a commit
/// of: an asynchronous commit can fail (the coordinator moving, a request timing out), and
/// nothing after the stop would cover it. Reads the committed offsets back and commits again
/// what is behind, until they match or `until` passes.
pub(super) async fn final_commits(
    consumer: &Arc<KafkaConsumer>,
    ownership: &Arc<Mutex<Ownership>>,
    until: Instant,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        let positions = lock(ownership).final_positions();
        if positions.is_empty() {
            return;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            for ((topic, partition), position) in &positions {
                tracing::warn!(target: "inoutbox::kafka", topic = %topic, partition, position,
                    "the last offset commit is not confirmed; the next owner may process again what came before it");
            }
            return;
        }
        let behind = behind(consumer, positions, left.min(CHECK_TIMEOUT)).await;
        if behind.is_empty() {
            return;
        }
        commit_again(consumer, ownership, &behind);
        tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// The positions the broker does not have yet (all of them if it cannot be asked).
async fn behind(
    consumer: &Arc<KafkaConsumer>,
    positions: Vec<(PartitionKey, i64)>,
    timeout: Duration,
) -> Vec<(PartitionKey, i64)> {
    let Some(tpl) = offsets(positions.iter().map(|(k, p)| (k, *p))) else {
        return Vec::new();
    };
    let probe = consumer.clone();
    // A blocking call, off the runtime's workers; it holds the consumer no longer than
    // `timeout`.
    let committed =
        tokio::task::spawn_blocking(move || probe.committed_offsets(tpl, timeout)).await;
    let Ok(Ok(committed)) = committed else {
        return positions;
    };
    positions
        .into_iter()
        .filter(|((topic, partition), position)| {
            let at = committed
                .find_partition(topic, *partition)
                .map(|e| e.offset());
            !matches!(at, Some(Offset::Offset(o)) if o >= *position)
        })
        .collect()
}

/// Queues the commits of `behind` again, for the partitions still owned in their generation.
fn commit_again(
    consumer: &KafkaConsumer,
    ownership: &Mutex<Ownership>,
    behind: &[(PartitionKey, i64)],
) {
    let own = lock(ownership);
    let owned: Vec<(PartitionKey, i64)> = own.final_positions();
    let again = behind.iter().filter(|b| owned.contains(b));
    let Some(tpl) = offsets(again.map(|(k, p)| (k, *p))) else {
        return;
    };
    if tpl.count() == 0 {
        return;
    }
    if let Err(error) = consumer.commit(&tpl, CommitMode::Async) {
        tracing::warn!(target: "inoutbox::kafka", %error, "committing the last offsets again failed");
    }
}

/// Closes the consumer (librdkafka commits what is queued, revokes the assignment and leaves
/// the group) on a thread of its own, and waits for it until `deadline`: `true` if it closed
/// in time. Past the deadline the thread is left to finish on its own (a blocking task would
/// hold up the runtime's shutdown).
pub(super) async fn close(consumer: Arc<KafkaConsumer>, deadline: Instant) -> bool {
    let (closed, is_closed) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("inoutbox-kafka-close".to_owned())
        .spawn(move || {
            destroy_last(consumer, deadline.into_std());
            let _ = closed.send(());
        });
    if let Err(error) = spawned {
        tracing::warn!(target: "inoutbox::kafka", %error, "cannot start the thread that closes the consumer");
        return false;
    }
    tokio::time::timeout_at(deadline, is_closed).await.is_ok()
}

/// Drops `consumer` once this is its last reference (another one, held by a blocking call
/// that times out, would otherwise close it on that thread), or at `deadline` whatever holds
/// the others.
fn destroy_last(mut consumer: Arc<KafkaConsumer>, deadline: std::time::Instant) {
    loop {
        match Arc::try_unwrap(consumer) {
            Ok(last) => return drop(last),
            Err(shared) if std::time::Instant::now() >= deadline => return drop(shared),
            Err(shared) => consumer = shared,
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
