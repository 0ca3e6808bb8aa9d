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

use metrics::SharedString;
use serde::de::DeserializeOwned;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::handler::HandlerError;
use crate::shutdown::{sleep_unless_cancelled, CancellationToken};
use crate::store::{InboxStore, StoredEffect};
use crate::telemetry::metric::{self as m, LABEL_GROUP};

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
    /// The effect as the drain hands it to an executor on its first run: `kind` scheduled by
    /// the handler of group `group` for the event `event_id` with `payload` (serialized as
    /// JSON), with the idempotency key [`after_commit`](super::after_commit) gives it (see
    /// [`idempotency_key`](super::idempotency_key); the event source is `""`). For testing
    /// an executor on its own; `TestInbox::run_effects` (feature `testing`) runs the effects a
    /// delivery scheduled.
    ///
    /// # Errors
    ///
    /// When `payload` does not serialize to JSON.
    pub fn new<T: serde::Serialize + ?Sized>(
        group: &str,
        event_id: &str,
        kind: &str,
        payload: &T,
    ) -> Result<Self, HandlerError> {
        Ok(Self {
            kind: kind.to_owned(),
            idempotency_key: super::idempotency_key(group, "", event_id, kind),
            group: group.to_owned(),
            event_id: event_id.to_owned(),
            payload: serde_json::to_vec(payload).map_err(HandlerError::permanent)?,
            attempt: 1,
        })
    }

    /// The same effect on run `attempt` (1 for the first), to test what an executor does on
    /// a retry.
    #[must_use]
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// The payload, decoded.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.payload).map_err(HandlerError::permanent)
    }
}

/// The future an effect executor returns.
pub type EffectFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// An effect executor, erased.
pub(crate) type Executor = Arc<dyn Fn(Effect) -> EffectFuture + Send + Sync>;

/// Effects a consumer runs at once unless told otherwise
/// ([`ConsumerBuilder::effect_concurrency`](crate::ConsumerBuilder::effect_concurrency)).
///
/// Effects are calls to other services: they wait, they do not compute, and no transaction is
/// held open while they run (each is claimed and then marked done in statements of their own),
/// so several at once cost a few tasks, not database connections. Eight lets a burst of slow
/// calls (a 3 s review each) go through eight times faster than one at a time, while a backlog
/// after an outage still reaches the receiving service a few calls at a time, not hundreds.
pub const DEFAULT_EFFECT_CONCURRENCY: usize = 8;

/// The executors of a consumer, by kind, and how many effects it runs at once.
#[derive(Clone)]
pub(crate) struct Executors {
    pub(crate) by_kind: HashMap<String, Executor>,
    pub(crate) concurrency: usize,
}

impl Default for Executors {
    fn default() -> Self {
        Self {
            by_kind: HashMap::new(),
            concurrency: DEFAULT_EFFECT_CONCURRENCY,
        }
    }
}

impl Executors {
    /// Registers `executor` for effects of `kind` (replacing an earlier one of that kind).
    pub(crate) fn insert<F, Fut>(&mut self, kind: impl Into<String>, executor: F)
    where
        F: Fn(Effect) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let executor: Executor =
            Arc::new(move |effect: Effect| Box::pin(executor(effect)) as EffectFuture);
        self.by_kind.insert(kind.into(), executor);
    }
}

impl std::fmt::Debug for Executors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executors")
            .field("kinds", &self.by_kind.keys().collect::<Vec<_>>())
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

/// What the drain runs on, shared with the task of each effect in flight: the store, the
/// group and the signal of its commits.
pub(crate) trait DrainSource: Send + Sync + 'static {
    /// The store.
    type Store: InboxStore;
    /// The store the effects are in.
    fn store(&self) -> &Self::Store;
    /// The consumer group whose effects are drained.
    fn group(&self) -> &str;
    /// Notified when a handler of the group committed (it may have scheduled effects).
    fn committed(&self) -> &Notify;
}

/// How long a drain's claim on an effect holds (it is retried by another process after it).
pub(crate) const EFFECT_LEASE: Duration = Duration::from_secs(30);
/// How often the drain looks for effects other processes left.
const EFFECT_POLL: Duration = Duration::from_secs(1);
/// Effects claimed at once, at most.
pub(crate) const EFFECT_BATCH: u32 = 32;

/// The wait before an effect that failed `attempts` times runs again: 1 s doubling to 5 min.
fn retry_in(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(8)).min(Duration::from_secs(300))
}

/// A claimant name for effects, unique to this drain.
pub(crate) fn owner_name(prefix: &str) -> String {
    format!("{prefix}-{}-{:x}", std::process::id(), rand_suffix())
}

/// Drains the effects of the group until `shutdown`: claims its pending effects (leased,
/// skipping those others hold) as slots free up, runs their executors, up to
/// `executors.concurrency` at once, each in a task of its own, and marks them done or failed.
/// Claims only as many as it has free slots, so no claimed effect waits for a slot while its
/// lease runs out. Starts with a drain, so rows a dead process left run (once their lease, if
/// any, expired). An executor that fails, panics or overruns its lease is a failed run: counted
/// on the row and retried after a backoff, while the drain goes on with the other effects. Once
/// `shutdown` is cancelled no further effect starts and the drain waits for those in flight
/// (the consumer bounds that wait by its grace period; an abort stops them, and the claimed
/// ones left run again after their lease).
pub(crate) async fn drain<D: DrainSource>(
    source: Arc<D>,
    executors: Executors,
    shutdown: CancellationToken,
) {
    let owner: Arc<str> = owner_name("effects").into();
    let slots = executors.concurrency.max(1);
    let executors = Arc::new(executors);
    let mut running = JoinSet::new();
    while !shutdown.is_cancelled() {
        let woken = source.committed().notified();
        let free = slots.saturating_sub(running.len());
        let mut more = false;
        if free > 0 {
            let want = free.min(EFFECT_BATCH as usize);
            let claimed = claim(&*source, &owner, want as u32).await;
            more = claimed.len() == want;
            for row in claimed {
                let (source, executors, owner) = (source.clone(), executors.clone(), owner.clone());
                running.spawn(async move {
                    let _ = run_one(source.store(), &executors, &owner, row).await;
                });
            }
        }
        if more && running.len() < slots {
            continue;
        }
        wait_for_work(&mut running, slots, woken, &shutdown).await;
    }
    while let Some(ended) = running.join_next().await {
        reraise(ended);
    }
}

/// Claims up to `limit` effects of the source's group; none when the store fails (logged).
async fn claim<D: DrainSource>(source: &D, owner: &str, limit: u32) -> Vec<StoredEffect> {
    let group = source.group();
    match source
        .store()
        .claim_effects(group, owner, EFFECT_LEASE, limit)
        .await
    {
        Ok(claimed) => claimed,
        Err(e) => {
            tracing::warn!(target: "inoutbox::effects", group, error = e.to_string().as_str(), "claiming effects failed");
            Vec::new()
        }
    }
}

/// Waits until there may be something to do: an effect in flight ended (a slot is free), or,
/// while a slot is free, a commit, the poll interval or the shutdown.
async fn wait_for_work(
    running: &mut JoinSet<()>,
    slots: usize,
    woken: Notified<'_>,
    shutdown: &CancellationToken,
) {
    if running.is_empty() {
        tokio::select! {
            () = woken => {},
            _ = sleep_unless_cancelled(EFFECT_POLL, shutdown) => {},
        }
    } else if running.len() >= slots {
        tokio::select! {
            Some(ended) = running.join_next() => reraise(ended),
            () = shutdown.cancelled() => {},
        }
    } else {
        tokio::select! {
            Some(ended) = running.join_next() => reraise(ended),
            () = woken => {},
            _ = sleep_unless_cancelled(EFFECT_POLL, shutdown) => {},
        }
    }
}

/// A panic of an effect's task outside its executor (whose panics are failed runs) is a panic
/// of the drain, which the consumer reports; an abort is the end of the drain's own stop.
fn reraise(ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Runs one claimed effect (its executor, or a failure when it has none) and marks it done or
/// failed; returns the effect as the executor received it and the outcome.
pub(crate) async fn run_one<S: InboxStore>(
    store: &S,
    executors: &Executors,
    owner: &str,
    row: StoredEffect,
) -> (Effect, Result<(), String>) {
    let (id, attempts) = (row.id, row.attempts);
    let effect = Effect {
        kind: row.kind,
        idempotency_key: row.idempotency_key,
        group: row.group,
        event_id: row.event_id,
        payload: row.payload,
        attempt: attempts + 1,
    };
    let group = SharedString::from(effect.group.clone());
    let started = Instant::now();
    let result = match executors.by_kind.get(&effect.kind) {
        None => Err(format!("no executor for effect kind `{}`", effect.kind)),
        Some(executor) => execute(executor, effect.clone(), EFFECT_LEASE).await,
    };
    metrics::counter!(m::EFFECTS_ATTEMPTS, LABEL_GROUP => group.clone()).increment(1);
    metrics::histogram!(m::EFFECTS_RUN_DURATION, LABEL_GROUP => group.clone())
        .record(started.elapsed().as_secs_f64());
    if let Err(error) = &result {
        metrics::counter!(m::EFFECTS_RETRIES, LABEL_GROUP => group).increment(1);
        tracing::warn!(target: "inoutbox::effects",
            effect = id,
            attempt = attempts + 1,
            error = error.as_str(),
            retry_in = ?retry_in(attempts),
            "effect failed, retrying later"
        );
    }
    if let Err(e) = store
        .settle_effect(
            id,
            owner,
            result.as_ref().err().map(String::as_str),
            retry_in(attempts),
        )
        .await
    {
        // Its lease expires and it runs again: at least once, not lost.
        tracing::warn!(target: "inoutbox::effects",
            effect = id,
            error = e.to_string().as_str(),
            "marking an effect failed"
        );
    }
    (effect, result)
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
