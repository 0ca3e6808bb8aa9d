//! Deferred messages: a handler's answer "not yet, again in 30 s" ([`HandlerError::defer`]).
//!
//! Defer: the handler's transaction rolls back; a second transaction holds the message's inbox
//! row (claimed as any message's is, so a redelivery that got there first makes this one a
//! duplicate; or, for a run of a deferred row, checked under its lease) and keeps it
//! unprocessed with its due time, key, headers and payload. The message is then resolved
//! ([`Outcome::Deferred`]): its partition commits past it and goes on. A redelivery of it
//! meets its row and is a duplicate.
//!
//! Run when due: the consumer's deferred worker claims a due row with a lease (PostgreSQL:
//! `FOR UPDATE SKIP LOCKED`; SQLite: one `UPDATE ... RETURNING`, one writer at a time), so that
//! of several consumers of the group one runs it, and runs its handler through the one-message
//! path ([`Inbox::run`]) as a two-phase worker does: the handler's transaction checks the lease
//! and locks the row, and marks it processed only if it still holds it. Retries, attempts and
//! dead letters are those of any message; deferred again, it is kept again with a new due
//! time; deferred more than [`InboxConfig::max_deferrals`](super::InboxConfig::max_deferrals)
//! times, it is dead-lettered and its row deleted (a replay of the letter runs it anew).

use std::sync::Arc;
use std::time::Instant;

use super::prepare::{Prepared, Ready};
use super::process::{wait_outage, REJECTIONS_BEFORE_DEAD_LETTER};
use super::Inbox;
use crate::handler::HandlerError;
use crate::message::Outcome;
use crate::shutdown::{sleep_unless_cancelled, CancellationToken};
use crate::store::{Claim, InboxStore, ReceivedRow, StoreError};

/// What writing a deferral came to.
enum Kept {
    /// Kept, deferred this many times.
    Deferred(u32),
    /// Deferred more often than the limit: nothing written.
    OverLimit(u32),
    /// The message is resolved otherwise (a duplicate, a lost lease).
    Ended(Outcome),
}

impl<S: InboxStore> Inbox<S> {
    /// The handler deferred `msg` (`error` is its [`HandlerError::defer`]): keeps it in the
    /// inbox with its due time, or dead-letters it past the limit; waits out outages.
    pub(super) async fn defer(
        &self,
        msg: &Ready<'_>,
        error: &HandlerError,
        shutdown: &CancellationToken,
    ) -> Outcome {
        let after = error.deferred_for().unwrap_or_default();
        if !S::DEFERRAL || !self.config.ack.uses_inbox() {
            let reason = format!(
                "the handler deferred the message ({error}), but deferred messages need the \
                 inbox (`ExactlyOnceInbox`) on a store that keeps them ({} does{})",
                S::NAME,
                if S::DEFERRAL { "" } else { " not" }
            );
            return self.give_up_deferred(msg, reason, 0, shutdown).await;
        }
        let (mut outage, mut rejections) = (self.config.outage_backoff.start(), 0);
        loop {
            let error = match self.keep(msg, after).await {
                Ok(Kept::Deferred(deferrals)) => {
                    tracing::info!(target: "inoutbox::engine", group = self.group(), at = %msg.d.coordinates(),
                        event_id = msg.key.event_id.as_str(), deferrals, again_in = ?after,
                        reason = error.to_string().as_str(), "deferred");
                    return Outcome::Deferred { after, deferrals };
                }
                Ok(Kept::OverLimit(deferrals)) => {
                    let reason = format!(
                        "deferred {deferrals} times, more than max_deferrals = {}; last: {error}",
                        self.config.max_deferrals
                    );
                    return self
                        .give_up_deferred(msg, reason, deferrals, shutdown)
                        .await;
                }
                Ok(Kept::Ended(outcome)) => return outcome,
                Err(e) => e,
            };
            // The database refuses to keep it: a few more tries, then given up on, with why.
            rejections += u32::from(error.is_rejected());
            if rejections >= REJECTIONS_BEFORE_DEAD_LETTER {
                let reason = format!("the database rejects this message's deferral: {error}");
                return self.give_up_deferred(msg, reason, 0, shutdown).await;
            }
            if !wait_outage(&mut outage, &error, shutdown).await {
                return Outcome::Abandoned;
            }
        }
    }

    /// One transaction: the inbox row held (claimed, or checked under the lease), then kept
    /// deferred; rolled back past the limit.
    async fn keep(&self, msg: &Ready<'_>, after: std::time::Duration) -> Result<Kept, StoreError> {
        let mut tx = self.store.begin().await?;
        let held = match msg.lease {
            Some(owner) => match self.store.check_lease(&mut tx, &msg.key, owner).await {
                Ok(Some(_)) => None,
                Ok(None) => Some(Outcome::LeaseLost),
                Err(e) => {
                    let _ = self.store.rollback(tx).await;
                    return Err(e);
                }
            },
            None => match self.claim_for_deferral(&mut tx, msg).await {
                Ok(ended) => ended,
                Err(e) => {
                    let _ = self.store.rollback(tx).await;
                    return Err(e);
                }
            },
        };
        if let Some(outcome) = held {
            let _ = self.store.rollback(tx).await;
            return Ok(Kept::Ended(outcome));
        }
        let deferrals = match self.store.defer(&mut tx, &msg.key, msg.d, after).await {
            Ok(n) => n,
            Err(e) => {
                let _ = self.store.rollback(tx).await;
                return Err(e);
            }
        };
        if deferrals > self.config.max_deferrals {
            let _ = self.store.rollback(tx).await;
            return Ok(Kept::OverLimit(deferrals));
        }
        self.store.commit(tx).await?;
        Ok(Kept::Deferred(deferrals))
    }

    /// Claims the inbox row of a message deferred on its first delivery; `Some(outcome)` when
    /// the claim found it a duplicate.
    async fn claim_for_deferral(
        &self,
        tx: &mut S::Tx,
        msg: &Ready<'_>,
    ) -> Result<Option<Outcome>, StoreError> {
        self.expire_business_keys(tx, &[&msg.key]).await?;
        Ok(
            match self
                .store
                .claim(tx, &msg.key, msg.event_type, msg.d)
                .await?
            {
                Claim::New { .. } => None,
                claim => Some(super::process::duplicate(&msg.key, claim)),
            },
        )
    }

    /// A deferral that cannot be kept: given up on as the strategy says (dead-lettered, by
    /// default). A deferred row's owner deletes it afterwards (see [`Self::settle_deferred`]).
    async fn give_up_deferred(
        &self,
        msg: &Ready<'_>,
        reason: String,
        deferrals: u32,
        shutdown: &CancellationToken,
    ) -> Outcome {
        if self.config.ack.acknowledges_failures() {
            return Outcome::FailedAcknowledged { error: reason };
        }
        let (key, event_type) = (Some(&msg.key), Some(msg.event_type));
        self.dead_letter(msg.d, key, event_type, &reason, deferrals, shutdown)
            .await
    }

    /// Deferred messages of the group kept and not yet run (`None` when the store keeps none).
    pub async fn deferred_pending(&self) -> Result<Option<i64>, StoreError> {
        if !S::DEFERRAL || !self.config.ack.uses_inbox() {
            return Ok(None);
        }
        self.store.count_deferred(self.group()).await.map(Some)
    }

    /// Runs the group's deferred messages when due until `shutdown` becomes true; the message
    /// in hand then gets [`InboxConfig::worker_grace`](super::InboxConfig::worker_grace), and
    /// is abandoned after it (rolled back; its row claimed again once the lease expired).
    /// Returns at once when the store keeps no deferred messages. Any number of processes may
    /// run this for a group: a due row is run by one of them at a time.
    pub(crate) async fn run_deferred(self: Arc<Self>, shutdown: CancellationToken)
    where
        S: 'static,
    {
        if !S::DEFERRAL || !self.config.ack.uses_inbox() {
            return;
        }
        let owner = format!("{}-deferred", uuid::Uuid::new_v4());
        let (inbox, token) = (self.clone(), shutdown.clone());
        let mut worker = tokio::spawn(async move { inbox.deferred_worker(&owner, &token).await });
        tokio::select! {
            _ = &mut worker => return,
            () = shutdown.cancelled() => {}
        }
        let grace = self.config.worker_grace;
        if tokio::time::timeout(grace, &mut worker).await.is_err() {
            worker.abort();
            let _ = worker.await;
            tracing::warn!(target: "inoutbox::engine", group = self.group(), grace = ?grace,
                "the deferred worker still had a message in hand at the end of the grace period; \
                 abandoned (rolled back, claimed again after its lease)");
        }
    }

    /// Claims a due row, runs it, and again; sleeps for the poll interval when none is due.
    async fn deferred_worker(&self, owner: &str, shutdown: &CancellationToken) {
        let mut outage = self.config.outage_backoff.start();
        while !shutdown.is_cancelled() {
            match self
                .store
                .claim_deferred(self.group(), owner, self.config.lease)
                .await
            {
                Ok(Some(row)) => {
                    outage.reset();
                    self.run_due(row, owner, shutdown).await;
                }
                Ok(None) => {
                    outage.reset();
                    sleep_unless_cancelled(self.config.deferred_poll, shutdown).await;
                }
                Err(e) => {
                    if !wait_outage(&mut outage, &e, shutdown).await {
                        break;
                    }
                }
            }
        }
    }

    /// Runs the handler of a claimed due row under its lease, then settles the row.
    async fn run_due(&self, row: ReceivedRow, owner: &str, shutdown: &CancellationToken) {
        let d = &row.delivery;
        let (span, started) = (self.message_span(d), Instant::now());
        let outcome = match self.prepare(d).with_span(&span) {
            Prepared::Ready(ready) => {
                let ready = Ready {
                    key: row.key.clone(),
                    lease: Some(owner),
                    ..ready
                };
                self.run(&ready, shutdown).await
            }
            other => self.resolve(d, other, shutdown).await,
        };
        self.finish(d, &span, started, &outcome);
        self.settle_deferred(&row, owner, &outcome).await;
    }

    /// After a deferred row's run: a dead-lettered, skipped or failed-and-acknowledged row is
    /// deleted (a replay or a redelivery runs the message anew), an abandoned one released for
    /// any worker; a row left failing keeps its lease until it expires, and is claimed again.
    /// A processed or deferred-again row was settled in its transaction.
    async fn settle_deferred(&self, row: &ReceivedRow, owner: &str, outcome: &Outcome) {
        let key = &row.key;
        let result = match outcome {
            Outcome::DeadLettered { .. }
            | Outcome::Skipped { .. }
            | Outcome::FailedAcknowledged { .. } => self.store.drop_received(key, owner).await,
            Outcome::Abandoned => self.store.release_lease(key, owner).await,
            _ => Ok(()),
        };
        if let Err(e) = result {
            // The lease expires and the row is claimed again: resolved again, not lost.
            tracing::warn!(target: "inoutbox::engine", group = self.group(),
                event_id = key.event_id.as_str(), error = e.to_string().as_str(),
                "settling a deferred row failed; its lease will expire");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::{Arc, Mutex};

    use crate::engine::fake::{slow_row, two_phase_inbox, Faulty};
    use crate::engine::{AckStrategy, CommitOn, Inbox, InboxConfig};
    use crate::handler::{DispatchTable, HandlerError, HandlerFuture, HandlerRegistration};
    use crate::message::{Delivery, Outcome};
    use crate::shutdown::CancellationToken;

    /// A handler that always defers.
    static LATER: HandlerRegistration = HandlerRegistration::new(
        "Later",
        "g3",
        "later",
        file!(),
        line!(),
        std::any::TypeId::of::<()>,
        defers,
    );

    fn defers<'a>(
        _: &'a [u8],
        _: &'a mut (dyn std::any::Any + Send),
        _: &'a crate::handler::MessageMeta,
    ) -> HandlerFuture<'a> {
        Box::pin(async {
            Err(HandlerError::defer_because(
                Duration::from_secs(30),
                "the order is not there yet",
            ))
        })
    }

    #[tokio::test]
    async fn a_deferral_without_the_inbox_is_dead_lettered_with_why() {
        let handlers = DispatchTable::from_registrations("g3", [&LATER]).expect("a table");
        let config = InboxConfig::default().ack(AckStrategy::AtLeastOnce {
            commit: CommitOn::OnSuccess,
        });
        let inbox = Inbox::with_handlers(Faulty::default(), handlers, config).expect("inbox");
        let d = Delivery {
            topic: "t".into(),
            partition: 0,
            offset: 7,
            key: None,
            payload: Some(b"{}".to_vec()),
            headers: vec![
                ("ce_id".into(), Some(b"e-7".to_vec())),
                ("ce_type".into(), Some(b"Later".to_vec())),
            ],
        };
        let shutdown = CancellationToken::new();
        let run = inbox.process(&d, &shutdown);
        let outcome = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("resolved, not retried for ever");
        let Outcome::DeadLettered { reason, .. } = outcome else {
            panic!("dead-lettered, got {outcome:?}");
        };
        assert!(
            reason.contains("deferred messages need the inbox")
                && reason.contains("(faulty does)")
                && reason.contains("the order is not there yet (again in 30s)"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn a_stop_aborts_a_deferred_run_still_running_at_the_end_of_the_grace() {
        let (held, dropped) = tokio::sync::oneshot::channel::<()>();
        let held = Arc::new(Mutex::new(Some(held)));
        let store = Faulty {
            held: held.clone(),
            due: Mutex::new(Some(slow_row())),
            ..Faulty::default()
        };
        let config = InboxConfig::default().worker_grace(Duration::from_millis(50));
        let inbox = two_phase_inbox(store, config);
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(inbox.run_deferred(shutdown.clone()));
        // Until the run's transaction is stuck on its row.
        while held.lock().unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(30), worker).await;
        assert!(
            stopped.is_ok(),
            "the deferred worker outlived its grace period"
        );
        assert!(dropped.await.is_err(), "the run's transaction was dropped");
    }
}
