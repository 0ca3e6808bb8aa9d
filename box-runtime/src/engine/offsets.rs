//! The commit position of one partition: it never passes a message that is not resolved.

use std::collections::BTreeSet;

/// Keeps the committed offset of one partition from passing a message that is not resolved.
///
/// Messages may be resolved out of order (with key-ordered lanes): a message marked
/// [`start`](Self::start)ed is in flight until resolved, and one marked held (failed, left
/// unacknowledged) stays unresolved. The commit position never passes the lowest unresolved
/// offset. Messages never started are taken as resolved in offset order.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    in_flight: BTreeSet<i64>,
    held: BTreeSet<i64>,
    highest: Option<i64>,
    committed: Option<i64>,
}

impl OffsetTracker {
    /// Marks `offset` in flight: handed to a lane, not resolved yet.
    pub fn start(&mut self, offset: i64) {
        self.in_flight.insert(offset);
        self.highest = Some(self.highest.map_or(offset, |h| h.max(offset)));
    }

    /// Marks `offset` resolved; returns the new commit position (next offset to read) if it
    /// advanced.
    pub fn resolve(&mut self, offset: i64) -> Option<i64> {
        self.held.remove(&offset);
        self.in_flight.remove(&offset);
        let highest = self.highest.map_or(offset, |h| h.max(offset));
        self.highest = Some(highest);
        let position = self.lowest_unresolved().unwrap_or(highest + 1);
        self.advance(position)
    }

    /// Marks `offset` held: not resolved. Returns the new commit position if it advanced (it
    /// can, up to the held offset).
    pub fn hold(&mut self, offset: i64) -> Option<i64> {
        self.in_flight.remove(&offset);
        self.held.insert(offset);
        self.highest = Some(self.highest.map_or(offset, |h| h.max(offset)));
        let position = self.lowest_unresolved().unwrap_or(offset);
        self.advance(position)
    }

    fn lowest_unresolved(&self) -> Option<i64> {
        match (self.held.first(), self.in_flight.first()) {
            (Some(h), Some(f)) => Some(*h.min(f)),
            (h, f) => h.or(f).copied(),
        }
    }

    fn advance(&mut self, position: i64) -> Option<i64> {
        if self.committed.is_none_or(|c| position > c) {
            self.committed = Some(position);
            Some(position)
        } else {
            None
        }
    }

    /// The lowest offset held (left unacknowledged), if any: the commit position cannot pass it.
    pub fn lowest_held(&self) -> Option<i64> {
        self.held.first().copied()
    }

    /// The last commit position handed out.
    pub fn position(&self) -> Option<i64> {
        self.committed
    }
}

#[cfg(test)]
mod tests {
    use super::OffsetTracker;

    #[test]
    fn commit_position_follows_resolved_messages() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.resolve(0), Some(1));
        assert_eq!(t.resolve(1), Some(2));
    }

    #[test]
    fn commit_position_never_passes_a_held_message() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.resolve(4), Some(5));
        assert_eq!(t.hold(5), None);
        assert_eq!(t.resolve(6), None);
        assert_eq!(t.resolve(7), None);
        assert_eq!(t.position(), Some(5));
        // Once the held message is resolved, the position jumps past everything resolved.
        assert_eq!(t.resolve(5), Some(8));
    }

    #[test]
    fn hold_on_a_fresh_partition_commits_up_to_it() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.hold(10), Some(10));
        assert_eq!(t.resolve(11), None);
    }

    #[test]
    fn out_of_order_resolution_never_passes_a_message_in_flight() {
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            t.start(o);
        }
        assert_eq!(t.resolve(12), Some(10), "10 and 11 are still in flight");
        assert_eq!(t.resolve(14), None);
        assert_eq!(t.resolve(10), Some(11));
        assert_eq!(t.resolve(11), Some(13), "12 was resolved before");
        assert_eq!(t.hold(13), None, "13 failed and is held");
        t.start(15);
        assert_eq!(t.resolve(15), None);
        assert_eq!(t.position(), Some(13));
        assert_eq!(t.resolve(13), Some(16));
    }
}
