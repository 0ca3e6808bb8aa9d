//! The consumer service: an inbox on a store, fed by a transport, until shutdown.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::shutdown::CancellationToken;

use crate::effects::{self, Effect, Executors};
use crate::engine::{
    AckStrategy, EventId, Inbox, InboxConfig, OnExhausted, Ordering, Report, RetryPolicy,
    SetupError, Source, UnknownEvent,
};
use crate::kafka::{member, KafkaConfig, KafkaTransportError};
use crate::outbox::Retention;
use crate::store::InboxStore;
use sampler::{sample_inbox, Sampling};
use crate::telemetry::Health;

pub(crate) mod sampler;

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
pub struct Consumer<S> {
    inbox: Arc<Inbox<S>>,
    kafka: KafkaConfig,
    reports: Option<mpsc::UnboundedSender<Report>>,
    sampling: Sampling,
    effects: Executors,
}

/// Builds a [`Consumer`]; every setting has a safe default.
#[must_use]
pub struct ConsumerBuilder<S> {
    group: String,
    store: S,
    kafka: KafkaConfig,
    config: InboxConfig,
    reports: Option<mpsc::UnboundedSender<Report>>,
    sampling: Sampling,
    effects: Executors,
}

impl<S: InboxStore> Consumer<S> {
    /// A consumer for `group` (the `group = "..."` of its handlers).
    pub fn builder(group: impl Into<String>, store: S, kafka: KafkaConfig) -> ConsumerBuilder<S> {
        ConsumerBuilder {
            group: group.into(),
            store,
            kafka,
            config: InboxConfig::default(),
            reports: None,
            sampling: Sampling::default(),
            effects: Executors::default(),
        }
    }

    /// The inbox engine.
    pub fn inbox(&self) -> &Inbox<S> {
        &self.inbox
    }

    /// The consumer's health (see [`Health`]): live while `run` runs, joined while it holds
    /// an assignment of the group, the database reachable as the last transaction and the last
    /// gauge sample found it, and the time the last batch was resolved.
    pub fn health(&self) -> Health {
        self.inbox.health()
    }

    /// Consumes until `shutdown` completes; then finishes the messages in hand, commits and
    /// leaves the group.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), KafkaTransportError> {
        let rx = CancellationToken::new();
        let health = self.inbox.health();
        health.set_live(true);
        let sampler = tokio::spawn(sample_inbox(self.inbox.clone(), self.sampling, rx.clone()));
        let purge = tokio::spawn(retention(self.inbox.clone(), rx.clone()));
        // Two-phase workers (none when the group has no two-phase handler) run beside the
        // member and stop with it, each after the message in hand.
        let workers = tokio::spawn(self.inbox.clone().run_two_phase(rx.clone()));
        let effects = (!self.effects.by_kind.is_empty()).then(|| {
            let (inbox, executors, rx) = (self.inbox.clone(), self.effects, rx.clone());
            tokio::spawn(async move {
                effects::drain(inbox.store(), &executors, &inbox.committed, rx).await
            })
        });
        let run = member::run(self.inbox, self.kafka, rx.clone(), self.reports, self.sampling);
        tokio::pin!(run);
        let result = tokio::select! {
            result = &mut run => result,
            () = shutdown => {
                rx.cancel();
                run.await
            }
        };
        rx.cancel();
        let _ = workers.await;
        if let Some(effects) = effects {
            let _ = effects.await;
        }
        sampler.abort();
        health.set_live(false);
        health.set_joined(false);
        purge.abort();
        result
    }

    /// Consumes until SIGINT or SIGTERM.
    pub async fn run_until_signal(self) -> Result<(), KafkaTransportError> {
        self.run(shutdown_signal()).await
    }
}

impl<S: InboxStore> ConsumerBuilder<S> {
    /// The acknowledgement strategy (default [`AckStrategy::ExactlyOnceInbox`]).
    pub fn ack(mut self, ack: AckStrategy) -> Self {
        self.config.ack = ack;
        self
    }

    /// Where event ids come from (default: the `ce_id` header).
    pub fn event_id(mut self, event_id: EventId) -> Self {
        self.config.event_id = event_id;
        self
    }

    /// Keys the inbox by `(source, id)` (default: by id alone).
    pub fn source(mut self, source: Source) -> Self {
        self.config.source = source;
        self
    }

    /// The header carrying the event type (default `ce_type`).
    pub fn event_type_header(mut self, name: impl Into<String>) -> Self {
        self.config.event_type_header = name.into();
        self
    }

    /// Retries of failed handler runs (default: 5 runs, 100 ms doubling to 30 s).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.config.retry = retry;
        self
    }

    /// What happens once retries are exhausted (default: dead letter).
    pub fn on_exhausted(mut self, on_exhausted: OnExhausted) -> Self {
        self.config.on_exhausted = on_exhausted;
        self
    }

    /// What happens to event types without a handler (default: dead letter).
    pub fn unknown_event(mut self, unknown: UnknownEvent) -> Self {
        self.config.unknown_event = unknown;
        self
    }

    /// Payloads over this size are dead-lettered unread (default 1 MiB).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.config.max_payload_bytes = bytes;
        self
    }

    /// Messages of one partition handled in one transaction at most (default 500; 1 turns
    /// batching off).
    pub fn max_batch(mut self, messages: usize) -> Self {
        self.config.max_batch = messages.max(1);
        self
    }

    /// How long a batch waits for more messages before it closes (default 2 ms).
    pub fn max_wait(mut self, wait: std::time::Duration) -> Self {
        self.config.max_wait = wait;
        self
    }

    /// The order of handling inside a partition (default [`Ordering::Partition`]).
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.config.ordering = ordering;
        self
    }

    /// Concurrent lanes per partition with [`Ordering::Key`] (default 8).
    pub fn key_lanes(mut self, lanes: usize) -> Self {
        self.config.key_lanes = lanes.max(1);
        self
    }

    /// The longest one transaction may take before it is abandoned as an outage (default 60 s).
    pub fn transaction_timeout(mut self, limit: std::time::Duration) -> Self {
        self.config.transaction_timeout = limit;
        self
    }

    /// How processed inbox rows are purged (default: those processed over 7 days ago, 1000
    /// rows per statement, every minute); `None` turns the purge off.
    pub fn retention(mut self, retention: Option<Retention>) -> Self {
        self.config.retention = retention;
        self
    }

    /// How long a business key refuses other events with the same key (default: as long as
    /// its inbox row is kept).
    pub fn business_key_window(mut self, window: std::time::Duration) -> Self {
        self.config.business_key_window = Some(window);
        self
    }

    /// Workers per process running two-phase handlers (default 4; see
    /// [`InboxConfig::two_phase_workers`]). Any number of processes may run them.
    pub fn two_phase_workers(mut self, workers: usize) -> Self {
        self.config.two_phase_workers = workers.max(1);
        self
    }

    /// How long a worker's claim on a received row holds unless renewed (default 30 s; see
    /// [`InboxConfig::lease`]).
    pub fn lease(mut self, lease: std::time::Duration) -> Self {
        self.config.lease = lease.max(std::time::Duration::from_millis(300));
        self
    }

    /// How often idle workers look for rows other processes received (default 500 ms).
    pub fn two_phase_poll(mut self, every: std::time::Duration) -> Self {
        self.config.two_phase_poll = every;
        self
    }

    /// Registers the executor of effects of `kind`, scheduled by handlers with
    /// [`effects::after_commit`](crate::effects::after_commit); the consumer then drains the
    /// effects table after each commit and at start-up (see [`crate::effects`]). The executor
    /// must be idempotent on [`Effect::idempotency_key`]: an effect runs at least once.
    pub fn effect<F, Fut>(mut self, kind: impl Into<String>, executor: F) -> Self
    where
        F: Fn(Effect) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), crate::HandlerError>> + Send + 'static,
    {
        let executor: effects::Executor =
            Arc::new(move |effect: Effect| Box::pin(executor(effect)) as effects::EffectFuture);
        self.effects.by_kind.insert(kind.into(), executor);
        self
    }

    /// Replaces the whole inbox configuration.
    pub fn config(mut self, config: InboxConfig) -> Self {
        self.config = config;
        self
    }

    /// How often the consumer samples its gauges (dead letters, stuck rows, lag per partition)
    /// and probes its database (default 15 s; see [`crate::telemetry`]).
    pub fn sample_interval(mut self, interval: std::time::Duration) -> Self {
        self.sampling.interval = interval;
        self
    }

    /// After how long a received inbox row still not processed counts as stuck (default
    /// 5 minutes).
    pub fn stuck_after(mut self, after: std::time::Duration) -> Self {
        self.sampling.stuck_after = after;
        self
    }

    /// Sends a [`Report`] for every message handled (for tests and metrics).
    pub fn reports(mut self, sender: mpsc::UnboundedSender<Report>) -> Self {
        self.reports = Some(sender);
        self
    }

    /// Builds the dispatch table of the group from every handler linked into the binary; fails
    /// on two handlers for one event type, or none for the group.
    pub fn build(self) -> Result<Consumer<S>, SetupError> {
        let inbox = Inbox::new(self.store, &self.group, self.config)?;
        Ok(Consumer {
            inbox: Arc::new(inbox),
            kafka: self.kafka,
            reports: self.reports,
            sampling: self.sampling,
            effects: self.effects,
        })
    }
}

/// Deletes inbox rows processed longer ago than the retention window, every
/// `retention.interval`, until `stop`: in statements of `retention.batch_size` rows, each its
/// own short transaction, so no lock is held for long. Every group's rows in the inbox table
/// go, whichever consumer purges; several consumers purging at once only share the work.
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
        tokio::select! {
            () = tokio::time::sleep(retention.interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

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
    tracing::info!(target: "inoutbox::consumer", "shutdown signal received");
}
