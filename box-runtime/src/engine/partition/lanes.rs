//! Key-ordered lanes ([`Ordering::Key`](crate::engine::Ordering::Key)): the messages of one
//! partition run in concurrent transactions, each a micro-batch of waiting messages whose keys
//! no batch in flight holds, so that one key's messages stay in offset order while different
//! keys run side by side.
//!
//! A batch is cut when a transaction can start (a permit of [`Inbox::transactions`], one per
//! connection of the store's pool, shared by the group's partitions), from what waits then:
//! while the database is slow to answer (far away, or busy), messages gather and the next
//! batch carries more of them; while it answers fast, batches are cut as they come. So the
//! number of transactions follows the round trip, not the number of partitions, and no
//! message waits for a connection that another lane holds idle. The partition resolves offsets
//! as batches finish, and the tracker keeps the committed position from passing any message
//! still waiting or in a batch.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::poll_fn;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinSet;
use tokio_util::sync::PollSemaphore;

use crate::shutdown::CancellationToken;

use super::intake::{reminder, warn_if_held};
use super::state::Partition;
use crate::engine::Inbox;
use crate::message::{Delivery, Outcome};
use crate::store::InboxStore;
use crate::transport::PartitionLink;
use crate::util::{fnv1a64, CatchUnwind};

type Results = Vec<(Arc<Delivery>, Outcome)>;

/// What a batch's task gives back: the keys it held, how long it ran, and its results or the
/// panic that ended it (outside the handler's guard).
type BatchEnd = (Vec<u64>, Duration, Result<Results, String>);

/// About how long one batch should run at most while messages wait: a longer one would leave
/// connections idle at the end of a backlog while it finishes alone; a shorter one pays more
/// commits and claims per message (measured 1 ms from PostgreSQL: 100 ms batches ran 4 500 to
/// 5 600 msgs/s, 300 ms 7 700 to 7 900, 1 s no more). Batches are cut to it from the time a
/// message took in the batches before.
const BATCH_TIME: Duration = Duration::from_millis(300);

/// About how long one batch runs at least while enough messages wait: spreading what waits
/// over more transactions than the round trip needs only pays more claims and commits per
/// message. While the database answers fast (a message in tens of microseconds), batches stay
/// as large as the partition order's; while it is far away, the share among the free
/// transactions is larger than this anyway.
const MIN_BATCH_TIME: Duration = Duration::from_millis(20);

/// Runs the partition in key-ordered batches; `Err(panic)` when a panic outside the handler's
/// guard ended a batch (its messages stay in flight in the tracker: the position never passes
/// them). The batches are tasks of this run: when the run is dropped (aborted at the end of the
/// grace period), they are aborted with it, their transactions rolled back.
pub(super) async fn run<S: InboxStore, L: PartitionLink>(
    part: &mut Partition<L>,
    inbox: Arc<Inbox<S>>,
    deliveries: &mut mpsc::Receiver<Arc<Delivery>>,
) -> Result<(), String> {
    let (most, max) = (inbox.key_lanes(), inbox.config().max_batch.max(1));
    let mut waiting = Waiting::new(max.saturating_mul(2));
    let mut permits = PollSemaphore::new(inbox.transactions.clone());
    let mut batches: JoinSet<BatchEnd> = JoinSet::new();
    let mut reminder = reminder();
    let mut panicked = None;
    // Taking no more messages: the channel closed, or the run is ending.
    let (mut closed, mut stopping) = (false, false);
    loop {
        if stopping || (closed && waiting.is_empty()) {
            break;
        }
        let cut = waiting.runnable() && batches.len() < most;
        tokio::select! {
            biased;
            Some(joined) = batches.join_next() => {
                let (keys, took, end) = joined
                    .unwrap_or_else(|e| (Vec::new(), Duration::ZERO, Err(e.to_string())));
                waiting.release(&keys, took);
                match end {
                    Ok(results) => stopping = !part.settle(results).await,
                    Err(panic) => {
                        panicked = Some(panic);
                        stopping = true;
                    }
                }
            }
            Some(permit) = poll_fn(|cx| permits.poll_acquire(cx)), if cut => {
                if part.ending() {
                    stopping = true;
                    continue;
                }
                let free = inbox.transactions.available_permits().min(most - batches.len() - 1);
                let (keys, batch) = waiting.cut(max, free);
                batches.spawn(run_batch(inbox.clone(), keys, batch, part.stop.clone(), permit));
            }
            d = deliveries.recv(), if !closed && waiting.has_room() => {
                let Some(d) = d else {
                    closed = true;
                    continue;
                };
                if part.ending() {
                    stopping = true;
                    continue;
                }
                part.tracker.start(d.offset);
                waiting.push(d);
                while waiting.has_room() {
                    let Ok(d) = deliveries.try_recv() else { break };
                    part.tracker.start(d.offset);
                    waiting.push(d);
                }
            }
            () = part.stop.cancelled(), if !stopping => stopping = true,
            _ = reminder.tick() => warn_if_held(&part.tracker, &part.link),
        }
    }
    // Batches in flight finish the message in hand; what never ran stays unresolved, so the
    // committed position stays before it.
    while let Some(joined) = batches.join_next().await {
        match joined {
            Ok((_, _, Ok(results))) => {
                part.settle(results).await;
            }
            Ok((_, _, Err(panic))) => {
                panicked.get_or_insert(panic);
            }
            Err(e) => {
                panicked.get_or_insert(e.to_string());
            }
        }
    }
    panicked.map_or(Ok(()), Err)
}

/// One batch in its own transaction, holding its permit until it ends.
async fn run_batch<S: InboxStore>(
    inbox: Arc<Inbox<S>>,
    keys: Vec<u64>,
    batch: Vec<Arc<Delivery>>,
    stop: CancellationToken,
    permit: OwnedSemaphorePermit,
) -> BatchEnd {
    let (refs, started): (Vec<&Delivery>, _) =
        (batch.iter().map(|d| &**d).collect(), Instant::now());
    let ended = CatchUnwind(Box::pin(inbox.process_batch(&refs, &stop))).await;
    drop(permit);
    let took = started.elapsed();
    (
        keys,
        took,
        ended.map(|outcomes| batch.into_iter().zip(outcomes).collect()),
    )
}

/// The messages of a partition waiting for a batch, in offset order, and the keys that batches
/// in flight hold.
struct Waiting {
    queue: VecDeque<(u64, Arc<Delivery>)>,
    /// Key → its messages in batches in flight.
    busy: HashMap<u64, usize>,
    room: usize,
    /// What one message took in the batches that ended (a moving average), if any did.
    per_message: Option<Duration>,
    /// No waiting message can run before a batch in flight ends: each waits behind its key.
    stuck: bool,
}

impl Waiting {
    fn new(room: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            busy: HashMap::new(),
            room: room.max(1),
            per_message: None,
            stuck: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn has_room(&self) -> bool {
        self.queue.len() < self.room
    }

    fn runnable(&self) -> bool {
        !self.queue.is_empty() && !self.stuck
    }

    fn push(&mut self, d: Arc<Delivery>) {
        let key = key_of(d.key.as_deref());
        if !self.busy.contains_key(&key) {
            self.stuck = false;
        }
        self.queue.push_back((key, d));
    }

    /// Takes waiting messages, in offset order, whose keys no batch in flight holds and no
    /// message left waiting before them has; their keys become busy. Takes at most `max`; past
    /// a share of what waits beside `free` other transactions that could start now (so that
    /// none idles while one carries a long batch), but no less than what runs in about
    /// [`MIN_BATCH_TIME`] and no more than what runs in about [`BATCH_TIME`], only messages of
    /// keys the batch already holds (no other transaction could take them).
    fn cut(&mut self, max: usize, free: usize) -> (Vec<u64>, Vec<Arc<Delivery>>) {
        let mut share = self.queue.len().div_ceil(free + 1);
        if let Some(per_message) = self.per_message.filter(|t| !t.is_zero()) {
            let fits = |time: Duration| {
                usize::try_from(time.as_nanos() / per_message.as_nanos()).unwrap_or(usize::MAX)
            };
            share = share.max(fits(MIN_BATCH_TIME)).min(fits(BATCH_TIME));
        }
        let max = max.max(1);
        let share = share.clamp(1, max);
        // A key left waiting stays left: its later messages find it busy, or no room (the batch
        // only grows, and the key is not among those it holds).
        let mut held = HashSet::new();
        let (mut keys, mut batch) = (Vec::new(), Vec::new());
        let mut left = VecDeque::with_capacity(self.queue.len());
        for (key, d) in self.queue.drain(..) {
            let room = batch.len() < share || (batch.len() < max && held.contains(&key));
            if room && !self.busy.contains_key(&key) {
                held.insert(key);
                keys.push(key);
                batch.push(d);
            } else {
                left.push_back((key, d));
            }
        }
        self.queue = left;
        for key in &keys {
            *self.busy.entry(*key).or_default() += 1;
        }
        self.recheck();
        (keys, batch)
    }

    /// A batch of `keys` ended after `took`: its keys are free again.
    fn release(&mut self, keys: &[u64], took: Duration) {
        if !keys.is_empty() {
            let each = took / u32::try_from(keys.len()).unwrap_or(u32::MAX);
            self.per_message = Some(self.per_message.map_or(each, |avg| (avg * 3 + each) / 4));
        }
        for key in keys {
            if let Some(n) = self.busy.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.busy.remove(key);
                }
            }
        }
        self.recheck();
    }

    fn recheck(&mut self) {
        self.stuck = self.queue.iter().all(|(k, _)| self.busy.contains_key(k));
    }
}

/// A key's hash ([`fnv1a64`]); keyless messages share one (0, never a key's). Two keys with one
/// hash only wait for each other.
fn key_of(key: Option<&[u8]>) -> u64 {
    key.map_or(0, |key| fnv1a64(&[key]) as u64 | 1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::Duration;

    use super::{key_of, Waiting};
    use crate::message::Delivery;

    fn msg(offset: i64, key: Option<&str>) -> Arc<Delivery> {
        Arc::new(Delivery {
            topic: "t".into(),
            partition: 0,
            offset,
            key: key.map(|k| k.as_bytes().to_vec()),
            payload: None,
            headers: Vec::new(),
        })
    }

    fn offsets(batch: &[Arc<Delivery>]) -> Vec<i64> {
        batch.iter().map(|d| d.offset).collect()
    }

    #[test]
    fn keys_hash_apart_and_keyless_messages_share_one() {
        assert_eq!(key_of(Some(b"k-1")), key_of(Some(b"k-1")));
        assert_ne!(key_of(Some(b"k-1")), key_of(Some(b"k-2")));
        assert_ne!(key_of(Some(b"")), key_of(None));
    }

    #[test]
    fn a_batch_never_takes_a_key_a_batch_in_flight_holds_nor_passes_its_waiting_message() {
        let mut w = Waiting::new(100);
        for (offset, key) in [(0, "a"), (1, "b"), (2, "a"), (3, "c"), (4, "b"), (5, "d")] {
            w.push(msg(offset, Some(key)));
        }
        let (_, first) = w.cut(2, 0);
        assert_eq!(offsets(&first), [0, 1]);
        // a and b are busy: 2 (a) and 4 (b) wait; c and d run.
        let (_, second) = w.cut(10, 0);
        assert_eq!(offsets(&second), [3, 5]);
        assert!(!w.runnable(), "only messages of busy keys wait");
        w.release(&[key_of(Some(b"a"))], Duration::ZERO);
        assert!(w.runnable());
        let (_, third) = w.cut(10, 0);
        assert_eq!(offsets(&third), [2], "b is still held by the first batch");
    }

    #[test]
    fn past_its_share_a_batch_takes_only_the_keys_it_holds() {
        let mut w = Waiting::new(100);
        for (offset, key) in [(0, "a"), (1, "a"), (2, "b"), (3, "a"), (4, "c")] {
            w.push(msg(offset, Some(key)));
        }
        // Five waiting, four transactions could start: a share of two; a's later messages
        // could run nowhere else, so they come along (b, c are left to the others).
        let (_, batch) = w.cut(10, 3);
        assert_eq!(offsets(&batch), [0, 1, 3]);
        let (_, batch) = w.cut(1, 3);
        assert_eq!(offsets(&batch), [2], "max is a hard bound");
    }

    /// `n` waiting messages of different keys, after batches that took `each` a message.
    fn measured(n: i64, each: Duration) -> Waiting {
        let mut w = Waiting::new(1000);
        for offset in 0..n {
            w.push(msg(offset, Some(&format!("k-{offset}"))));
        }
        w.release(&[key_of(None); 10], each * 10);
        w
    }

    #[test]
    fn a_batch_runs_between_the_least_and_the_most_time_a_batch_should() {
        // 1 ms a message, 100 transactions could start: a share of 10, raised to the 20
        // messages that run in MIN_BATCH_TIME.
        let (_, batch) = measured(1000, Duration::from_millis(1)).cut(500, 99);
        assert_eq!(batch.len(), 20);
        // 10 ms a message, nothing else could start: the share of 1000 is cut to the 30 that
        // run in BATCH_TIME.
        let (_, batch) = measured(1000, Duration::from_millis(10)).cut(500, 0);
        assert_eq!(batch.len(), 30);
        // Fast messages (a loopback database): batches as large as max allows, never larger.
        let (_, batch) = measured(1000, Duration::from_micros(20)).cut(500, 99);
        assert_eq!(batch.len(), 500);
        // Nothing measured yet: the share alone.
        let mut w = Waiting::new(1000);
        for offset in 0..100 {
            w.push(msg(offset, Some(&format!("k-{offset}"))));
        }
        assert_eq!(w.cut(500, 9).1.len(), 10);
    }

    #[test]
    fn one_key_runs_one_batch_at_a_time_in_offset_order() {
        let mut w = Waiting::new(100);
        for offset in 0..5 {
            w.push(msg(offset, None));
        }
        let (keys, first) = w.cut(3, 0);
        assert_eq!(offsets(&first), [0, 1, 2]);
        assert!(!w.runnable());
        w.release(&keys, Duration::ZERO);
        let (_, second) = w.cut(3, 0);
        assert_eq!(offsets(&second), [3, 4]);
    }
}
