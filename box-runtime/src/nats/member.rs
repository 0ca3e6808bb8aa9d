//! A member of a consumer group on NATS: every renewal interval it renews the leases it holds,
//! restarts the partitions whose reading ended, and takes the leases of free partitions; each
//! owned partition runs through the engine ([`Partitions::start`]) with a child of the
//! consumer's token that is cancelled when the lease is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, message::Acker};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use super::dead_letter::DeadLetterSubject;
use super::lag::{LagSampler, Sampled};
use super::lease::{Lease, NatsPartition};
use super::reader::{self, Ended, Reader};
use super::{token, NatsConfig, NatsTransportError};
use crate::shutdown::{finish_within, CancellationToken};
use crate::telemetry::MIN_SAMPLE_INTERVAL;
use crate::transport::{Partitions, Transport};

/// (topic, partition).
type Key = (Arc<str>, u32);

/// A partition this member holds the lease of, and its run.
struct Owned {
    lease: Arc<Lease>,
    /// The lease's last revision in the bucket.
    revision: u64,
    /// The name of the partition's consumer (for the lag gauge).
    consumer: String,
    stop: CancellationToken,
    run: JoinHandle<()>,
    reader: JoinHandle<Ended>,
}

/// The run of a partition being stopped; `restart`: the lease is still held, read it again
/// once the run has finished.
struct Retiring {
    run: JoinHandle<()>,
    restart: bool,
    /// Given up to another member (more than a fair share held): the lease's revision, deleted
    /// once the run has finished and acknowledged what it resolved.
    release: Option<u64>,
}

struct Member<P> {
    partitions: P,
    shutdown: CancellationToken,
    config: NatsConfig,
    kv: kv::Store,
    js: jetstream::Context,
    /// The topics, in the order of the configuration.
    topics: Vec<Arc<str>>,
    /// Each partition's stream.
    streams: HashMap<Key, jetstream::stream::Stream>,
    /// This member's value in the leases it holds.
    id: String,
    owned: HashMap<Key, Owned>,
    retiring: HashMap<Key, Retiring>,
    acks: mpsc::UnboundedSender<Acker>,
    dead_letters: Option<Arc<DeadLetterSubject>>,
    first_error: Option<NatsTransportError>,
}

impl Transport for NatsConfig {
    type Error = NatsTransportError;

    async fn run<P: Partitions>(
        self,
        partitions: P,
        shutdown: CancellationToken,
    ) -> Result<(), NatsTransportError> {
        let client = super::connect(&self.url, self.startup_timeout).await?;
        let js = jetstream::new(client.clone());
        let topics: Vec<Arc<str>> = self.topics.iter().map(|t| Arc::from(t.as_str())).collect();
        let mut streams = HashMap::new();
        for topic in &topics {
            let all = super::ensure_streams(&js, topic, self.partitions)
                .await
                .map_err(NatsTransportError::Setup)?;
            streams.extend((0..).zip(all).map(|(p, s)| ((topic.clone(), p), s)));
        }
        let kv = lease_bucket(&js, &self).await?;
        let dead_letters = match &self.dead_letter_subject {
            Some(subject) => {
                let dlq = DeadLetterSubject {
                    js: js.clone(),
                    subject: subject.clone(),
                    group: partitions.group().to_owned(),
                };
                dlq.ensure().await.map_err(NatsTransportError::Setup)?;
                Some(Arc::new(dlq))
            }
            None => None,
        };
        let (acks, queued) = mpsc::unbounded_channel();
        let pump = tokio::spawn(ack_pump(queued));
        let member = Member {
            partitions,
            shutdown,
            config: self,
            kv,
            js,
            topics,
            streams,
            id: uuid::Uuid::new_v4().to_string(),
            owned: HashMap::new(),
            retiring: HashMap::new(),
            acks,
            dead_letters,
            first_error: None,
        };
        member.run(pump, client).await
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }
}

/// The lease bucket: one value per key, removed after the lease TTL without an update. Its
/// stream is created here as async-nats would create it (`KV_<bucket>`): async-nats's own
/// `create_key_value` first reads the account's limits, which it cannot parse from a 2.9 server.
async fn lease_bucket(
    js: &jetstream::Context,
    config: &NatsConfig,
) -> Result<kv::Store, NatsTransportError> {
    let bucket = &config.lease_bucket;
    let stream = jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age: config.lease_ttl,
        storage: jetstream::stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        num_replicas: 1,
        ..Default::default()
    };
    super::get_or_create_stream(js, stream)
        .await
        .map_err(|e| NatsTransportError::Setup(format!("lease bucket {bucket}: {e}")))?;
    js.get_key_value(bucket)
        .await
        .map_err(|e| NatsTransportError::Setup(format!("lease bucket {bucket}: {e}")))
}

/// Sends the queued acknowledgements in order; ends when every link and the member are gone.
async fn ack_pump(mut queued: mpsc::UnboundedReceiver<Acker>) {
    while let Some(acker) = queued.recv().await {
        if let Err(e) = acker.ack().await {
            tracing::debug!(target: "inoutbox::nats", error = %e, "acknowledgement not sent");
        }
    }
}

impl<P: Partitions> Member<P> {
    fn lease_key(&self, key: &Key) -> String {
        format!(
            "{}.{}.{}",
            token(self.partitions.group()),
            token(&key.0),
            key.1
        )
    }

    async fn run(
        mut self,
        pump: JoinHandle<()>,
        client: async_nats::Client,
    ) -> Result<(), NatsTransportError> {
        let group = self.partitions.group().to_owned();
        tracing::info!(target: "inoutbox::nats", group, member = %self.id, "joined");
        let every = self.partitions.sample_interval().max(MIN_SAMPLE_INTERVAL);
        let mut lag = LagSampler::new(&group, every);
        loop {
            self.renew_all().await;
            self.follow_readers().await;
            self.restart_finished().await;
            let fair = self.fair_share().await;
            self.shed(fair);
            self.acquire(fair).await;
            lag.tick(self.sampled());
            self.partitions.health().set_joined(true);
            tokio::select! {
                () = self.shutdown.cancelled() => break,
                () = tokio::time::sleep(self.config.renew_interval()) => {}
            }
        }
        self.leave(pump, client).await
    }

    /// The partitions owned now, with their consumers, for the lag gauge.
    fn sampled(&self) -> Vec<Sampled> {
        self.owned
            .iter()
            .filter_map(|(key, owned)| {
                let stream = self.streams.get(key)?.clone();
                Some((key.0.clone(), key.1, stream, owned.consumer.clone()))
            })
            .collect()
    }

    /// Renews every held lease; a lease that cannot be renewed is lost.
    async fn renew_all(&mut self) {
        let keys: Vec<Key> = self.owned.keys().cloned().collect();
        for key in keys {
            if !self.renew(&key).await {
                self.lose(&key, false);
            }
        }
    }

    async fn renew(&mut self, key: &Key) -> bool {
        let lease_key = self.lease_key(key);
        let Some(owned) = self.owned.get_mut(key) else {
            return false;
        };
        if !owned.lease.holds() {
            return false;
        }
        let sent = Instant::now();
        let value = self.id.clone().into_bytes().into();
        match self.kv.update(&lease_key, value, owned.revision).await {
            Ok(revision) => {
                owned.revision = revision;
                owned.lease.renewed(sent + self.config.lease_ttl);
                true
            }
            Err(e) => {
                tracing::warn!(target: "inoutbox::nats", lease = %lease_key, error = %e, "lease not renewed");
                false
            }
        }
    }

    /// Stops the run of a partition: lost, or (`restart`) to be read again under the same lease.
    fn lose(&mut self, key: &Key, restart: bool) {
        let Some(owned) = self.owned.remove(key) else {
            return;
        };
        if !restart {
            owned.lease.lose();
            tracing::info!(target: "inoutbox::nats", topic = %key.0, partition = key.1, "lease lost; partition revoked");
        }
        owned.stop.cancel();
        owned.reader.abort();
        self.retiring.insert(
            key.clone(),
            Retiring {
                run: owned.run,
                restart,
                release: None,
            },
        );
    }

    /// How many partitions this member may hold: all of them divided among the live members
    /// (each registered under `<group>._members.<id>` in the lease bucket, renewed every tick,
    /// expiring with the TTL), rounded up.
    async fn fair_share(&self) -> usize {
        let total = self.streams.len();
        let prefix = format!("{}._members.", token(self.partitions.group()));
        let me = format!("{prefix}{}", self.id);
        if self
            .kv
            .put(&me, self.id.clone().into_bytes().into())
            .await
            .is_err()
        {
            return total;
        }
        let Ok(mut keys) = self.kv.keys().await else {
            return total;
        };
        let mut members = 0usize;
        while let Some(key) = futures_util::StreamExt::next(&mut keys).await {
            members += usize::from(key.is_ok_and(|k| k.starts_with(&prefix)));
        }
        total.div_ceil(members.max(1))
    }

    /// Gives up one partition a tick while holding more than `fair`: its run finishes the
    /// message in hand and acknowledges it, then the lease is deleted for another member.
    fn shed(&mut self, fair: usize) {
        if self.owned.len() <= fair {
            return;
        }
        let Some(key) = self.owned.keys().max().cloned() else {
            return;
        };
        let Some(owned) = self.owned.remove(&key) else {
            return;
        };
        tracing::info!(target: "inoutbox::nats", topic = %key.0, partition = key.1, fair, "giving a partition up to another member");
        owned.stop.cancel();
        owned.reader.abort();
        self.retiring.insert(
            key,
            Retiring {
                run: owned.run,
                restart: false,
                release: Some(owned.revision),
            },
        );
    }

    /// Partitions whose reading ended (a lost delivery, a failed pull, a run that ended on its
    /// own) are restarted from their acknowledgement floor.
    async fn follow_readers(&mut self) {
        let ended: Vec<Key> = self
            .owned
            .iter()
            .filter(|(_, o)| o.reader.is_finished() || o.run.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            let Some(owned) = self.owned.get_mut(&key) else {
                continue;
            };
            let why = if owned.reader.is_finished() {
                match (&mut owned.reader).await {
                    Ok(Ended::Failed(why)) => why,
                    Ok(ended) => format!("{ended:?}"),
                    Err(e) => e.to_string(),
                }
            } else {
                "the run ended".to_owned()
            };
            tracing::info!(target: "inoutbox::nats", topic = %key.0, partition = key.1, why,
                "partition reading ended; restarting it from its acknowledgement floor");
            self.lose(&key, true);
        }
    }

    /// Restarts the finished runs whose lease is still held; forgets those lost.
    async fn restart_finished(&mut self) {
        let finished: Vec<Key> = self
            .retiring
            .iter()
            .filter(|(_, r)| r.run.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for key in finished {
            let Some(retired) = self.retiring.remove(&key) else {
                continue;
            };
            if let Err(e) = retired.run.await {
                let error = task_error(&key, &e);
                tracing::error!(target: "inoutbox::nats", %error);
                self.first_error.get_or_insert(error);
            }
            if retired.restart {
                self.restart(key).await;
            } else if let Some(revision) = retired.release {
                let lease_key = self.lease_key(&key);
                let _ = self
                    .kv
                    .delete_expect_revision(lease_key, Some(revision))
                    .await;
            }
        }
    }

    async fn restart(&mut self, key: Key) {
        let lease_key = self.lease_key(&key);
        let sent = Instant::now();
        let value = self.id.clone().into_bytes().into();
        // A new revision names the new consumer (and proves the lease still ours).
        let Some(revision) = self.current_revision(&lease_key).await else {
            return;
        };
        match self.kv.update(&lease_key, value, revision).await {
            Ok(revision) => self.start(key, revision, sent).await,
            Err(e) => {
                tracing::info!(target: "inoutbox::nats", lease = %lease_key, error = %e, "lease lost before the restart")
            }
        }
    }

    async fn current_revision(&self, lease_key: &str) -> Option<u64> {
        match self.kv.entry(lease_key).await {
            Ok(Some(entry)) if entry.value.as_ref() == self.id.as_bytes() => Some(entry.revision),
            _ => None,
        }
    }

    /// Takes the leases of free partitions, up to `fair` held.
    async fn acquire(&mut self, fair: usize) {
        for topic in self.topics.clone() {
            for partition in 0..self.config.partitions {
                if self.owned.len() + self.retiring.len() >= fair {
                    return;
                }
                let key = (topic.clone(), partition);
                if self.owned.contains_key(&key) || self.retiring.contains_key(&key) {
                    continue;
                }
                let lease_key = self.lease_key(&key);
                let sent = Instant::now();
                let value = self.id.clone().into_bytes().into();
                if let Ok(revision) = self.kv.create(&lease_key, value).await {
                    tracing::info!(target: "inoutbox::nats", topic = %topic, partition, revision, "lease taken; partition assigned");
                    self.start(key, revision, sent).await;
                }
            }
        }
    }

    /// Starts reading a partition under the lease of `revision` (renewed at `sent`).
    async fn start(&mut self, key: Key, revision: u64, sent: Instant) {
        let lease = Arc::new(Lease::new(sent + self.config.lease_ttl));
        let group = self.partitions.group().to_owned();
        let Some(stream) = self.streams.get(&key) else {
            return;
        };
        let consumer = match reader::consumer(stream, &self.config, &group, &key.0, key.1, revision)
            .await
        {
            Ok(consumer) => consumer,
            Err(e) => {
                tracing::warn!(target: "inoutbox::nats", topic = %key.0, partition = key.1, error = %e,
                        "partition consumer not created; giving the lease up");
                let _ = self
                    .kv
                    .delete_expect_revision(self.lease_key(&key), Some(revision))
                    .await;
                return;
            }
        };
        let partition = i32::try_from(key.1).unwrap_or(i32::MAX);
        let consumer_name = consumer.cached_info().name.clone();
        let (sender, deliveries) = mpsc::channel(self.config.partition_buffer.max(1));
        let stop = self.shutdown.child_token();
        let link = NatsPartition {
            topic: key.0.clone(),
            partition,
            lease: lease.clone(),
            acks: self.acks.clone(),
            dead_letters: self.dead_letters.clone(),
        };
        let run = self.partitions.start(link, deliveries, stop.clone());
        let reader = tokio::spawn(
            Reader {
                consumer,
                js: self.js.clone(),
                lease: lease.clone(),
                deliveries: sender,
                stop: stop.clone(),
                topic: key.0.clone(),
                partition,
                batch: self.config.partition_buffer,
            }
            .run(),
        );
        self.owned.insert(
            key,
            Owned {
                lease,
                revision,
                consumer: consumer_name,
                stop,
                run,
                reader,
            },
        );
    }

    /// Finishes the messages in hand within the grace (renewing the leases meanwhile), sends
    /// the last acknowledgements, and gives the leases up.
    async fn leave(
        mut self,
        pump: JoinHandle<()>,
        client: async_nats::Client,
    ) -> Result<(), NatsTransportError> {
        let group = self.partitions.group().to_owned();
        tracing::info!(target: "inoutbox::nats", group, "shutting down: finishing messages in hand");
        let deadline = tokio::time::Instant::now() + self.config.shutdown_grace;
        let mut runs = JoinSet::new();
        let mut held = Vec::new();
        for (key, owned) in std::mem::take(&mut self.owned) {
            let Owned {
                lease,
                revision,
                stop,
                run,
                reader,
                ..
            } = owned;
            stop.cancel();
            reader.abort();
            let run_key = key.clone();
            runs.spawn(async move { (run_key, run.await) });
            held.push((key, revision, lease));
        }
        for (key, retired) in std::mem::take(&mut self.retiring) {
            runs.spawn(async move { (key, retired.run.await) });
        }
        let mut first_error = self.first_error.take();
        let in_time = tokio::select! {
            in_time = finish_within(&mut runs, deadline, |done| {
                if let Ok((key, Err(e))) = done {
                    let error = task_error(&key, &e);
                    tracing::error!(target: "inoutbox::nats", %error);
                    first_error.get_or_insert(error);
                }
            }) => in_time,
            () = self.keep_renewing(&mut held) => false,
        };
        if !in_time {
            tracing::warn!(target: "inoutbox::nats", group, grace = ?self.config.shutdown_grace,
                "messages were still in hand at the end of the grace period; abandoned");
        }
        drop(self.acks);
        let _ = tokio::time::timeout_at(deadline, pump).await;
        let _ = tokio::time::timeout_at(deadline, client.flush()).await;
        for (key, revision, lease) in held {
            lease.lose();
            let lease_key = format!("{}.{}.{}", token(&group), token(&key.0), key.1);
            let _ = self
                .kv
                .delete_expect_revision(lease_key, Some(revision))
                .await;
        }
        let me = format!("{}._members.{}", token(&group), self.id);
        let _ = self.kv.delete(me).await;
        self.partitions.health().set_joined(false);
        tracing::info!(target: "inoutbox::nats", group, "consumer stopped");
        first_error.map_or(Ok(()), Err)
    }

    /// Renews the leases of the runs finishing during a graceful stop (never ends).
    async fn keep_renewing(&self, held: &mut [(Key, u64, Arc<Lease>)]) {
        loop {
            tokio::time::sleep(self.config.renew_interval()).await;
            for (key, revision, lease) in held.iter_mut() {
                let sent = Instant::now();
                let value = self.id.clone().into_bytes().into();
                if let Ok(next) = self.kv.update(self.lease_key(key), value, *revision).await {
                    *revision = next;
                    lease.renewed(sent + self.config.lease_ttl);
                } else {
                    lease.lose();
                }
            }
        }
    }
}

fn task_error(key: &Key, e: &tokio::task::JoinError) -> NatsTransportError {
    NatsTransportError::Task {
        topic: key.0.to_string(),
        partition: i32::try_from(key.1).unwrap_or(i32::MAX),
        message: e.to_string(),
    }
}
