//! A relay's lifetime: its workers, the wake-up and the retention purge run as tasks; a
//! shutdown stops them within the grace period.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::watch;

use crate::shutdown::{finish_within, CancellationToken};
use tokio::task::JoinSet;

use super::shared::Shared;
use super::telemetry::RelayTelemetry;
use super::{worker, Relay, RelayConfig, RelayError, RelayStore};
use crate::telemetry::MIN_SAMPLE_INTERVAL;
use crate::transport::Publisher;

type Tasks = JoinSet<Result<(), RelayError>>;

/// Polls `fut` once: `true` if it completed.
async fn poll_once<F: Future>(mut fut: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// Publishes until `shutdown` completes, then stops within [`RelayBuilder::grace`].
    ///
    /// `shutdown` is polled once before anything else (so [`shutdown_signal`](crate::shutdown_signal)
    /// has its handlers installed from the start) and then throughout, however busy the relay
    /// is. On shutdown no new batch is read; batches in flight get until the grace period's
    /// end to be acknowledged and marked, and whatever is still unacknowledged then is
    /// abandoned unmarked (it is published again later: at least once). A graceful stop
    /// therefore publishes nothing twice unless the broker is slower than the grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), RelayError> {
        run(self, shutdown).await
    }
}

async fn run<S: RelayStore, P: Publisher>(
    relay: Relay<S, P>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RelayError> {
    tokio::pin!(shutdown);
    // First of all: `shutdown_signal()` installs its signal handlers when first polled, so a
    // SIGTERM that comes while the relay is busy from its first moment is caught.
    if poll_once(shutdown.as_mut()).await {
        return Ok(());
    }
    let shared = Arc::new(Shared {
        store: relay.store,
        publisher: relay.publisher,
        config: relay.config,
        reports: relay.reports,
        stop: CancellationToken::new(),
        wake: watch::Sender::new(0),
        telemetry: RelayTelemetry::new(relay.health),
        sample_interval: relay.sample_interval,
    });
    let health = shared.telemetry.health.clone();
    health.set_live(true);
    let mut tasks = Tasks::new();
    let outcome = tokio::select! {
        result = supervise(&shared, &mut tasks) => result,
        () = &mut shutdown => Ok(()),
    };
    shared.stop.cancel();
    finish(&mut tasks, &shared.config).await;
    health.set_live(false);
    health.set_joined(false);
    outcome
}

/// Starts the tasks and waits until one fails (a fatal error ends the relay).
async fn supervise<S: RelayStore, P: Publisher>(
    shared: &Arc<Shared<S, P>>,
    tasks: &mut Tasks,
) -> Result<(), RelayError> {
    shared.store.listen().await?;
    // Every worker joins (concurrently) before any claims slots, so the first shares count
    // them all.
    let mut opening = JoinSet::new();
    for _ in 0..shared.config.workers.max(1) {
        let store = shared.store.clone();
        opening.spawn(async move { store.open().await });
    }
    let mut sessions = Vec::with_capacity(shared.config.workers);
    while let Some(opened) = opening.join_next().await {
        match opened {
            Ok(session) => sessions.push(session?),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    shared.telemetry.health.set_joined(!sessions.is_empty());
    tasks.spawn(wake_up(shared.clone()));
    tasks.spawn(sample(shared.clone()));
    if shared.config.retention.is_some() {
        tasks.spawn(purge(shared.clone()));
    }
    for (n, session) in sessions.into_iter().enumerate() {
        tasks.spawn(worker::run(shared.clone(), session, n));
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    Ok(())
}

/// Lets the tasks finish their batches in flight until the grace period ends; then abandons
/// what is left (unmarked rows are published again later).
async fn finish(tasks: &mut Tasks, config: &RelayConfig) {
    let deadline = tokio::time::Instant::now() + config.grace;
    let in_time = finish_within(tasks, deadline, |done| {
        if let Ok(Err(e)) = done {
            tracing::warn!(target: "inoutbox::relay", error = %e, "relay task failed while stopping");
        }
    })
    .await;
    if !in_time {
        tracing::warn!(target: "inoutbox::relay",
            grace = ?config.grace,
            "relay stop: batches still unacknowledged after the grace period are \
             abandoned unmarked (they will be published again)"
        );
    }
}

/// Turns notifications (and, failing those, the poll interval) into wake-ups of the workers.
async fn wake_up<S: RelayStore, P: Publisher>(shared: Arc<Shared<S, P>>) -> Result<(), RelayError> {
    let stop = shared.stop.clone();
    loop {
        tokio::select! {
            () = shared.store.wait(shared.config.poll_interval) => {
                shared.wake.send_modify(|n| *n = n.wrapping_add(1));
            }
            () = stop.cancelled() => return Ok(()),
        }
    }
}

/// Samples the backlog gauges every sample interval; the outcome also tells the relay's
/// health whether the database answers.
async fn sample<S: RelayStore, P: Publisher>(shared: Arc<Shared<S, P>>) -> Result<(), RelayError> {
    let stop = shared.stop.clone();
    loop {
        match shared.store.backlog().await {
            Ok(backlog) => {
                shared.telemetry.backlog(&backlog);
                shared.telemetry.health.set_database(true);
            }
            Err(e) => {
                shared.telemetry.health.set_database(false);
                tracing::debug!(target: "inoutbox::relay", error = %e, "sampling the outbox backlog failed");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(shared.sample_interval.max(MIN_SAMPLE_INTERVAL)) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
}

/// Deletes published rows older than the retention window, every `retention.interval`.
async fn purge<S: RelayStore, P: Publisher>(shared: Arc<Shared<S, P>>) -> Result<(), RelayError> {
    let Some(retention) = &shared.config.retention else {
        return Ok(());
    };
    let stop = shared.stop.clone();
    loop {
        match shared.store.purge(retention).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(target: "inoutbox::relay", deleted = n, "outbox retention purge")
            }
            Err(e) => {
                tracing::warn!(target: "inoutbox::relay", error = %e, "outbox retention purge failed")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(retention.interval) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
}
