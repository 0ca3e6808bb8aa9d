//! The inbox engine: what happens to one message, whatever the broker and the database.
//!
//! [`Inbox::process`] takes a [`Delivery`] through the consumer's [`AckStrategy`]: the inbox
//! row, the handler and the processed mark in one transaction, retries with backoff, dead
//! letters. It returns an [`Outcome`] saying whether the offset may be committed; the transport
//! decides how ([`OffsetTracker`] keeps it from passing a message that is not resolved).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{
    AckStrategy, CommitOn, EventId, InboxConfig, OnExhausted, Source, UnknownEvent,
};
use crate::handler::{DispatchTable, ErrorKind, HandlerError, HandlerRegistration, MessageMeta};
use crate::store::{self, Claim, DeadLetter, InboxKey, InboxStore, StoreError};
use crate::transport::Delivery;
use crate::util::CatchUnwind;

/// What became of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its transaction committed.
    Processed {
        /// Which run succeeded (1 = first).
        attempt: u32,
    },
    /// The inbox row existed: the handler did not run.
    Duplicate,
    /// The handler failed and the strategy acknowledges anyway (`AtMostOnce`, `OnPersist`): the
    /// effect is lost by design.
    FailedAcknowledged {
        /// The error chain.
        error: String,
    },
    /// The handler failed and the message stays unacknowledged
    /// ([`OnExhausted::LeaveUncommitted`]); it is delivered again after a restart or rebalance.
    FailedUnacknowledged {
        /// The error chain.
        error: String,
        /// Failed runs so far.
        attempts: u32,
    },
    /// Stored in the dead-letter table; acknowledged.
    DeadLettered {
        /// Why.
        reason: String,
        /// Its id in the dead-letter table.
        id: i64,
    },
    /// No handler for the event type and the consumer skips those; acknowledged.
    Skipped {
        /// Why.
        reason: String,
    },
    /// Shutdown came while waiting to retry: nothing acknowledged.
    Abandoned,
}

impl Outcome {
    /// Whether the offset of this message may be committed.
    pub fn acknowledges(&self) -> bool {
        !matches!(self, Self::FailedUnacknowledged { .. } | Self::Abandoned)
    }

    /// A one-word label for logs and counters.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Processed { .. } => "processed",
            Self::Duplicate => "duplicate",
            Self::FailedAcknowledged { .. } => "failed (acknowledged)",
            Self::FailedUnacknowledged { .. } => "failed",
            Self::DeadLettered { .. } => "dead-lettered",
            Self::Skipped { .. } => "skipped",
            Self::Abandoned => "abandoned",
        }
    }
}

/// Keeps the committed offset of one partition from passing a message that is not resolved.
///
/// Messages are resolved in offset order, except those held (failed, left unacknowledged): the
/// commit position never passes the lowest held offset.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    held: BTreeSet<i64>,
    highest: Option<i64>,
    committed: Option<i64>,
}

impl OffsetTracker {
    /// Marks `offset` resolved; returns the new commit position (next offset to read) if it
    /// advanced.
    pub fn resolve(&mut self, offset: i64) -> Option<i64> {
        self.held.remove(&offset);
        let highest = self.highest.map_or(offset, |h| h.max(offset));
        self.highest = Some(highest);
        let position = self.held.first().copied().unwrap_or(highest + 1);
        self.advance(position)
    }

    /// Marks `offset` held: not resolved. Returns the new commit position if it advanced (it
    /// can, up to the held offset).
    pub fn hold(&mut self, offset: i64) -> Option<i64> {
        self.held.insert(offset);
        self.highest = Some(self.highest.map_or(offset, |h| h.max(offset)));
        let position = self.held.first().copied().unwrap_or(offset);
        self.advance(position)
    }

    fn advance(&mut self, position: i64) -> Option<i64> {
        if self.committed.is_none_or(|c| position > c) {
            self.committed = Some(position);
            Some(position)
        } else {
            None
        }
    }

    /// The last commit position handed out.
    pub fn position(&self) -> Option<i64> {
        self.committed
    }
}

/// One consumer group's inbox on a store.
#[derive(Debug)]
pub struct Inbox<S> {
    store: S,
    handlers: DispatchTable,
    config: InboxConfig,
}

/// Why an inbox could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The handlers of the group are inconsistent.
    #[error(transparent)]
    Registry(#[from] crate::handler::RegistryError),
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Why a dead letter could not be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// No dead letter with that id in the group.
    #[error("no dead letter {id} in group `{group}`")]
    NotFound {
        /// The group.
        group: String,
        /// The id.
        id: i64,
    },
    /// It was replayed successfully before.
    #[error("dead letter {id} of group `{group}` was already replayed")]
    AlreadyReplayed {
        /// The group.
        group: String,
        /// The id.
        id: i64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

enum Prepared<'d> {
    Ready {
        reg: &'static HandlerRegistration,
        key: InboxKey,
        event_type: &'d str,
        payload: &'d [u8],
    },
    Bad {
        reason: String,
        key: Option<InboxKey>,
        event_type: Option<&'d str>,
    },
    Skip(String),
}

impl<S: InboxStore> Inbox<S> {
    /// The inbox of `group` on `store`, with the handlers linked into the binary.
    pub fn new(store: S, group: &str, config: InboxConfig) -> Result<Self, SetupError> {
        let handlers = DispatchTable::for_store::<S::Tx>(group, S::NAME)?;
        Self::with_handlers(store, handlers, config)
    }

    /// The inbox with an explicit dispatch table.
    pub fn with_handlers(
        store: S,
        handlers: DispatchTable,
        config: InboxConfig,
    ) -> Result<Self, SetupError> {
        handlers.check_tx_type::<S::Tx>(S::NAME)?;
        if config.retry.max_attempts == 0 {
            return Err(SetupError::Config(
                "retry.max_attempts must be at least 1".into(),
            ));
        }
        Ok(Self {
            store,
            handlers,
            config,
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        self.handlers.group()
    }

    /// Whether the offset is committed before the handler runs ([`AckStrategy::AtMostOnce`]).
    pub fn acknowledges_before_processing(&self) -> bool {
        self.config.ack == AckStrategy::AtMostOnce
    }

    fn prepare<'d>(&self, d: &'d Delivery) -> Prepared<'d> {
        let event_type = d.header_str(&self.config.event_type_header);
        let group = self.group().to_owned();
        let Some(payload) = d.payload.as_deref() else {
            return Prepared::Bad {
                reason: "message has no payload".into(),
                key: None,
                event_type,
            };
        };
        if payload.len() > self.config.max_payload_bytes {
            return Prepared::Bad {
                reason: format!(
                    "payload of {} bytes exceeds the limit of {} bytes",
                    payload.len(),
                    self.config.max_payload_bytes
                ),
                key: None,
                event_type,
            };
        }
        let source = match &self.config.source {
            Source::None => String::new(),
            Source::Header(name) => match d.header_str(name) {
                Some(s) => s.to_owned(),
                None => {
                    return Prepared::Bad {
                        reason: format!("missing or empty source header `{name}`"),
                        key: None,
                        event_type,
                    }
                }
            },
        };
        let event_id = match &self.config.event_id {
            EventId::Header(name) => match d.header_str(name) {
                Some(id) => id.to_owned(),
                None if !self.config.ack.uses_inbox() => d.coordinates(),
                None => {
                    return Prepared::Bad {
                        reason: format!("missing or empty event id header `{name}`"),
                        key: None,
                        event_type,
                    }
                }
            },
            EventId::BrokerCoordinates => d.coordinates(),
        };
        let key = InboxKey {
            group,
            source,
            event_id,
        };
        let Some(event_type) = event_type else {
            return Prepared::Bad {
                reason: format!(
                    "missing or empty event type header `{}`",
                    self.config.event_type_header
                ),
                key: Some(key),
                event_type: None,
            };
        };
        let Some(reg) = self.handlers.get(event_type) else {
            let reason = format!(
                "no handler for event type `{event_type}` in group `{}` (handled: {})",
                self.group(),
                self.handlers.event_types().collect::<Vec<_>>().join(", ")
            );
            return match self.config.unknown_event {
                UnknownEvent::Skip => Prepared::Skip(reason),
                UnknownEvent::DeadLetter => Prepared::Bad {
                    reason,
                    key: Some(key),
                    event_type: Some(event_type),
                },
            };
        };
        Prepared::Ready {
            reg,
            key,
            event_type,
            payload,
        }
    }

    /// Takes one message through the strategy. Retries store outages until they pass and failed
    /// handler runs as the retry policy says; returns [`Outcome::Abandoned`] if `shutdown`
    /// becomes true while waiting.
    pub async fn process(&self, d: &Delivery, shutdown: &watch::Receiver<bool>) -> Outcome {
        let outcome = match self.prepare(d) {
            Prepared::Skip(reason) => Outcome::Skipped { reason },
            Prepared::Bad {
                reason,
                key,
                event_type,
            } => {
                self.dead_letter(d, key.as_ref(), event_type, &reason, 0, shutdown)
                    .await
            }
            Prepared::Ready {
                reg,
                key,
                event_type,
                payload,
            } => self.run(d, reg, key, event_type, payload, shutdown).await,
        };
        self.log(d, &outcome);
        outcome
    }

    fn log(&self, d: &Delivery, outcome: &Outcome) {
        let id = d.header_str(names_id(&self.config)).unwrap_or("-");
        match outcome {
            Outcome::Processed { attempt } => tracing::info!(
                group = self.group(), at = %d.coordinates(), event_id = id, attempt, "processed"),
            Outcome::Duplicate => tracing::info!(
                group = self.group(), at = %d.coordinates(), event_id = id, "duplicate"),
            Outcome::FailedAcknowledged { error } | Outcome::FailedUnacknowledged { error, .. } => {
                tracing::warn!(group = self.group(), at = %d.coordinates(), event_id = id, %error, "{}", outcome.label())
            }
            Outcome::DeadLettered { reason, .. } => tracing::warn!(
                group = self.group(), at = %d.coordinates(), event_id = id, %reason, "dead-lettered"),
            Outcome::Skipped { reason } => tracing::info!(
                group = self.group(), at = %d.coordinates(), event_id = id, %reason, "skipped"),
            Outcome::Abandoned => tracing::info!(
                group = self.group(), at = %d.coordinates(), event_id = id, "abandoned at shutdown"),
        }
    }

    async fn run(
        &self,
        d: &Delivery,
        reg: &'static HandlerRegistration,
        key: InboxKey,
        event_type: &str,
        payload: &[u8],
        shutdown: &watch::Receiver<bool>,
    ) -> Outcome {
        let inbox = self.config.ack.uses_inbox();
        let mut outage = Backoff::new(self.config.outage_backoff);
        let mut local_failures = 0u32;
        loop {
            // One transaction: inbox row, handler, processed mark.
            let mut tx = match self.store.begin().await {
                Ok(tx) => tx,
                Err(e) => {
                    if !outage.wait(&e, shutdown).await {
                        return Outcome::Abandoned;
                    }
                    continue;
                }
            };
            let previous_failures = if inbox {
                match self.store.claim(&mut tx, &key, event_type, d).await {
                    Ok(Claim::Duplicate) => {
                        let _ = self.store.rollback(tx).await;
                        return Outcome::Duplicate;
                    }
                    Ok(Claim::New { attempts }) => {
                        crate::failpoint::hit("after_inbox_insert").await;
                        attempts
                    }
                    Err(e) => {
                        let _ = self.store.rollback(tx).await;
                        if !outage.wait(&e, shutdown).await {
                            return Outcome::Abandoned;
                        }
                        continue;
                    }
                }
            } else {
                local_failures
            };
            let attempt = previous_failures + 1;
            let meta = self.meta(d, &key, event_type, attempt);
            let result = {
                let fut = (reg.invoke)(payload, &mut tx, &meta);
                match CatchUnwind(fut).await {
                    Ok(result) => result,
                    Err(panic) => Err(HandlerError::transient(format!(
                        "handler panicked: {panic}"
                    ))),
                }
            };
            match result {
                Ok(()) => {
                    crate::failpoint::hit("after_handler").await;
                    let marked = if inbox {
                        self.store
                            .mark_processed(&mut tx, &key, previous_failures > 0)
                            .await
                    } else {
                        Ok(())
                    };
                    let committed = match marked {
                        Ok(()) => self.store.commit(tx).await,
                        Err(e) => {
                            let _ = self.store.rollback(tx).await;
                            Err(e)
                        }
                    };
                    match committed {
                        Ok(()) => {
                            crate::failpoint::hit("after_db_commit").await;
                            return Outcome::Processed { attempt };
                        }
                        // The commit may or may not have happened: with an inbox the next
                        // claim tells; without one the handler runs again (at least once).
                        Err(e) => {
                            if !outage.wait(&e, shutdown).await {
                                return Outcome::Abandoned;
                            }
                            continue;
                        }
                    }
                }
                Err(error) => {
                    let _ = self.store.rollback(tx).await;
                    if store::is_unavailable(error.source_error()) {
                        // The database went away under the handler: an outage, not a failure
                        // of this message.
                        let e = StoreError::Unavailable(sqlx::Error::PoolClosed);
                        if !outage.wait(&e, shutdown).await {
                            return Outcome::Abandoned;
                        }
                        continue;
                    }
                    outage.reset();
                    let chain = error.to_string();
                    match self.config.ack {
                        AckStrategy::AtMostOnce
                        | AckStrategy::AtLeastOnce {
                            commit: CommitOn::OnPersist,
                        } => {
                            return Outcome::FailedAcknowledged { error: chain };
                        }
                        _ => {}
                    }
                    let attempts = if inbox {
                        match self.record_failure(&key, &chain, shutdown).await {
                            Some(n) => n,
                            None => return Outcome::Abandoned,
                        }
                    } else {
                        local_failures += 1;
                        local_failures
                    };
                    let retry = error.kind() == ErrorKind::Transient
                        && attempts < self.config.retry.max_attempts;
                    if retry {
                        let wait = self.config.retry.backoff(attempts);
                        tracing::info!(group = self.group(), at = %d.coordinates(), attempt = attempts,
                            error = %chain, retry_in = ?wait, "handler failed, retrying");
                        if !sleep_unless_shutdown(wait, shutdown).await {
                            return Outcome::Abandoned;
                        }
                        continue;
                    }
                    let exhausted = error.kind() == ErrorKind::Transient;
                    if exhausted && self.config.on_exhausted == OnExhausted::LeaveUncommitted {
                        return Outcome::FailedUnacknowledged {
                            error: chain,
                            attempts,
                        };
                    }
                    let reason = match error.kind() {
                        ErrorKind::Transient => {
                            format!("failed {attempts} times; last error: {chain}")
                        }
                        _ => chain,
                    };
                    return self
                        .dead_letter(d, Some(&key), Some(event_type), &reason, attempts, shutdown)
                        .await;
                }
            }
        }
    }

    /// Deletes inbox rows processed more than `older_than` ago (default retention: 7 days,
    /// [`DEFAULT_RETENTION`]), in batches of `batch` rows so that no statement holds many locks;
    /// returns how many were deleted. A deleted row no longer protects against a redelivery of
    /// its event, so keep the window longer than any redelivery can be late.
    pub async fn purge_processed(
        &self,
        older_than: Duration,
        batch: u32,
    ) -> Result<u64, StoreError> {
        store::delete_in_batches(batch, |limit| {
            self.store.delete_processed(older_than, limit)
        })
        .await
    }

    /// Inbox rows received more than `older_than` ago and still not processed: a health metric
    /// (only the two-phase mode leaves such rows by design).
    pub async fn stuck(&self, older_than: Duration) -> Result<i64, StoreError> {
        self.store.count_stuck(older_than).await
    }

    /// Runs a dead letter of this group through the normal inbox path again (the handler, in
    /// its transaction with the inbox row). Marks it replayed when it was processed, or when
    /// the event turns out to be processed already.
    pub async fn replay(&self, id: i64) -> Result<Outcome, ReplayError> {
        let letter = self
            .store
            .load_dead_letter(self.group(), id)
            .await?
            .ok_or_else(|| ReplayError::NotFound {
                group: self.group().to_owned(),
                id,
            })?;
        if letter.replayed {
            return Err(ReplayError::AlreadyReplayed {
                group: self.group().to_owned(),
                id,
            });
        }
        let (_never, shutdown) = watch::channel(false);
        let outcome = self.process(&letter.delivery, &shutdown).await;
        if matches!(outcome, Outcome::Processed { .. } | Outcome::Duplicate) {
            self.store.mark_replayed(id).await?;
        }
        Ok(outcome)
    }

    async fn record_failure(
        &self,
        key: &InboxKey,
        error: &str,
        shutdown: &watch::Receiver<bool>,
    ) -> Option<u32> {
        let mut outage = Backoff::new(self.config.outage_backoff);
        loop {
            match self.store.record_failure(key, error).await {
                Ok(n) => return Some(n),
                Err(e) => {
                    if !outage.wait(&e, shutdown).await {
                        return None;
                    }
                }
            }
        }
    }

    async fn dead_letter(
        &self,
        d: &Delivery,
        key: Option<&InboxKey>,
        event_type: Option<&str>,
        reason: &str,
        attempts: u32,
        shutdown: &watch::Receiver<bool>,
    ) -> Outcome {
        let letter = DeadLetter {
            group: self.group(),
            key,
            event_type,
            delivery: d,
            error: reason,
            attempts,
        };
        let mut outage = Backoff::new(self.config.outage_backoff);
        loop {
            match self.store.dead_letter(&letter).await {
                Ok(id) => {
                    return Outcome::DeadLettered {
                        reason: reason.to_owned(),
                        id,
                    }
                }
                Err(e) => {
                    if !outage.wait(&e, shutdown).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }

    fn meta(&self, d: &Delivery, key: &InboxKey, event_type: &str, attempt: u32) -> MessageMeta {
        MessageMeta {
            group: key.group.clone(),
            event_id: key.event_id.clone(),
            source: (!key.source.is_empty()).then(|| key.source.clone()),
            event_type: event_type.to_owned(),
            topic: d.topic.clone(),
            partition: d.partition,
            offset: d.offset,
            key: d.key.clone(),
            headers: d.headers.clone(),
            attempt,
        }
    }
}

fn names_id(config: &InboxConfig) -> &str {
    match &config.event_id {
        EventId::Header(name) => name,
        EventId::BrokerCoordinates => crate::names::HEADER_ID,
    }
}

/// Sleeps, returning `false` early if shutdown is signalled.
pub(crate) async fn sleep_unless_shutdown(
    wait: Duration,
    shutdown: &watch::Receiver<bool>,
) -> bool {
    if *shutdown.borrow() {
        return false;
    }
    let mut shutdown = shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(wait) => true,
        _ = shutdown.wait_for(|s| *s) => false,
    }
}

/// Exponential backoff for store outages; errors that are not outages are retried too (they
/// may be transient server states), but logged as errors.
struct Backoff {
    next: Duration,
    bounds: (Duration, Duration),
}

impl Backoff {
    fn new(bounds: (Duration, Duration)) -> Self {
        Self {
            next: bounds.0,
            bounds,
        }
    }

    fn reset(&mut self) {
        self.next = self.bounds.0;
    }

    async fn wait(&mut self, error: &StoreError, shutdown: &watch::Receiver<bool>) -> bool {
        if error.is_retryable() {
            tracing::warn!(%error, retry_in = ?self.next, "database unavailable, backing off");
        } else {
            tracing::error!(%error, retry_in = ?self.next, "database error, retrying");
        }
        let wait = self.next;
        self.next = (self.next * 2).min(self.bounds.1);
        sleep_unless_shutdown(wait, shutdown).await
    }
}

/// How long processed inbox rows are kept by default: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::OffsetTracker;

    #[test]
    fn commit_position_follows_resolved_messages() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.resolve(0), Some(1));
        assert_eq!(t.resolve(1), Some(2));
    }

    #[test]
    fn commit_position_never_passes_a_held_message() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.resolve(4), Some(5));
        assert_eq!(t.hold(5), None);
        assert_eq!(t.resolve(6), None);
        assert_eq!(t.resolve(7), None);
        assert_eq!(t.position(), Some(5));
        // Once the held message is resolved, the position jumps past everything resolved.
        assert_eq!(t.resolve(5), Some(8));
    }

    #[test]
    fn hold_on_a_fresh_partition_commits_up_to_it() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.hold(10), Some(10));
        assert_eq!(t.resolve(11), None);
    }
}
