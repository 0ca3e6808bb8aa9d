//! One relay worker: a session holding a share of the slots, and the loop that reads, publishes
//! and marks their rows, one batch at a time.
//!
//! A worker reads a batch only after the previous one was acknowledged and marked, and always
//! from the oldest publishable row of each of its slots. That is what keeps per-key order
//! simple: no cursor can pass a row that commits late (see the module docs of `relay`). The
//! workers of a relay (and of every relay) overlap with each other instead: while one waits
//! for the broker, the others read or mark.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::shutdown::CancellationToken;
use tokio::time::Instant;
use tracing::Instrument;

use super::shared::Shared;
use super::{RelayError, RelaySession, RelayStore};
use crate::store::StoreError;
use crate::transport::Publisher;

/// How soon a worker holding less than its share tries again to claim slots.
const CLAIM_RETRY: Duration = Duration::from_millis(250);
/// How often a worker rebalances in its first [`YOUTH`]: relays started together (or one
/// joining a running group) find their shares within a fraction of a second.
const YOUNG_REBALANCE: Duration = Duration::from_millis(25);
/// See [`YOUNG_REBALANCE`].
const YOUTH: Duration = Duration::from_secs(2);

/// What a step did.
enum Step {
    /// Published a batch: read again at once.
    Busy,
    /// Nothing to publish (or no slot held): wait for a wake-up.
    Idle,
}

/// The slots a worker holds and where its next read starts.
struct Slots {
    /// All slots of the store: `0..count`.
    count: u32,
    /// Held, sorted.
    held: Vec<u32>,
    /// The slot the next read starts at (the reads rotate over the held slots).
    start: u32,
    next_rebalance: Instant,
    /// When the next scheduled row of the held slots is due, as of the last read that found
    /// nothing: an idle worker wakes up then, notification or not.
    next_due: Option<Instant>,
    born: Instant,
}

impl Slots {
    fn new(count: u32) -> Self {
        let count = count.max(1);
        Self {
            count,
            held: Vec::new(),
            start: 0,
            next_rebalance: Instant::now(),
            next_due: None,
            born: Instant::now(),
        }
    }

    /// Takes or gives back slots so that every member of the group holds about
    /// `count / members`, and checks that the session still holds what it believes it holds.
    async fn rebalance<R: RelaySession>(
        &mut self,
        session: &mut R,
        interval: Duration,
    ) -> Result<(), StoreError> {
        let members = session.members().await?;
        let share = (self.count as usize).div_ceil(members.count.max(1));
        if self.held.len() > share {
            let excess = self.held.split_off(share);
            session.release(&excess).await?;
        }
        session.verify(&self.held).await?;
        if self.held.len() < share {
            // Contiguous blocks: extend the run held, or start at this member's place.
            let from = match self.held.last() {
                Some(&last) => last + 1,
                None => (members.rank * self.count as usize / members.count.max(1)) as u32,
            };
            let candidates: Vec<u32> = (0..self.count)
                .map(|i| (from + i) % self.count)
                .filter(|s| !self.held.contains(s))
                .collect();
            let claimed = session.claim(&candidates, share - self.held.len()).await?;
            self.held.extend(claimed);
            self.held.sort_unstable();
        }
        tracing::debug!(target: "inoutbox::relay",
            members = members.count,
            share,
            held = ?self.held,
            "relay worker rebalanced"
        );
        let mut wait = interval;
        if self.held.len() < share {
            wait = wait.min(CLAIM_RETRY);
        }
        if self.born.elapsed() < YOUTH {
            wait = wait.min(YOUNG_REBALANCE);
        }
        self.next_rebalance = Instant::now() + wait;
        Ok(())
    }
}

/// Runs one worker until the relay stops. Store errors drop the session (and with it the
/// slots) and open a new one after a backoff; a configuration error (a session that cannot
/// hold its locks) ends the relay.
pub(super) async fn run<S: RelayStore, P: Publisher>(
    shared: Arc<Shared<S, P>>,
    session: S::Session,
    n: usize,
) -> Result<(), RelayError> {
    let stop = shared.stop.clone();
    let mut wake = shared.wake.subscribe();
    let mut slots = Slots::new(shared.store.slots());
    let mut session = Some(session);
    let mut errors = 0u32;
    while !stop.is_cancelled() {
        let current = match session.as_mut() {
            Some(current) => current,
            None => match reopen(&shared, &stop).await {
                Some(Ok(opened)) => session.insert(opened),
                Some(Err(e)) => {
                    errors += 1;
                    pause(&shared, &stop, errors, &e, n).await;
                    continue;
                }
                None => break,
            },
        };
        let stepped = step(&shared, current, &mut slots, &mut wake).await;
        match &stepped {
            Ok(_) => shared.telemetry.health.cycle(),
            Err(_) => shared.telemetry.health.set_database(false),
        }
        match stepped {
            Ok(Step::Busy) => errors = 0,
            Ok(Step::Idle) => {
                errors = 0;
                let until = slots
                    .next_due
                    .map_or(slots.next_rebalance, |due| due.min(slots.next_rebalance));
                tokio::select! {
                    _ = wake.changed() => {}
                    () = tokio::time::sleep_until(until) => {}
                    () = stop.cancelled() => {}
                }
            }
            Err(StoreError::Config(message)) => {
                if let Some(s) = session.take() {
                    s.close().await;
                }
                return Err(StoreError::Config(message).into());
            }
            Err(e) => {
                errors += 1;
                if let Some(s) = session.take() {
                    s.close().await; // its slots go with it
                }
                slots.held.clear();
                pause(&shared, &stop, errors, &e, n).await;
            }
        }
    }
    if let Some(s) = session.take() {
        s.close().await;
    }
    Ok(())
}

async fn reopen<S: RelayStore, P: Publisher>(
    shared: &Shared<S, P>,
    stop: &CancellationToken,
) -> Option<Result<S::Session, StoreError>> {
    tokio::select! {
        opened = shared.store.open() => Some(opened),
        () = stop.cancelled() => None,
    }
}

async fn pause<S, P>(
    shared: &Shared<S, P>,
    stop: &CancellationToken,
    errors: u32,
    error: &StoreError,
    worker: usize,
) {
    let wait = shared.config.backoff.delay(errors);
    tracing::warn!(target: "inoutbox::relay", worker, %error, retry_in = ?wait, "relay worker: store error; reconnecting");
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        () = stop.cancelled() => {}
    }
}

/// One step: rebalance if due, then read, publish and mark one batch.
async fn step<S: RelayStore, P: Publisher>(
    shared: &Shared<S, P>,
    session: &mut S::Session,
    slots: &mut Slots,
    wake: &mut watch::Receiver<u64>,
) -> Result<Step, StoreError> {
    let config = &shared.config;
    if Instant::now() >= slots.next_rebalance {
        slots.rebalance(session, config.rebalance_interval).await?;
    }
    slots.next_due = None;
    if slots.held.is_empty() {
        return Ok(Step::Idle);
    }
    // Seen before the read: a notification that arrives during it wakes the next wait.
    wake.borrow_and_update();
    let rows = session
        .read(&slots.held, slots.start, config.batch_size)
        .await?;
    let Some(last) = rows.last() else {
        // Nothing publishable: sleep until a notification, the poll, or the next due time.
        let due = session.next_due(&slots.held).await?;
        slots.next_due = due.map(|wait| Instant::now() + wait);
        return Ok(Step::Idle);
    };
    if rows.len() >= config.batch_size {
        // More may be waiting: the next read starts after the last slot of this one, so
        // every held slot gets its turn however busy the first ones are.
        slots.start = (last.slot + 1) % slots.count;
    }
    let span =
        tracing::info_span!(target: "inoutbox::relay", "inoutbox.relay.batch", rows = rows.len());
    shared
        .publish(session, &slots.held, &rows)
        .instrument(span)
        .await?;
    Ok(Step::Busy)
}
