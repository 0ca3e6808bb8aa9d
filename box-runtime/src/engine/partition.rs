//! The transport-side contract: what a broker must do for the engine, and the loop that runs
//! one partition's messages through the inbox.
//!
//! A transport (Kafka, the in-process cluster, a future NATS or RabbitMQ one) does three things:
//! - **deliveries in**: for each partition it owns, it starts [`run`] with a channel of that
//!   partition's [`Delivery`]s, in offset order;
//! - **resolution out**: [`run`] tells it, through the partition's [`PartitionLink`], which
//!   position may be committed (never past a message that is not resolved, see
//!   [`OffsetTracker`]);
//! - **ownership changes**: the link says whether the partition is still owned; once it is not,
//!   [`run`] stops at once, commits nothing more, and the transport starts a new run for the
//!   next assignment.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::shutdown::CancellationToken;

use super::{lanes, Delivery, Inbox, OffsetTracker, Ordering, Outcome};
use crate::backoff::Backoff;
use crate::store::InboxStore;

/// One owned partition, as the transport exposes it to the engine.
pub trait PartitionLink: Send + Sync + 'static {
    /// Whether this member still owns the partition (for the assignment the run started in).
    fn owned(&self) -> bool;

    /// Queues a commit of `position` (the next offset to read) without waiting; `false` when
    /// it was not queued (the partition is no longer owned, or the broker refused it).
    fn commit(&self, position: i64) -> bool;

    /// Commits `position` and waits for the broker's answer (the at-most-once strategy commits
    /// before the handler runs).
    fn commit_now(&self, position: i64) -> impl Future<Output = Result<(), String>> + Send;

    /// A message was dead-lettered (it is in the dead-letter table already): the transport may
    /// also publish it, e.g. to a dead-letter topic.
    fn dead_lettered(
        &self,
        delivery: &Delivery,
        reason: &str,
        id: i64,
    ) -> impl Future<Output = ()> + Send;

    /// `topic/partition`, for logs.
    fn name(&self) -> String;
}

/// What a partition run reports for each message (see `ConsumerBuilder::reports`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// The message.
    pub delivery: Arc<Delivery>,
    /// What became of it.
    pub outcome: Outcome,
    /// The offset position committed after it, if one was.
    pub committed: Option<i64>,
}

/// Runs one partition's messages through `inbox` until the channel closes, `stop` turns true
/// or the partition is no longer owned: in micro-batches (see [`Inbox::process_batch`]), or in
/// key-ordered lanes with [`Ordering::Key`]. Commits once per batch as messages resolve; on the
/// way out re-queues the last position (closing the consumer waits for queued commits).
pub async fn run<S: InboxStore, L: PartitionLink>(
    inbox: Arc<Inbox<S>>,
    deliveries: mpsc::Receiver<Arc<Delivery>>,
    link: L,
    stop: CancellationToken,
    reports: Option<mpsc::UnboundedSender<Report>>,
) {
    let mut part = Partition {
        link,
        stop,
        reports,
        tracker: OffsetTracker::default(),
    };
    if inbox.acknowledges_before_processing() {
        part.at_most_once(&inbox, deliveries).await;
    } else if inbox.config().ordering == Ordering::Key {
        lanes::run(&mut part, inbox, deliveries).await;
    } else {
        part.batches(&inbox, deliveries).await;
    }
    if let Some(position) = part.tracker.position() {
        part.link.commit(position);
    }
}

/// One partition's state while it runs.
pub(super) struct Partition<L> {
    pub(super) link: L,
    pub(super) stop: CancellationToken,
    reports: Option<mpsc::UnboundedSender<Report>>,
    pub(super) tracker: OffsetTracker,
}

impl<L: PartitionLink> Partition<L> {
    /// Whether to stop taking messages: shutting down, or the partition was revoked (the rest
    /// is left to the next owner).
    pub(super) fn ending(&self) -> bool {
        self.stop.is_cancelled() || !self.link.owned()
    }

    /// Micro-batches in offset order: each batch one transaction, then one commit.
    async fn batches<S: InboxStore>(
        &mut self,
        inbox: &Inbox<S>,
        mut deliveries: mpsc::Receiver<Arc<Delivery>>,
    ) {
        let (max, wait) = (inbox.config().max_batch.max(1), inbox.config().max_wait);
        let mut reminder = reminder();
        loop {
            let next = next_batch(&mut deliveries, max, wait, &mut reminder, || {
                warn_if_held(&self.tracker, &self.link)
            });
            let Some(batch) = next.await else {
                break;
            };
            if self.ending() {
                break;
            }
            let refs: Vec<&Delivery> = batch.iter().map(|d| &**d).collect();
            let outcomes = inbox.process_batch(&refs, &self.stop).await;
            if !self.settle(batch.into_iter().zip(outcomes)).await {
                break;
            }
        }
    }

    /// Resolves a batch's messages in the tracker (dead letters also go to the transport),
    /// commits the position once, and reports; `false` if a message was abandoned (shutdown,
    /// revocation).
    ///
    /// An abandoned message stays in flight in the tracker: a message after it in the batch
    /// that did resolve (a copy of an earlier message, a dead letter) never moves the position
    /// past it, so the next owner of the partition reads it again.
    pub(super) async fn settle(
        &mut self,
        results: impl IntoIterator<Item = (Arc<Delivery>, Outcome)>,
    ) -> bool {
        let mut settled = Vec::new();
        // The position to commit, and the message whose resolution moved it there last.
        let mut position = None;
        let mut mover = 0;
        let mut complete = true;
        for (d, outcome) in results {
            if outcome == Outcome::Abandoned {
                self.tracker.start(d.offset);
                complete = false;
                continue;
            }
            if let Outcome::DeadLettered { reason, id } = &outcome {
                self.link.dead_lettered(&d, reason, *id).await;
            }
            let moved = if outcome.acknowledges() {
                self.tracker.resolve(d.offset)
            } else {
                self.tracker.hold(d.offset)
            };
            if moved.is_some() {
                position = moved;
                mover = settled.len();
            }
            settled.push((d, outcome));
        }
        let committed = position.filter(|p| self.link.commit(*p));
        if let Some(reports) = &self.reports {
            for (n, (delivery, outcome)) in settled.into_iter().enumerate() {
                let committed = if n == mover { committed } else { None };
                let _ = reports.send(Report {
                    delivery,
                    outcome,
                    committed,
                });
            }
        }
        complete
    }

    /// At most once: each offset is committed before its handler runs; a message whose commit
    /// cannot be made is left to the partition's next owner, unprocessed.
    async fn at_most_once<S: InboxStore>(
        &mut self,
        inbox: &Inbox<S>,
        mut deliveries: mpsc::Receiver<Arc<Delivery>>,
    ) {
        while let Some(d) = deliveries.recv().await {
            if self.ending() {
                break;
            }
            let Some(position) = self.tracker.resolve(d.offset) else {
                continue;
            };
            if !commit_before(&self.link, position, &self.stop).await {
                return;
            }
            let outcome = inbox.process(&d, &self.stop).await;
            if outcome == Outcome::Abandoned {
                break;
            }
            if let Outcome::DeadLettered { reason, id } = &outcome {
                self.link.dead_lettered(&d, reason, *id).await;
            }
            if let Some(reports) = &self.reports {
                let _ = reports.send(Report {
                    delivery: d,
                    outcome,
                    committed: Some(position),
                });
            }
        }
    }
}

/// The next batch: waits for a first message, takes what else is ready up to `max`, and waits
/// up to `wait` for more while the batch is not full. `None` when the channel closed.
pub(super) async fn next_batch(
    deliveries: &mut mpsc::Receiver<Arc<Delivery>>,
    max: usize,
    wait: std::time::Duration,
    reminder: &mut tokio::time::Interval,
    mut on_reminder: impl FnMut(),
) -> Option<Vec<Arc<Delivery>>> {
    let first = loop {
        tokio::select! {
            d = deliveries.recv() => break d?,
            _ = reminder.tick() => on_reminder(),
        }
    };
    let mut batch = Vec::with_capacity(max.min(64));
    batch.push(first);
    while batch.len() < max {
        match deliveries.try_recv() {
            Ok(d) => batch.push(d),
            Err(_) => break,
        }
    }
    if batch.len() < max && !wait.is_zero() {
        let deadline = tokio::time::Instant::now() + wait;
        while batch.len() < max {
            match tokio::time::timeout_at(deadline, deliveries.recv()).await {
                Ok(Some(d)) => batch.push(d),
                _ => break,
            }
        }
    }
    Some(batch)
}

pub(super) fn reminder() -> tokio::time::Interval {
    let mut reminder = tokio::time::interval(HELD_REMINDER);
    reminder.reset();
    reminder
}

/// How often a partition whose commit position is pinned by an unacknowledged message says so.
const HELD_REMINDER: std::time::Duration = std::time::Duration::from_secs(60);

/// `OnExhausted::LeaveUncommitted` pins the committed offset at the failed message until a
/// restart or rebalance: say so periodically, so it is not silent.
pub(super) fn warn_if_held<L: PartitionLink>(tracker: &OffsetTracker, link: &L) {
    if let Some(offset) = tracker.lowest_held() {
        tracing::warn!(target: "inoutbox::engine", partition = %link.name(), offset,
            "the committed offset is held at a message left unacknowledged \
             (OnExhausted::LeaveUncommitted); it is delivered again after a restart or rebalance");
    }
}

/// Commits `position` before processing, retrying while the partition is owned and the
/// consumer runs; `false` if it gave up.
async fn commit_before<L: PartitionLink>(
    link: &L,
    position: i64,
    stop: &CancellationToken,
) -> bool {
    let mut backoff = Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    )
    .start();
    loop {
        match link.commit_now(position).await {
            Ok(()) => return true,
            Err(error) if link.owned() && !stop.is_cancelled() => {
                let wait = backoff.next_delay();
                tracing::warn!(target: "inoutbox::engine", partition = %link.name(), %error, retry_in = ?wait,
                    "commit before processing failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};


    use crate::shutdown::CancellationToken;
    use super::{Delivery, OffsetTracker, Outcome, Partition, PartitionLink};

    /// A link that owns its partition for ever and records the positions committed.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<i64>>);

    impl PartitionLink for Arc<Recorder> {
        fn owned(&self) -> bool {
            true
        }
        fn commit(&self, position: i64) -> bool {
            self.0.lock().unwrap().push(position);
            true
        }
        async fn commit_now(&self, position: i64) -> Result<(), String> {
            self.commit(position);
            Ok(())
        }
        async fn dead_lettered(&self, _: &Delivery, _: &str, _: i64) {}
        fn name(&self) -> String {
            "t/0".to_owned()
        }
    }

    fn delivery(offset: i64) -> Arc<Delivery> {
        Arc::new(Delivery {
            topic: "t".into(),
            partition: 0,
            offset,
            key: None,
            payload: None,
            headers: Vec::new(),
        })
    }

    #[tokio::test]
    async fn a_message_resolved_after_an_abandoned_one_never_commits_past_it() {
        let link = Arc::new(Recorder::default());
        let stop = CancellationToken::new();
        let mut part = Partition {
            link: link.clone(),
            stop,
            reports: None,
            tracker: OffsetTracker::default(),
        };
        let batch = [
            (delivery(10), Outcome::Processed { attempt: 1 }),
            (delivery(11), Outcome::Abandoned),
            (delivery(12), Outcome::Abandoned),
            // A copy of an earlier message, and a dead letter, resolved after the abandoned.
            (delivery(13), Outcome::Duplicate),
            (
                delivery(14),
                Outcome::DeadLettered {
                    reason: "bad".to_owned(),
                    id: 1,
                },
            ),
        ];
        assert!(!part.settle(batch).await, "the batch is not complete");
        assert_eq!(
            *link.0.lock().unwrap(),
            [11],
            "committed up to the abandoned message"
        );
        assert_eq!(part.tracker.position(), Some(11));
    }
}
