//! The brokers the contract suite runs against: one generic test body, instantiated for Kafka
//! (a Tansu process per test; the in-process mock cluster for the rebalance) and, with the
//! feature `nats`, for NATS JetStream (a `nats-server -js` process per test).
//!
//! What a test needs of a broker: topics of N partitions, raw messages sent to them, the
//! consumer settings of a group, a relay's publisher, what a topic holds, and how far a group
//! has committed a partition. Positions differ: a Kafka partition's offsets are 0, 1, 2...; a
//! NATS message's offset is its stream sequence (the stream holds every partition of the
//! topic). So the tests speak of a partition's *n-th message* ([`Bus::offset`],
//! [`Bus::position`]) and of *how many* of its messages are committed ([`Bus::committed`]).

#[cfg(feature = "nats")]
use std::collections::HashMap;
use std::future::Future;
#[cfg(feature = "nats")]
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inoutbox::transport::{Publisher, Transport};

use super::{Msg, Received};

/// NATS topics of the contract suite begin with this, so that a handler shared by both
/// brokers can tell which one a message came from ([`slot`]).
pub const NATS_TOPIC_PREFIX: &str = "nats-";

/// The index of a handler's per-test counters: the store's index, plus 3 on NATS (the Kafka
/// and NATS instances of a test run at the same time, in one process).
pub fn slot(store: usize, topic: &str) -> usize {
    store
        + if topic.starts_with(NATS_TOPIC_PREFIX) {
            3
        } else {
            0
        }
}

/// A broker, fresh for one test.
pub trait Bus: Sized + 'static {
    /// A consumer's transport settings.
    type Config: Transport;
    /// The relay's publisher.
    type Publisher: Publisher;
    /// For messages.
    const NAME: &'static str;
    /// Added to a store's index for per-test counters (see [`slot`]).
    const SLOT: usize;

    /// A broker of its own.
    fn start() -> impl Future<Output = Self>;
    /// A broker for the rebalance test (Kafka: the in-process mock cluster, whose group
    /// coordinator rebalances as Kafka does; Tansu's does not).
    fn start_for_rebalance() -> impl Future<Output = Self> {
        Self::start()
    }
    /// A topic name of this broker, unique, from `prefix`.
    fn topic(&self, prefix: &str) -> String;
    /// Creates `topic` with `partitions` partitions.
    fn create_topic(&self, topic: &str, partitions: u32) -> impl Future<Output = ()>;
    /// Sends `msg` (CloudEvents binary mode) to its partition: `msg.partition`, or the hash
    /// of its key.
    fn send(&self, topic: &str, msg: Msg) -> impl Future<Output = ()>;
    /// The consumer settings of a member of a group reading `topic` (made by
    /// [`create_topic`](Self::create_topic)), with quick joins and a short lease.
    fn consumer(&self, topic: &str) -> Self::Config;
    /// A relay publisher for topics of `partitions` partitions.
    fn publisher(&self, partitions: u32) -> impl Future<Output = Self::Publisher>;
    /// The first `n` messages of `topic` (all its partitions); panics if they do not come
    /// within `within`.
    fn read_topic(
        &self,
        topic: &str,
        partitions: u32,
        n: usize,
        within: Duration,
    ) -> impl Future<Output = Vec<Received>>;
    /// How many of the messages of `topic`/`partition` that [`send`](Self::send) sent the
    /// consumer group `group` has committed (`None`: nothing committed).
    fn committed(
        &self,
        group: &str,
        topic: &str,
        partition: u32,
    ) -> impl Future<Output = Option<i64>>;
    /// The `Delivery::offset` of the `index`-th message (from 0) sent to `topic`/`partition`.
    fn offset(&self, topic: &str, partition: u32, index: usize) -> i64;

    /// The racing test: its topic's partitions, each of which gets a copy of the raced event.
    const RACE_PARTITIONS: u32;
    /// The racing test's two consumers feeding one inbox group `group`, each of which reads
    /// half of the copies of an event, at once.
    fn racers(&self, topic: &str, group: &str) -> [Self::Config; 2];
    /// Waits until the racers are ready to be sent the copies.
    fn racers_ready(&self, topic: &str, group: &str) -> impl Future<Output = ()>;

    /// The rebalance test: the partition of the gated message.
    const GATE_PARTITION: u32;
    /// The rebalance test: waits, while the gated message is in hand in the first member,
    /// until the second member `second` of `group` has taken its share of the partitions
    /// (on Kafka, a rebalance revoked the gated partition; on NATS, the lease of the gated
    /// partition passed to the second member); says what it saw.
    fn handed_over(
        &self,
        group: &str,
        topic: &str,
        second: &mut super::Running,
    ) -> impl Future<Output = String>;

    /// The committed position (a report's `committed`) once the first `n` messages sent to
    /// `topic`/`partition` are committed.
    fn position(&self, topic: &str, partition: u32, n: usize) -> i64 {
        self.offset(topic, partition, n - 1) + 1
    }

    /// Waits (at most 15 s) for [`committed`](Self::committed) to reach `at_least`; returns
    /// what was last seen.
    fn wait_committed(
        &self,
        group: &str,
        topic: &str,
        partition: u32,
        at_least: i64,
    ) -> impl Future<Output = Option<i64>> {
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let seen = self.committed(group, topic, partition).await;
                if seen.is_some_and(|o| o >= at_least) || Instant::now() > deadline {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kafka.

/// Kafka: a Tansu process, or the in-process mock cluster.
pub struct Kafka {
    _tansu: Option<super::Broker>,
    in_process: Option<inoutbox::kafka::InProcessKafka>,
    pub brokers: String,
    producer: rdkafka::producer::FutureProducer,
}

impl Bus for Kafka {
    type Config = inoutbox::KafkaConfig;
    type Publisher = inoutbox::kafka::KafkaPublisher;
    const NAME: &'static str = "Kafka";
    const SLOT: usize = 0;

    async fn start() -> Self {
        let broker = super::Broker::start();
        let brokers = broker.brokers.clone();
        Self {
            producer: super::producer(&brokers),
            _tansu: Some(broker),
            in_process: None,
            brokers,
        }
    }

    async fn start_for_rebalance() -> Self {
        let kafka = inoutbox::kafka::InProcessKafka::start().expect("in-process kafka");
        let brokers = kafka.brokers().to_owned();
        Self {
            producer: super::producer(&brokers),
            _tansu: None,
            in_process: Some(kafka),
            brokers,
        }
    }

    fn topic(&self, prefix: &str) -> String {
        super::unique(prefix)
    }

    async fn create_topic(&self, topic: &str, partitions: u32) {
        let partitions = i32::try_from(partitions).expect("partitions");
        match &self.in_process {
            Some(kafka) => kafka.create_topic(topic, partitions).expect("topic"),
            None => super::create_topic(&self.brokers, topic, partitions).await,
        }
    }

    async fn send(&self, topic: &str, msg: Msg) {
        super::send(&self.producer, topic, msg).await
    }

    fn consumer(&self, topic: &str) -> inoutbox::KafkaConfig {
        match &self.in_process {
            Some(kafka) => kafka.consumer_config([topic]),
            None => super::kafka(&self.brokers, topic),
        }
    }

    async fn publisher(&self, _partitions: u32) -> inoutbox::kafka::KafkaPublisher {
        super::tansu_publisher(&self.brokers)
    }

    async fn read_topic(
        &self,
        topic: &str,
        partitions: u32,
        n: usize,
        within: Duration,
    ) -> Vec<Received> {
        let partitions = i32::try_from(partitions).expect("partitions");
        super::read_topic(&self.brokers, topic, partitions, n, within).await
    }

    async fn committed(&self, group: &str, topic: &str, partition: u32) -> Option<i64> {
        let (b, g, t) = (self.brokers.clone(), group.to_owned(), topic.to_owned());
        let partition = i32::try_from(partition).expect("partition");
        tokio::task::spawn_blocking(move || super::committed(&b, &g, &t, partition))
            .await
            .expect("join")
    }

    fn offset(&self, _topic: &str, _partition: u32, index: usize) -> i64 {
        i64::try_from(index).expect("index")
    }

    /// Both partitions: each consumer reads both copies.
    const RACE_PARTITIONS: u32 = 2;

    /// Two Kafka groups of their own (`<group>-kafka-a`, `-b`): every message reaches both.
    fn racers(&self, topic: &str, group: &str) -> [inoutbox::KafkaConfig; 2] {
        [
            self.consumer(topic).group_id(format!("{group}-kafka-a")),
            self.consumer(topic).group_id(format!("{group}-kafka-b")),
        ]
    }

    /// Each group reads its partitions from the start whenever it joins.
    async fn racers_ready(&self, _topic: &str, _group: &str) {}

    const GATE_PARTITION: u32 = 0;

    /// The second member reports once the rebalance has given it partitions (with the eager
    /// protocol, after every partition of the first was revoked). On SQLite the blocked
    /// transaction holds the one write lock, so nothing can be reported: it waits a few
    /// seconds instead (a join takes about one).
    async fn handed_over(&self, _group: &str, _topic: &str, second: &mut super::Running) -> String {
        let first = second.next(Duration::from_secs(8)).await;
        format!(
            "the second member reported {:?}",
            first.map(|r| (r.delivery.partition, r.delivery.offset))
        )
    }
}

// ---------------------------------------------------------------------------------------------
// NATS JetStream.

/// NATS JetStream: a `nats-server -js` process of its own.
#[cfg(feature = "nats")]
pub struct Nats {
    pub server: super::nats::NatsServer,
    pub js: async_nats::jetstream::Context,
    /// Each topic's partitions.
    partitions: Mutex<HashMap<String, u32>>,
    /// The stream sequences of what `send` sent, per (topic, partition), in order.
    sent: Mutex<HashMap<(String, u32), Vec<u64>>>,
}

#[cfg(feature = "nats")]
impl Nats {
    fn partitions_of(&self, topic: &str) -> u32 {
        *lock(&self.partitions)
            .get(topic)
            .unwrap_or_else(|| panic!("topic {topic} was not created"))
    }

    /// The lease bucket (once a member has created it).
    pub async fn leases(&self) -> async_nats::jetstream::kv::Store {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(leases) = self.js.get_key_value("inoutbox_leases").await {
                return leases;
            }
            assert!(Instant::now() < deadline, "no lease bucket within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The member holding the lease of `group`'s `topic`/`partition`, if any.
    pub async fn holder(&self, group: &str, topic: &str, partition: u32) -> Option<Vec<u8>> {
        let key = super::nats::lease_key(group, topic, partition);
        match self.leases().await.get(key).await {
            Ok(Some(owner)) if !owner.is_empty() => Some(owner.to_vec()),
            _ => None,
        }
    }

    /// Waits (at most 60 s) until `members` members of `group` each hold an equal share of
    /// `topic`'s `partitions` (a member that joins takes its share over a few renewals).
    pub async fn shared(&self, group: &str, topic: &str, partitions: u32, members: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut held: HashMap<Vec<u8>, u32> = HashMap::new();
            for p in 0..partitions {
                if let Some(owner) = self.holder(group, topic, p).await {
                    *held.entry(owner).or_default() += 1;
                }
            }
            let share = partitions / u32::try_from(members).expect("members");
            if held.len() == members && held.values().all(|n| *n == share) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{members} members of {group} did not share {partitions} partitions within 60 s: {:?}",
                held.values().collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(feature = "nats")]
impl Bus for Nats {
    type Config = inoutbox::nats::NatsConfig;
    type Publisher = inoutbox::nats::NatsPublisher;
    const NAME: &'static str = "NATS";
    const SLOT: usize = 3;

    async fn start() -> Self {
        let server = super::nats::NatsServer::start();
        let js = server.js().await;
        Self {
            server,
            js,
            partitions: Mutex::new(HashMap::new()),
            sent: Mutex::new(HashMap::new()),
        }
    }

    fn topic(&self, prefix: &str) -> String {
        super::unique(&format!("{NATS_TOPIC_PREFIX}{prefix}"))
    }

    async fn create_topic(&self, topic: &str, partitions: u32) {
        super::nats::create_streams(&self.js, topic, partitions).await;
        lock(&self.partitions).insert(topic.to_owned(), partitions);
    }

    async fn send(&self, topic: &str, msg: Msg) {
        use inoutbox::nats::{partition_for, subject};
        let partition = match (msg.partition, &msg.key, &msg.id) {
            (Some(p), _, _) => u32::try_from(p).expect("partition"),
            (None, Some(key), _) | (None, None, Some(key)) => {
                partition_for(key.as_bytes(), self.partitions_of(topic))
            }
            (None, None, None) => 0,
        };
        let mut headers = vec![
            ("ce_source", "tests"),
            ("ce_specversion", "1.0"),
            ("content-type", "application/json"),
        ];
        for (name, value) in [
            ("ce_id", &msg.id),
            ("ce_type", &msg.event_type),
            (inoutbox::nats::HEADER_KEY, &msg.key),
        ] {
            if let Some(value) = value {
                headers.push((name, value.as_str()));
            }
        }
        let seq = super::nats::publish(
            &self.js,
            &subject(topic, partition),
            &headers,
            msg.payload.clone(),
        )
        .await;
        lock(&self.sent)
            .entry((topic.to_owned(), partition))
            .or_default()
            .push(seq);
    }

    fn consumer(&self, topic: &str) -> inoutbox::nats::NatsConfig {
        super::nats::config(&self.server, topic, self.partitions_of(topic))
    }

    async fn publisher(&self, partitions: u32) -> inoutbox::nats::NatsPublisher {
        inoutbox::nats::NatsPublisher::connect(&self.server.url, partitions)
            .await
            .expect("NATS publisher")
    }

    async fn read_topic(
        &self,
        topic: &str,
        _partitions: u32,
        n: usize,
        within: Duration,
    ) -> Vec<Received> {
        super::nats::read_n(&self.js, topic, n, within).await
    }

    /// What the group has acknowledged on the partition (its lease consumers acknowledge with
    /// `AckPolicy::All`, so their acknowledgement floor plays the role of Kafka's committed
    /// offset; a lease's consumer starts after its predecessors' floor), as the number of the
    /// partition's messages at or below it.
    async fn committed(&self, group: &str, topic: &str, partition: u32) -> Option<i64> {
        let floor = super::nats::acknowledged(&self.js, topic, group, partition).await;
        if floor == 0 {
            return None;
        }
        let sent = lock(&self.sent);
        let below = sent
            .get(&(topic.to_owned(), partition))
            .map_or(0, |seqs| seqs.iter().filter(|s| **s <= floor).count());
        Some(i64::try_from(below).expect("count"))
    }

    fn offset(&self, topic: &str, partition: u32, index: usize) -> i64 {
        let sent = lock(&self.sent);
        let seq = sent
            .get(&(topic.to_owned(), partition))
            .and_then(|seqs| seqs.get(index))
            .unwrap_or_else(|| panic!("no message {index} sent to {topic}/{partition}"));
        i64::try_from(*seq).expect("sequence")
    }

    /// Four partitions, two members of the one group with two each: a lease is the group's,
    /// so two members never read one partition at once (two lease buckets would not do
    /// either: the members would share their partitions' consumer names).
    const RACE_PARTITIONS: u32 = 4;

    fn racers(&self, topic: &str, _group: &str) -> [inoutbox::nats::NatsConfig; 2] {
        [self.consumer(topic), self.consumer(topic)]
    }

    /// Until the two members hold two partitions each.
    async fn racers_ready(&self, topic: &str, group: &str) {
        self.shared(group, topic, Self::RACE_PARTITIONS, 2).await;
    }

    /// A member over its fair share gives its highest partition up first.
    const GATE_PARTITION: u32 = 3;

    /// The first member, over its share once the second has joined, gives the gated
    /// partition up: its run is stopped, and it no longer renews the lease while the message
    /// in hand is finished. Held past the lease TTL, the lease expires and the second member
    /// takes it: waits for that.
    async fn handed_over(&self, group: &str, topic: &str, _second: &mut super::Running) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = self.holder(group, topic, 0).await;
        loop {
            let gated = self.holder(group, topic, Self::GATE_PARTITION).await;
            if gated.is_some() && first.is_some() && gated != first {
                return format!(
                    "the lease of partition {} passed to the second member",
                    Self::GATE_PARTITION
                );
            }
            assert!(
                Instant::now() < deadline,
                "the second member did not take the gated partition within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(feature = "nats")]
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
