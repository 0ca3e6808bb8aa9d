//! The consumer side of the contract.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::message::Delivery;
use crate::sealed::Sealed;
use crate::shutdown::CancellationToken;
use crate::telemetry::Health;

/// A broker's consumer side: a member of a consumer group that feeds the engine the messages
/// of the partitions (or streams) it owns.
///
/// `Consumer::builder(group, store, transport)` takes any `Transport`; Kafka's is
/// [`KafkaConfig`](crate::kafka::KafkaConfig).
pub trait Transport: Send + 'static {
    /// Why the transport stopped (it could not join, a partition run panicked, ...).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Joins the group `partitions.group()` and runs until `shutdown` is cancelled. For every
    /// partition it is assigned, it calls [`Partitions::start`] with that partition's messages in
    /// order, a [`PartitionLink`], and a child of `shutdown` that it cancels when the partition
    /// is revoked. On shutdown it waits for the runs it started (at most its grace period),
    /// commits what they resolved, and leaves the group. It sets
    /// [`Health::set_joined`] while it holds an assignment.
    fn run<P: Partitions>(
        self,
        partitions: P,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Its grace period: how long a graceful stop lets the work in hand finish, counted from
    /// the cancellation of `shutdown`. The consumer gives the tasks it runs beside the
    /// transport (the effects drain) the same. Default 30 s.
    fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(30)
    }
}

/// What the engine gives a transport: the group it serves, and the start of one partition's
/// run. Implemented by the engine only (sealed); a transport calls it. To test a transport,
/// run a real [`Consumer`](crate::Consumer) on it (an in-memory SQLite store from
/// `inoutbox::testing::sqlite_memory` needs no service).
pub trait Partitions: Sealed + Clone + Send + Sync + 'static {
    /// The consumer group (the `group = "..."` of the handlers).
    fn group(&self) -> &str;

    /// The consumer's health: a transport sets whether it is joined.
    fn health(&self) -> Health;

    /// How often the consumer samples its gauges; a transport samples its own (lag) as often.
    fn sample_interval(&self) -> Duration;

    /// Starts the run of one owned partition: its messages arrive on `deliveries` in order;
    /// it commits through `link`; it ends when `deliveries` closes, `stop` is cancelled or
    /// `link` reports the partition no longer owned. Whatever it resolved is committed before
    /// the task ends (the position queued through [`PartitionLink::commit`]).
    fn start<L: PartitionLink>(
        &self,
        link: L,
        deliveries: mpsc::Receiver<Arc<Delivery>>,
        stop: CancellationToken,
    ) -> JoinHandle<()>;
}

/// One owned partition (or stream), as the transport exposes it to the engine.
pub trait PartitionLink: Send + Sync + 'static {
    /// Whether this member still owns the partition (for the assignment the run started in).
    fn owned(&self) -> bool;

    /// Queues a commit of `position` (the next offset to read: every message before it is
    /// resolved) without waiting; `false` when it was not queued (the partition is no longer
    /// owned, or the broker refused it). A transport that acknowledges messages one by one
    /// acknowledges every message it delivered before `position`.
    fn commit(&self, position: i64) -> bool;

    /// Commits `position` and waits for the broker's answer (the at-most-once strategy commits
    /// before the handler runs).
    fn commit_now(&self, position: i64) -> impl Future<Output = Result<(), String>> + Send;

    /// A message was dead-lettered (it is in the dead-letter table already, under `id`): the
    /// transport may also publish a copy, e.g. to a dead-letter topic.
    fn dead_lettered(
        &self,
        delivery: &Delivery,
        reason: &str,
        id: i64,
    ) -> impl Future<Output = ()> + Send;

    /// `topic/partition`, for logs.
    fn name(&self) -> String;
}
