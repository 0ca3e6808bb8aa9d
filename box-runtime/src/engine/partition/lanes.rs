//! Key-ordered lanes ([`Ordering::Key`](crate::engine::Ordering::Key)): the messages of one
//! partition are spread over concurrent lanes by a hash of their key, so that one key's
//! messages stay in offset order in one lane while different keys run side by side. Each lane
//! takes micro-batches; the partition resolves offsets as lanes finish, and the tracker keeps
//! the committed position from passing any message still in a lane.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::shutdown::CancellationToken;

use super::intake::{next_batch, reminder, warn_if_held};
use super::state::Partition;
use crate::engine::Inbox;
use crate::message::{Delivery, Outcome};
use crate::store::InboxStore;
use crate::transport::PartitionLink;
use crate::util::CatchUnwind;

type Results = Vec<(Arc<Delivery>, Outcome)>;

/// What a lane sends back: a batch's results, or the panic that ended it (outside the
/// handler's guard).
type LaneEnd = Result<Results, String>;

/// Runs the partition in lanes; `Err(panic)` when a panic outside the handler's guard ended a
/// lane (its batch stays in flight in the tracker: the position never passes it). The lanes
/// are tasks of this run: when the run is dropped (aborted at the end of the grace period),
/// they are aborted with it, their transactions rolled back.
pub(super) async fn run<S: InboxStore, L: PartitionLink>(
    part: &mut Partition<L>,
    inbox: Arc<Inbox<S>>,
    deliveries: &mut mpsc::Receiver<Arc<Delivery>>,
) -> Result<(), String> {
    let lanes = inbox.key_lanes();
    let capacity = inbox.config().max_batch.max(1);
    let (done_tx, mut done) = mpsc::unbounded_channel::<LaneEnd>();
    let mut senders = Vec::with_capacity(lanes);
    let mut tasks = JoinSet::new();
    for _ in 0..lanes {
        let (tx, rx) = mpsc::channel(capacity);
        senders.push(tx);
        tasks.spawn(lane(inbox.clone(), rx, part.stop.clone(), done_tx.clone()));
    }
    drop(done_tx);
    let mut reminder = reminder();
    let mut panicked = None;
    loop {
        tokio::select! {
            d = deliveries.recv() => {
                let Some(d) = d else { break };
                if part.ending() {
                    break;
                }
                part.tracker.start(d.offset);
                let lane = lane_of(d.key.as_deref(), lanes);
                if senders[lane].send(d).await.is_err() {
                    break; // the lane stopped (shutdown, or a panic it reports below)
                }
            }
            Some(end) = done.recv() => match end {
                Ok(results) => if !part.settle(results).await {
                    break;
                },
                Err(panic) => {
                    panicked = Some(panic);
                    break;
                }
            },
            _ = reminder.tick() => warn_if_held(&part.tracker, &part.link),
        }
    }
    // Lanes finish the batch in hand; what they never started stays unresolved, so the
    // committed position stays before it.
    drop(senders);
    while let Some(end) = done.recv().await {
        match end {
            Ok(results) => {
                part.settle(results).await;
            }
            Err(panic) => {
                panicked.get_or_insert(panic);
            }
        }
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            panicked.get_or_insert(e.to_string());
        }
    }
    panicked.map_or(Ok(()), Err)
}

async fn lane<S: InboxStore>(
    inbox: Arc<Inbox<S>>,
    mut deliveries: mpsc::Receiver<Arc<Delivery>>,
    stop: CancellationToken,
    done: mpsc::UnboundedSender<LaneEnd>,
) {
    let (max, wait) = (inbox.config().max_batch.max(1), inbox.config().max_wait);
    let mut idle = reminder();
    loop {
        let Some(batch) = next_batch(&mut deliveries, max, wait, &mut idle, || {}).await else {
            break;
        };
        if stop.is_cancelled() {
            break;
        }
        let refs: Vec<&Delivery> = batch.iter().map(|d| &**d).collect();
        let outcomes = match CatchUnwind(Box::pin(inbox.process_batch(&refs, &stop))).await {
            Ok(outcomes) => outcomes,
            Err(panic) => {
                let _ = done.send(Err(panic));
                break;
            }
        };
        let abandoned = outcomes.contains(&Outcome::Abandoned);
        if done
            .send(Ok(batch.into_iter().zip(outcomes).collect()))
            .is_err()
            || abandoned
        {
            break;
        }
    }
}

/// The lane of a key: a stable hash (FNV-1a) of its bytes; keyless messages share lane 0.
fn lane_of(key: Option<&[u8]>, lanes: usize) -> usize {
    let Some(key) = key else { return 0 };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % lanes as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::lane_of;

    #[test]
    fn one_key_one_lane() {
        assert_eq!(lane_of(Some(b"k-1"), 8), lane_of(Some(b"k-1"), 8));
        assert_eq!(lane_of(None, 8), 0);
        let spread: std::collections::HashSet<usize> = (0..100)
            .map(|i| lane_of(Some(format!("key-{i}").as_bytes()), 8))
            .collect();
        assert!(spread.len() > 4, "keys spread over lanes: {spread:?}");
    }
}
