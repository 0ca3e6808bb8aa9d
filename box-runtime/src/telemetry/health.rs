//! Liveness and readiness of a consumer or a relay, as a cheap cloneable handle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The health of a [`Consumer`](crate::Consumer) or a [`Relay`](crate::relay::Relay): what a
/// liveness and a readiness probe ask. Cheap to clone and to read (atomics); the consumer or
/// relay updates it as it runs.
///
/// - [`live`](Self::live): its run loop is running (from the start of `run` to its end).
/// - [`ready`](Self::ready): live, joined (a consumer: it has received an assignment from
///   the group coordinator, even of no partition; a relay: its workers have opened their
///   sessions), and its database answered its last use (a probe of the gauge sampler, every
///   sample interval, or a cycle).
/// - [`last_cycle`](Self::last_cycle): when it last completed a cycle: a consumer, a batch
///   of messages resolved; a relay, a read (and publication) of its outbox.
///
/// ```no_run
/// # async fn demo(consumer: inoutbox::Consumer<inoutbox::PgStore, inoutbox::KafkaConfig>) {
/// let health = consumer.health();
/// tokio::spawn(consumer.run_until_signal());
/// // later, in an HTTP handler:
/// let status = if health.ready() { 200 } else { 503 };
/// # let _ = status;
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Health(Arc<State>);

#[derive(Debug)]
struct State {
    live: AtomicBool,
    joined: AtomicBool,
    database: AtomicBool,
    /// Milliseconds since the Unix epoch; 0 = never.
    last_cycle: AtomicU64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            live: AtomicBool::new(false),
            joined: AtomicBool::new(false),
            // Until a probe says otherwise: the store was reachable when it was built.
            database: AtomicBool::new(true),
            last_cycle: AtomicU64::new(0),
        }
    }
}

impl Health {
    /// Whether the run loop is running.
    pub fn live(&self) -> bool {
        self.0.live.load(Ordering::Relaxed)
    }

    /// Whether it is live, joined and its database reachable.
    pub fn ready(&self) -> bool {
        self.live() && self.joined() && self.database_reachable()
    }

    /// Whether it has joined its group (see the type's docs).
    pub fn joined(&self) -> bool {
        self.0.joined.load(Ordering::Relaxed)
    }

    /// Whether the database answered its last use: the last probe of the sampler or the last
    /// cycle, whichever came last.
    pub fn database_reachable(&self) -> bool {
        self.0.database.load(Ordering::Relaxed)
    }

    /// When the last cycle completed; `None` before the first.
    pub fn last_cycle(&self) -> Option<SystemTime> {
        match self.0.last_cycle.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(UNIX_EPOCH + Duration::from_millis(ms)),
        }
    }

    pub(crate) fn set_live(&self, live: bool) {
        self.0.live.store(live, Ordering::Relaxed);
    }

    /// Sets whether the consumer or relay is joined: for a [`Transport`](crate::transport::Transport),
    /// whether its member holds an assignment of the group (even of no partition); the
    /// consumer clears it when it stops.
    pub fn set_joined(&self, joined: bool) {
        self.0.joined.store(joined, Ordering::Relaxed);
    }

    pub(crate) fn set_database(&self, reachable: bool) {
        self.0.database.store(reachable, Ordering::Relaxed);
    }

    /// A cycle completed now (the database answered it).
    pub(crate) fn cycle(&self) {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        self.0.last_cycle.store(ms, Ordering::Relaxed);
        self.set_database(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_live_joined_and_database() {
        let h = Health::default();
        assert!(!h.live() && !h.ready() && h.last_cycle().is_none());
        h.set_live(true);
        assert!(!h.ready(), "not joined yet");
        h.set_joined(true);
        assert!(h.ready());
        h.set_database(false);
        assert!(!h.ready(), "database unreachable");
        let before = SystemTime::now() - Duration::from_millis(1);
        h.cycle();
        assert!(h.ready(), "a cycle proves the database");
        assert!(h.last_cycle().is_some_and(|t| t >= before));
        let clone = h.clone();
        h.set_live(false);
        assert!(!clone.live() && !clone.ready(), "clones share the state");
    }
}
