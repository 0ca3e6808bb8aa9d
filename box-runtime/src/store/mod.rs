//! Stores: where inbox rows, attempt counts and dead letters live. The engine sees only
//! [`InboxStore`].

use std::any::Any;
use std::future::Future;

use crate::message::Delivery;

mod connect;
mod error;
pub(crate) mod legacy;
pub(crate) mod migrate;
pub(crate) mod sql;
pub(crate) mod tables;
pub mod text;
mod two_phase;

pub use crate::ident::IdentError;
pub use crate::redact::redact_url;
pub use connect::CONNECT_TIMEOUT;
pub(crate) use connect::{bounded, check_scheme, release_ping};
use error::unsupported;
pub use error::{class_of, classify, is_unavailable, ErrorClass, StoreError};
pub use tables::Tables;
pub(crate) use two_phase::OWNED;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use two_phase::{optional_modes, received_row};
pub use two_phase::{EffectCounts, LeaseRequest, ReceivedRow, StoredEffect};

/// The identity of a message in a consumer group's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InboxKey {
    /// Consumer group.
    pub group: String,
    /// Source, or `""` when the key has none.
    pub source: String,
    /// Event id.
    pub event_id: String,
    /// The business key (an operation id read from the payload, see `idempotency_key` and
    /// `dedup_by`), when the handler declares one: a second line of deduplication, unique per
    /// group beside the event id. Held as `scope:key` (the handler's event type or its
    /// `dedup_scope`), so keys of two event types never meet unless their handlers share a
    /// scope.
    pub business_key: Option<String>,
}

/// What inserting the inbox row found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The row is new: run the handler. `attempts` is how many earlier runs failed.
    New {
        /// Earlier failed runs.
        attempts: u32,
    },
    /// The row existed: the message was already processed.
    Duplicate,
    /// Another event with the same business key was processed in the group (within the
    /// business-key window): this one is a duplicate by meaning.
    DuplicateBusinessKey,
}

/// One message of a batch to claim: its key (unique within the batch), type and coordinates.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    /// The inbox key (all of one group).
    pub key: &'a InboxKey,
    /// The event type.
    pub event_type: &'a str,
    /// The message.
    pub delivery: &'a Delivery,
}

/// A message given up on, with everything needed to inspect or replay it.
#[derive(Clone, Debug)]
pub struct DeadLetter<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// The inbox key, when the message had a usable id.
    pub key: Option<&'a InboxKey>,
    /// The event type header, if present.
    pub event_type: Option<&'a str>,
    /// The raw message.
    pub delivery: &'a Delivery,
    /// Why, with the error chain.
    pub error: &'a str,
    /// Failed runs (0 when the message never reached a handler).
    pub attempts: u32,
    /// Payloads longer than this are stored cut to it, with their size and digest.
    pub max_payload_bytes: usize,
}

impl DeadLetter<'_> {
    /// The event type as stored: NUL replaced, length bounded.
    pub fn stored_event_type(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.event_type
            .map(|t| text::safe_text(t, text::MAX_LABEL_BYTES))
    }

    /// The error as stored: NUL replaced, length bounded.
    pub fn stored_error(&self) -> std::borrow::Cow<'_, str> {
        text::safe_text(self.error, text::MAX_ERROR_BYTES)
    }

    /// The source as stored (`""` when the key has none or there is no key).
    pub fn stored_source(&self) -> &str {
        self.key.map_or("", |k| k.source.as_str())
    }

    /// The payload as stored, and, when it was cut, its full size and SHA-256.
    pub fn stored_payload(&self) -> (Option<&[u8]>, Option<i64>, Option<String>) {
        match self.delivery.payload.as_deref() {
            Some(p) if p.len() > self.max_payload_bytes => (
                Some(&p[..self.max_payload_bytes]),
                Some(p.len() as i64),
                Some(text::sha256_hex(p)),
            ),
            other => (other, None, None),
        }
    }
}

/// What a store that keeps no deferred messages answers when asked to.
fn no_deferral(store: &str) -> StoreError {
    StoreError::Config(format!(
        "the {store} store does not keep deferred messages (PostgreSQL, MySQL/MariaDB and SQLite do)"
    ))
}

/// Runs `delete_batch` (a statement deleting at most `batch` rows) until a run deletes fewer:
/// retention deletes in short statements, never one long one. Returns the rows deleted.
pub(crate) async fn delete_in_batches<F, Fut>(
    batch: u32,
    mut delete_batch: F,
) -> Result<u64, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = delete_batch(batch).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// The storage an inbox engine needs. PostgreSQL implements it ([`PgStore`](crate::PgStore)) and SQLite.
///
/// Every method that takes no transaction runs on its own (autocommit), so what it writes
/// survives the rollback of a handler's transaction.
pub trait InboxStore: Send + Sync + 'static {
    /// The transaction handed to handlers.
    type Tx: Any + Send;

    /// A short name for messages (`"postgres"`).
    const NAME: &'static str;

    /// The table names.
    fn tables(&self) -> &Tables;

    /// How many transactions of one consumer this store runs usefully at once: the default
    /// number of key lanes per partition (see
    /// [`InboxConfig::key_lanes`](crate::engine::InboxConfig::key_lanes)). By default 1 (one
    /// lane: partition order); a pooled store answers its pool's size.
    fn parallel_transactions(&self) -> usize {
        1
    }

    // Two-phase handlers and effects after commit: unsupported unless a store implements them.

    /// Whether the store supports two-phase handlers.
    const TWO_PHASE: bool = false;

    /// Whether the store keeps effects after commit (the effects methods below).
    const EFFECTS: bool = false;

    /// Two-phase receive: inserts the rows as `received` (message, headers and key kept)
    /// unless they exist (`ON CONFLICT DO NOTHING`), in `tx`; returns which were inserted.
    fn receive<'a>(
        &'a self,
        _tx: &'a mut Self::Tx,
        _requests: &'a [ClaimRequest<'a>],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// Claims one received row whose lease is free or expired (others' claims are skipped,
    /// not waited for), leasing it to `request.owner`; outside any transaction.
    fn claim_received<'a>(
        &'a self,
        _request: &'a LeaseRequest<'a>,
    ) -> impl Future<Output = Result<Option<ReceivedRow>, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// Extends the lease of `owner` on a received row; `false` when it no longer holds it.
    fn renew_lease<'a>(
        &'a self,
        _key: &'a InboxKey,
        _owner: &'a str,
        _lease: std::time::Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// Gives up the lease of `owner` on a received (or deferred) row, so that any worker may
    /// claim it.
    fn release_lease<'a>(
        &'a self,
        _key: &'a InboxKey,
        _owner: &'a str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// Deletes a received (or deferred) row `owner` holds (it was dead-lettered: a redelivery
    /// is received again, as a one-phase message would be handled again).
    fn drop_received<'a>(
        &'a self,
        _key: &'a InboxKey,
        _owner: &'a str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// In the handler's transaction: whether `owner` still holds the received (or deferred),
    /// unprocessed row (`Some(earlier failed runs)`), or not (`None`); the row stays locked
    /// against other claims until the transaction ends.
    fn check_lease<'a>(
        &'a self,
        _tx: &'a mut Self::Tx,
        _key: &'a InboxKey,
        _owner: &'a str,
    ) -> impl Future<Output = Result<Option<u32>, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// In the handler's transaction: marks the row processed if `owner` still holds it (the
    /// condition is checked under the row lock, so of two holders only one can succeed);
    /// clears recorded failures; `false` when the lease was lost.
    fn finish_leased<'a>(
        &'a self,
        _tx: &'a mut Self::Tx,
        _key: &'a InboxKey,
        _owner: &'a str,
        _had_failures: bool,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "two-phase handlers")))
    }

    /// Claims up to `limit` effects of consumer group `group` not done whose lease is free or
    /// expired; outside any transaction. Another group's effects are never claimed: each
    /// group's consumers run only the executors of their own effects.
    fn claim_effects<'a>(
        &'a self,
        _group: &'a str,
        _owner: &'a str,
        _lease: std::time::Duration,
        _limit: u32,
    ) -> impl Future<Output = Result<Vec<StoredEffect>, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "effects after commit")))
    }

    /// Marks an effect done (`error: None`), or records a failed run and leaves it to be run
    /// again after `retry_in`.
    fn settle_effect<'a>(
        &'a self,
        _id: i64,
        _owner: &'a str,
        _error: Option<&'a str>,
        _retry_in: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "effects after commit")))
    }

    /// Counts the effects of consumer group `group` not done: all, failed, and the age of the
    /// oldest.
    fn count_effects<'a>(
        &'a self,
        _group: &'a str,
    ) -> impl Future<Output = Result<EffectCounts, StoreError>> + Send + 'a {
        std::future::ready(Err(unsupported(Self::NAME, "effects after commit")))
    }

    /// Deletes up to `limit` effects (of every group) done more than `older_than` ago; returns
    /// how many.
    fn delete_done_effects(
        &self,
        _older_than: std::time::Duration,
        _limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + '_ {
        std::future::ready(Err(unsupported(Self::NAME, "effects after commit")))
    }

    // Deferred messages (`HandlerError::defer`): unsupported unless a store implements them.
    // A deferred row is claimed, checked, finished, released and dropped with the lease
    // methods above (`check_lease`, `finish_leased`, `release_lease`, `drop_received`), which
    // a store that keeps deferred messages implements for them.

    /// Whether the store keeps deferred messages.
    const DEFERRAL: bool = false;

    /// In `tx`, which holds the inbox row of `key` (just claimed, or checked under a lease):
    /// keeps the message as an unprocessed row due `after` from now, with its key, headers and
    /// payload, its lease cleared and its deferral count increased; returns that count.
    fn defer<'a>(
        &'a self,
        _tx: &'a mut Self::Tx,
        _key: &'a InboxKey,
        _delivery: &'a Delivery,
        _after: std::time::Duration,
    ) -> impl Future<Output = Result<u32, StoreError>> + Send + 'a {
        std::future::ready(Err(no_deferral(Self::NAME)))
    }

    /// Claims one deferred row of `group` that is due and whose lease is free or expired
    /// (rows being claimed by another worker are skipped, not waited for), leasing it to
    /// `owner` for `lease`; outside any transaction.
    fn claim_deferred<'a>(
        &'a self,
        _group: &'a str,
        _owner: &'a str,
        _lease: std::time::Duration,
    ) -> impl Future<Output = Result<Option<ReceivedRow>, StoreError>> + Send + 'a {
        std::future::ready(Err(no_deferral(Self::NAME)))
    }

    /// Counts the deferred rows of `group` not yet run.
    fn count_deferred<'a>(
        &'a self,
        _group: &'a str,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a {
        std::future::ready(Err(no_deferral(Self::NAME)))
    }

    // The core of every store: no default.

    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// Commits it.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls it back.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Inserts the inbox row unless it exists (`ON CONFLICT DO NOTHING`); reports which, and how
    /// many earlier runs of this message failed.
    ///
    /// The row may be written already marked processed: it becomes visible only when the
    /// transaction commits, which happens only after the handler succeeded, so nothing can tell
    /// the difference, and it saves the round trip of a separate update.
    fn claim<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        event_type: &'a str,
        delivery: &'a Delivery,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send + 'a;

    /// [`claim`](Self::claim) for a batch in one statement: the keys are distinct and of one
    /// group; returns one [`Claim`] per request, in order.
    fn claim_batch<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        requests: &'a [ClaimRequest<'a>],
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send + 'a;

    /// Frees the business keys of `keys` held by inbox rows received more than `older_than`
    /// ago (the business-key window), in `tx`, so that a claim after it may take them again.
    fn expire_business_keys<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
        older_than: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Deletes inbox rows this transaction claimed but whose handlers will not run in it (a
    /// batch cut short by a graceful stop), so that they commit unclaimed.
    fn release_claims<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        keys: &'a [&'a InboxKey],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Marks the inbox row processed (if `claim` did not already), in the same transaction;
    /// clears recorded failures when there were some.
    fn mark_processed<'a>(
        &'a self,
        tx: &'a mut Self::Tx,
        key: &'a InboxKey,
        had_failures: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Records a failed run outside any transaction; returns the number of failed runs so far.
    fn record_failure<'a>(
        &'a self,
        key: &'a InboxKey,
        error: &'a str,
    ) -> impl Future<Output = Result<u32, StoreError>> + Send + 'a;

    /// Stores a dead letter outside any transaction; returns its id.
    fn dead_letter<'a>(
        &'a self,
        letter: &'a DeadLetter<'a>,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a;

    /// Loads a dead letter of `group` by id.
    fn load_dead_letter<'a>(
        &'a self,
        group: &'a str,
        id: i64,
    ) -> impl Future<Output = Result<Option<StoredDeadLetter>, StoreError>> + Send + 'a;

    /// Records that a dead letter was replayed successfully.
    fn mark_replayed(&self, id: i64) -> impl Future<Output = Result<(), StoreError>> + Send + '_;

    /// Deletes at most `limit` inbox rows processed more than `older_than` ago; returns how many.
    fn delete_processed(
        &self,
        older_than: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + '_;

    /// Counts inbox rows received more than `older_than` ago and still not processed.
    fn count_stuck(
        &self,
        older_than: std::time::Duration,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + '_;

    /// Counts the dead letters of `group` not replayed.
    fn count_dead_letters<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a;
}

/// A dead letter as stored: the raw message and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDeadLetter {
    /// Its id in the dead-letter table.
    pub id: i64,
    /// The consumer group.
    pub group: String,
    /// The event id, when the message had one.
    pub event_id: Option<String>,
    /// The event type header, when present.
    pub event_type: Option<String>,
    /// The raw message (topic, partition, offset, key, headers, payload bytes).
    pub delivery: Delivery,
    /// The reason and error chain.
    pub error: String,
    /// Failed runs.
    pub attempts: u32,
    /// Whether it was replayed successfully.
    pub replayed: bool,
}
