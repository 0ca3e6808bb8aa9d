//! How a consumer group's inbox behaves: acknowledgement strategy, event identity, retries, bad messages.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::message::Retention;
use crate::names;

/// When the broker is told a message is done (the offset committed), and whether the inbox
/// deduplicates. The four strategies measured in the seed article; [`AckStrategy::ExactlyOnceInbox`]
/// is the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AckStrategy {
    /// Commit the offset on receipt, before the handler runs. A failure loses the message: for
    /// telemetry that is cheaper to lose than to repeat.
    AtMostOnce,
    /// Run the handler in a transaction without an inbox row; commit the offset as `commit` says.
    AtLeastOnce {
        /// When the offset is committed.
        commit: CommitOn,
    },
    /// Insert the inbox row, run the handler and mark the row processed in one transaction;
    /// commit the offset only after that transaction commits. Duplicates are skipped.
    #[default]
    ExactlyOnceInbox,
}

/// When [`AckStrategy::AtLeastOnce`] commits the offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOn {
    /// After the transaction ends, whether it committed or rolled back: a failed message is
    /// acknowledged and its effect lost.
    OnPersist,
    /// Only after the transaction committed: a failed message is delivered again (and its effect
    /// applied again if it had succeeded before: no deduplication).
    OnSuccess,
}

impl AckStrategy {
    /// Shorthand for `AtLeastOnce { commit: CommitOn::OnPersist }`.
    pub const AT_LEAST_ONCE_ON_PERSIST: Self = Self::AtLeastOnce {
        commit: CommitOn::OnPersist,
    };
    /// Shorthand for `AtLeastOnce { commit: CommitOn::OnSuccess }`.
    pub const AT_LEAST_ONCE_ON_SUCCESS: Self = Self::AtLeastOnce {
        commit: CommitOn::OnSuccess,
    };

    /// Whether this strategy keeps inbox rows.
    pub fn uses_inbox(self) -> bool {
        matches!(self, Self::ExactlyOnceInbox)
    }

    /// Whether messages may share a transaction: with the inbox, and without it when a failed
    /// message is not acknowledged (`OnSuccess`). The two strategies that acknowledge failures
    /// handle one message per transaction, as the seed table measures them.
    pub(crate) fn batches(self) -> bool {
        matches!(
            self,
            Self::ExactlyOnceInbox
                | Self::AtLeastOnce {
                    commit: CommitOn::OnSuccess
                }
        )
    }

    /// Whether a failed message is acknowledged anyway (its effect lost by design).
    pub(crate) fn acknowledges_failures(self) -> bool {
        matches!(
            self,
            Self::AtMostOnce
                | Self::AtLeastOnce {
                    commit: CommitOn::OnPersist
                }
        )
    }
}

/// Where a message's event id comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventId {
    /// A header set by the producer: `ce_id` (CloudEvents) by default, `id` for Debezium.
    Header(String),
    /// `topic/partition/offset`: only correct while the topic is never rewritten or replayed
    /// under new offsets, so it must be chosen explicitly.
    BrokerCoordinates,
}

impl Default for EventId {
    fn default() -> Self {
        Self::Header(names::HEADER_ID.to_owned())
    }
}

/// Whether the inbox key includes the event's source: `(group, source, id)` instead of
/// `(group, id)`, for ids that are unique only per producer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// Ids are globally unique (UUIDs): the key is `(group, id)`.
    #[default]
    None,
    /// The source is read from this header (`ce_source` for CloudEvents); a message without it
    /// is a bad message.
    Header(String),
}

impl Source {
    /// The CloudEvents `ce_source` header.
    pub fn cloudevents() -> Self {
        Self::Header(names::HEADER_SOURCE.to_owned())
    }
}

/// How failed handler runs are retried in the process before the message is given up on.
///
/// ```
/// use std::time::Duration;
/// use inoutbox::inbox::{Backoff, RetryPolicy};
///
/// let retry = RetryPolicy::default()
///     .max_attempts(3)
///     .backoff(Backoff::new(Duration::from_millis(50), Duration::from_secs(5)));
/// assert_eq!(retry.max_attempts, 3);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
#[must_use]
pub struct RetryPolicy {
    /// Runs in total, including the first (at least 1; default 5).
    pub max_attempts: u32,
    /// The wait between runs (default 100 ms doubling to 30 s, 25 % jitter).
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)).jitter(0.25),
        }
    }
}

impl RetryPolicy {
    /// One run, no retry.
    pub fn no_retries() -> Self {
        Self::default().max_attempts(1)
    }

    /// Runs in total, including the first (at least 1).
    pub fn max_attempts(mut self, runs: u32) -> Self {
        self.max_attempts = runs;
        self
    }

    /// The wait between runs.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The wait after `attempt` failed runs (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.backoff.delay(attempt)
    }
}

/// The order in which messages of one partition are handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ordering {
    /// One message after the other, in offset order: what a handler that needs the order of
    /// messages with different keys keeps.
    Partition,
    /// Messages with the same key in offset order; different keys in concurrent transactions
    /// (see [`InboxConfig::key_lanes`]), so that the concurrency does not come from the number
    /// of partitions. Each transaction is a micro-batch of the messages waiting when a
    /// connection is free whose keys no transaction in flight holds: the slower the database
    /// answers, the more each carries. Keyless messages share one key, in offset order. The
    /// committed offset still never passes a message that is not resolved. The default.
    #[default]
    Key,
}

/// What happens to a message whose handler failed on every allowed attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnExhausted {
    /// Store it in the dead-letter table (raw bytes, headers, error, attempts) and commit its
    /// offset so the partition moves on.
    #[default]
    DeadLetter,
    /// Leave its offset uncommitted and go on with the next messages; the committed offset stays
    /// before it, so it is delivered again after a restart or rebalance.
    LeaveUncommitted,
}

/// What happens to a message whose event type no handler of the group handles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownEvent {
    /// Dead-letter it with the reason.
    #[default]
    DeadLetter,
    /// Acknowledge it without doing anything (topics shared by several services).
    Skip,
}

/// The behaviour of one consumer group's inbox; set through [`ConsumerBuilder`](crate::ConsumerBuilder).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct InboxConfig {
    /// Acknowledgement strategy.
    pub ack: AckStrategy,
    /// Where the event id comes from.
    pub event_id: EventId,
    /// Whether the key includes the source.
    pub source: Source,
    /// The header carrying the event type.
    pub event_type_header: String,
    /// Retries of failed handler runs.
    pub retry: RetryPolicy,
    /// What to do once retries are exhausted.
    pub on_exhausted: OnExhausted,
    /// What to do with event types no handler handles.
    pub unknown_event: UnknownEvent,
    /// Payloads larger than this are dead-lettered unread.
    pub max_payload_bytes: usize,
    /// Payloads longer than this are stored cut to it in a dead letter, with their size and
    /// SHA-256 (default 1 MiB).
    pub dead_letter_payload_bytes: usize,
    /// The wait while the database is unreachable.
    pub outage_backoff: Backoff,
    /// Messages of one partition handled in one transaction at most (default 500; 1 turns
    /// batching off).
    pub max_batch: usize,
    /// How long a batch waits for more messages before it closes (default 2 ms; with
    /// [`Ordering::Key`] a batch is cut when a transaction can start instead).
    pub max_wait: Duration,
    /// The order of handling inside a partition (default [`Ordering::Key`]: per key;
    /// [`Ordering::Partition`] keeps the whole partition's order).
    pub ordering: Ordering,
    /// The most transactions one partition runs at once with [`Ordering::Key`]; 0 (the
    /// default) sizes it from the store: as many as its pool has connections
    /// ([`InboxStore::parallel_transactions`](crate::store::InboxStore::parallel_transactions)),
    /// one on a store that writes one transaction at a time (SQLite).
    pub key_lanes: usize,
    /// The longest one transaction (a message or a batch, handlers included) may take before
    /// it is abandoned as an outage (its connection dropped, rolled back, retried after a
    /// backoff): a connection left half-open by the network would otherwise wait for ever
    /// (default 60 s).
    pub transaction_timeout: Duration,
    /// Runs of one message that may end in a timeout or a lost race while the database
    /// answers (a statement or lock timeout, a serialization failure or deadlock, or
    /// [`transaction_timeout`](Self::transaction_timeout) with the database answering right
    /// after), counted in the inbox's attempts like failed runs, before the message is given up
    /// on as [`on_exhausted`](Self::on_exhausted) says (default 10). An unreachable database is
    /// waited out and never counted.
    pub busy_attempts: u32,
    /// How long a stop waits for the two-phase workers' messages in hand before it aborts
    /// them (rolled back, their rows claimed again after the lease), default 30 s.
    pub worker_grace: Duration,
    /// How the consumer deletes processed inbox rows: by default those processed more than
    /// 7 days ago, 1000 rows per statement, every minute; `None` turns it off (then nothing
    /// deletes them: purge them yourself, e.g. with `inoutbox purge`). A deleted row no longer
    /// protects against a redelivery of its event: keep the window longer than any
    /// redelivery can be late.
    pub retention: Option<Retention>,
    /// How long a business key (`idempotency_key` / `dedup_by`) keeps refusing other events
    /// with the same key: `None` (the default) for as long as the inbox row that holds it is
    /// kept (the retention window).
    pub business_key_window: Option<Duration>,
    /// Workers per process that run two-phase handlers (`mode = "two_phase"`), default 4.
    pub two_phase_workers: usize,
    /// How long a worker's claim on a received row holds unless renewed (renewed every third
    /// of it while the handler runs; a crashed worker's row is claimed again after it), default
    /// 30 s.
    pub lease: Duration,
    /// How often idle workers look for received rows that other processes stored (rows this
    /// process receives wake them at once), default 500 ms.
    pub two_phase_poll: Duration,
    /// How many times a handler may defer one message
    /// ([`HandlerError::defer`](crate::HandlerError::defer)); deferred once more, the message
    /// is dead-lettered with the reason (default 20).
    pub max_deferrals: u32,
    /// How often the consumer's deferred worker looks for deferred messages that are due
    /// (default 1 s): a message runs at most this long after its due time while the worker is
    /// idle.
    pub deferred_poll: Duration,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            ack: AckStrategy::default(),
            event_id: EventId::default(),
            source: Source::default(),
            event_type_header: names::HEADER_TYPE.to_owned(),
            retry: RetryPolicy::default(),
            on_exhausted: OnExhausted::default(),
            unknown_event: UnknownEvent::default(),
            max_payload_bytes: 1024 * 1024,
            dead_letter_payload_bytes: 1024 * 1024,
            outage_backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            max_batch: 500,
            max_wait: Duration::from_millis(2),
            ordering: Ordering::Key,
            key_lanes: 0,
            transaction_timeout: Duration::from_secs(60),
            busy_attempts: 10,
            worker_grace: Duration::from_secs(30),
            retention: Some(Retention::default()),
            business_key_window: None,
            two_phase_workers: 4,
            lease: Duration::from_secs(30),
            two_phase_poll: Duration::from_millis(500),
            max_deferrals: 20,
            deferred_poll: Duration::from_secs(1),
        }
    }
}

impl InboxConfig {
    /// The header the event id is read from (for logs; `ce_id` with broker coordinates).
    pub(crate) fn event_id_header(&self) -> &str {
        match &self.event_id {
            EventId::Header(name) => name,
            EventId::BrokerCoordinates => names::HEADER_ID,
        }
    }
}

/// How long processed inbox rows are kept by default: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The setters of an [`InboxConfig`], written once: expanded in `impl InboxConfig` and in the
/// builders that hold one (`inbox_setters!(config)` sets `self.config.<field>`).
macro_rules! inbox_setters {
    ($($field:ident)?) => {
        /// The acknowledgement strategy (default
        /// [`AckStrategy::ExactlyOnceInbox`](crate::engine::AckStrategy::ExactlyOnceInbox)).
        pub fn ack(mut self, ack: $crate::engine::AckStrategy) -> Self {
            self$(.$field)?.ack = ack;
            self
        }

        /// Where event ids come from (default: the `ce_id` header).
        pub fn event_id(mut self, event_id: $crate::engine::EventId) -> Self {
            self$(.$field)?.event_id = event_id;
            self
        }

        /// Keys the inbox by `(source, id)` (default: by id alone).
        pub fn source(mut self, source: $crate::engine::Source) -> Self {
            self$(.$field)?.source = source;
            self
        }

        /// The header carrying the event type (default `ce_type`).
        pub fn event_type_header(mut self, name: impl Into<String>) -> Self {
            self$(.$field)?.event_type_header = name.into();
            self
        }

        /// Retries of failed handler runs (default: 5 runs, 100 ms doubling to 30 s).
        pub fn retry(mut self, retry: $crate::engine::RetryPolicy) -> Self {
            self$(.$field)?.retry = retry;
            self
        }

        /// What happens once retries are exhausted (default: dead letter).
        pub fn on_exhausted(mut self, on_exhausted: $crate::engine::OnExhausted) -> Self {
            self$(.$field)?.on_exhausted = on_exhausted;
            self
        }

        /// What happens to event types the group has no handler for (default: dead letter;
        /// `Skip` for a topic shared with other consumers).
        pub fn unknown_event(mut self, unknown: $crate::engine::UnknownEvent) -> Self {
            self$(.$field)?.unknown_event = unknown;
            self
        }

        /// Payloads over this size are dead-lettered unread (default 1 MiB).
        pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
            self$(.$field)?.max_payload_bytes = bytes;
            self
        }

        /// Messages of one partition handled in one transaction at most (default 500; 1 turns
        /// batching off).
        pub fn max_batch(mut self, messages: usize) -> Self {
            self$(.$field)?.max_batch = messages.max(1);
            self
        }

        /// How long a batch waits for more messages before it closes (default 2 ms; with
    /// [`Ordering::Key`] a batch is cut when a transaction can start instead).
        pub fn max_wait(mut self, wait: std::time::Duration) -> Self {
            self$(.$field)?.max_wait = wait;
            self
        }

        /// The order of handling inside a partition (default
        /// [`Ordering::Key`](crate::engine::Ordering::Key): per key, different keys in
        /// concurrent transactions; [`Ordering::Partition`](crate::engine::Ordering::Partition):
        /// the whole partition's order, one batch at a time).
        pub fn ordering(mut self, ordering: $crate::engine::Ordering) -> Self {
            self$(.$field)?.ordering = ordering;
            self
        }

        /// The most transactions one partition runs at once with
        /// [`Ordering::Key`](crate::engine::Ordering::Key) (default 0: as many as the store's
        /// pool has connections; the group's partitions share those connections besides).
        pub fn key_lanes(mut self, lanes: usize) -> Self {
            self$(.$field)?.key_lanes = lanes;
            self
        }

        /// The longest one transaction may take before it is abandoned as an outage (default
        /// 60 s).
        pub fn transaction_timeout(mut self, limit: std::time::Duration) -> Self {
            self$(.$field)?.transaction_timeout = limit;
            self
        }

        /// Runs of one message that may time out or lose a race while the database answers,
        /// counted, before it is given up on (default 10, at least 1).
        pub fn busy_attempts(mut self, runs: u32) -> Self {
            self$(.$field)?.busy_attempts = runs.max(1);
            self
        }

        /// How long a stop waits for the two-phase workers' messages in hand (default 30 s).
        pub fn worker_grace(mut self, grace: std::time::Duration) -> Self {
            self$(.$field)?.worker_grace = grace;
            self
        }

        /// How processed inbox rows are purged (default: those processed over 7 days ago,
        /// 1000 rows per statement, every minute); `None` turns the purge off.
        pub fn retention(mut self, retention: Option<$crate::message::Retention>) -> Self {
            self$(.$field)?.retention = retention;
            self
        }

        /// How long a business key refuses other events with the same key (default: as long
        /// as its inbox row is kept).
        pub fn business_key_window(mut self, window: std::time::Duration) -> Self {
            self$(.$field)?.business_key_window = Some(window);
            self
        }

        /// Workers per process running two-phase handlers (default 4). Any number of
        /// processes may run them.
        pub fn two_phase_workers(mut self, workers: usize) -> Self {
            self$(.$field)?.two_phase_workers = workers.max(1);
            self
        }

        /// How long a worker's claim on a received row holds unless renewed (default 30 s,
        /// at least 300 ms).
        pub fn lease(mut self, lease: std::time::Duration) -> Self {
            self$(.$field)?.lease = lease.max(std::time::Duration::from_millis(300));
            self
        }

        /// How often idle workers look for rows other processes received (default 500 ms).
        pub fn two_phase_poll(mut self, every: std::time::Duration) -> Self {
            self$(.$field)?.two_phase_poll = every;
            self
        }

        /// How many times a handler may defer one message before it is dead-lettered
        /// (default 20; 0 dead-letters the first deferral).
        pub fn max_deferrals(mut self, deferrals: u32) -> Self {
            self$(.$field)?.max_deferrals = deferrals;
            self
        }

        /// How often the deferred worker looks for due messages (default 1 s, at least
        /// 10 ms).
        pub fn deferred_poll(mut self, every: std::time::Duration) -> Self {
            self$(.$field)?.deferred_poll = every.max(std::time::Duration::from_millis(10));
            self
        }
    };
}
pub(crate) use inbox_setters;

impl InboxConfig {
    inbox_setters!();
}
