//! One message through the strategy: the inbox row, the handler and the processed mark in one
//! transaction, retries with backoff, and the failures that end in a dead letter.

use std::time::Instant;

use tracing::{Instrument, Span};

use super::config::{EventId, OnExhausted};
use super::prepare::{Prepared, Ready};
use super::Inbox;
use crate::backoff::Attempts;
use crate::handler::{ErrorKind, HandlerError, MessageMeta};
use crate::message::{Delivery, Outcome};
use crate::shutdown::{sleep_unless_cancelled, CancellationToken};
use crate::store::{self, Claim, InboxKey, InboxStore, StoreError};
use crate::util::CatchUnwind;

/// What one run of the handler came to.
pub(super) enum Attempt {
    /// The message is resolved.
    Done(Outcome),
    /// The database failed (not the handler): back off and run again, counting nothing.
    Outage(StoreError),
    /// The run timed out or lost a race (a lock or statement timeout, a serialization failure
    /// or deadlock, the transaction timeout): counted while the database answers, then given
    /// up on (see `Inbox::busy`).
    Busy(String),
    /// The handler failed.
    Failed(HandlerError),
}

/// The outcome of a claim that found the message a duplicate.
pub(super) fn duplicate(key: &InboxKey, claim: Claim) -> Outcome {
    match (claim, &key.business_key) {
        (Claim::DuplicateBusinessKey, Some(business_key)) => Outcome::DuplicateBusinessKey {
            key: business_key.clone(),
        },
        _ => Outcome::Duplicate,
    }
}

/// What a handler's error means, by the class of the database error in its chain (see
/// [`store::ErrorClass`]), unless the handler chose the kind itself.
pub(super) fn classify_failure(error: HandlerError) -> Attempt {
    let class = store::class_of(error.source_error());
    if error.is_explicit() {
        // A transient error that says the database went away is still an outage.
        return match (error.kind(), class) {
            (ErrorKind::Transient, Some(store::ErrorClass::Unavailable)) => {
                Attempt::Outage(StoreError::lost_under_handler())
            }
            _ => Attempt::Failed(error),
        };
    }
    match class {
        Some(store::ErrorClass::Unavailable) => Attempt::Outage(StoreError::lost_under_handler()),
        Some(store::ErrorClass::Conflict | store::ErrorClass::Timeout) => {
            Attempt::Busy(error.to_string())
        }
        // A constraint or data error can never succeed: dead-letter at once.
        Some(store::ErrorClass::Rejected) => Attempt::Failed(error.into_permanent()),
        _ => Attempt::Failed(error),
    }
}

impl<S: InboxStore> Inbox<S> {
    /// Takes one message through the strategy. Retries store outages until they pass and failed
    /// handler runs as the retry policy says; returns [`Outcome::Abandoned`] if `shutdown`
    /// becomes true while waiting.
    pub async fn process(&self, d: &Delivery, shutdown: &CancellationToken) -> Outcome {
        let (span, started) = (self.message_span(d), Instant::now());
        let prepared = self.prepare(d).with_span(&span);
        let outcome = self
            .resolve(d, prepared, shutdown)
            .instrument(span.clone())
            .await;
        self.finish(d, &span, started, &outcome);
        if outcome.acknowledges() {
            self.telemetry.health.cycle();
        }
        outcome
    }

    /// The span of one message (see [`crate::telemetry`]).
    pub(super) fn message_span(&self, d: &Delivery) -> Span {
        let headers = (
            &*self.config.event_type_header,
            self.config.event_id_header(),
        );
        self.telemetry.message_span(d, headers)
    }

    /// A message is resolved: its log line, metrics and span fields.
    pub(super) fn finish(&self, d: &Delivery, span: &Span, started: Instant, outcome: &Outcome) {
        let event_type = d.header_str(&self.config.event_type_header);
        let id = d.header_str(self.config.event_id_header());
        self.telemetry
            .resolved(span, event_type, id, outcome, started);
        self.log(d, outcome);
    }

    /// Takes a prepared message to its outcome: skipped, dead-lettered, or run alone.
    pub(super) async fn resolve(
        &self,
        d: &Delivery,
        prepared: Prepared<'_>,
        shutdown: &CancellationToken,
    ) -> Outcome {
        match prepared {
            Prepared::Skip(reason) => Outcome::Skipped { reason },
            Prepared::Bad {
                reason,
                key,
                event_type,
            } => {
                self.dead_letter(d, key.as_ref(), event_type, &reason, 0, shutdown)
                    .await
            }
            Prepared::Ready(ready) if ready.reg.mode.is_two_phase() && ready.lease.is_none() => {
                let received = self.receive_all(&[(0, &ready)], shutdown).await;
                received
                    .into_iter()
                    .next()
                    .map_or(Outcome::Abandoned, |(_, o)| o)
            }
            Prepared::Ready(ready) => self.run(&ready, shutdown).await,
        }
    }

    /// Logs what became of one message: at debug (the consumer logs a summary of its group at
    /// info), a failure or a dead letter at warn.
    pub(super) fn log(&self, d: &Delivery, outcome: &Outcome) {
        let id = d.header_str(self.config.event_id_header()).unwrap_or("-");
        let (group, at) = (self.group(), d.at());
        match outcome {
            Outcome::Processed { attempt } => {
                tracing::debug!(target: "inoutbox::engine", group, %at, event_id = id, attempt, "processed")
            }
            Outcome::Duplicate => {
                tracing::debug!(target: "inoutbox::engine", group, %at, event_id = id, "duplicate")
            }
            Outcome::DuplicateBusinessKey { key } => {
                tracing::debug!(target: "inoutbox::engine", group, %at, event_id = id, business_key = key.as_str(), "duplicate business key")
            }
            // Text from the message (ids, types, reasons quoting them) is logged as a field with
            // Debug escaping, never in the message part: a newline in it cannot forge a line.
            Outcome::FailedAcknowledged { error } | Outcome::FailedUnacknowledged { error, .. } => {
                tracing::warn!(target: "inoutbox::engine", group, %at, event_id = id, error = error.as_str(), outcome = outcome.label(), "failed")
            }
            Outcome::DeadLettered { reason, .. } => {
                tracing::warn!(target: "inoutbox::engine", group, %at, event_id = id, reason = reason.as_str(), "dead-lettered")
            }
            Outcome::Skipped { reason } => {
                tracing::debug!(target: "inoutbox::engine", group, %at, event_id = id, reason = reason.as_str(), "skipped")
            }
            Outcome::Abandoned => {
                tracing::debug!(target: "inoutbox::engine", group, %at, event_id = id, "abandoned (stopping, or the partition was revoked): left for the next owner")
            }
            Outcome::Received => {
                tracing::debug!(target: "inoutbox::engine", group, %at, event_id = id, "received")
            }
            Outcome::LeaseLost => {
                tracing::warn!(target: "inoutbox::engine", group, %at, event_id = id, "lease lost, rolled back")
            }
            // Logged with its reason where it was kept (`deferred.rs`).
            Outcome::Deferred { .. } => {}
        }
    }

    /// Runs the handler until the message is resolved: outages are waited out, failures
    /// retried or given up on as the policy says.
    pub(super) async fn run(&self, msg: &Ready<'_>, shutdown: &CancellationToken) -> Outcome {
        self.run_from(msg, None, shutdown).await
    }

    /// [`run`](Self::run), when the first attempt already happened (in a batch) and `failed`
    /// is how it ended.
    pub(super) async fn run_from(
        &self,
        msg: &Ready<'_>,
        mut failed: Option<Attempt>,
        shutdown: &CancellationToken,
    ) -> Outcome {
        let mut outage = self.config.outage_backoff.start();
        let mut local_failures = 0u32;
        let mut rejections = 0u32;
        loop {
            let attempt = match failed.take() {
                Some(attempt) => attempt,
                None => self.attempt_within(msg, local_failures).await,
            };
            // A serialization failure, deadlock or timeout of inoutbox's own statements for this
            // message counts as the handler's do.
            let attempt = match attempt {
                Attempt::Outage(e @ StoreError::Conflict { .. }) => Attempt::Busy(e.to_string()),
                attempt => attempt,
            };
            let error = match attempt {
                Attempt::Done(outcome) => return outcome,
                Attempt::Outage(e) if e.is_rejected() => {
                    // The database refuses what inoutbox writes for this message: a few more tries
                    // (a schema being changed), then the message is given up on, with the reason.
                    rejections += 1;
                    if rejections >= REJECTIONS_BEFORE_DEAD_LETTER {
                        let reason = format!("the database rejects this message: {e}");
                        let (key, event_type) = (Some(&msg.key), Some(msg.event_type));
                        return self
                            .dead_letter(msg.d, key, event_type, &reason, 0, shutdown)
                            .await;
                    }
                    if !wait_outage(&mut outage, &e, shutdown).await {
                        return Outcome::Abandoned;
                    }
                    continue;
                }
                Attempt::Outage(e) => {
                    if !wait_outage(&mut outage, &e, shutdown).await {
                        return Outcome::Abandoned;
                    }
                    continue;
                }
                Attempt::Busy(error) => {
                    let busy = self.busy(msg, &error, &mut local_failures, &mut outage, shutdown);
                    match busy.await {
                        Some(outcome) => return outcome,
                        None => continue,
                    }
                }
                Attempt::Failed(error) => error,
            };
            if error.kind() == ErrorKind::Deferred {
                return self.defer(msg, &error, shutdown).await;
            }
            outage.reset();
            let chain = error.to_string();
            if self.config.ack.acknowledges_failures() {
                return Outcome::FailedAcknowledged { error: chain };
            }
            let attempts = if self.config.ack.uses_inbox() {
                match self.record_failure(&msg.key, &chain, shutdown).await {
                    Some(n) => n,
                    None => return Outcome::Abandoned,
                }
            } else {
                local_failures += 1;
                local_failures
            };
            if let Some(outcome) = self
                .after_failure(msg, &error, chain, attempts, shutdown)
                .await
            {
                return outcome;
            }
        }
    }

    /// [`attempt`](Self::attempt) within the transaction timeout.
    async fn attempt_within(&self, msg: &Ready<'_>, local_failures: u32) -> Attempt {
        let limit = self.config.transaction_timeout;
        match tokio::time::timeout(limit, self.attempt(msg, local_failures)).await {
            Ok(attempt) => attempt,
            // Dropped with its connection, rolled back: the database went away, or this
            // message's run takes too long. `busy` tells which.
            Err(_) => Attempt::Busy(StoreError::timed_out(limit).to_string()),
        }
    }

    /// A run that timed out or lost a race (see [`Attempt::Busy`]). The database is down, or
    /// this message keeps timing out while it works: the count written right after tells them
    /// apart. When the database does not answer it, the wait is an outage's and nothing is
    /// counted; when it does, the run is counted (in the inbox's attempts, which survive the
    /// rollback and a restart) and, after `busy_attempts` of them, the message is given up on.
    /// `None` to run it again after the backoff.
    async fn busy(
        &self,
        msg: &Ready<'_>,
        error: &str,
        local_failures: &mut u32,
        outage: &mut Attempts,
        shutdown: &CancellationToken,
    ) -> Option<Outcome> {
        let attempts = if self.config.ack.uses_inbox() {
            match self.store.record_failure(&msg.key, error).await {
                Ok(n) => n,
                Err(e) => {
                    let waited = wait_outage(outage, &e, shutdown).await;
                    return (!waited).then_some(Outcome::Abandoned);
                }
            }
        } else {
            *local_failures += 1;
            *local_failures
        };
        if attempts >= self.config.busy_attempts {
            let reason = format!(
                "timed out or lost a race with other transactions on {attempts} runs while the \
                 database answered; last error: {error}"
            );
            return Some(self.give_up(msg, reason, attempts, shutdown).await);
        }
        let wait = outage.next_delay();
        tracing::warn!(target: "inoutbox::engine", group = self.group(), at = %msg.d.coordinates(),
            error, attempt = attempts, of = self.config.busy_attempts, retry_in = ?wait,
            "timed out or lost a race under the handler, retrying");
        if !sleep_unless_cancelled(wait, shutdown).await {
            return Some(Outcome::Abandoned);
        }
        None
    }

    /// A message given up on after `attempts` runs: acknowledged as failed, left
    /// unacknowledged, or dead-lettered, as the strategy and `on_exhausted` say.
    async fn give_up(
        &self,
        msg: &Ready<'_>,
        reason: String,
        attempts: u32,
        shutdown: &CancellationToken,
    ) -> Outcome {
        if self.config.ack.acknowledges_failures() {
            return Outcome::FailedAcknowledged { error: reason };
        }
        if self.config.on_exhausted == OnExhausted::LeaveUncommitted {
            return Outcome::FailedUnacknowledged {
                error: reason,
                attempts,
            };
        }
        let (key, event_type) = (Some(&msg.key), Some(msg.event_type));
        self.dead_letter(msg.d, key, event_type, &reason, attempts, shutdown)
            .await
    }

    /// One transaction: inbox row, handler, processed mark, commit.
    pub(super) async fn attempt(&self, msg: &Ready<'_>, local_failures: u32) -> Attempt {
        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return Attempt::Outage(e),
        };
        let previous_failures = match self.open_row(msg, &mut tx, local_failures).await {
            Ok(n) => n,
            Err(end) => {
                let _ = self.store.rollback(tx).await;
                return end;
            }
        };
        let attempt = previous_failures + 1;
        if let Err(error) = self.invoke(msg, &mut tx, attempt).await {
            let _ = self.store.rollback(tx).await;
            return classify_failure(error);
        }
        crate::failpoint::hit("after_handler").await;
        if let Err(end) = self.close_row(msg, &mut tx, previous_failures > 0).await {
            let _ = self.store.rollback(tx).await;
            return end;
        }
        match self.store.commit(tx).await {
            Ok(()) => {
                self.committed.notify_one();
                crate::failpoint::hit("after_db_commit").await;
                Attempt::Done(Outcome::Processed { attempt })
            }
            // The commit may or may not have happened: with an inbox the next claim tells;
            // without one the handler runs again (at least once).
            Err(e) => Attempt::Outage(e),
        }
    }

    /// Frees, in `tx`, the business keys of `keys` whose holders are older than the configured
    /// business-key window (nothing without a window).
    pub(super) async fn expire_business_keys(
        &self,
        tx: &mut S::Tx,
        keys: &[&InboxKey],
    ) -> Result<(), StoreError> {
        match self.config.business_key_window {
            Some(window) if keys.iter().any(|k| k.business_key.is_some()) => {
                self.store.expire_business_keys(tx, keys, window).await
            }
            _ => Ok(()),
        }
    }

    /// Before the handler, in its transaction: inserts the inbox row (or, for a two-phase
    /// worker, checks that it still holds the received row); returns the earlier failed runs,
    /// or how the attempt ends (a duplicate, a lost lease, an outage).
    pub(super) async fn open_row(
        &self,
        msg: &Ready<'_>,
        tx: &mut S::Tx,
        local_failures: u32,
    ) -> Result<u32, Attempt> {
        if let Some(owner) = msg.lease {
            return match self.store.check_lease(tx, &msg.key, owner).await {
                Ok(Some(attempts)) => Ok(attempts),
                Ok(None) => Err(Attempt::Done(Outcome::LeaseLost)),
                Err(e) => Err(Attempt::Outage(e)),
            };
        }
        if !self.config.ack.uses_inbox() {
            return Ok(local_failures);
        }
        self.expire_business_keys(tx, &[&msg.key])
            .await
            .map_err(Attempt::Outage)?;
        match self.store.claim(tx, &msg.key, msg.event_type, msg.d).await {
            Ok(claim @ (Claim::Duplicate | Claim::DuplicateBusinessKey)) => {
                Err(Attempt::Done(duplicate(&msg.key, claim)))
            }
            Ok(Claim::New { attempts }) => {
                crate::failpoint::hit("after_inbox_insert").await;
                Ok(attempts)
            }
            Err(e) => Err(Attempt::Outage(e)),
        }
    }

    /// After the handler, in its transaction: marks the inbox row processed; a two-phase
    /// worker's mark succeeds only if it still holds the row's lease.
    pub(super) async fn close_row(
        &self,
        msg: &Ready<'_>,
        tx: &mut S::Tx,
        had_failures: bool,
    ) -> Result<(), Attempt> {
        if let Some(owner) = msg.lease {
            return match self
                .store
                .finish_leased(tx, &msg.key, owner, had_failures)
                .await
            {
                Ok(true) => Ok(()),
                Ok(false) => Err(Attempt::Done(Outcome::LeaseLost)),
                Err(e) => Err(Attempt::Outage(e)),
            };
        }
        if !self.config.ack.uses_inbox() {
            return Ok(());
        }
        self.store
            .mark_processed(tx, &msg.key, had_failures)
            .await
            .map_err(Attempt::Outage)
    }

    /// Calls the handler in `tx`, turning a panic into a transient error.
    pub(super) async fn invoke(
        &self,
        msg: &Ready<'_>,
        tx: &mut S::Tx,
        attempt: u32,
    ) -> Result<(), HandlerError> {
        let meta = self.meta(msg, attempt);
        let fut = (msg.reg.invoke)(msg.payload, tx, &meta);
        let started = Instant::now();
        let result = CatchUnwind(fut).instrument(msg.span.clone()).await;
        self.telemetry
            .handler_ran(msg.event_type, started.elapsed());
        match result {
            Ok(result) => result,
            Err(panic) => Err(HandlerError::transient(format!(
                "handler panicked: {panic}"
            ))),
        }
    }

    /// Calls a batch handler once for a run of its messages in `tx` (`attempts`: earlier failed
    /// runs of each), turning a panic into a transient error.
    pub(super) async fn invoke_run(
        &self,
        run: &[(usize, &Ready<'_>)],
        tx: &mut S::Tx,
        attempts: &[u32],
    ) -> Result<(), HandlerError> {
        let Some(invoke_batch) = run.first().and_then(|(_, m)| m.reg.invoke_batch) else {
            return Err(HandlerError::permanent("not a batch handler"));
        };
        let metas: Vec<MessageMeta> = run
            .iter()
            .zip(attempts)
            .map(|((_, m), a)| self.meta(m, a + 1))
            .collect();
        let payloads: Vec<&[u8]> = run.iter().map(|(_, m)| m.payload).collect();
        let fut = invoke_batch(&payloads, tx, &metas);
        let started = Instant::now();
        let result = CatchUnwind(fut).await;
        if let Some((_, first)) = run.first() {
            self.telemetry
                .handler_ran(first.event_type, started.elapsed());
        }
        match result {
            Ok(result) => result,
            Err(panic) => Err(HandlerError::transient(format!(
                "handler panicked: {panic}"
            ))),
        }
    }

    /// After a failed run counted as `attempts`: `None` to run again (after the backoff), or
    /// the outcome when the message is given up on.
    pub(super) async fn after_failure(
        &self,
        msg: &Ready<'_>,
        error: &HandlerError,
        chain: String,
        attempts: u32,
        shutdown: &CancellationToken,
    ) -> Option<Outcome> {
        let transient = error.kind() == ErrorKind::Transient;
        if transient && attempts < self.config.retry.max_attempts {
            self.telemetry.retried(msg.event_type);
            let wait = self.config.retry.delay(attempts);
            tracing::debug!(target: "inoutbox::engine", group = self.group(), at = %msg.d.coordinates(), attempt = attempts,
                error = chain.as_str(), retry_in = ?wait, "handler failed, retrying");
            if !sleep_unless_cancelled(wait, shutdown).await {
                return Some(Outcome::Abandoned);
            }
            return None;
        }
        if transient && self.config.on_exhausted == OnExhausted::LeaveUncommitted {
            return Some(Outcome::FailedUnacknowledged {
                error: chain,
                attempts,
            });
        }
        let reason = if transient {
            format!("failed {attempts} times; last error: {chain}")
        } else {
            chain
        };
        let (d, key, event_type) = (msg.d, Some(&msg.key), Some(msg.event_type));
        Some(
            self.dead_letter(d, key, event_type, &reason, attempts, shutdown)
                .await,
        )
    }

    pub(super) fn meta(&self, msg: &Ready<'_>, attempt: u32) -> MessageMeta {
        if !msg.reg.takes_meta {
            // The handler never sees it: no copies of ids, topic and headers.
            return MessageMeta::new(String::new(), String::new(), String::new());
        }
        let (d, key) = (msg.d, &msg.key);
        // The handler sees the id as sent, even when the inbox keys on its digest.
        let event_id = match &self.config.event_id {
            EventId::Header(name) => d.header_str(name).unwrap_or(&key.event_id),
            EventId::BrokerCoordinates => &key.event_id,
        };
        let mut meta = MessageMeta::new(&key.group, event_id, msg.event_type);
        meta.source = (!key.source.is_empty()).then(|| key.source.clone());
        meta.topic = d.topic.to_string();
        meta.partition = d.partition;
        meta.offset = d.offset;
        meta.key = d.key.clone();
        meta.headers = d.headers.clone();
        meta.attempt = attempt;
        meta.effects_table = Some(self.effects_table.clone());
        meta
    }
}

/// Waits out a store error by the outage backoff; `false` if shutdown came first. Errors that
/// are not outages are retried too (they may be passing server states), but logged as errors.
pub(super) async fn wait_outage(
    outage: &mut Attempts,
    error: &StoreError,
    shutdown: &CancellationToken,
) -> bool {
    let wait = outage.next_delay();
    // A database message may quote the data: logged escaped, as a field.
    let text = error.to_string();
    if error.is_retryable() {
        tracing::warn!(target: "inoutbox::engine", error = text.as_str(), retry_in = ?wait, "database unavailable, backing off");
    } else {
        tracing::error!(target: "inoutbox::engine", error = text.as_str(), retry_in = ?wait, "database error, retrying");
    }
    sleep_unless_cancelled(wait, shutdown).await
}

/// How many times inoutbox's own statements for one message may be rejected by the database
/// (SQLSTATE class 22 or 23) before the message is dead-lettered.
pub(super) const REJECTIONS_BEFORE_DEAD_LETTER: u32 = 3;
