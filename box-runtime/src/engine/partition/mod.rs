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

mod batches;
mod intake;
mod lanes;
mod state;

use state::Partition;
pub use state::Report;

/// Runs one partition's messages through `inbox` until the channel closes, `stop` turns true
/// or the partition is no longer owned: in micro-batches (see [`Inbox::process_batch`]), or in
/// key-ordered lanes with [`Ordering::Key`]. Commits once per batch as messages resolve; on the
/// way out re-queues the last position (closing the consumer waits for queued commits).
pub(crate) async fn run<S: InboxStore, L: PartitionLink>(
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
        batches::at_most_once(&mut part, &inbox, deliveries).await;
    } else if inbox.config().ordering == Ordering::Key {
        lanes::run(&mut part, inbox, deliveries).await;
    } else {
        batches::batches(&mut part, &inbox, deliveries).await;
    }
    if let Some(position) = part.tracker.position() {
        part.link.commit(position);
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
