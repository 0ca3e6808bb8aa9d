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

/// Lets `tasks` finish until `grace` has passed, handing each result to `done`; then aborts
/// the rest and waits for them to unwind. `true` when every task finished in time.
pub(crate) async fn finish_within<T: 'static>(
    tasks: &mut JoinSet<T>,
    grace: Duration,
    mut done: impl FnMut(Result<T, JoinError>),
) -> bool {
    let deadline = tokio::time::Instant::now() + grace;
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
