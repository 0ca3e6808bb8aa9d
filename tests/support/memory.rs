//! An in-memory broker that implements inoutbox's transport contract from outside the crate,
//! with the facade's public API only (`inoutbox::transport`, `inoutbox::shutdown`, never the
//! runtime crate): the proof that a second broker plugs into the real `Consumer` and `Relay`,
//! and a broker the tests can fault at will.
//!
//! - [`MemoryBroker`]: topics of N partitions (an append-only log each), committed positions
//!   per (group, topic, partition), and consumer groups whose partitions are dealt round-robin
//!   to their live members. Every change of membership bumps the group's generation and
//!   revokes the partitions that change hands: their run's token is cancelled, and their link
//!   no longer owns them and commits nothing, as in Kafka. What happens to ownership and
//!   commits is written to an audit log ([`Event`]) the tests check.
//! - [`MemoryPublisher`]: the relay's side. Partitions by a stable hash of the key, appends,
//!   answers with a [`Receipt`]; can refuse a topic or be unavailable for the next sends.
//! - [`MemoryTransport`]: the consumer's side. A group member that runs each partition it owns
//!   through [`Partitions::start`], follows rebalances, can deliver again what it delivered
//!   already (at least once), and leaves the group gracefully.
//! - [`RunningConsumer`]: a consumer on a [`MemoryTransport`], running in a task.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use inoutbox::inbox::Report;
use inoutbox::shutdown::CancellationToken;
use inoutbox::store::InboxStore;
use inoutbox::transport::{
    Delivery, OutgoingMessage, PartitionLink, Partitions, PublishError, Publisher, Receipt,
    Transport,
};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinError, JoinHandle, JoinSet};

/// `(topic, partition)`.
pub type PartitionKey = (Arc<str>, i32);

/// Headers in broker order: names, and values as bytes (`None` for a null value).
pub type Headers = Vec<(String, Option<Vec<u8>>)>;

/// A message as a producer hands it to the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// The key, if any.
    pub key: Option<Vec<u8>>,
    /// The payload, if any.
    pub payload: Option<Vec<u8>>,
    /// The headers.
    pub headers: Headers,
}

impl Message {
    /// A keyless message with this payload and no header.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Self {
            key: None,
            payload: Some(payload.into()),
            headers: Vec::new(),
        }
    }

    /// With this key.
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// With one more header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_owned(), Some(value.as_bytes().to_vec())));
        self
    }

    /// The first header `name` as text.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// A message in a partition's log.
#[derive(Clone, Debug)]
pub struct Stored {
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// The message.
    pub message: Message,
}

/// What happened to ownership and commits, in the order it happened: the broker's audit log.
///
/// A *lease* is one run of one partition by one member: granted when the member starts the
/// run, ended when a rebalance revokes it or the member releases it. Only the current lease of
/// a partition may commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A member joined the group; the group is now at `generation`.
    Joined {
        group: String,
        member: u64,
        generation: u64,
    },
    /// A member left the group; the group is now at `generation`.
    Left {
        group: String,
        member: u64,
        generation: u64,
    },
    /// A member started a run of a partition assigned to it, reading from `from`.
    Granted {
        group: String,
        partition: PartitionKey,
        member: u64,
        lease: u64,
        from: i64,
    },
    /// A rebalance (to `generation`) gave the partition to another member: the run's token was
    /// cancelled, its link owns the partition no more.
    Revoked {
        group: String,
        partition: PartitionKey,
        lease: u64,
        generation: u64,
    },
    /// The member ended the run itself (a restart, or leaving the group).
    Released {
        group: String,
        partition: PartitionKey,
        lease: u64,
    },
    /// A position was stored.
    Committed {
        group: String,
        partition: PartitionKey,
        lease: u64,
        position: i64,
    },
    /// A commit was refused: the lease no longer owned the partition.
    Refused {
        group: String,
        partition: PartitionKey,
        lease: u64,
        position: i64,
    },
}

/// A message the engine dead-lettered, as its partition's link was told.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The consumer group.
    pub group: String,
    /// The message.
    pub delivery: Delivery,
    /// Why.
    pub reason: String,
    /// Its id in the dead-letter table.
    pub id: i64,
}

/// The partition of a message: a stable hash (FNV-1a) of its key; keyless messages go to
/// partition 0.
pub fn partition_for(key: Option<&[u8]>, partitions: i32) -> i32 {
    let Some(key) = key else { return 0 };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let n = u64::try_from(partitions.max(1)).unwrap_or(1);
    i32::try_from(h % n).unwrap_or(0)
}

/// An in-memory broker: topics, committed positions, consumer groups and an audit log. Cheap
/// to clone: clones share the broker.
#[derive(Clone)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Bumped on every append and every change of membership: members wake up on it.
    changes: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    topics: BTreeMap<Arc<str>, Vec<Vec<Message>>>,
    groups: HashMap<String, Group>,
    /// Member and lease ids.
    next_id: u64,
    events: Vec<Event>,
    dead_letters: Vec<DeadLetter>,
}

#[derive(Default)]
struct Group {
    generation: u64,
    /// The live members, by id (join order), and the topics each subscribes to.
    members: BTreeMap<u64, Vec<Arc<str>>>,
    /// The assignment of the current generation.
    owners: HashMap<PartitionKey, u64>,
    /// The current run of each partition that has one.
    leases: HashMap<PartitionKey, Lease>,
    committed: HashMap<PartitionKey, i64>,
}

struct Lease {
    id: u64,
    member: u64,
    /// The run's token: cancelled when the partition is revoked.
    stop: CancellationToken,
    /// Where the run is: the position it started from, then the last one it committed.
    position: i64,
    /// With re-delivery: a commit past this position calls for a restart.
    mark: Option<i64>,
    /// A commit passed the mark: the member restarts the run.
    restart: bool,
}

/// Removes the leases `ending` picks and cancels their runs' tokens; returns them.
fn end_leases(
    leases: &mut HashMap<PartitionKey, Lease>,
    ending: impl Fn(&PartitionKey, &Lease) -> bool,
) -> Vec<(PartitionKey, Lease)> {
    let keys: Vec<PartitionKey> = leases
        .iter()
        .filter(|(key, lease)| ending(key, lease))
        .map(|(key, _)| key.clone())
        .collect();
    keys.into_iter()
        .map(|key| {
            let lease = leases.remove(&key).expect("lease");
            lease.stop.cancel();
            (key, lease)
        })
        .collect()
}

/// A lease just granted.
struct Grant {
    lease: u64,
    from: i64,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryBroker")
            .field("topics", &state.topics.keys().collect::<Vec<_>>())
            .field("groups", &state.groups.keys().collect::<Vec<_>>())
            .field("events", &state.events.len())
            .finish()
    }
}

impl MemoryBroker {
    /// An empty broker.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                changes: watch::channel(0).0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the members up (a message was appended, or the membership changed).
    fn changed(&self) {
        self.inner.changes.send_modify(|n| *n += 1);
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Creates `topic` with `partitions` partitions (nothing if it exists); the groups that
    /// subscribe to it rebalance.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        assert!(partitions > 0, "a topic has at least one partition");
        let mut state = self.lock();
        if state.topics.contains_key(topic) {
            return;
        }
        let count = usize::try_from(partitions).expect("partitions");
        state.topics.insert(topic.into(), vec![Vec::new(); count]);
        let subscribed: Vec<String> = state
            .groups
            .iter()
            .filter(|(_, g)| g.members.values().flatten().any(|t| &**t == topic))
            .map(|(name, _)| name.clone())
            .collect();
        for group in subscribed {
            state.rebalance(&group);
        }
        drop(state);
        self.changed();
    }

    /// Appends `message` to `topic`, to `partition` or else by the hash of its key; its
    /// `(partition, offset)`, or why not (an unknown topic or partition).
    pub fn append(
        &self,
        topic: &str,
        partition: Option<i32>,
        message: Message,
    ) -> Result<(i32, i64), String> {
        let mut state = self.lock();
        let Some(log) = state.topics.get_mut(topic) else {
            return Err(format!("unknown topic `{topic}`"));
        };
        let count = i32::try_from(log.len()).expect("partition count");
        let partition = partition.unwrap_or_else(|| partition_for(message.key.as_deref(), count));
        let Some(messages) = usize::try_from(partition).ok().and_then(|p| log.get_mut(p)) else {
            return Err(format!("unknown partition {topic}/{partition}"));
        };
        let offset = i64::try_from(messages.len()).expect("offset");
        messages.push(message);
        drop(state);
        self.changed();
        Ok((partition, offset))
    }

    /// Appends `message` to `topic` (see [`append`](Self::append)); panics on an unknown
    /// topic or partition.
    pub fn produce(&self, topic: &str, partition: Option<i32>, message: Message) -> (i32, i64) {
        self.append(topic, partition, message)
            .unwrap_or_else(|e| panic!("produce: {e}"))
    }

    /// Every message of `topic`, partition after partition, each in offset order.
    pub fn messages(&self, topic: &str) -> Vec<Stored> {
        let state = self.lock();
        let Some(log) = state.topics.get(topic) else {
            return Vec::new();
        };
        log.iter()
            .zip(0..)
            .flat_map(|(messages, partition)| {
                messages.iter().zip(0..).map(move |(m, offset)| Stored {
                    partition,
                    offset,
                    message: m.clone(),
                })
            })
            .collect()
    }

    /// The end offset (the next offset to write) of each partition of `topic`.
    pub fn end_offsets(&self, topic: &str) -> Vec<i64> {
        let state = self.lock();
        state.topics.get(topic).map_or_else(Vec::new, |log| {
            log.iter()
                .map(|m| i64::try_from(m.len()).expect("offset"))
                .collect()
        })
    }

    /// The position committed for `group` on `topic`/`partition`.
    pub fn committed(&self, group: &str, topic: &str, partition: i32) -> Option<i64> {
        let state = self.lock();
        state
            .groups
            .get(group)?
            .committed
            .get(&(Arc::from(topic), partition))
            .copied()
    }

    /// Whether `group` is settled on `topic`: every partition has a run that committed it to
    /// its end (or started there), with no restart due, and the committed position is the end.
    /// Nothing more happens on a settled topic until a message is appended.
    pub fn settled(&self, group: &str, topic: &str) -> bool {
        let state = self.lock();
        let (Some(g), Some(log)) = (state.groups.get(group), state.topics.get(topic)) else {
            return false;
        };
        (0..).zip(log).all(|(partition, messages)| {
            let end = i64::try_from(messages.len()).expect("offset");
            let key = (Arc::from(topic), partition);
            g.committed.get(&key).copied().unwrap_or(0) == end
                && g.leases
                    .get(&key)
                    .is_some_and(|l| l.position == end && !l.restart)
        })
    }

    /// Waits until `group` is [settled](Self::settled) on `topic`; the committed positions.
    /// Panics if it does not get there `within`.
    pub async fn wait_settled(&self, group: &str, topic: &str, within: Duration) -> Vec<i64> {
        let deadline = tokio::time::Instant::now() + within;
        while !self.settled(group, topic) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{group} did not settle on {topic} within {within:?}: committed {:?}, ends {:?}",
                self.committed_positions(group, topic),
                self.end_offsets(topic),
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.committed_positions(group, topic)
    }

    /// The position committed for `group` on each partition of `topic` (0 for none).
    pub fn committed_positions(&self, group: &str, topic: &str) -> Vec<i64> {
        (0..)
            .zip(self.end_offsets(topic))
            .map(|(partition, _)| self.committed(group, topic, partition).unwrap_or(0))
            .collect()
    }

    /// The audit log so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Commits stored for a lease after it was revoked or released: Kafka's rule is that
    /// there are none.
    pub fn commits_after_revocation(&self) -> Vec<Event> {
        let mut ended = HashSet::new();
        let mut late = Vec::new();
        for event in self.lock().events.iter() {
            match event {
                Event::Revoked { lease, .. } | Event::Released { lease, .. } => {
                    ended.insert(*lease);
                }
                Event::Committed { lease, .. } if ended.contains(lease) => {
                    late.push(event.clone());
                }
                _ => {}
            }
        }
        late
    }

    /// How many events of the audit log `pick` selects.
    pub fn count_events(&self, pick: impl Fn(&Event) -> bool) -> usize {
        self.lock().events.iter().filter(|e| pick(e)).count()
    }

    /// The current generation of `group` (0 before its first member joined).
    pub fn generation(&self, group: &str) -> u64 {
        self.lock().groups.get(group).map_or(0, |g| g.generation)
    }

    /// The partitions each live member of `group` is assigned, by member id.
    pub fn assignment(&self, group: &str) -> BTreeMap<u64, Vec<PartitionKey>> {
        let state = self.lock();
        let mut out: BTreeMap<u64, Vec<PartitionKey>> = BTreeMap::new();
        if let Some(g) = state.groups.get(group) {
            for (key, member) in &g.owners {
                out.entry(*member).or_default().push(key.clone());
            }
        }
        out.values_mut().for_each(|keys| keys.sort());
        out
    }

    /// The dead letters the links were told of.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.lock().dead_letters.clone()
    }

    // --- The members' side (used by `MemoryTransport` and `MemoryLink`) ----------------------

    /// A new member of `group`, subscribed to `topics`: the group rebalances.
    fn join(&self, group: &str, topics: &[Arc<str>]) -> u64 {
        let mut state = self.lock();
        let member = state.next_id();
        let g = state.groups.entry(group.to_owned()).or_default();
        g.members.insert(member, topics.to_vec());
        let generation = state.rebalance(group);
        state.events.push(Event::Joined {
            group: group.to_owned(),
            member,
            generation,
        });
        drop(state);
        self.changed();
        member
    }

    /// The member leaves `group`: its runs are released and the group rebalances.
    fn leave(&self, group: &str, member: u64) {
        let mut state = self.lock();
        let State { groups, events, .. } = &mut *state;
        let Some(g) = groups.get_mut(group) else {
            return;
        };
        for (key, lease) in end_leases(&mut g.leases, |_, lease| lease.member == member) {
            events.push(Event::Released {
                group: group.to_owned(),
                partition: key,
                lease: lease.id,
            });
        }
        g.members.remove(&member);
        let generation = state.rebalance(group);
        state.events.push(Event::Left {
            group: group.to_owned(),
            member,
            generation,
        });
        drop(state);
        self.changed();
    }

    /// The partitions assigned to `member` in the current generation.
    fn assigned(&self, group: &str, member: u64) -> Vec<PartitionKey> {
        let state = self.lock();
        let Some(g) = state.groups.get(group) else {
            return Vec::new();
        };
        let mut keys: Vec<PartitionKey> = g
            .owners
            .iter()
            .filter(|(_, m)| **m == member)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Starts a run of `key` for `member`, reading from the committed position, or with
    /// `rewind = (from, mark)` from `from`. With `redeliver`, a commit past the mark (`from`
    /// without a rewind) calls for a restart. `None` unless the partition is assigned to the
    /// member and has no run.
    fn grant(
        &self,
        group: &str,
        key: &PartitionKey,
        member: u64,
        stop: CancellationToken,
        rewind: Option<(i64, i64)>,
        redeliver: bool,
    ) -> Option<Grant> {
        let mut state = self.lock();
        let lease = state.next_id();
        let g = state.groups.get_mut(group)?;
        if g.owners.get(key) != Some(&member) || g.leases.contains_key(key) {
            return None;
        }
        let committed = g.committed.get(key).copied().unwrap_or(0);
        let (from, mark) = rewind.unwrap_or((committed, committed));
        g.leases.insert(
            key.clone(),
            Lease {
                id: lease,
                member,
                stop,
                position: from,
                mark: redeliver.then_some(mark),
                restart: false,
            },
        );
        state.events.push(Event::Granted {
            group: group.to_owned(),
            partition: key.clone(),
            member,
            lease,
            from,
        });
        Some(Grant { lease, from })
    }

    /// Ends the run `lease` of `key` (the member stops feeding it).
    fn release(&self, group: &str, key: &PartitionKey, lease: u64) {
        let mut state = self.lock();
        let State { groups, events, .. } = &mut *state;
        let Some(g) = groups.get_mut(group) else {
            return;
        };
        if g.leases.get(key).is_some_and(|l| l.id == lease) {
            g.leases.remove(key);
            events.push(Event::Released {
                group: group.to_owned(),
                partition: key.clone(),
                lease,
            });
        }
    }

    /// Whether `lease` is the current run of `key`.
    fn owns(&self, group: &str, key: &PartitionKey, lease: u64) -> bool {
        self.lock().owns(group, key, lease)
    }

    /// Whether `lease` (the current run of `key`) is to be restarted for re-delivery.
    fn restart_due(&self, group: &str, key: &PartitionKey, lease: u64) -> bool {
        let state = self.lock();
        state
            .groups
            .get(group)
            .and_then(|g| g.leases.get(key))
            .is_some_and(|l| l.id == lease && l.restart)
    }

    /// Up to `max` messages of `key` from `from`, as deliveries.
    fn read(&self, key: &PartitionKey, from: i64, max: usize) -> Vec<Arc<Delivery>> {
        let state = self.lock();
        let Some(messages) = state
            .topics
            .get(&key.0)
            .and_then(|log| log.get(usize::try_from(key.1).ok()?))
        else {
            return Vec::new();
        };
        messages
            .iter()
            .enumerate()
            .skip(usize::try_from(from).unwrap_or(0))
            .take(max)
            .map(|(offset, m)| {
                Arc::new(Delivery {
                    topic: key.0.clone(),
                    partition: key.1,
                    offset: i64::try_from(offset).expect("offset"),
                    key: m.key.clone(),
                    payload: m.payload.clone(),
                    headers: m.headers.clone(),
                })
            })
            .collect()
    }
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn owns(&self, group: &str, key: &PartitionKey, lease: u64) -> bool {
        self.groups
            .get(group)
            .and_then(|g| g.leases.get(key))
            .is_some_and(|l| l.id == lease)
    }

    /// Stores a commit, whoever makes it: the ownership check is the link's (see
    /// [`MemoryLink::commit`]), and the audit log shows a commit that should not have passed.
    fn store_commit(&mut self, group: &str, key: &PartitionKey, lease: u64, position: i64) {
        if let Some(g) = self.groups.get_mut(group) {
            g.committed.insert(key.clone(), position);
            if let Some(run) = g.leases.get_mut(key).filter(|l| l.id == lease) {
                run.position = position;
                run.restart |= run.mark.is_some_and(|mark| position > mark);
            }
        }
        self.events.push(Event::Committed {
            group: group.to_owned(),
            partition: key.clone(),
            lease,
            position,
        });
    }

    /// A new generation of `group`: every partition of every subscribed topic, in order, is
    /// dealt to the members subscribed to its topic in turn (round-robin); the runs of
    /// partitions that change hands are revoked. Partitions that stay keep their run
    /// (cooperative, sticky). The new generation.
    fn rebalance(&mut self, group: &str) -> u64 {
        let State {
            topics,
            groups,
            events,
            ..
        } = self;
        let Some(g) = groups.get_mut(group) else {
            return 0;
        };
        g.generation += 1;
        let subscribed: BTreeSet<&Arc<str>> = g.members.values().flatten().collect();
        let mut owners = HashMap::new();
        let mut turn = 0;
        for topic in subscribed {
            let Some(log) = topics.get(topic) else {
                continue; // not created yet
            };
            let candidates: Vec<u64> = g
                .members
                .iter()
                .filter(|(_, ts)| ts.contains(topic))
                .map(|(id, _)| *id)
                .collect();
            for partition in 0..i32::try_from(log.len()).expect("partition count") {
                owners.insert(
                    (topic.clone(), partition),
                    candidates[turn % candidates.len()],
                );
                turn += 1;
            }
        }
        let moved = |key: &PartitionKey, lease: &Lease| owners.get(key) != Some(&lease.member);
        for (key, lease) in end_leases(&mut g.leases, moved) {
            events.push(Event::Revoked {
                group: group.to_owned(),
                partition: key,
                lease: lease.id,
                generation: g.generation,
            });
        }
        g.owners = owners;
        g.generation
    }
}

// ---------------------------------------------------------------------------------------------
// The consumer's side.

/// One run of one partition, as the engine sees it: commits while the run's lease is the
/// partition's current one.
pub struct MemoryLink {
    broker: MemoryBroker,
    group: String,
    key: PartitionKey,
    lease: u64,
}

impl PartitionLink for MemoryLink {
    fn owned(&self) -> bool {
        self.broker.owns(&self.group, &self.key, self.lease)
    }

    /// Stores `position` if the run still owns the partition. The check and the store happen
    /// under the broker's lock, which a rebalance also takes: no commit is stored for a
    /// partition after its revocation (Kafka's rule).
    fn commit(&self, position: i64) -> bool {
        let mut state = self.broker.lock();
        if !state.owns(&self.group, &self.key, self.lease) {
            state.events.push(Event::Refused {
                group: self.group.clone(),
                partition: self.key.clone(),
                lease: self.lease,
                position,
            });
            return false;
        }
        state.store_commit(&self.group, &self.key, self.lease, position);
        true
    }

    async fn commit_now(&self, position: i64) -> Result<(), String> {
        if self.commit(position) {
            Ok(())
        } else {
            Err(format!("{} is no longer owned", self.name()))
        }
    }

    async fn dead_lettered(&self, delivery: &Delivery, reason: &str, id: i64) {
        self.broker.lock().dead_letters.push(DeadLetter {
            group: self.group.clone(),
            delivery: delivery.clone(),
            reason: reason.to_owned(),
            id,
        });
    }

    fn name(&self) -> String {
        format!("{}/{}", self.key.0, self.key.1)
    }
}

/// The consumer's side of the memory broker: a member of the consumer group that feeds the
/// engine the partitions it owns. `Consumer::builder(group, store, MemoryTransport::new(..))`.
#[derive(Clone, Debug)]
#[must_use]
pub struct MemoryTransport {
    broker: MemoryBroker,
    topics: Vec<Arc<str>>,
    buffer: usize,
    grace: Duration,
    poll: Duration,
    redeliver: Option<i64>,
}

impl MemoryTransport {
    /// A member of the consumer's group on `broker`, subscribed to `topics`.
    pub fn new<T: AsRef<str>>(broker: &MemoryBroker, topics: impl IntoIterator<Item = T>) -> Self {
        Self {
            broker: broker.clone(),
            topics: topics.into_iter().map(|t| Arc::from(t.as_ref())).collect(),
            buffer: 16,
            grace: Duration::from_secs(10),
            poll: Duration::from_millis(5),
            redeliver: None,
        }
    }

    /// Messages handed to a partition's run ahead of it (default 16).
    pub fn buffer(mut self, messages: usize) -> Self {
        self.buffer = messages.max(1);
        self
    }

    /// How long a stop waits for the runs to finish the messages in hand (default 10 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// At-least-once delivery: whenever a run commits past the position it started from (for
    /// a restarted run, past the position it was restarted at), the run is restarted `back`
    /// messages before the committed position, as a consumer that lost its last commits would
    /// be. The run in hand finishes first (its channel is closed: it resolves what it was
    /// handed and commits), then the new run is handed the last `back` resolved messages
    /// again. Each restart follows new progress, so the partition still gets to its end.
    pub fn redeliver(mut self, back: i64) -> Self {
        self.redeliver = Some(back.max(1));
        self
    }
}

/// Why a [`MemoryTransport`] stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum MemoryTransportError {
    /// A partition's run failed (it panicked).
    Run {
        /// `topic/partition`.
        partition: String,
        /// What happened.
        message: String,
    },
}

impl std::fmt::Display for MemoryTransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Run { partition, message } => {
                write!(f, "the run of partition {partition} failed: {message}")
            }
        }
    }
}

impl std::error::Error for MemoryTransportError {}

impl Transport for MemoryTransport {
    type Error = MemoryTransportError;

    async fn run<P: Partitions>(
        self,
        partitions: P,
        shutdown: CancellationToken,
    ) -> Result<(), MemoryTransportError> {
        let group = partitions.group().to_owned();
        let id = self.broker.join(&group, &self.topics);
        // Joined from the first assignment (the broker assigns at once) until it leaves.
        partitions.health().set_joined(true);
        let member = Member {
            settings: self,
            partitions,
            group,
            id,
            shutdown,
            runs: HashMap::new(),
            retired: Vec::new(),
            first_error: None,
        };
        member.run().await
    }
}

/// A member of the group and the partition runs it feeds.
struct Member<P> {
    settings: MemoryTransport,
    partitions: P,
    group: String,
    id: u64,
    /// The consumer's shutdown: each run gets a child of it.
    shutdown: CancellationToken,
    runs: HashMap<PartitionKey, Run>,
    /// Runs no longer fed (revoked, restarted, ended), finishing; reaped as they end.
    retired: Vec<(PartitionKey, JoinHandle<()>)>,
    first_error: Option<MemoryTransportError>,
}

/// One run of one partition.
struct Run {
    lease: u64,
    /// `None` once closed for a restart: the run finishes what it was handed and ends.
    sender: Option<mpsc::Sender<Arc<Delivery>>>,
    handle: JoinHandle<()>,
    /// The next offset to hand it.
    next: i64,
}

impl<P: Partitions> Member<P> {
    /// Follows the group and feeds the runs until shutdown; then leaves.
    async fn run(mut self) -> Result<(), MemoryTransportError> {
        let mut changes = self.settings.broker.subscribe();
        let mut tick = tokio::time::interval(self.settings.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.follow().await;
            // Woken by an append or a rebalance; the tick catches runs that made room in their
            // channel, commits that call for a restart, and runs that ended.
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                _ = changes.changed() => {}
                _ = tick.tick() => {}
            }
        }
        self.leave().await
    }

    /// One round: retires the runs of revoked partitions, restarts runs for re-delivery,
    /// starts runs of newly assigned partitions, and hands every run what it has room for.
    async fn follow(&mut self) {
        let broker = self.settings.broker.clone();
        let keys: Vec<PartitionKey> = self.runs.keys().cloned().collect();
        for key in keys {
            let run = &self.runs[&key];
            let owned = broker.owns(&self.group, &key, run.lease);
            // Revoked: its token is cancelled already. Ended by itself while fed (a panic, a
            // message abandoned): the partition gets a new run from the committed position.
            if !owned || (run.sender.is_some() && run.handle.is_finished()) {
                let run = self.runs.remove(&key).expect("run");
                if owned {
                    broker.release(&self.group, &key, run.lease);
                }
                self.retired.push((key, run.handle));
            }
        }
        if let Some(back) = self.settings.redeliver {
            self.redeliver(back);
        }
        for key in broker.assigned(&self.group, self.id) {
            if !self.runs.contains_key(&key) {
                self.start(key, None);
            }
        }
        for (key, run) in &mut self.runs {
            let Some(sender) = &run.sender else {
                continue;
            };
            let room = sender.capacity();
            if room == 0 {
                continue;
            }
            for delivery in broker.read(key, run.next, room) {
                let offset = delivery.offset;
                if sender.try_send(delivery).is_err() {
                    break;
                }
                run.next = offset + 1;
            }
        }
        self.reap().await;
    }

    /// Closes the channel of each run the broker says is due for a restart; restarts the
    /// partitions whose closed run has ended, `back` messages before the committed position.
    fn redeliver(&mut self, back: i64) {
        let broker = self.settings.broker.clone();
        let mut restart = Vec::new();
        for (key, run) in &mut self.runs {
            match &run.sender {
                Some(_) if broker.restart_due(&self.group, key, run.lease) => run.sender = None,
                None if run.handle.is_finished() => restart.push(key.clone()),
                _ => {}
            }
        }
        for key in restart {
            let run = self.runs.remove(&key).expect("run");
            let committed = broker.committed(&self.group, &key.0, key.1).unwrap_or(0);
            broker.release(&self.group, &key, run.lease);
            self.retired.push((key.clone(), run.handle));
            self.start(key, Some(((committed - back).max(0), committed)));
        }
    }

    /// Starts a run of `key` if the broker grants it: from the committed position, or with
    /// `rewind = (from, mark)` from `from` (see [`MemoryBroker::grant`]).
    fn start(&mut self, key: PartitionKey, rewind: Option<(i64, i64)>) {
        let stop = self.shutdown.child_token();
        let broker = &self.settings.broker;
        let redeliver = self.settings.redeliver.is_some();
        let Some(grant) = broker.grant(&self.group, &key, self.id, stop.clone(), rewind, redeliver)
        else {
            return;
        };
        let (sender, deliveries) = mpsc::channel(self.settings.buffer);
        let link = MemoryLink {
            broker: broker.clone(),
            group: self.group.clone(),
            key: key.clone(),
            lease: grant.lease,
        };
        let handle = self.partitions.start(link, deliveries, stop);
        self.runs.insert(
            key,
            Run {
                lease: grant.lease,
                sender: Some(sender),
                handle,
                next: grant.from,
            },
        );
    }

    /// Collects the retired runs that ended; a failed one is the member's error.
    async fn reap(&mut self) {
        let (ended, running) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|(_, handle)| handle.is_finished());
        self.retired = running;
        for (key, handle) in ended {
            if let Err(e) = handle.await {
                self.failed(&key, &e);
            }
        }
    }

    fn failed(&mut self, key: &PartitionKey, error: &JoinError) {
        let error = MemoryTransportError::Run {
            partition: format!("{}/{}", key.0, key.1),
            message: error.to_string(),
        };
        eprintln!("memory transport: {error}");
        self.first_error.get_or_insert(error);
    }

    /// The shutdown: the runs' tokens (children of the shutdown) are cancelled already, so
    /// each finishes the message in hand and commits what it resolved while its partition is
    /// still owned; after the grace period the rest is aborted. Then the member leaves.
    async fn leave(mut self) -> Result<(), MemoryTransportError> {
        let mut runs = JoinSet::new();
        let mut aborts = Vec::new();
        let handles: Vec<_> = self
            .runs
            .drain()
            .map(|(key, run)| (key, run.handle)) // dropping the sender closes the channel
            .chain(self.retired.drain(..))
            .collect();
        for (key, handle) in handles {
            aborts.push(handle.abort_handle());
            runs.spawn(async move { (key, handle.await) });
        }
        let mut failures = Vec::new();
        let in_time = tokio::time::timeout(self.settings.grace, async {
            while let Some(joined) = runs.join_next().await {
                if let Ok((key, Err(e))) = joined {
                    failures.push((key, e));
                }
            }
        })
        .await
        .is_ok();
        if !in_time {
            eprintln!(
                "memory transport: runs of {} still in hand after {:?}; aborted",
                self.group, self.settings.grace
            );
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
        }
        for (key, e) in &failures {
            self.failed(key, e);
        }
        self.settings.broker.leave(&self.group, self.id);
        self.first_error.map_or(Ok(()), Err)
    }
}

// ---------------------------------------------------------------------------------------------
// The relay's side.

/// The relay's side of the memory broker: `Relay::builder(store, MemoryPublisher::new(..))`.
/// Clones share their fault switches, so a test keeps one to flip them while the relay runs.
#[derive(Clone, Debug)]
pub struct MemoryPublisher {
    broker: MemoryBroker,
    faults: Arc<Mutex<Faults>>,
}

#[derive(Debug, Default)]
struct Faults {
    /// Topics whose messages the broker refuses.
    rejected: HashSet<String>,
    /// How many of the next sends fail as if the broker were unreachable.
    unavailable: u32,
}

/// What [`MemoryPublisher::fail_next`]'s failures say.
pub const UNAVAILABLE: &str = "memory broker unavailable (fault switch)";

impl MemoryPublisher {
    /// A publisher to `broker`, without faults.
    pub fn new(broker: &MemoryBroker) -> Self {
        Self {
            broker: broker.clone(),
            faults: Arc::default(),
        }
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// From now on the broker refuses every message for `topic`
    /// ([`PublishError::rejected`]: the relay parks the row after its attempts).
    pub fn reject_topic(&self, topic: &str) {
        self.faults().rejected.insert(topic.to_owned());
    }

    /// The next `sends` sends fail at once, as with a broker out of reach
    /// ([`PublishError::unavailable`]: the relay retries the row, and holds back the later rows
    /// of its key meanwhile).
    pub fn fail_next(&self, sends: u32) {
        self.faults().unavailable = sends;
    }

    /// How many of the failures [`fail_next`](Self::fail_next) asked for are still to come.
    pub fn failures_left(&self) -> u32 {
        self.faults().unavailable
    }
}

impl Publisher for MemoryPublisher {
    /// Appends the message at once, to the partition of its key: a message is appended in the
    /// order it is handed over, so one key's messages keep their order. An unavailable broker
    /// fails the send at once (nothing appended, the relay holds back the key); a refused
    /// message fails its acknowledgement.
    fn send(
        &self,
        message: &OutgoingMessage<'_>,
    ) -> Result<
        impl Future<Output = Result<Receipt, PublishError>> + Send + 'static + use<>,
        PublishError,
    > {
        {
            let mut faults = self.faults();
            if faults.unavailable > 0 {
                faults.unavailable -= 1;
                return Err(PublishError::unavailable(UNAVAILABLE));
            }
            if faults.rejected.contains(message.topic) {
                let refused = PublishError::rejected(format!(
                    "topic `{}` refuses messages (fault switch)",
                    message.topic
                ));
                return Ok(std::future::ready(Err(refused)));
            }
        }
        let stored = Message {
            key: message.key.map(|k| k.as_bytes().to_vec()),
            payload: Some(message.payload.to_vec()),
            headers: message
                .headers()
                .map(|(name, value)| (name.to_owned(), Some(value.as_bytes().to_vec())))
                .collect(),
        };
        let receipt = self
            .broker
            .append(message.topic, None, stored)
            .map(|(partition, offset)| Receipt::new(partition, offset))
            .map_err(PublishError::rejected);
        Ok(std::future::ready(receipt))
    }
}

// ---------------------------------------------------------------------------------------------
// A consumer on the memory broker, running in a task.

/// A consumer on a [`MemoryTransport`] running in a task, with its reports.
pub struct RunningConsumer {
    reports: mpsc::UnboundedReceiver<Report>,
    /// Every report received so far.
    pub seen: Vec<Report>,
    /// The consumer's health, as its transport and engine set it.
    pub health: inoutbox::telemetry::Health,
    stop: CancellationToken,
    handle: Option<JoinHandle<Result<(), MemoryTransportError>>>,
}

impl RunningConsumer {
    /// Builds the consumer and runs it in a task until [`stop`](Self::stop).
    pub fn start<S: InboxStore>(builder: inoutbox::ConsumerBuilder<S, MemoryTransport>) -> Self {
        super::init_logging();
        let (tx, reports) = mpsc::unbounded_channel();
        let consumer = builder.reports(tx).build().expect("build consumer");
        let health = consumer.health();
        let stop = CancellationToken::new();
        let handle = tokio::spawn(consumer.run_until_cancelled(stop.clone()));
        Self {
            reports,
            seen: Vec::new(),
            health,
            stop,
            handle: Some(handle),
        }
    }

    /// Receives reports until `done` holds for all seen so far; panics after `within`.
    pub async fn until(&mut self, within: Duration, done: impl Fn(&[Report]) -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        while !done(&self.seen) {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(report)) => self.seen.push(report),
                Ok(None) => panic!("the consumer stopped; reports: {:#?}", self.seen),
                Err(_) => panic!(
                    "not there within {within:?}; {} reports: {:#?}",
                    self.seen.len(),
                    self.seen
                ),
            }
        }
    }

    /// Stops gracefully (the transport leaves the group) and returns every report.
    pub async fn stop(mut self) -> Vec<Report> {
        self.stop.cancel();
        let handle = self.handle.take().expect("running");
        tokio::time::timeout(Duration::from_secs(30), handle)
            .await
            .expect("the consumer stops within 30 s")
            .expect("consumer task")
            .expect("consumer run");
        while let Ok(report) = self.reports.try_recv() {
            self.seen.push(report);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for RunningConsumer {
    /// A consumer left running by a failed test stops with it.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
