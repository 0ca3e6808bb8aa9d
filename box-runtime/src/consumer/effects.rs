//! The effects drain as the consumer runs it: a task of its own, watched. An end before the
//! shutdown (a panic outside any executor) is logged as an error and makes the consumer's
//! health not live; at shutdown the drain gets the transport's grace period, then is aborted
//! (the effects in flight run again after their lease).

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::effects::DrainSource;
use crate::engine::Inbox;
use crate::message::Retention;
use crate::shutdown::{finish_within, CancellationToken};
use crate::store::InboxStore;
use crate::telemetry::Health;

/// The drain runs on the consumer's inbox: its store, its group, and its signal of commits.
impl<S: InboxStore> DrainSource for Inbox<S> {
    type Store = S;

    fn store(&self) -> &S {
        Inbox::store(self)
    }

    fn group(&self) -> &str {
        Inbox::group(self)
    }

    fn committed(&self) -> &tokio::sync::Notify {
        &self.committed
    }
}

/// Deletes the effects done longer ago than `retention.older_than` (of every group: like the
/// inbox rows, whichever consumer purges), in batches; logs what it did.
pub(super) async fn purge_done<S: InboxStore>(store: &S, group: &str, retention: &Retention) {
    let purged = crate::store::delete_in_batches(retention.batch_size, |limit| {
        store.delete_done_effects(retention.older_than, limit)
    })
    .await;
    match purged {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(target: "inoutbox::consumer", group, deleted = n, "effects retention purge")
        }
        Err(e) => {
            tracing::warn!(target: "inoutbox::consumer", group, error = %e, "effects retention purge failed")
        }
    }
}

/// Runs `drain` until `token` is cancelled and then at most `grace` more; if it ends before
/// that, says so and marks `health` not live.
pub(super) async fn watch_drain(
    drain: impl Future<Output = ()> + Send + 'static,
    group: String,
    token: CancellationToken,
    health: Health,
    grace: Duration,
) {
    let mut tasks = JoinSet::new();
    tasks.spawn(drain);
    tokio::select! {
        ended = tasks.join_next() => {
            if token.is_cancelled() {
                return;
            }
            let reason = match ended {
                Some(Err(e)) if e.is_panic() => "it panicked",
                _ => "it ended",
            };
            tracing::error!(target: "inoutbox::consumer", group = group.as_str(), reason,
                "the effects drain stopped: effects after commit no longer run; the consumer is not live");
            health.set_live(false);
            return;
        }
        () = token.cancelled() => {}
    }
    let deadline = Instant::now() + grace;
    if !finish_within(&mut tasks, deadline, |_| {}).await {
        tracing::warn!(target: "inoutbox::consumer", group = group.as_str(), ?grace,
            "the effects drain did not stop within the grace period: the effect in hand was abandoned and runs again after its lease");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::watch_drain;
    use crate::shutdown::CancellationToken;
    use crate::telemetry::Health;

    #[tokio::test]
    async fn a_drain_that_dies_makes_the_consumer_not_live() {
        let health = Health::default();
        health.set_live(true);
        let token = CancellationToken::new();
        let drain = async { panic!("a store that panics") };
        let grace = Duration::from_secs(30);
        watch_drain(drain, "g".to_owned(), token.clone(), health.clone(), grace).await;
        assert!(!health.live(), "the health shows the dead drain");
        assert!(!token.is_cancelled());
    }

    #[tokio::test]
    async fn a_drain_stuck_at_shutdown_is_stopped_at_the_end_of_the_grace_period() {
        let health = Health::default();
        health.set_live(true);
        let token = CancellationToken::new();
        token.cancel();
        // An executor that never returns and ignores the shutdown.
        let stuck = std::future::pending::<()>();
        let watch = watch_drain(
            stuck,
            "g".to_owned(),
            token,
            health.clone(),
            Duration::from_millis(50),
        );
        tokio::time::timeout(Duration::from_secs(60), watch)
            .await
            .expect("the drain was stopped at the end of the grace period");
        assert!(health.live(), "a stop at shutdown is no failure");
    }
}
