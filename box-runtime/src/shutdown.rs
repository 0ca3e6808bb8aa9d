//! One shutdown, everywhere: a [`CancellationToken`]. A consumer or relay makes one when it
//! starts running; every task it starts (partition runs, lanes, two-phase workers, the effects
//! drain, samplers, purges, relay workers) takes a clone or a child of it, and a transport
//! cancels a child token when the partition it feeds is no longer owned.
//!
//! The grace rules, in one place:
//! - once the token is cancelled no task starts new work: a partition takes no new batch, a
//!   relay worker reads no new rows, a retry's wait ends at once;
//! - the work in hand may finish within the grace period ([`finish_within`]): a handler's
//!   transaction commits and its position is committed, a relay batch is acknowledged and
//!   marked;
//! - what is still running when the grace period ends is aborted: a handler's transaction rolls
//!   back, its message stays uncommitted, a relay batch stays unmarked. Either way it is
//!   delivered or published again later: a stop loses nothing, and doubles nothing that
//!   finished in time.

use std::time::Duration;

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!(target: "inoutbox::shutdown", "shutdown signal received");
}

/// Sleeps for `wait`; `false` (at once) if `token` is or gets cancelled first.
pub(crate) async fn sleep_unless_cancelled(wait: Duration, token: &CancellationToken) -> bool {
    if token.is_cancelled() {
        return false;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => true,
        () = token.cancelled() => false,
    }
}

/// Lets `tasks` finish until `deadline` (the end of the grace period), handing each result to
/// `done`; then aborts the rest and waits for them to unwind. `true` when every task finished
/// in time.
pub(crate) async fn finish_within<T: 'static>(
    tasks: &mut JoinSet<T>,
    deadline: Instant,
    mut done: impl FnMut(Result<T, JoinError>),
) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(Some(result)) => done(result),
            Ok(None) => return true,
            Err(_) => {
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::task::JoinSet;
    use tokio::time::Instant;

    use super::finish_within;

    #[tokio::test]
    async fn work_in_hand_finishes_within_the_grace_period_and_the_rest_is_aborted() {
        let mut tasks = JoinSet::new();
        tasks.spawn(async { 1 });
        tasks.spawn(async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            2
        });
        let mut finished = Vec::new();
        let in_time = finish_within(
            &mut tasks,
            Instant::now() + Duration::from_secs(5),
            |done| finished.push(done.expect("finished")),
        )
        .await;
        assert!(in_time);
        finished.sort_unstable();
        assert_eq!(finished, [1, 2]);

        let stuck_ran_on = Arc::new(AtomicBool::new(false));
        let flag = stuck_ran_on.clone();
        tasks.spawn(async { 3 });
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            flag.store(true, Ordering::SeqCst);
            4
        });
        let mut finished = Vec::new();
        let started = Instant::now();
        let in_time = finish_within(
            &mut tasks,
            Instant::now() + Duration::from_millis(50),
            |done| finished.push(done.expect("finished")),
        )
        .await;
        assert!(!in_time, "a task was still running at the deadline");
        assert_eq!(
            finished,
            [3],
            "only the task that finished in time is handed over"
        );
        assert!(tasks.is_empty(), "the rest is aborted and reaped");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!stuck_ran_on.load(Ordering::SeqCst));
    }
}
