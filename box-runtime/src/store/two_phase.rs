//! What the two-phase inbox and the effects drain need from a store: received rows claimed
//! with leases, and effects scheduled in a handler's transaction.

use std::time::Duration;

use super::InboxKey;
use crate::message::Delivery;

/// What a worker asks for when it claims a received row.
#[derive(Clone, Copy, Debug)]
pub struct LeaseRequest<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// Who claims (unique per worker pool, across processes).
    pub owner: &'a str,
    /// How long the claim holds unless renewed.
    pub lease: Duration,
    /// The event types of the group's two-phase handlers.
    pub event_types: &'a [&'a str],
    /// Those among them that keep per-key order: a row of such a type is claimed only when no
    /// earlier row of its key (same topic, partition and message key) is still unprocessed.
    pub ordered: &'a [&'a str],
}

/// A received row, claimed by a worker.
#[derive(Clone, Debug)]
pub struct ReceivedRow {
    /// Its inbox key.
    pub key: InboxKey,
    /// The message as it was received (headers, key and payload).
    pub delivery: Delivery,
}

/// An effect scheduled by a handler, claimed by the drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEffect {
    /// Its row id.
    pub id: i64,
    /// The consumer group of the handler that scheduled it.
    pub group: String,
    /// The event id of the message whose handler scheduled it.
    pub event_id: String,
    /// What to run (the name an executor is registered under).
    pub kind: String,
    /// The key the receiving side deduplicates on: the same for every run of this effect.
    pub idempotency_key: String,
    /// The serialized payload.
    pub payload: Vec<u8>,
    /// Earlier failed runs.
    pub attempts: u32,
}

/// A consumer group's effects not done, as the gauge sampler counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EffectCounts {
    /// Effects not done yet.
    pub pending: i64,
    /// Effects not done whose runs failed at least once.
    pub failed: i64,
    /// Seconds since the oldest effect not done was scheduled, if any.
    pub oldest_pending_secs: Option<f64>,
}
