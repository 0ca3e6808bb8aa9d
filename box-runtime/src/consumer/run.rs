//! [`Consumer`] and its run.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::effects::watch_drain;
use super::sampler::{log_summaries, sample_inbox, Sampling};
use crate::effects::{self, Executors};
use crate::engine::partition::Starter;
use crate::engine::{Inbox, InboxConfig, Report};
use crate::shutdown::{shutdown_signal, CancellationToken};
use crate::store::InboxStore;
use crate::telemetry::Health;
use crate::transport::Transport;

/// A consumer group member: every `#[inbox_handler]` of its group, on a store, fed by Kafka.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use inoutbox::{Consumer, KafkaConfig, PgStore};
///
/// let store = PgStore::new(pool);
/// store.migrate().await?;
/// Consumer::builder("billing", store, KafkaConfig::new("127.0.0.1:9092", ["orders"]))
///     .build()?
///     .run_until_signal()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a consumer does nothing until `run` or `run_until_signal` is awaited"]
pub struct Consumer<S, T> {
    pub(super) inbox: Arc<Inbox<S>>,
    pub(super) transport: T,
    pub(super) reports: Option<mpsc::UnboundedSender<Report>>,
    pub(super) sampling: Sampling,
    pub(super) effects: Executors,
}

impl<S: InboxStore, T: Transport> Consumer<S, T> {
    /// The group's settings.
    pub fn config(&self) -> &InboxConfig {
        self.inbox.config()
    }

    /// The store.
    pub fn store(&self) -> &S {
        self.inbox.store()
    }

    /// The consumer's health (see [`Health`]): live while `run` runs, joined while it holds
    /// an assignment of the group, the database reachable as the last transaction and the last
    /// gauge sample found it, and the time the last batch was resolved.
    pub fn health(&self) -> Health {
        self.inbox.health()
    }

    /// Consumes until `shutdown` completes; then finishes the messages in hand (within the
    /// transport's grace period), commits and leaves the group.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), T::Error> {
        let token = CancellationToken::new();
        let run = self.run_until_cancelled(token.clone());
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => result,
            () = shutdown => {
                token.cancel();
                run.await
            }
        }
    }

    /// Consumes until `token` is cancelled (the shutdown of a service that runs several parts
    /// under one token).
    pub async fn run_until_cancelled(self, token: CancellationToken) -> Result<(), T::Error> {
        let inbox = self.inbox;
        let health = inbox.health();
        health.set_live(true);
        let sampler = tokio::spawn(sample_inbox(inbox.clone(), self.sampling, token.clone()));
        let summaries = tokio::spawn(log_summaries(inbox.clone(), self.sampling.summary_interval));
        let purge = tokio::spawn(retention(inbox.clone(), token.clone()));
        // Two-phase workers (none when the group has no two-phase handler) run beside the
        // transport and stop with it, each after the message in hand.
        let workers = tokio::spawn(inbox.clone().run_two_phase(token.clone()));
        // The deferred worker (none when the store keeps no deferred messages) runs due
        // messages beside them, and stops as they do.
        let deferred = tokio::spawn(inbox.clone().run_deferred(token.clone()));
        // The effects drain (none without executors) stops within the transport's grace.
        let effects = (!self.effects.by_kind.is_empty()).then(|| {
            let group = inbox.group().to_owned();
            let drain = effects::drain(inbox.clone(), self.effects, token.clone());
            let grace = self.transport.shutdown_grace();
            tokio::spawn(watch_drain(
                drain,
                group,
                token.clone(),
                health.clone(),
                grace,
            ))
        });
        let partitions = Starter {
            inbox: inbox.clone(),
            reports: self.reports,
            sample_interval: self.sampling.interval,
        };
        let result = self.transport.run(partitions, token.clone()).await;
        token.cancel();
        let _ = workers.await;
        let _ = deferred.await;
        if let Some(effects) = effects {
            let _ = effects.await;
        }
        sampler.abort();
        purge.abort();
        summaries.abort();
        let _ = summaries.await;
        inbox.log_summary();
        health.set_live(false);
        health.set_joined(false);
        result
    }

    /// Consumes until SIGINT or SIGTERM.
    pub async fn run_until_signal(self) -> Result<(), T::Error> {
        self.run(shutdown_signal()).await
    }
}

/// Deletes inbox rows processed longer ago than the retention window, and effects done longer
/// ago (on a store that keeps effects), every `retention.interval`, until `stop`: in
/// statements of `retention.batch_size` rows, each its own short transaction, so no lock is
/// held for long. Every group's rows go, whichever consumer purges; several consumers purging
/// at once only share the work.
async fn retention<S: InboxStore>(inbox: Arc<Inbox<S>>, stop: CancellationToken) {
    let (Some(retention), true) = (inbox.config().retention, inbox.config().ack.uses_inbox())
    else {
        return;
    };
    let group = inbox.group();
    loop {
        match inbox
            .purge_processed(retention.older_than, retention.batch_size)
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(target: "inoutbox::consumer", group, deleted = n, "inbox retention purge")
            }
            Err(e) => {
                tracing::warn!(target: "inoutbox::consumer", group, error = %e, "inbox retention purge failed")
            }
        }
        if S::EFFECTS {
            super::effects::purge_done(inbox.store(), group, &retention).await;
        }
        tokio::select! {
            () = tokio::time::sleep(retention.interval) => {}
            () = stop.cancelled() => return,
        }
    }
}
