//! The consumer group member: subscribes, routes each message to its partition's run (one task
//! per owned partition, started through [`Partitions`]), and shuts down gracefully.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::FutureProducer;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use super::budget::Budget;
use super::close;
use super::dead_letter::DeadLetterTopic;
use super::lag::{self, LagGauges};
use super::ownership::{lock, KafkaPartition, Ownership, PartitionKey, RebalanceContext};
use super::{KafkaConfig, KafkaTransportError};
use crate::message::Delivery;
use crate::shutdown::{finish_within, CancellationToken};
use crate::store::text;
use crate::telemetry::MIN_SAMPLE_INTERVAL;
use crate::transport::{Partitions, Transport};

/// The task running one partition of one ownership generation.
struct PartitionTask {
    generation: u64,
    sender: mpsc::Sender<Arc<Delivery>>,
    handle: JoinHandle<()>,
}

/// A member of the consumer group and the partition tasks it runs.
struct Member<P> {
    partitions: P,
    /// The consumer's shutdown: each partition run gets a child of it, cancelled on revocation.
    shutdown: CancellationToken,
    config: KafkaConfig,
    consumer: Arc<StreamConsumer<RebalanceContext>>,
    ownership: Arc<Mutex<Ownership>>,
    dead_letters: Option<Arc<DeadLetterTopic>>,
    tasks: HashMap<PartitionKey, PartitionTask>,
    /// Tasks of revoked partitions, finishing the message in hand; reaped at shutdown.
    retired: Vec<(PartitionKey, JoinHandle<()>)>,
    /// Messages of partitions whose task is busy, in offset order; those partitions are
    /// paused until their task takes them, so that one slow partition never holds the others.
    waiting: HashMap<PartitionKey, VecDeque<Arc<Delivery>>>,
    /// The bytes the partition runs hold, bounded by `KafkaConfig::buffer_bytes`.
    budget: Budget,
    /// The subscribed topics' names, shared by their messages.
    topics: Vec<Arc<str>>,
    first_error: Option<KafkaTransportError>,
}

/// How long a request that wakes librdkafka's fetcher waits for its answer (see
/// [`Member::wake_fetchers`]): not at all. The request going out is what wakes the fetcher;
/// its answer is of no use, and waiting for it would hold up a runtime worker.
const WAKE_TIMEOUT: Duration = Duration::ZERO;

/// A consumer group member on Kafka: the partitions librdkafka assigns, each run by the engine
/// from its own task.
impl Transport for KafkaConfig {
    type Error = KafkaTransportError;

    fn run<P: Partitions>(
        self,
        partitions: P,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = Result<(), KafkaTransportError>> + Send {
        run(partitions, self, shutdown)
    }

    fn shutdown_grace(&self) -> std::time::Duration {
        self.shutdown_grace
    }
}

/// Runs the group's partitions on Kafka until `shutdown` is cancelled: then finishes the
/// message each partition has in hand, commits what is resolved, and leaves the group.
async fn run<P: Partitions>(
    partitions: P,
    config: KafkaConfig,
    shutdown: CancellationToken,
) -> Result<(), KafkaTransportError> {
    let every = partitions.sample_interval().max(MIN_SAMPLE_INTERVAL);
    let mut member = Member::join(partitions, config, shutdown.clone()).await?;
    let mut errors = ErrorLog::default();
    let mut retry_waiting = tokio::time::interval(Duration::from_millis(5));
    let lag = LagGauges::new(member.partitions.group());
    // The first sample comes one interval after joining, not at once: a consumer that lives
    // shorter than that never queries the broker for its lag.
    let mut sample = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The loop only ever waits for the broker (or for room in a busy partition's task,
        // with that partition paused): it keeps polling, so the member stays in the group
        // whatever one partition does.
        let message = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            _ = retry_waiting.tick(), if !member.waiting.is_empty() => {
                member.drain_waiting();
                continue;
            }
            _ = sample.tick() => {
                lag::sample(&member.consumer, &lag);
                member.reap_retired().await;
                continue;
            }
            m = member.consumer.recv() => m,
        };
        match message {
            Ok(m) => {
                let topic = member.topic(m.topic());
                member.dispatch(Arc::new(to_delivery(&m, topic)));
            }
            Err(e) => {
                if let Some(fatal) = fatal_error(&member.consumer, &e) {
                    // librdkafka will not recover this client (fenced by another member with
                    // the same `group.instance.id`, ...): the run ends with the error, so the
                    // consumer stops being live and its caller sees why.
                    tracing::error!(target: "inoutbox::kafka", error = %fatal, "fatal consumer error; stopping");
                    member.first_error.get_or_insert(fatal);
                    break;
                }
                errors.log(&e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    member.leave().await
}

impl<P: Partitions> Member<P> {
    async fn join(
        partitions: P,
        config: KafkaConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, KafkaTransportError> {
        let ownership = Arc::new(Mutex::new(Ownership::default()));
        let group_id = config
            .group_id
            .clone()
            .unwrap_or_else(|| partitions.group().to_owned());
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            // Prefetched messages are bounded by this (16 MiB) rather than the backlog; with
            // the partition buffers it bounds the consumer's memory.
            .set("queued.max.messages.kbytes", "16384");
        for (k, v) in &config.settings {
            client.set(k, v);
        }
        let consumer: StreamConsumer<RebalanceContext> = client
            .create_with_context(RebalanceContext {
                ownership: ownership.clone(),
                health: partitions.health(),
            })
            .map_err(|e| KafkaTransportError::Setup(super::redacted(e)))?;
        let consumer = Arc::new(consumer);
        reach_a_broker(&consumer, &config).await?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| KafkaTransportError::Setup(super::redacted(e)))?;
        tracing::info!(target: "inoutbox::kafka", group = partitions.group(), kafka_group = %group_id, topics = ?topics, "consumer started");
        let dead_letters = dead_letter_topic(&config, &group_id)?;
        Ok(Self {
            topics: config.topics.iter().map(|t| t.as_str().into()).collect(),
            budget: Budget::new(config.buffer_bytes),
            partitions,
            shutdown,
            config,
            consumer,
            ownership,
            dead_letters,
            tasks: HashMap::new(),
            retired: Vec::new(),
            waiting: HashMap::new(),
            first_error: None,
        })
    }

    /// Reaps the tasks of revoked partitions that have finished (a task that panicked is
    /// logged, and fails the run when it ends), so they do not pile up for the member's life.
    async fn reap_retired(&mut self) {
        for (pk, handle) in reap(&mut self.retired) {
            if let Err(e) = handle.await {
                let error = task_error(&pk, &e);
                tracing::error!(target: "inoutbox::kafka", %error);
                self.first_error.get_or_insert(error);
            }
        }
    }

    /// The shared name of `topic` (a subscribed topic's, not a copy per message).
    fn topic(&self, topic: &str) -> Arc<str> {
        self.topics
            .iter()
            .find(|t| &***t == topic)
            .cloned()
            .unwrap_or_else(|| topic.into())
    }

    /// Hands a message to the task of its partition without ever waiting for it: when the
    /// task is busy, the message waits here and the partition is paused (librdkafka fetches
    /// it again from the right place once resumed). Messages of partitions no longer owned are
    /// dropped: the next owner reads them again.
    fn dispatch(&mut self, delivery: Arc<Delivery>) {
        let pk = (delivery.topic.clone(), delivery.partition);
        let Some(generation) = lock(&self.ownership).owned.get(&pk).copied() else {
            return;
        };
        // A run is replaced only when the partition was assigned anew: a new run starts from
        // the committed position the assignment fetches from. A run of the same assignment
        // never ends early (a panic halts it, see `engine::partition::run`); replacing one
        // that did would start a fresh position past the messages it held.
        let stale = self
            .tasks
            .get(&pk)
            .is_none_or(|t| t.generation != generation);
        if stale {
            if let Some(PartitionTask { sender, handle, .. }) = self.tasks.remove(&pk) {
                // Its partition was revoked since: it finishes its message without committing.
                drop(sender);
                self.retired.push((pk.clone(), handle));
            }
            self.waiting.remove(&pk);
            self.pause(&pk, false);
            let task = self.start(pk.clone(), generation);
            self.tasks.insert(pk.clone(), task);
        }
        if let Some(queue) = self.waiting.get_mut(&pk) {
            queue.push_back(delivery);
            return;
        }
        let Some(task) = self.tasks.get(&pk) else {
            return;
        };
        if !self.budget.admits(&delivery) {
            // The runs hold the budget: this one waits, and its partition with it.
            self.waiting
                .entry(pk.clone())
                .or_default()
                .push_back(delivery);
            self.pause(&pk, true);
            return;
        }
        let kept = delivery.clone();
        match task.sender.try_send(delivery) {
            Ok(()) => self.budget.hold(&kept),
            Err(mpsc::error::TrySendError::Full(d)) => {
                self.waiting.entry(pk.clone()).or_default().push_back(d);
                self.pause(&pk, true);
            }
            Err(mpsc::error::TrySendError::Closed(d)) => {
                tracing::warn!(target: "inoutbox::kafka", topic = %d.topic, partition = d.partition, "partition task ended early");
            }
        }
    }

    /// Moves waiting messages to their tasks as they make room; resumes partitions whose
    /// waiting messages are all taken.
    fn drain_waiting(&mut self) {
        let mut resumed = Vec::new();
        for (pk, queue) in &mut self.waiting {
            let Some(task) = self.tasks.get(pk) else {
                queue.clear();
                resumed.push(pk.clone());
                continue;
            };
            while let Some(d) = queue.pop_front() {
                if !self.budget.admits(&d) {
                    queue.push_front(d);
                    break;
                }
                let kept = d.clone();
                match task.sender.try_send(d) {
                    Ok(()) => self.budget.hold(&kept),
                    Err(mpsc::error::TrySendError::Full(d)) => {
                        queue.push_front(d);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => queue.clear(),
                }
            }
            if queue.is_empty() {
                resumed.push(pk.clone());
            }
        }
        // Every owned partition paused means librdkafka's fetcher went idle: it does not look
        // at a resumed partition until its next wake-up, up to a second later. Any request to
        // the partition's leader wakes it at once.
        let all_paused = self.waiting.len() >= self.tasks.len();
        for pk in &resumed {
            self.waiting.remove(pk);
            self.pause(pk, false);
        }
        if all_paused && !resumed.is_empty() {
            self.wake_fetchers(resumed);
        }
    }

    /// Wakes librdkafka's fetchers for these partitions' leaders by asking each for the
    /// partition's watermarks, without waiting for the answers ([`WAKE_TIMEOUT`]): librdkafka
    /// sends the request and returns at once (its answer is dropped when it comes), so this
    /// never blocks the runtime. On this task, not a blocking thread: a request waited for on
    /// another thread kept the consumer alive there.
    fn wake_fetchers(&self, partitions: Vec<PartitionKey>) {
        // A handful is enough: one request wakes the fetcher of every partition its broker
        // leads.
        for (topic, partition) in partitions.into_iter().take(4) {
            let _ = self
                .consumer
                .fetch_watermarks(&topic, partition, WAKE_TIMEOUT);
        }
    }

    fn pause(&self, pk: &PartitionKey, pause: bool) {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&pk.0, pk.1);
        let result = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = result {
            tracing::debug!(target: "inoutbox::kafka", topic = %pk.0, partition = pk.1, pause, error = %e, "pause/resume failed");
        }
    }

    fn start(&self, key: PartitionKey, generation: u64) -> PartitionTask {
        let (sender, deliveries) = mpsc::channel(self.config.partition_buffer.max(1));
        let stop = self.shutdown.child_token();
        lock(&self.ownership)
            .stops
            .insert(key.clone(), stop.clone());
        let link = KafkaPartition {
            consumer: self.consumer.clone(),
            ownership: self.ownership.clone(),
            key,
            generation,
            dead_letters: self.dead_letters.clone(),
        };
        let handle = self.partitions.start(link, deliveries, stop);
        PartitionTask {
            generation,
            sender,
            handle,
        }
    }

    /// Finishes the messages in hand, commits and leaves the group.
    async fn leave(mut self) -> Result<(), KafkaTransportError> {
        let group = self.partitions.group().to_owned();
        tracing::info!(target: "inoutbox::kafka", group, "shutting down: finishing messages in hand");
        lock(&self.ownership).stop_all();
        let deadline = tokio::time::Instant::now() + self.config.shutdown_grace;
        let mut runs = JoinSet::new();
        let mut aborts = Vec::new();
        let retired = std::mem::take(&mut self.retired);
        for (pk, handle) in self
            .tasks
            .drain()
            .map(|(pk, t)| (pk, t.handle))
            .chain(retired)
        {
            aborts.push(handle.abort_handle());
            runs.spawn(async move { (pk, handle.await) });
        }
        let mut first_error = self.first_error.take();
        let in_time = finish_within(&mut runs, deadline, |done| {
            if let Ok((pk, Err(e))) = done {
                let error = task_error(&pk, &e);
                tracing::error!(target: "inoutbox::kafka", %error);
                first_error.get_or_insert(error);
            }
        })
        .await;
        if !in_time {
            // The grace period is over: the handlers still running are dropped with their
            // transactions (rolled back) and their offsets are not committed.
            tracing::warn!(target: "inoutbox::kafka", group, grace = ?self.config.shutdown_grace,
                "messages were still in hand at the end of the grace period; abandoned");
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
        }
        // The last commits made sure of, then the close (which flushes the queued commits and
        // leaves the group): with the broker gone that could take for ever, so they get what
        // is left of the grace period, and no more (see `close`).
        match close::leave(self.consumer, &self.ownership, deadline).await {
            Some(close::Closed::LeftGroup) => {}
            Some(close::Closed::WithoutLeaving) => tracing::info!(target: "inoutbox::kafka", group,
                "the group coordinator did not answer: closed without leaving the group (it drops this member after the session timeout)"),
            None => tracing::warn!(target: "inoutbox::kafka", group,
                "leaving the group did not finish within the grace period (broker unreachable?)"),
        }
        tracing::info!(target: "inoutbox::kafka", group, "consumer stopped");
        first_error.map_or(Ok(()), Err)
    }
}

/// Fails start-up with a clear error when no broker answers within the start-up timeout (a
/// wrong address, a broker that is down), instead of retrying silently for ever.
async fn reach_a_broker(
    consumer: &Arc<StreamConsumer<RebalanceContext>>,
    config: &KafkaConfig,
) -> Result<(), KafkaTransportError> {
    let probe = consumer.clone();
    let timeout = config.startup_timeout;
    let answered =
        tokio::task::spawn_blocking(move || probe.fetch_metadata(None, timeout).map(|_| ())).await;
    match answered {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(KafkaTransportError::Unreachable {
            brokers: config.brokers.clone(),
            timeout,
            source,
        }),
        Err(join) => Err(KafkaTransportError::Task {
            topic: String::new(),
            partition: -1,
            message: join.to_string(),
        }),
    }
}

/// The finished tasks of `tasks`, taken out of it.
fn reap<T>(tasks: &mut Vec<(PartitionKey, JoinHandle<T>)>) -> Vec<(PartitionKey, JoinHandle<T>)> {
    let (finished, running) = std::mem::take(tasks)
        .into_iter()
        .partition(|(_, handle)| handle.is_finished());
    *tasks = running;
    finished
}

/// The client's fatal error, if `error` is one (librdkafka will not recover the client).
fn fatal_error(
    consumer: &StreamConsumer<RebalanceContext>,
    error: &rdkafka::error::KafkaError,
) -> Option<KafkaTransportError> {
    let fatal = consumer.client().fatal_error();
    if fatal.is_none()
        && !matches!(
            error,
            rdkafka::error::KafkaError::MessageConsumptionFatal(_)
        )
    {
        return None;
    }
    let (code, reason) = fatal.map_or_else(
        || {
            (
                format!("{:?}", error.rdkafka_error_code()),
                error.to_string(),
            )
        },
        |(code, reason)| (format!("{code:?}"), reason),
    );
    Some(KafkaTransportError::Fatal { code, reason })
}

/// Consumer errors (e.g. every broker down) are logged once, then at most every 30 s with
/// how many there were, instead of ten lines a second.
#[derive(Default)]
struct ErrorLog {
    since: Option<std::time::Instant>,
    suppressed: u64,
}

impl ErrorLog {
    fn log(&mut self, error: &rdkafka::error::KafkaError) {
        let now = std::time::Instant::now();
        match self.since {
            Some(since) if now.duration_since(since) < Duration::from_secs(30) => {
                self.suppressed += 1;
            }
            _ => {
                tracing::warn!(target: "inoutbox::kafka", error = %error, repeated = self.suppressed,
                    "kafka consumer error; retrying");
                self.since = Some(now);
                self.suppressed = 0;
            }
        }
    }
}

fn dead_letter_topic(
    config: &KafkaConfig,
    group_id: &str,
) -> Result<Option<Arc<DeadLetterTopic>>, KafkaTransportError> {
    let Some(topic) = &config.dead_letter_topic else {
        return Ok(None);
    };
    let mut producer = ClientConfig::new();
    producer
        .set("bootstrap.servers", &config.brokers)
        .set("acks", "all");
    for (k, v) in &config.producer_settings {
        producer.set(k, v);
    }
    let producer: FutureProducer = producer
        .create()
        .map_err(|e| KafkaTransportError::Setup(super::redacted(e)))?;
    Ok(Some(Arc::new(DeadLetterTopic {
        producer,
        topic: topic.clone(),
        group: group_id.to_owned(),
    })))
}

fn to_delivery(m: &BorrowedMessage<'_>, topic: Arc<str>) -> Delivery {
    Delivery {
        topic,
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers: headers(m),
    }
}

/// The message's headers, in broker order. Read through librdkafka directly: rdkafka's own
/// accessor panics on a header name that is not UTF-8, and any producer can send one. Such a
/// name is kept with its invalid bytes written as `\xHH`; values are kept as bytes.
fn headers(m: &BorrowedMessage<'_>) -> Vec<(String, Option<Vec<u8>>)> {
    use rdkafka::bindings as rd;
    let mut list: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `m.ptr()` is the live message this borrow refers to; librdkafka writes a pointer
    // to headers owned by the message (or leaves it null when there are none).
    let err = unsafe { rd::rd_kafka_message_headers(m.ptr(), &mut list) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || list.is_null() {
        return Vec::new();
    }
    // SAFETY: `list` is valid while the message is borrowed.
    let count = unsafe { rd::rd_kafka_header_cnt(list) };
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::os::raw::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `idx < count`; the out-pointers are valid locals.
        let err =
            unsafe { rd::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: as `rd_kafka_header_get_all` returned them: a name and `size` bytes of value,
        // both owned by the message.
        let name = unsafe { super::headers::name_bytes(name, value, size) };
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec());
        out.push((text::header_name(name), value));
    }
    out
}

fn task_error(pk: &PartitionKey, e: &tokio::task::JoinError) -> KafkaTransportError {
    KafkaTransportError::Task {
        topic: pk.0.to_string(),
        partition: pk.1,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::reap;

    /// Revoked partitions' tasks are kept until they finish, then reaped: they do not pile
    /// up for the member's life.
    #[tokio::test]
    async fn finished_tasks_of_revoked_partitions_are_reaped_and_the_running_ones_kept() {
        let (hold, held) = tokio::sync::oneshot::channel::<()>();
        let mut retired = vec![
            (("t".into(), 0), tokio::spawn(async {})),
            (
                ("t".into(), 1),
                tokio::spawn(async move {
                    let _ = held.await;
                }),
            ),
            (
                ("t".into(), 2),
                tokio::spawn(async { panic!("a lane panicked") }),
            ),
        ];
        while !retired[0].1.is_finished() || !retired[2].1.is_finished() {
            tokio::task::yield_now().await;
        }
        let finished = reap(&mut retired);
        let mut reaped: Vec<i32> = finished.iter().map(|((_, p), _)| *p).collect();
        reaped.sort_unstable();
        assert_eq!(reaped, [0, 2]);
        assert_eq!(retired.len(), 1, "the running task is kept");
        assert_eq!(retired[0].0 .1, 1);
        let mut panicked = 0;
        for (_, handle) in finished {
            panicked += usize::from(handle.await.is_err_and(|e| e.is_panic()));
        }
        assert_eq!(
            panicked, 1,
            "a panicked task's result is still there to report"
        );
        drop(hold);
    }
}
