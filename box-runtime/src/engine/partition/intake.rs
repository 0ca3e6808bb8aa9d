//! Taking messages in: the next micro-batch from a partition's channel, and the reminder that
//! a held position is not silent.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::engine::offsets::OffsetTracker;
use crate::message::Delivery;
use crate::transport::PartitionLink;

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
