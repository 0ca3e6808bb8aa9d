//! A link: the toxics that apply to a set of connections, the connections themselves (so they
//! can be reset), and counters.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// The faults applied to the connections of a link, in both directions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Toxics {
    /// Added to every chunk, in each direction.
    pub latency: Duration,
    /// Each chunk's latency is drawn uniformly from `latency - jitter ..= latency + jitter`
    /// (never below zero); chunks still arrive in order.
    pub jitter: Duration,
    /// Bytes per second per direction of each connection; `None` for no limit.
    pub bandwidth: Option<u64>,
    /// A partition: bytes are read and dropped, nothing is forwarded, nothing is closed. A new
    /// connection is accepted and not connected upstream until the link heals.
    pub blackhole: bool,
}

/// Counters of a link (or, summed, of a proxy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open now.
    pub open: u64,
    /// Bytes forwarded from clients to the upstream.
    pub bytes_up: u64,
    /// Bytes forwarded from the upstream to clients.
    pub bytes_down: u64,
    /// Bytes read and dropped by a blackhole.
    pub dropped: u64,
    /// Connections closed with a reset (by [`Link::reset`], or because a side reset).
    pub resets: u64,
}

impl std::ops::Add for Stats {
    type Output = Stats;

    fn add(self, o: Stats) -> Stats {
        Stats {
            accepted: self.accepted + o.accepted,
            open: self.open + o.open,
            bytes_up: self.bytes_up + o.bytes_up,
            bytes_down: self.bytes_down + o.bytes_down,
            dropped: self.dropped + o.dropped,
            resets: self.resets + o.resets,
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) accepted: AtomicU64,
    pub(crate) open: AtomicU64,
    pub(crate) bytes_up: AtomicU64,
    pub(crate) bytes_down: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) resets: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

pub(crate) struct LinkState {
    pub(crate) toxics: watch::Sender<Toxics>,
    /// Open connections and the signal that resets each.
    pub(crate) conns: Mutex<HashMap<u64, Arc<Notify>>>,
    pub(crate) counters: Counters,
}

/// The toxics of a set of connections: all of a proxy's (its default link, whose setters
/// [`Proxy`](crate::Proxy) repeats), or those of the clients a [`Proxy::link`](crate::Proxy::link)
/// predicate picks. Changes apply at once, to open connections and new ones. Cloning gives
/// another handle to the same link.
#[derive(Clone)]
pub struct Link {
    pub(crate) state: Arc<LinkState>,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            state: Arc::new(LinkState {
                toxics: watch::channel(Toxics::default()).0,
                conns: Mutex::new(HashMap::new()),
                counters: Counters::default(),
            }),
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("toxics", &self.toxics())
            .field("stats", &self.stats())
            .finish()
    }
}

/// A predicate choosing the clients of a link by their address.
pub(crate) type PeerFilter = Box<dyn Fn(SocketAddr) -> bool + Send + Sync>;

impl Link {
    /// The toxics in force.
    pub fn toxics(&self) -> Toxics {
        *self.state.toxics.borrow()
    }

    /// Replaces every toxic at once.
    pub fn set_toxics(&self, toxics: Toxics) {
        self.state.toxics.send_replace(toxics);
    }

    /// Adds `latency`, give or take up to `jitter` (uniformly), to every chunk in each direction.
    pub fn set_latency(&self, latency: Duration, jitter: Duration) {
        self.state.toxics.send_modify(|t| {
            t.latency = latency;
            t.jitter = jitter;
        });
    }

    /// Limits each direction of each connection to `bytes_per_second` (`None`: no limit).
    pub fn set_bandwidth(&self, bytes_per_second: Option<u64>) {
        self.state
            .toxics
            .send_modify(|t| t.bandwidth = bytes_per_second.map(|b| b.max(1)));
    }

    /// Starts (`true`) or heals (`false`) a partition: while it lasts, bytes are read and
    /// dropped in both directions, nothing is forwarded, and no socket is closed (a close
    /// or reset by either side reaches the other only after the heal).
    pub fn set_blackhole(&self, on: bool) {
        self.state.toxics.send_modify(|t| t.blackhole = on);
    }

    /// Starts a partition (see [`set_blackhole`](Self::set_blackhole)).
    pub fn blackhole(&self) {
        self.set_blackhole(true);
    }

    /// Ends a partition (see [`set_blackhole`](Self::set_blackhole)).
    pub fn heal(&self) {
        self.set_blackhole(false);
    }

    /// Removes every toxic.
    pub fn clear(&self) {
        self.set_toxics(Toxics::default());
    }

    /// Closes every open connection of the link with a reset (RST, `SO_LINGER` 0) on both
    /// sides; returns how many there were. The resets happen on the proxy's thread just after.
    pub fn reset(&self) -> usize {
        let conns = lock(&self.state.conns);
        for signal in conns.values() {
            signal.notify_one();
        }
        conns.len()
    }

    /// The link's counters.
    pub fn stats(&self) -> Stats {
        let c = &self.state.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            accepted: get(&c.accepted),
            open: get(&c.open),
            bytes_up: get(&c.bytes_up),
            bytes_down: get(&c.bytes_down),
            dropped: get(&c.dropped),
            resets: get(&c.resets),
        }
    }

    pub(crate) fn blackholed(&self) -> bool {
        self.state.toxics.borrow().blackhole
    }

    /// Waits until the link is not blackholed.
    pub(crate) async fn healed(&self) {
        let mut rx = self.state.toxics.subscribe();
        // The sender lives as long as the link: the wait ends only by a heal.
        let _ = rx.wait_for(|t| !t.blackhole).await;
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
