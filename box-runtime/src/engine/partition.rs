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

use tokio::sync::{mpsc, watch};

use super::{Delivery, Inbox, OffsetTracker, Outcome};
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

/// Runs one partition's messages through `inbox`, in order, until the channel closes, `stop`
/// turns true or the partition is no longer owned. Commits as messages resolve; on the way out
/// re-queues the last position (closing the consumer waits for queued commits).
pub async fn run<S: InboxStore, L: PartitionLink>(
    inbox: Arc<Inbox<S>>,
    mut deliveries: mpsc::Receiver<Arc<Delivery>>,
    link: L,
    stop: watch::Receiver<bool>,
    reports: Option<mpsc::UnboundedSender<Report>>,
) {
    let mut tracker = OffsetTracker::default();
    let before = inbox.acknowledges_before_processing();
    let mut reminder = tokio::time::interval(HELD_REMINDER);
    reminder.reset();
    loop {
        let d = tokio::select! {
            d = deliveries.recv() => match d {
                Some(d) => d,
                None => break,
            },
            _ = reminder.tick() => {
                warn_if_held(&tracker, &link);
                continue;
            }
        };
        if *stop.borrow() || !link.owned() {
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
            if !commit_before(&link, position, &stop).await {
                return;
            }
            committed = Some(position);
        }
        let outcome = inbox.process(&d, &stop).await;
        if outcome == Outcome::Abandoned {
            break;
        }
        if let Outcome::DeadLettered { reason, id } = &outcome {
            link.dead_lettered(&d, reason, *id).await;
        }
        if !before {
            let position = if outcome.acknowledges() {
                tracker.resolve(d.offset)
            } else {
                tracker.hold(d.offset)
            };
            if let Some(position) = position {
                if link.commit(position) {
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
    if let Some(position) = tracker.position() {
        link.commit(position);
    }
}

/// How often a partition whose commit position is pinned by an unacknowledged message says so.
const HELD_REMINDER: std::time::Duration = std::time::Duration::from_secs(60);

/// `OnExhausted::LeaveUncommitted` pins the committed offset at the failed message until a
/// restart or rebalance: say so periodically, so it is not silent.
fn warn_if_held<L: PartitionLink>(tracker: &OffsetTracker, link: &L) {
    if let Some(offset) = tracker.lowest_held() {
        tracing::warn!(partition = %link.name(), offset,
            "the committed offset is held at a message left unacknowledged \
             (OnExhausted::LeaveUncommitted); it is delivered again after a restart or rebalance");
    }
}

/// Commits `position` before processing, retrying while the partition is owned and the
/// consumer runs; `false` if it gave up.
async fn commit_before<L: PartitionLink>(
    link: &L,
    position: i64,
    stop: &watch::Receiver<bool>,
) -> bool {
    let mut backoff = Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    )
    .start();
    loop {
        match link.commit_now(position).await {
            Ok(()) => return true,
            Err(error) if link.owned() && !*stop.borrow() => {
                let wait = backoff.next_delay();
                tracing::warn!(partition = %link.name(), %error, retry_in = ?wait,
                    "commit before processing failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(_) => return false,
        }
    }
}
