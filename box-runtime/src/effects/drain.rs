//! Running effects: [`Effect`] as an executor receives it, the executors of a consumer, and the
//! drain that claims committed effects, runs them and marks them done or failed.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::handler::HandlerError;
use crate::shutdown::{sleep_unless_cancelled, CancellationToken};
use crate::store::{InboxStore, StoredEffect};

/// One effect, as its executor receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// What to run (the name given to [`after_commit`](super::after_commit)).
    pub kind: String,
    /// The key the receiving side deduplicates on: the same for every run of this effect.
    pub idempotency_key: String,
    /// The consumer group of the handler that scheduled it.
    pub group: String,
    /// The event id of the message whose handler scheduled it.
    pub event_id: String,
    /// The payload, as JSON.
    pub payload: Vec<u8>,
    /// Which run this is: 1 for the first.
    pub attempt: u32,
}

impl Effect {
    /// The payload, decoded.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.payload).map_err(HandlerError::permanent)
    }
}

/// The future an effect executor returns.
pub type EffectFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// An effect executor, erased.
pub(crate) type Executor = Arc<dyn Fn(Effect) -> EffectFuture + Send + Sync>;

/// The executors of a consumer, by kind.
#[derive(Clone, Default)]
pub(crate) struct Executors {
    pub(crate) by_kind: HashMap<String, Executor>,
}

impl std::fmt::Debug for Executors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_kind.keys()).finish()
    }
}

/// How long a drain's claim on an effect holds (it is retried by another process after it).
const EFFECT_LEASE: Duration = Duration::from_secs(30);
/// How often the drain looks for effects other processes left.
const EFFECT_POLL: Duration = Duration::from_secs(1);
/// Effects claimed at once.
const EFFECT_BATCH: u32 = 32;

/// The wait before an effect that failed `attempts` times runs again: 1 s doubling to 5 min.
fn retry_in(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(8)).min(Duration::from_secs(300))
}

/// Drains the effects of `group` until `shutdown`: claims its pending effects (leased,
/// skipping those others hold), runs their executors, marks them done or failed. Starts with a
/// drain, so rows a dead process left run (once their lease, if any, expired). An executor
/// that fails, panics or overruns its lease is a failed run: counted on the row and retried
/// after a backoff, while the drain goes on with the other effects. Once `shutdown` is
/// cancelled no further effect starts; the claimed ones left run again after their lease.
pub(crate) async fn drain<S: InboxStore>(
    store: &S,
    group: &str,
    executors: &Executors,
    wake: &Notify,
    shutdown: CancellationToken,
) {
    let owner = format!("effects-{}-{:x}", std::process::id(), rand_suffix());
    while !shutdown.is_cancelled() {
        let woken = wake.notified();
        let claimed = match store
            .claim_effects(group, &owner, EFFECT_LEASE, EFFECT_BATCH)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(target: "inoutbox::effects", group, error = e.to_string().as_str(), "claiming effects failed");
                Vec::new()
            }
        };
        if claimed.is_empty() {
            tokio::select! {
                () = woken => {},
                _ = sleep_unless_cancelled(EFFECT_POLL, &shutdown) => {},
            }
            continue;
        }
        for effect in claimed {
            if shutdown.is_cancelled() {
                break;
            }
            run_one(store, executors, &owner, effect).await;
        }
    }
}

async fn run_one<S: InboxStore>(store: &S, executors: &Executors, owner: &str, row: StoredEffect) {
    let (id, attempts) = (row.id, row.attempts);
    let result = match executors.by_kind.get(&row.kind) {
        None => Err(format!("no executor for effect kind `{}`", row.kind)),
        Some(executor) => {
            let effect = Effect {
                kind: row.kind,
                idempotency_key: row.idempotency_key,
                group: row.group,
                event_id: row.event_id,
                payload: row.payload,
                attempt: attempts + 1,
            };
            execute(executor, effect, EFFECT_LEASE).await
        }
    };
    if let Err(error) = &result {
        tracing::warn!(target: "inoutbox::effects",
            effect = id,
            attempt = attempts + 1,
            error = error.as_str(),
            retry_in = ?retry_in(attempts),
            "effect failed, retrying later"
        );
    }
    let error = result.err();
    if let Err(e) = store
        .settle_effect(id, owner, error.as_deref(), retry_in(attempts))
        .await
    {
        // Its lease expires and it runs again: at least once, not lost.
        tracing::warn!(target: "inoutbox::effects",
            effect = id,
            error = e.to_string().as_str(),
            "marking an effect failed"
        );
    }
}

/// Runs `executor` on `effect` for at most `limit`: its error, its panic (in making the future
/// or in running it) or its overrun is an `Err` saying which, never a panic of the caller.
async fn execute(executor: &Executor, effect: Effect, limit: Duration) -> Result<(), String> {
    let mut future = match catch_unwind(AssertUnwindSafe(|| executor(effect))) {
        Ok(future) => future,
        Err(panic) => return Err(panicked(&*panic)),
    };
    let caught = std::future::poll_fn(|cx| {
        match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panicked(&*panic))),
        }
    });
    match tokio::time::timeout(limit, caught).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(panic)) => Err(panic),
        Err(_) => Err(format!("the effect took longer than {limit:?}")),
    }
}

/// What a failed run records for a panic: its message, when it has one.
fn panicked(panic: &(dyn Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    format!("the executor panicked: {message}")
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{execute, Effect, EffectFuture, Executor};
    use crate::handler::HandlerError;

    fn effect() -> Effect {
        Effect {
            kind: "mail".to_owned(),
            idempotency_key: "k".to_owned(),
            group: "g".to_owned(),
            event_id: "e".to_owned(),
            payload: b"{}".to_vec(),
            attempt: 1,
        }
    }

    #[tokio::test]
    async fn a_panicking_executor_is_a_failed_run_not_a_dead_drain() {
        let in_future: Executor = Arc::new(|_| -> EffectFuture {
            Box::pin(async {
                tokio::task::yield_now().await;
                panic!("smtp exploded")
            })
        });
        let before_future: Executor = Arc::new(|_| -> EffectFuture { panic!("no future") });
        let fails: Executor = Arc::new(|_| -> EffectFuture {
            Box::pin(async { Err(HandlerError::transient("down")) })
        });
        let hangs: Executor = Arc::new(|_| -> EffectFuture { Box::pin(std::future::pending()) });
        let limit = Duration::from_secs(30);
        let error = execute(&in_future, effect(), limit)
            .await
            .expect_err("failed");
        assert_eq!(error, "the executor panicked: smtp exploded");
        let error = execute(&before_future, effect(), limit)
            .await
            .expect_err("failed");
        assert_eq!(error, "the executor panicked: no future");
        let error = execute(&fails, effect(), limit).await.expect_err("failed");
        assert!(error.contains("down"), "{error}");
        let error = execute(&hangs, effect(), Duration::from_millis(10))
            .await
            .expect_err("failed");
        assert!(error.contains("took longer"), "{error}");
    }
}
