//! The end of a member: its last commits made sure of, then librdkafka's close (the queued
//! commits flushed, the group left), both within what is left of the shutdown grace.
//!
//! The close never runs librdkafka's leave-group path against a coordinator it cannot reach:
//! librdkafka 2.12.1 (the one rdkafka-sys bundles) can then dereference a null coordinator in
//! its leave-group handling and crash the process, later, on its own thread. When the
//! coordinator does not answer, the consumer is destroyed without the consumer close (no
//! leave request: the group drops the member after its session timeout, as it would have to
//! anyway with the coordinator unreachable).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::Offset;
use tokio::time::Instant;

use super::ownership::{lock, offsets, Ownership, PartitionKey, RebalanceContext};

type KafkaConsumer = StreamConsumer<RebalanceContext>;

/// The longest a look at the committed offsets waits for the coordinator.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How a consumer was closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closed {
    /// Through librdkafka's consumer close: queued commits flushed, the group left.
    LeftGroup,
    /// The coordinator did not answer: destroyed without the consumer close (and so without
    /// its leave-group path); the group drops the member after its session timeout.
    WithoutLeaving,
}

/// Leaves the group by `deadline`: the last commits get half of the time left, the close
/// the rest. How the consumer was closed, or `None` if that did not finish in time.
pub(super) async fn leave(
    consumer: Arc<KafkaConsumer>,
    ownership: &Arc<Mutex<Ownership>>,
    deadline: Instant,
) -> Option<Closed> {
    let now = Instant::now();
    let half = now + deadline.saturating_duration_since(now) / 2;
    let answered = match final_commits(&consumer, ownership, half).await {
        Some(answered) => answered,
        None => coordinator_answers(&consumer, half).await,
    };
    close(consumer, answered, deadline).await
}

/// Makes sure the broker has the last position each partition still owned queued a commit
/// of: an asynchronous commit can fail (the coordinator moving, a request timing out), and
/// nothing after the stop would cover it. Reads the committed offsets back and commits again
/// what is behind, until they match or `until` passes. Whether the coordinator answered the
/// last reading (`None` if there was nothing to read).
async fn final_commits(
    consumer: &Arc<KafkaConsumer>,
    ownership: &Arc<Mutex<Ownership>>,
    until: Instant,
) -> Option<bool> {
    let mut pause = Duration::from_millis(50);
    let mut answered = None;
    loop {
        let positions = lock(ownership).final_positions();
        if positions.is_empty() {
            return answered;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            for ((topic, partition), position) in &positions {
                tracing::warn!(target: "inoutbox::kafka", topic = %topic, partition, position,
                    "the last offset commit is not confirmed; the next owner may process again what came before it");
            }
            return answered;
        }
        let Some(behind) = behind(consumer, positions.clone(), left.min(CHECK_TIMEOUT)).await
        else {
            answered = Some(false);
            commit_again(consumer, ownership, &positions);
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
            continue;
        };
        answered = Some(true);
        if behind.is_empty() {
            return answered;
        }
        commit_again(consumer, ownership, &behind);
        tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// The positions the broker does not have yet; `None` if the coordinator did not answer.
async fn behind(
    consumer: &Arc<KafkaConsumer>,
    positions: Vec<(PartitionKey, i64)>,
    timeout: Duration,
) -> Option<Vec<(PartitionKey, i64)>> {
    let tpl = offsets(positions.iter().map(|(k, p)| (k, *p)))?;
    let probe = consumer.clone();
    // A blocking call, off the runtime's workers; it holds the consumer no longer than
    // `timeout`.
    let committed =
        tokio::task::spawn_blocking(move || probe.committed_offsets(tpl, timeout)).await;
    let Ok(Ok(committed)) = committed else {
        return None;
    };
    let behind = positions
        .into_iter()
        .filter(|((topic, partition), position)| {
            let at = committed
                .find_partition(topic, *partition)
                .map(|e| e.offset());
            !matches!(at, Some(Offset::Offset(o)) if o >= *position)
        })
        .collect();
    Some(behind)
}

/// Whether the group coordinator answers (asked for the committed offsets of the assignment)
/// before `until`.
async fn coordinator_answers(consumer: &Arc<KafkaConsumer>, until: Instant) -> bool {
    let timeout = until
        .saturating_duration_since(Instant::now())
        .min(CHECK_TIMEOUT);
    let probe = consumer.clone();
    let asked = tokio::task::spawn_blocking(move || {
        let assignment = probe.assignment()?;
        if assignment.count() == 0 {
            // Nothing to ask the coordinator about: the brokers answering will do.
            return probe.fetch_group_list(None, timeout).map(|_| ());
        }
        probe.committed_offsets(assignment, timeout).map(|_| ())
    })
    .await;
    matches!(asked, Ok(Ok(())))
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

/// Closes the consumer on a thread of its own, and waits for it until `deadline`: how, if it
/// closed in time. Past the deadline the thread is left to finish on its own (a blocking task
/// would hold up the runtime's shutdown). With the coordinator `answered`, librdkafka's close
/// commits what is queued, revokes the assignment and leaves the group; without, the consumer
/// is destroyed without it ([`destroy_without_close`]).
async fn close(consumer: Arc<KafkaConsumer>, answered: bool, deadline: Instant) -> Option<Closed> {
    let (closed, is_closed) = tokio::sync::oneshot::channel::<Closed>();
    let spawned = std::thread::Builder::new()
        .name("kafka-close".to_owned())
        .spawn(move || {
            let _ = closed.send(destroy_last(consumer, answered, deadline.into_std()));
        });
    if let Err(error) = spawned {
        tracing::warn!(target: "inoutbox::kafka", %error, "cannot start the thread that closes the consumer");
        return None;
    }
    tokio::time::timeout_at(deadline, is_closed)
        .await
        .ok()?
        .ok()
}

/// Destroys `consumer` once this is its last reference (another one, held by a blocking call
/// that times out, would otherwise close it on that thread): through librdkafka's close if
/// the coordinator `answered`, else without it. At `deadline` it waits on for the last
/// reference only if the close must be skipped (a drop elsewhere would run it).
fn destroy_last(
    mut consumer: Arc<KafkaConsumer>,
    answered: bool,
    deadline: std::time::Instant,
) -> Closed {
    loop {
        match Arc::try_unwrap(consumer) {
            Ok(last) if answered => {
                drop(last);
                return Closed::LeftGroup;
            }
            Ok(last) => {
                destroy_without_close(last);
                return Closed::WithoutLeaving;
            }
            Err(shared) if answered && std::time::Instant::now() >= deadline => {
                drop(shared);
                return Closed::LeftGroup;
            }
            Err(shared) => consumer = shared,
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Destroys the consumer with `RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE`: librdkafka then never
/// sends (or fakes the answer of) a leave request, the path that can crash when the
/// coordinator is gone. Commits still queued are given up after the session timeout.
///
/// rdkafka's own drop would close the consumer and destroy the handle a second time, so the
/// Rust side (the context librdkafka's callbacks point into, the queue handle) is left
/// allocated: a few hundred bytes, once per consumer stopped with its coordinator unreachable.
fn destroy_without_close(consumer: KafkaConsumer) {
    use rdkafka::bindings as rd;
    let consumer = std::mem::ManuallyDrop::new(consumer);
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live handle `consumer` owns, and nothing else uses it any more (this
    // was its last reference). The queue callback rdkafka registered is turned off first (its
    // target stays allocated anyway); then the handle is destroyed once, here, and never by
    // rdkafka, whose wrapper is never dropped.
    unsafe {
        let queue = rd::rd_kafka_queue_get_consumer(rk);
        if !queue.is_null() {
            rd::rd_kafka_queue_cb_event_enable(queue, None, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(queue);
        }
        rd::rd_kafka_destroy_flags(rk, rd::RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Health;
    use rdkafka::config::ClientConfig;
    use rdkafka::mocking::MockCluster;

    /// A member of group `g` on `cluster`, once it holds its assignment of topic `t`.
    async fn joined(
        cluster: &MockCluster<'_, rdkafka::producer::DefaultProducerContext>,
    ) -> (Arc<KafkaConsumer>, Arc<Mutex<Ownership>>) {
        let ownership = Arc::new(Mutex::new(Ownership::default()));
        let consumer: KafkaConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "g")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .create_with_context(RebalanceContext {
                ownership: ownership.clone(),
                health: Health::default(),
            })
            .expect("consumer");
        consumer.subscribe(&["t"]).expect("subscribe");
        let consumer = Arc::new(consumer);
        let until = Instant::now() + Duration::from_secs(30);
        while consumer.assignment().map_or(0, |a| a.count()) == 0 {
            assert!(
                Instant::now() < until,
                "the member never got its assignment"
            );
            let _ = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await;
        }
        (consumer, ownership)
    }

    /// The crash of librdkafka 2.12.1 is in its leave-group path with the coordinator gone: a
    /// stop then never takes that path (and with the coordinator there, it does leave).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_the_coordinator_gone_the_consumer_is_closed_without_the_leave_path() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("t", 1, 1).expect("topic");

        let (consumer, ownership) = joined(&cluster).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let closed = leave(consumer, &ownership, deadline).await;
        assert_eq!(
            closed,
            Some(Closed::LeftGroup),
            "with the coordinator answering"
        );

        let (consumer, ownership) = joined(&cluster).await;
        cluster.broker_down(1).expect("broker down");
        let deadline = Instant::now() + Duration::from_secs(6);
        let closed = leave(consumer, &ownership, deadline).await;
        assert_eq!(
            closed,
            Some(Closed::WithoutLeaving),
            "with the coordinator gone, the consumer close (and its leave path) must not run"
        );
    }
}
