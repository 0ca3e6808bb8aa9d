//! Micro-batches: several messages of one partition in one transaction — one claim statement
//! for all their inbox rows, their handlers in offset order, one commit.
//!
//! A failure is isolated to the failing message by rollback and split: the batch rolls back,
//! the messages before the failing one run again as a batch, the failing one goes through the
//! one-message path (its failed run counted, retried with backoff or dead-lettered), and the
//! messages after it run as a batch. Effects commit once; only the failing message is retried,
//! counted and dead-lettered, exactly as without batching.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::shutdown::CancellationToken;
use tracing::{Instrument, Span};

use super::prepare::{Prepared, Ready};
use super::process::{classify_failure, duplicate, Attempt};
use super::Inbox;
use crate::message::{Delivery, Outcome};
use crate::store::{Claim, ClaimRequest, InboxStore, StoreError};

/// How a batch transaction ended.
enum BatchEnd {
    /// Committed: one outcome per message run.
    Committed(Vec<Outcome>),
    /// The message at this position (among those run) failed: rolled back.
    Failed(usize, Attempt),
    /// A batch handler failed on the run of messages at these positions (which one is not
    /// known): rolled back.
    FailedRun(usize, usize),
    /// The database failed: rolled back.
    Outage(StoreError),
}

impl<S: InboxStore> Inbox<S> {
    /// Takes messages of one partition (in offset order) through the strategy, sharing
    /// transactions where the strategy allows; returns one outcome per message, in order. (A
    /// partition's run calls it; public for tests of the batch path only.)
    #[doc(hidden)]
    pub async fn process_batch(
        &self,
        batch: &[&Delivery],
        shutdown: &CancellationToken,
    ) -> Vec<Outcome> {
        self.telemetry.batch_size(batch.len());
        if batch.len() <= 1 || !self.config.ack.batches() {
            let mut outcomes = Vec::with_capacity(batch.len());
            for d in batch {
                outcomes.push(self.process(d, shutdown).await);
            }
            return outcomes;
        }
        let (span, started) = (self.telemetry.batch_span(batch.len()), Instant::now());
        let spans: Vec<Span> =
            span.in_scope(|| batch.iter().map(|d| self.message_span(d)).collect());
        let prepared: Vec<Prepared<'_>> = (batch.iter().zip(&spans))
            .map(|(d, s)| self.prepare(d).with_span(s))
            .collect();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let Sorted {
            runnable,
            received,
            copies,
        } = sort(&prepared, &mut outcomes);
        let split = self.run_split(&runnable, shutdown);
        let mut done = split.instrument(span.clone()).await;
        if !received.is_empty() {
            let receive = self.receive_all(&received, shutdown);
            done.extend(receive.instrument(span.clone()).await);
        }
        for (i, outcome) in done {
            outcomes[i] = Some(outcome);
        }
        // A copy of a message that was abandoned is not a duplicate of anything committed:
        // it is abandoned too (the next owner reads both again).
        for (copy, first) in copies {
            if outcomes[first] == Some(Outcome::Abandoned) {
                outcomes[copy] = Some(Outcome::Abandoned);
            }
        }
        for (i, p) in prepared.into_iter().enumerate() {
            if outcomes[i].is_none() {
                let resolve = self.resolve(batch[i], p, shutdown);
                outcomes[i] = Some(resolve.instrument(spans[i].clone()).await);
            }
        }
        let outcomes: Vec<Outcome> = outcomes.into_iter().flatten().collect();
        for ((d, outcome), s) in batch.iter().zip(&outcomes).zip(&spans) {
            self.finish(d, s, started, outcome);
        }
        if outcomes.iter().any(Outcome::acknowledges) {
            self.telemetry.health.cycle();
        }
        outcomes
    }

    /// Runs `msgs` as one batch; on a failure, splits around the failing message (see the
    /// module docs). Returns `(index in the batch, outcome)` pairs.
    async fn run_split(
        &self,
        msgs: &[(usize, &Ready<'_>)],
        shutdown: &CancellationToken,
    ) -> Vec<(usize, Outcome)> {
        let mut done = Vec::with_capacity(msgs.len());
        let mut rest = msgs;
        while !rest.is_empty() {
            if shutdown.is_cancelled() {
                done.extend(rest.iter().map(|(i, _)| (*i, Outcome::Abandoned)));
                break;
            }
            if rest.len() == 1 {
                let (i, msg) = rest[0];
                done.push((i, self.run(msg, shutdown).await));
                break;
            }
            let limit = self.config.transaction_timeout;
            let ended = tokio::time::timeout(limit, self.run_batch(rest, shutdown))
                .await
                .unwrap_or_else(|_| BatchEnd::Outage(StoreError::timed_out(limit)));
            match ended {
                BatchEnd::Committed(outcomes) => {
                    done.extend(rest.iter().map(|(i, _)| *i).zip(outcomes));
                    break;
                }
                BatchEnd::Outage(e) => {
                    // The one-message path waits out the outage, message by message.
                    tracing::warn!(target: "inoutbox::engine",
                        group = self.group(),
                        error = e.to_string().as_str(),
                        "a batch failed on the database; taking its messages one by one"
                    );
                    for (i, msg) in rest {
                        let outcome = if shutdown.is_cancelled() {
                            Outcome::Abandoned
                        } else {
                            self.run(msg, shutdown).await
                        };
                        done.push((*i, outcome));
                    }
                    break;
                }
                BatchEnd::FailedRun(from, to) => {
                    // Which message failed the batch handler is not known: the run goes one
                    // message at a time (one-element batches), which finds it.
                    for (i, outcome) in Box::pin(self.run_split(&rest[..from], shutdown)).await {
                        done.push((i, outcome));
                    }
                    for (i, msg) in &rest[from..to] {
                        done.push((*i, self.run(msg, shutdown).await));
                    }
                    rest = &rest[to..];
                }
                BatchEnd::Failed(k, failure) => {
                    let before = &rest[..k];
                    for (i, outcome) in Box::pin(self.run_split(before, shutdown)).await {
                        done.push((i, outcome));
                    }
                    let (i, msg) = rest[k];
                    done.push((i, self.run_from(msg, Some(failure), shutdown).await));
                    rest = &rest[k + 1..];
                }
            }
        }
        done
    }

    /// One transaction for `msgs`: one claim statement, the handlers of the new ones in order,
    /// one commit.
    /// A graceful stop that comes while the batch runs ends it after the handler in hand: what
    /// ran commits, the rest is left (abandoned) for the partition's next owner.
    async fn run_batch(
        &self,
        msgs: &[(usize, &Ready<'_>)],
        shutdown: &CancellationToken,
    ) -> BatchEnd {
        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return BatchEnd::Outage(e),
        };
        let claims = match self.claim_all(&mut tx, msgs).await {
            Ok(claims) => claims,
            Err(e) => {
                let _ = self.store.rollback(tx).await;
                return BatchEnd::Outage(e);
            }
        };
        let mut outcomes = Vec::with_capacity(msgs.len());
        let mut k = 0;
        while k < msgs.len() {
            if k > 0 && shutdown.is_cancelled() {
                if let Err(e) = self.release_unrun(&mut tx, &msgs[k..], &claims[k..]).await {
                    let _ = self.store.rollback(tx).await;
                    return BatchEnd::Outage(e);
                }
                outcomes.resize(msgs.len(), Outcome::Abandoned);
                break;
            }
            let end = run_end(msgs, &claims, k);
            if let Err(end) = self
                .step(&mut tx, &msgs[k..end], &claims[k..end], k, &mut outcomes)
                .await
            {
                let _ = self.store.rollback(tx).await;
                return end;
            }
            k = end;
        }
        match self.store.commit(tx).await {
            Ok(()) => {
                self.committed.notify_one();
                crate::failpoint::hit("after_db_commit").await;
                BatchEnd::Committed(outcomes)
            }
            Err(e) => BatchEnd::Outage(e),
        }
    }

    /// Claims every message's inbox row in one statement (or, without the inbox, takes every
    /// message as new).
    async fn claim_all(
        &self,
        tx: &mut S::Tx,
        msgs: &[(usize, &Ready<'_>)],
    ) -> Result<Vec<Claim>, StoreError> {
        if !self.config.ack.uses_inbox() {
            return Ok(vec![Claim::New { attempts: 0 }; msgs.len()]);
        }
        let requests: Vec<ClaimRequest<'_>> = msgs
            .iter()
            .map(|(_, m)| ClaimRequest {
                key: &m.key,
                event_type: m.event_type,
                delivery: m.d,
            })
            .collect();
        let keys: Vec<&crate::store::InboxKey> = msgs.iter().map(|(_, m)| &m.key).collect();
        self.expire_business_keys(tx, &keys).await?;
        let claims = self.store.claim_batch(tx, &requests).await?;
        crate::failpoint::hit("after_inbox_insert").await;
        Ok(claims)
    }

    /// Gives back the claims of messages a graceful stop left unrun.
    async fn release_unrun(
        &self,
        tx: &mut S::Tx,
        msgs: &[(usize, &Ready<'_>)],
        claims: &[Claim],
    ) -> Result<(), StoreError> {
        if !self.config.ack.uses_inbox() {
            return Ok(());
        }
        let unrun: Vec<&crate::store::InboxKey> = msgs
            .iter()
            .zip(claims)
            .filter(|(_, c)| matches!(c, Claim::New { .. }))
            .map(|((_, m), _)| &m.key)
            .collect();
        self.store.release_claims(tx, &unrun).await
    }

    /// Runs one message, or one run of messages of a batch handler, in `tx`; `at` is the
    /// position of the first in the batch. On failure, how the batch ends.
    async fn step(
        &self,
        tx: &mut S::Tx,
        msgs: &[(usize, &Ready<'_>)],
        claims: &[Claim],
        at: usize,
        outcomes: &mut Vec<Outcome>,
    ) -> Result<(), BatchEnd> {
        let attempts: Vec<u32> = claims
            .iter()
            .map(|c| match c {
                Claim::New { attempts } => *attempts,
                Claim::Duplicate | Claim::DuplicateBusinessKey => 0,
            })
            .collect();
        if let [claim @ (Claim::Duplicate | Claim::DuplicateBusinessKey)] = claims {
            outcomes.push(duplicate(&msgs[0].1.key, *claim));
            return Ok(());
        }
        let result = match msgs {
            [(_, msg)] => self.invoke(msg, tx, attempts[0] + 1).await,
            run => self.invoke_run(run, tx, &attempts).await,
        };
        if let Err(error) = result {
            return Err(match msgs.len() {
                1 => BatchEnd::Failed(at, classify_failure(error)),
                n => BatchEnd::FailedRun(at, at + n),
            });
        }
        for ((_, msg), failed_before) in msgs.iter().zip(&attempts) {
            crate::failpoint::hit("after_handler").await;
            if *failed_before > 0 {
                self.store
                    .mark_processed(tx, &msg.key, true)
                    .await
                    .map_err(BatchEnd::Outage)?;
            }
            outcomes.push(Outcome::Processed {
                attempt: failed_before + 1,
            });
        }
        Ok(())
    }
}

/// Where the step starting at `k` ends: after a run of new messages handled by one batch
/// handler, or after `k` alone.
fn run_end(msgs: &[(usize, &Ready<'_>)], claims: &[Claim], k: usize) -> usize {
    let new = |j: usize| matches!(claims[j], Claim::New { .. });
    let reg = msgs[k].1.reg;
    if reg.invoke_batch.is_none() || !new(k) {
        return k + 1;
    }
    (k + 1..msgs.len())
        .find(|&j| !new(j) || !std::ptr::eq(msgs[j].1.reg, reg))
        .unwrap_or(msgs.len())
}

/// A batch's ready messages, sorted by what happens to them next.
struct Sorted<'p, 'd> {
    /// Run by their handlers in one transaction.
    runnable: Vec<(usize, &'p Ready<'d>)>,
    /// Messages of two-phase handlers: stored as received, all in one transaction.
    received: Vec<(usize, &'p Ready<'d>)>,
    /// (copy, first): later copies of a message in the batch, already marked duplicates; a
    /// copy's outcome becomes its first's when that one is abandoned.
    copies: Vec<(usize, usize)>,
}

/// Sorts the ready messages of a batch (see [`Sorted`]). The first message of each key runs;
/// a later copy in the same batch is a duplicate. A later event with the business key of an
/// earlier one is left out (its outcome stays `None`) and taken alone after it, when the
/// earlier one's row has committed (or not).
fn sort<'p, 'd>(prepared: &'p [Prepared<'d>], outcomes: &mut [Option<Outcome>]) -> Sorted<'p, 'd> {
    let mut seen = HashMap::with_capacity(prepared.len());
    let mut business_keys = HashSet::new();
    let mut sorted = Sorted {
        runnable: Vec::with_capacity(prepared.len()),
        received: Vec::new(),
        copies: Vec::new(),
    };
    for (i, p) in prepared.iter().enumerate() {
        let Prepared::Ready(ready) = p else {
            continue;
        };
        if let Some(k) = &ready.key.business_key {
            if !business_keys.insert(k) {
                continue;
            }
        }
        match seen.entry((&ready.key.source, &ready.key.event_id)) {
            Entry::Occupied(first) => {
                outcomes[i] = Some(Outcome::Duplicate);
                sorted.copies.push((i, *first.get()));
            }
            Entry::Vacant(slot) => {
                slot.insert(i);
                if ready.reg.mode.is_two_phase() {
                    sorted.received.push((i, ready));
                } else {
                    sorted.runnable.push((i, ready));
                }
            }
        }
    }
    sorted
}
