//! What the relay needs from a store ([`RelayStore`] and its [`RelaySession`]); the backends
//! implement them (`postgres::relay`, `sqlite::relay`).

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::outbox::Retention;
use crate::store::StoreError;

/// The ordering unit: events of one `(topic, key)` are published in `seq` order. An event
/// without a key is a unit of its own (identified by its id).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRef {
    /// Topic.
    pub topic: String,
    /// The Kafka key; `None` for keyless events.
    pub key: Option<String>,
    /// For keyless events, the row's id (`Uuid::nil()` otherwise).
    pub id: Uuid,
}

/// An unpublished row, as the relay reads it.
#[derive(Clone, Debug)]
pub struct PendingRow {
    /// Event id (`ce_id`).
    pub id: Uuid,
    /// Publication order within the key.
    pub seq: i64,
    /// The slot of the row's key (see [`RelayStore::slots`]).
    pub slot: u32,
    /// Topic.
    pub topic: String,
    /// Kafka key.
    pub key: Option<String>,
    /// Event type (`ce_type`).
    pub event_type: String,
    /// The JSON payload, as text.
    pub payload: String,
    /// Extra headers stored with the row (`traceparent`, ...).
    pub headers: Vec<(String, String)>,
    /// Failed attempts so far.
    pub attempts: i32,
    /// The due time of a scheduled row (seconds since the Unix epoch); `None` for a row
    /// published as soon as it commits.
    pub due_at: Option<f64>,
}

impl PendingRow {
    /// The ordering unit of the row.
    pub fn key_ref(&self) -> KeyRef {
        KeyRef {
            topic: self.topic.clone(),
            key: self.key.clone(),
            id: if self.key.is_some() {
                Uuid::nil()
            } else {
                self.id
            },
        }
    }
}

/// The extra headers stored with a row (a JSON object of strings), as the relay publishes
/// them; anything that is not a string is left out.
pub(crate) fn parse_headers(json: &str) -> Vec<(String, String)> {
    if json == "{}" {
        return Vec::new();
    }
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json)
        .map(|m| {
            m.into_iter()
                .filter_map(|(k, v)| match v {
                    serde_json::Value::String(s) => Some((k, s)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The group of sessions sharing the slots, as one session sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Members {
    /// How many sessions (of every relay on this table) share the slots, this one included.
    pub count: usize,
    /// This session's place among them (from 0, in an order every session agrees on): where
    /// it starts claiming, so that members take contiguous blocks of slots.
    pub rank: usize,
}

/// A failed publication of one row, to record.
#[derive(Clone, Debug)]
pub struct Failure<'a> {
    /// The row.
    pub row: &'a PendingRow,
    /// The error, as text.
    pub error: &'a str,
    /// Give up on the row (park it) rather than retry.
    pub park: bool,
    /// Leave the row's key alone for this long (when not parked).
    pub backoff: Duration,
}

/// The storage a relay needs: PostgreSQL ([`PgRelayStore`](crate::postgres::PgRelayStore))
/// and SQLite ([`SqliteRelayStore`](crate::sqlite::SqliteRelayStore)) implement it.
///
/// Keys are hashed into [`slots`](RelayStore::slots); a slot is the unit a relay claims. The
/// contract that keeps per-key order with any number of relays:
///
/// * every row of one `(topic, key)` has the same slot;
/// * a slot is held by at most one [`RelaySession`] at a time, and a session that dies (its
///   process killed, its connection lost) loses its slots;
/// * [`RelaySession::read`] returns, per slot, the slot's publishable rows from its oldest on,
///   in `seq` order, read in one snapshot; rows of a key that is backing off are left out, and
///   so are the later rows of that key; a parked row holds the later rows of its key in the
///   same way until it is unparked;
/// * a scheduled row (a due time, see [`crate::outbox::enqueue_at`]) is publishable once its
///   due time has passed by the database's clock; until then it is left out and holds nothing
///   (the later rows of its key are publishable); [`RelaySession::next_due`] says when the
///   next one is due, so that an idle worker wakes up for it.
///
/// A store written outside this crate may implement it (with its [`RelaySession`]); the
/// rules above are what `inoutbox::testing::relay_conformance` (feature `testing`) checks.
pub trait RelayStore: Send + Sync + 'static {
    /// A worker's hold on the store: its claimed slots and the connection it reads through.
    type Session: RelaySession;

    /// How many slots keys are hashed into (slots are `0..slots()`).
    fn slots(&self) -> u32;

    /// Opens a session and makes it a member of the group of sessions sharing the slots.
    fn open(&self) -> impl Future<Output = Result<Self::Session, StoreError>> + Send;

    /// Starts listening for commits (so no wake-up is missed between a read and the wait).
    fn listen(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Waits until a row may have committed (a notification) or `timeout` passed.
    fn wait(&self, timeout: Duration) -> impl Future<Output = ()> + Send;

    /// Deletes published rows older than the retention window; returns how many.
    fn purge<'a>(
        &'a self,
        retention: &'a Retention,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a;

    /// How many committed rows are still to publish: neither published nor parked nor
    /// scheduled for later (rows waiting for a retry count). [`Relay::drain`](crate::relay::Relay::drain) runs until it
    /// is 0.
    fn unpublished(&self) -> impl Future<Output = Result<u64, StoreError>> + Send + '_ {
        async move { Ok(u64::try_from(self.backlog().await?.unpublished).unwrap_or(0)) }
    }

    /// The outbox's backlog, for the relay's gauges: one statement.
    fn backlog(&self) -> impl Future<Output = Result<Backlog, StoreError>> + Send + '_;
}

/// What an outbox holds that is not published yet.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Backlog {
    /// Rows not published yet that are due (parked rows, and scheduled rows not yet due,
    /// excluded).
    pub unpublished: i64,
    /// How long ago the oldest of them was enqueued (a scheduled row: how long ago it became
    /// due); `None` when there is none.
    pub oldest_unpublished_age: Option<Duration>,
    /// Parked rows (given up on until unparked).
    pub parked: i64,
    /// Keys held by a parked row: none of their later rows is published until it is unparked.
    pub held_keys: i64,
    /// Scheduled rows not yet due ([`crate::outbox::enqueue_at`]).
    pub scheduled: i64,
}

impl Backlog {
    /// From the counts and the oldest row's age in seconds.
    pub fn new(unpublished: i64, oldest_age_secs: Option<f64>, parked: i64) -> Self {
        Self {
            unpublished,
            oldest_unpublished_age: oldest_age_secs
                .map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO)),
            parked,
            held_keys: 0,
            scheduled: 0,
        }
    }

    /// The same backlog with `scheduled` rows not yet due.
    pub fn with_scheduled(mut self, scheduled: i64) -> Self {
        self.scheduled = scheduled;
        self
    }

    /// The same backlog with `held_keys` keys held by a parked row.
    pub fn with_held_keys(mut self, held_keys: i64) -> Self {
        self.held_keys = held_keys;
        self
    }
}

/// One worker's session: membership, claimed slots, and the reads, marks and failures of the
/// rows of those slots. Every call is made on the session's own connection (PostgreSQL), so a
/// lost connection, which also loses the slots, fails the next call before anything of its
/// slots is published.
pub trait RelaySession: Send + 'static {
    /// The sessions (of every relay on this table) sharing the slots, and this one's rank.
    fn members(&mut self) -> impl Future<Output = Result<Members, StoreError>> + Send + '_;

    /// Tries to claim slots of `candidates`, in their order and without waiting, until `want`
    /// were claimed; returns those claimed.
    fn claim<'a>(
        &'a mut self,
        candidates: &'a [u32],
        want: usize,
    ) -> impl Future<Output = Result<Vec<u32>, StoreError>> + Send + 'a;

    /// Releases slots (the caller has nothing of them in flight).
    fn release<'a>(
        &'a mut self,
        slots: &'a [u32],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Checks that the session still holds exactly `held` (and renews them where holds
    /// expire). An error means the slots may be someone else's: the caller drops the session.
    fn verify<'a>(
        &'a mut self,
        held: &'a [u32],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// How often the session must renew its hold on its slots while a batch is in flight
    /// (through [`verify`](RelaySession::verify)); `None` (the default) when holds do not
    /// expire (PostgreSQL's session locks last as long as the connection).
    fn renew_every(&self) -> Option<Duration> {
        None
    }

    /// Up to `limit` publishable rows of `slots`: rows due for a retry first (in `seq`
    /// order), then the others, per slot in `seq` order. `start` rotates the slots served
    /// first: those at or after it (PostgreSQL serves runs of contiguous slots, each run in
    /// `seq` order, beginning with the first run that starts at or after `start`). See
    /// [`RelayStore`] for what "publishable" means.
    fn read<'a>(
        &'a mut self,
        slots: &'a [u32],
        start: u32,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingRow>, StoreError>> + Send + 'a;

    /// How long until the next scheduled row of `slots` that is not due yet becomes due;
    /// `None` when there is none. An idle worker sleeps no longer than this, so a scheduled row
    /// is published when due without a notification. Only due times still ahead count: a due
    /// row that is held (behind a parked row, or a key backing off) never makes it 0.
    fn next_due<'a>(
        &'a mut self,
        slots: &'a [u32],
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send + 'a;

    /// Marks rows published (one statement).
    fn mark_published<'a>(
        &'a mut self,
        ids: &'a [Uuid],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Records failed attempts (one per key, at most): attempt count and error of each row;
    /// parks it, or backs its whole key off.
    fn record_failures<'a>(
        &'a mut self,
        failures: &'a [Failure<'a>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Releases every slot and leaves the group.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// The wait until a due time `secs` seconds ahead (as a store computes it), rounded up to the
/// next millisecond so that the wake-up does not come a hair before it; a negative or
/// unreadable number is no wait.
pub(crate) fn due_in(secs: f64) -> Duration {
    let ms = (secs * 1000.0).ceil();
    if ms.is_finite() && ms > 0.0 {
        Duration::from_millis((ms.min(u64::MAX as f64) as u64).saturating_add(1))
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_in_rounds_up_and_never_goes_negative() {
        assert_eq!(due_in(1.0001), Duration::from_millis(1002));
        assert_eq!(due_in(0.0), Duration::ZERO);
        assert_eq!(due_in(-3.0), Duration::ZERO);
        assert_eq!(due_in(f64::NAN), Duration::ZERO);
    }
}
