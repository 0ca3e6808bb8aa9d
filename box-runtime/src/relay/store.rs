//! What the relay needs from a store ([`RelayStore`]); the backends implement it
//! (`postgres::relay`, `sqlite::relay`).

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
    /// Whether the row's key is backing off after a failure (not to be published yet).
    pub waiting: bool,
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

/// The storage a relay needs. PostgreSQL implements it ([`PgRelayStore`](crate::postgres::PgRelayStore)); an embedded store
/// can implement the same seven operations.
///
/// The contract that keeps per-key order with several relays: between [`lock_keys`] and
/// [`unlock_keys`] no other relay publishes rows of the locked keys, and a lock is released
/// when the relay holding it dies.
///
/// [`lock_keys`]: RelayStore::lock_keys
/// [`unlock_keys`]: RelayStore::unlock_keys
pub trait RelayStore: Send + Sync + 'static {
    /// Starts listening for commits (so no wake-up is missed between a cycle and the wait).
    fn listen(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The keys of up to `limit` oldest publishable rows (committed, unpublished, not parked,
    /// not backing off), oldest first, without duplicates.
    fn candidates(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<KeyRef>, StoreError>> + Send;

    /// Tries to take the exclusive relay lock of each key without waiting; returns the keys
    /// now held by this relay.
    fn lock_keys<'a>(
        &'a self,
        keys: &'a [KeyRef],
    ) -> impl Future<Output = Result<Vec<KeyRef>, StoreError>> + Send + 'a;

    /// Releases keys taken by [`RelayStore::lock_keys`].
    fn unlock_keys<'a>(
        &'a self,
        keys: &'a [KeyRef],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Up to `limit` unpublished, unparked rows of `keys`, in `seq` order, read after the keys
    /// were locked. (Per key, the rows returned are a prefix of its pending rows.)
    fn pending<'a>(
        &'a self,
        keys: &'a [KeyRef],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingRow>, StoreError>> + Send + 'a;

    /// Marks rows published.
    fn mark_published<'a>(
        &'a self,
        ids: &'a [Uuid],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Records a failed attempt: attempt count and error; parks the row or backs its key off.
    fn record_failure<'a>(
        &'a self,
        failure: Failure<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Waits until a row may have committed (a notification) or `timeout` passed.
    fn wait(&self, timeout: Duration) -> impl Future<Output = ()> + Send;

    /// Deletes published rows older than the retention window; returns how many.
    fn purge<'a>(
        &'a self,
        retention: &'a Retention,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a;
}
