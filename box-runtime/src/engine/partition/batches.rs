//! The two ways a partition runs besides key lanes: micro-batches in offset order, and at most
//! once (each position committed before its handler runs).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::intake::{next_batch, reminder, warn_if_held};
use super::state::{Partition, Report};
use crate::backoff::Backoff;
use crate::engine::Inbox;
use crate::message::{Delivery, Outcome};
use crate::shutdown::CancellationToken;
use crate::store::InboxStore;
use crate::transport::PartitionLink;

/// Micro-batches in offset order: each batch one transaction, then one commit.
pub(super) async fn batches<S: InboxStore, L: PartitionLink>(
    part: &mut Partition<L>,
    inbox: &Inbox<S>,
    deliveries: &mut mpsc::Receiver<Arc<Delivery>>,
) {
    let (max, wait) = (inbox.config().max_batch.max(1), inbox.config().max_wait);
    let mut reminder = reminder();
    loop {
        let next = next_batch(deliveries, max, wait, &mut reminder, || {
            warn_if_held(&part.tracker, &part.link)
        });
        let Some(batch) = next.await else {
            break;
        };
        if part.ending() {
            break;
        }
        let refs: Vec<&Delivery> = batch.iter().map(|d| &**d).collect();
        let outcomes = inbox.process_batch(&refs, &part.stop).await;
        if !part.settle(batch.into_iter().zip(outcomes)).await {
            break;
        }
    }
}

/// At most once: each offset is committed before its handler runs; a message whose commit
/// cannot be made is left to the partition's next owner, unprocessed.
pub(super) async fn at_most_once<S: InboxStore, L: PartitionLink>(
    part: &mut Partition<L>,
    inbox: &Inbox<S>,
    deliveries: &mut mpsc::Receiver<Arc<Delivery>>,
) {
    while let Some(d) = deliveries.recv().await {
        if part.ending() {
            break;
        }
        let Some(position) = part.tracker.resolve(d.offset) else {
            continue;
        };
        if !commit_before(&part.link, position, &part.stop).await {
            return;
        }
        let outcome = inbox.process(&d, &part.stop).await;
        if outcome == Outcome::Abandoned {
            break;
        }
        if let Outcome::DeadLettered { reason, id } = &outcome {
            part.link.dead_lettered(&d, reason, *id).await;
        }
        if let Some(reports) = &part.reports {
            let _ = reports.send(Report {
                delivery: d,
                outcome,
                committed: Some(position),
            });
        }
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
