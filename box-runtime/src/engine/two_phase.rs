//! The two-phase inbox, for handlers that take seconds (`mode = "two_phase"`).
//!
//! Receive: the partition's transaction stores the message as a `received` inbox row (payload,
//! headers and key kept; a row that exists makes it a duplicate) and commits; the offset is
//! committed after that, without waiting for the handler. Process: workers (any number per
//! process, in any number of processes) claim received rows with a lease (`FOR UPDATE SKIP
//! LOCKED`: a row being claimed by another worker is skipped, a row whose lease is live is not
//! taken), renew the lease while the handler runs, and run the handler through the one-message
//! path ([`Inbox::run`]) with retries, attempts and dead letters as in the one-phase mode. Its
//! transaction checks the lease and locks the row until it ends, and marks the row processed
//! only if it still holds the lease: while it runs no other worker can claim the row, even once
//! the lease expired, and a worker whose lease was taken over before its transaction began
//! rolls back instead of applying the event twice. A crashed worker's row is claimed again once
//! its lease expires.

use std::convert::Infallible;
use std::sync::Arc;

use super::prepare::{Prepared, Ready};
use super::process::{wait_outage, REJECTIONS_BEFORE_DEAD_LETTER};
use super::Inbox;
use crate::message::Outcome;
use crate::shutdown::{finish_within, sleep_unless_cancelled, CancellationToken};
use crate::store::{ClaimRequest, InboxKey, InboxStore, LeaseRequest, ReceivedRow, StoreError};

/// A worker's name: a random UUID (v4) per worker, unique across processes and hosts (process
/// ids are not: every container's process may be pid 1), with the worker's number for logs.
fn owner_name(worker: usize) -> String {
    format!("{}-{worker}", uuid::Uuid::new_v4())
}

impl<S: InboxStore> Inbox<S> {
    /// Receive step of two-phase handlers: stores the messages as received rows in one
    /// transaction and wakes this process's workers; returns `(index, outcome)` pairs
    /// ([`Outcome::Received`], or [`Outcome::Duplicate`] when the row existed).
    pub(super) async fn receive_all(
        &self,
        msgs: &[(usize, &Ready<'_>)],
        shutdown: &CancellationToken,
    ) -> Vec<(usize, Outcome)> {
        let mut outage = self.config.outage_backoff.start();
        let mut rejections = 0;
        loop {
            let error = match self.try_receive(msgs).await {
                Ok(inserted) => {
                    if inserted.iter().any(|i| *i) {
                        self.wake.notify_waiters();
                    }
                    let outcome = |new: bool| match new {
                        true => Outcome::Received,
                        false => Outcome::Duplicate,
                    };
                    return msgs
                        .iter()
                        .zip(inserted)
                        .map(|((i, _), new)| (*i, outcome(new)))
                        .collect();
                }
                Err(e) => e,
            };
            rejections += u32::from(error.is_rejected());
            if rejections >= REJECTIONS_BEFORE_DEAD_LETTER {
                let reason = format!("the database rejects this message: {error}");
                let mut out = Vec::with_capacity(msgs.len());
                for (i, m) in msgs {
                    let (key, event_type) = (Some(&m.key), Some(m.event_type));
                    let o = self.dead_letter(m.d, key, event_type, &reason, 0, shutdown);
                    out.push((*i, o.await));
                }
                return out;
            }
            if !wait_outage(&mut outage, &error, shutdown).await {
                return msgs.iter().map(|(i, _)| (*i, Outcome::Abandoned)).collect();
            }
        }
    }

    async fn try_receive(&self, msgs: &[(usize, &Ready<'_>)]) -> Result<Vec<bool>, StoreError> {
        let requests: Vec<ClaimRequest<'_>> = msgs
            .iter()
            .map(|(_, m)| ClaimRequest {
                key: &m.key,
                event_type: m.event_type,
                delivery: m.d,
            })
            .collect();
        let mut tx = self.store.begin().await?;
        match self.store.receive(&mut tx, &requests).await {
            Ok(inserted) => {
                self.store.commit(tx).await?;
                Ok(inserted)
            }
            Err(e) => {
                let _ = self.store.rollback(tx).await;
                Err(e)
            }
        }
    }

    /// Runs the group's two-phase workers ([`InboxConfig::two_phase_workers`](crate::engine::InboxConfig::two_phase_workers) of them) until
    /// `shutdown` becomes true; each finishes the message in hand first, within
    /// [`InboxConfig::worker_grace`](crate::engine::InboxConfig::worker_grace). Returns at once when
    /// the group has no two-phase handler. Any number of processes may run workers of a group
    /// at once: a row is claimed by one worker at a time.
    pub(crate) async fn run_two_phase(self: Arc<Self>, shutdown: CancellationToken)
    where
        S: 'static,
    {
        let (types, ordered) = self.handlers.two_phase_types();
        if types.is_empty() {
            return;
        }
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..self.config.two_phase_workers.max(1) {
            let (inbox, shutdown) = (self.clone(), shutdown.clone());
            let (types, ordered) = (types.clone(), ordered.clone());
            tasks.spawn(async move {
                inbox
                    .worker(owner_name(worker), &types, &ordered, shutdown)
                    .await
            });
        }
        tracing::info!(target: "inoutbox::engine",
            group = self.group(),
            workers = tasks.len(),
            "two-phase workers started"
        );
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                joined = tasks.join_next() => if joined.is_none() {
                    return;
                },
            }
        }
        // The messages in hand get the grace period; then they are aborted: their
        // transactions roll back and their rows are claimed again once the leases expire.
        let deadline = tokio::time::Instant::now() + self.config.worker_grace;
        if !finish_within(&mut tasks, deadline, |_| {}).await {
            tracing::warn!(target: "inoutbox::engine", group = self.group(), grace = ?self.config.worker_grace,
                "two-phase workers still had messages in hand at the end of the grace period; \
                 abandoned (rolled back, claimed again after their leases)");
        }
    }

    /// One worker: claims a received row, runs it, and again; sleeps when there is none.
    async fn worker(
        &self,
        owner: String,
        types: &[&str],
        ordered: &[&str],
        shutdown: CancellationToken,
    ) {
        let request = LeaseRequest {
            group: self.group(),
            owner: &owner,
            lease: self.config.lease,
            event_types: types,
            ordered,
        };
        let mut outage = self.config.outage_backoff.start();
        while !shutdown.is_cancelled() {
            let woken = self.wake.notified();
            match self.store.claim_received(&request).await {
                Ok(Some(row)) => {
                    outage.reset();
                    self.work(row, &owner, &shutdown).await;
                }
                Ok(None) => {
                    outage.reset();
                    tokio::select! {
                        () = woken => {},
                        _ = sleep_unless_cancelled(self.config.two_phase_poll, &shutdown) => {},
                    }
                }
                Err(e) => {
                    if !wait_outage(&mut outage, &e, &shutdown).await {
                        break;
                    }
                }
            }
        }
    }

    /// Runs the handler of a claimed row while renewing its lease, then settles the row.
    async fn work(&self, row: ReceivedRow, owner: &str, shutdown: &CancellationToken) {
        let d = &row.delivery;
        let outcome = match self.prepare(d) {
            Prepared::Ready(ready) => {
                let ready = Ready {
                    key: row.key.clone(),
                    lease: Some(owner),
                    ..ready
                };
                tokio::select! {
                    outcome = self.run(&ready, shutdown) => outcome,
                    never = self.renew(&row.key, owner) => match never {},
                }
            }
            other => self.resolve(d, other, shutdown).await,
        };
        self.log(d, &outcome);
        self.settle(&row.key, owner, &outcome).await;
    }

    /// Renews the lease every third of it, for as long as the handler runs.
    async fn renew(&self, key: &InboxKey, owner: &str) -> Infallible {
        let every = self.config.lease / 3;
        loop {
            tokio::time::sleep(every).await;
            match self.store.renew_lease(key, owner, self.config.lease).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(target: "inoutbox::engine", group = self.group(), event_id = key.event_id.as_str(),
                    "the lease on a received row was lost; the handler's transaction will roll back")
                }
                Err(e) => {
                    tracing::warn!(target: "inoutbox::engine", group = self.group(), event_id = key.event_id.as_str(),
                    error = e.to_string().as_str(), "renewing a lease failed")
                }
            }
        }
    }

    /// After a worker's run: a dead-lettered or skipped row is deleted (a redelivery is
    /// received again, as a one-phase message is handled again), an abandoned one released for
    /// any worker; a row left failing keeps its lease until it expires, and is claimed again.
    async fn settle(&self, key: &InboxKey, owner: &str, outcome: &Outcome) {
        let result = match outcome {
            Outcome::DeadLettered { .. }
            | Outcome::Skipped { .. }
            | Outcome::FailedAcknowledged { .. } => self.store.drop_received(key, owner).await,
            Outcome::Abandoned => self.store.release_lease(key, owner).await,
            _ => Ok(()),
        };
        if let Err(e) = result {
            // The lease expires and the row is claimed again: resolved again, not lost.
            tracing::warn!(target: "inoutbox::engine",
                group = self.group(),
                event_id = key.event_id.as_str(),
                error = e.to_string().as_str(),
                "settling a received row failed; its lease will expire"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::owner_name;
    use crate::engine::fake::{slow_row, two_phase_inbox, Faulty};
    use crate::engine::InboxConfig;
    use crate::shutdown::CancellationToken;

    #[tokio::test]
    async fn a_stop_aborts_a_two_phase_worker_still_running_at_the_end_of_the_grace() {
        let (held, dropped) = tokio::sync::oneshot::channel::<()>();
        let held = Arc::new(Mutex::new(Some(held)));
        let store = Faulty {
            held: held.clone(),
            received: Mutex::new(Some(slow_row())),
            ..Faulty::default()
        };
        let config = InboxConfig::default()
            .two_phase_workers(1)
            .worker_grace(Duration::from_millis(50));
        let inbox = two_phase_inbox(store, config);
        let shutdown = CancellationToken::new();
        let workers = tokio::spawn(inbox.run_two_phase(shutdown.clone()));
        // Until the worker's handler transaction is stuck on its row.
        while held.lock().unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(30), workers).await;
        assert!(stopped.is_ok(), "the workers outlived their grace period");
        assert!(
            dropped.await.is_err(),
            "the worker's transaction was dropped"
        );
    }

    #[test]
    fn worker_names_are_random_uuids_not_process_ids() {
        let names: std::collections::HashSet<String> = (0..1000).map(|_| owner_name(0)).collect();
        assert_eq!(names.len(), 1000, "every worker's name is its own");
        for name in names.iter().take(3) {
            let id = uuid::Uuid::parse_str(&name[..36]).expect("a UUID");
            assert_eq!(id.get_version_num(), 4, "{name}");
        }
    }
}
