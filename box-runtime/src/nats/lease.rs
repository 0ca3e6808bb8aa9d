//! Leases on partitions, in a JetStream key-value bucket, and the link of one owned partition.
//!
//! A lease is the bucket's key `<group>.<topic>.<partition>`: created (only if absent) by the
//! member that takes the partition, updated every renewal interval with the revision it last
//! wrote (an update with another revision fails: someone else holds it), deleted when the
//! member gives it up. The bucket's TTL removes the key of a member that stopped renewing.
//!
//! The fence is twofold. Locally, a lease is valid until its TTL counted from when the last
//! successful renewal was *sent* (before the server stored it, so never later than the
//! server's expiry): the link acknowledges nothing once that time has passed, however long the
//! process was paused. On the server, each lease reads through a consumer of its own (named
//! with the lease's revision): the next owner deletes its predecessor's consumers, so an
//! acknowledgement that was already on its way lands on a consumer that no longer exists.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_nats::jetstream::message::Acker;
use tokio::sync::mpsc;

use super::dead_letter::DeadLetterSubject;
use crate::message::Delivery;
use crate::transport::PartitionLink;

/// One lease, shared by the member (which renews it) and the link (which acknowledges under it).
pub(super) struct Lease {
    /// Until when it holds (local clock).
    valid_until: Mutex<Instant>,
    /// Lost: a renewal failed, or the member gave it up.
    lost: AtomicBool,
    /// The delivered messages not yet acknowledged, by stream sequence: what a commit
    /// acknowledges (the highest below its position, the consumer acknowledging all).
    pending: Mutex<BTreeMap<i64, Acker>>,
}

impl Lease {
    pub(super) fn new(valid_until: Instant) -> Self {
        Self {
            valid_until: Mutex::new(valid_until),
            lost: AtomicBool::new(false),
            pending: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether the lease still holds now.
    pub(super) fn holds(&self) -> bool {
        !self.lost.load(Ordering::SeqCst) && Instant::now() < *lock(&self.valid_until)
    }

    /// A renewal sent at `sent` succeeded: valid until `sent + ttl`.
    pub(super) fn renewed(&self, until: Instant) {
        *lock(&self.valid_until) = until;
    }

    /// The lease is lost (or given up): nothing is acknowledged under it any more.
    pub(super) fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
        lock(&self.pending).clear();
    }

    /// A message was delivered: its acknowledgement waits for a commit past it.
    pub(super) fn delivered(&self, sequence: i64, acker: Acker) {
        lock(&self.pending).insert(sequence, acker);
    }

    /// The acknowledgement of every pending message before `position` (that of the highest),
    /// taken out of the pending ones.
    fn take_below(&self, position: i64) -> Option<Acker> {
        let mut pending = lock(&self.pending);
        let rest = pending.split_off(&position);
        let below = std::mem::replace(&mut *pending, rest);
        below.into_values().next_back()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One partition under one lease.
pub(super) struct NatsPartition {
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) lease: Arc<Lease>,
    /// The member's acknowledgement queue (sent in order, flushed at shutdown).
    pub(super) acks: mpsc::UnboundedSender<Acker>,
    pub(super) dead_letters: Option<Arc<DeadLetterSubject>>,
}

impl PartitionLink for NatsPartition {
    fn owned(&self) -> bool {
        self.lease.holds()
    }

    /// Queues the acknowledgement of the last delivered message before `position` (the
    /// consumer acknowledges all up to it), only while the lease holds.
    fn commit(&self, position: i64) -> bool {
        if !self.lease.holds() {
            tracing::debug!(target: "inoutbox::nats", topic = %self.topic, partition = self.partition, position,
                "lease no longer held; not acknowledging");
            return false;
        }
        if let Some(acker) = self.lease.take_below(position) {
            return self.acks.send(acker).is_ok();
        }
        true
    }

    /// Acknowledges up to `position` and waits for the server's confirmation.
    async fn commit_now(&self, position: i64) -> Result<(), String> {
        if !self.lease.holds() {
            return Err("lease no longer held".to_owned());
        }
        match self.lease.take_below(position) {
            Some(acker) => acker.double_ack().await.map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    async fn dead_lettered(&self, delivery: &Delivery, reason: &str, id: i64) {
        if let Some(dlq) = &self.dead_letters {
            dlq.publish(delivery, reason, id).await;
        }
    }

    fn name(&self) -> String {
        format!("{}/{}", self.topic, self.partition)
    }
}
