//! A partition's run: what a transport starts for each partition it owns (see
//! [`Partitions`](crate::transport::Partitions)), in one of three shapes: micro-batches in
//! offset order (`batches`), key-ordered lanes (`lanes`), or at most once (`batches`). Messages
//! come in through `intake`; `state` settles what they came to (commit, report).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::engine::config::Ordering;
use crate::engine::offsets::OffsetTracker;
use crate::engine::Inbox;
use crate::message::Delivery;
use crate::sealed::Sealed;
use crate::shutdown::CancellationToken;
use crate::store::InboxStore;
use crate::telemetry::Health;
use crate::transport::{PartitionLink, Partitions};
use crate::util::CatchUnwind;

mod batches;
mod intake;
mod lanes;
mod state;

use state::Partition;
pub use state::Report;

/// Runs one partition's messages through `inbox` until the channel closes, `stop` turns true
/// or the partition is no longer owned: in micro-batches (see [`Inbox::process_batch`]), or in
/// key-ordered lanes with [`Ordering::Key`] when the store runs more than one
/// transaction at once. Commits once per batch as messages resolve; on the
/// way out re-queues the last position (closing the consumer waits for queued commits).
///
/// A panic outside the handler's guard (in the store, in the run itself, in a lane) halts the
/// partition (see [`halt`]): the run never ends early, so the transport never starts a second
/// run of the partition whose fresh position would pass the messages the first one held.
pub(crate) async fn run<S: InboxStore, L: PartitionLink>(
    inbox: Arc<Inbox<S>>,
    mut deliveries: mpsc::Receiver<Arc<Delivery>>,
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
    let shape = async {
        if inbox.acknowledges_before_processing() {
            batches::at_most_once(&mut part, &inbox, &mut deliveries).await;
            Ok(())
        } else if inbox.config().ordering == Ordering::Key && inbox.key_lanes() > 1 {
            // (One lane is the partition's order: the batches below.)
            lanes::run(&mut part, inbox.clone(), &mut deliveries).await
        } else {
            batches::batches(&mut part, &inbox, &mut deliveries).await;
            Ok(())
        }
    };
    let ended = CatchUnwind(Box::pin(shape)).await.and_then(|lanes| lanes);
    // The tracker only ever hands out positions before every unresolved message, panic or
    // not: what it committed last is safe to commit again.
    if let Some(position) = part.tracker.position() {
        part.link.commit(position);
    }
    if let Err(panic) = ended {
        halt(&part, &inbox.health(), &panic, &mut deliveries).await;
        // Ends by the same panic, so that the transport's join of the run (and with it the
        // consumer's run) reports it.
        std::panic::resume_unwind(Box::new(format!(
            "partition {} halted: {panic}",
            part.link.name()
        )));
    }
}

/// After a panic outside the handler's guard: the partition takes nothing more and commits
/// nothing more (its committed position stays before every message it did not resolve) until
/// the partition is revoked or the consumer stops; then the next run, in this process or
/// another, starts from that position. The consumer is no longer live (see
/// [`Health::live`]), so that a supervisor restarts it; the deliveries are left unread, so the
/// transport stops fetching the partition.
async fn halt<L: PartitionLink>(
    part: &Partition<L>,
    health: &Health,
    panic: &str,
    deliveries: &mut mpsc::Receiver<Arc<Delivery>>,
) {
    health.set_live(false);
    tracing::error!(target: "inoutbox::engine", partition = %part.link.name(), panic,
        committed = ?part.tracker.position(),
        "a panic outside the handler halted the partition: it takes and commits nothing more \
         until it is revoked or the consumer stops (the consumer reports itself not live)");
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = part.stop.cancelled() => return,
            _ = check.tick() => {
                if !part.link.owned() || deliveries.is_closed() {
                    return;
                }
            }
        }
    }
}

/// The engine's side of the transport contract for one consumer: starts partition runs of
/// its inbox.
pub(crate) struct Starter<S> {
    pub(crate) inbox: Arc<Inbox<S>>,
    pub(crate) reports: Option<mpsc::UnboundedSender<Report>>,
    pub(crate) sample_interval: Duration,
}

impl<S> Clone for Starter<S> {
    fn clone(&self) -> Self {
        Self {
            inbox: self.inbox.clone(),
            reports: self.reports.clone(),
            sample_interval: self.sample_interval,
        }
    }
}

impl<S> Sealed for Starter<S> {}

impl<S: InboxStore> Partitions for Starter<S> {
    fn group(&self) -> &str {
        self.inbox.group()
    }

    fn health(&self) -> Health {
        self.inbox.health()
    }

    fn sample_interval(&self) -> Duration {
        self.sample_interval
    }

    fn start<L: PartitionLink>(
        &self,
        link: L,
        deliveries: mpsc::Receiver<Arc<Delivery>>,
        stop: CancellationToken,
    ) -> JoinHandle<()> {
        tokio::spawn(run(
            self.inbox.clone(),
            deliveries,
            link,
            stop,
            self.reports.clone(),
        ))
    }
}

#[cfg(test)]
mod tests;
