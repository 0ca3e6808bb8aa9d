//! The commit position of one partition: it never passes a message that is not resolved.

use std::collections::BTreeSet;

/// Keeps the committed offset of one partition from passing a message that is not resolved.
///
/// Messages are resolved in offset order, except those held (failed, left unacknowledged): the
/// commit position never passes the lowest held offset.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    held: BTreeSet<i64>,
    highest: Option<i64>,
    committed: Option<i64>,
}

impl OffsetTracker {
    /// Marks `offset` resolved; returns the new commit position (next offset to read) if it
    /// advanced.
    pub fn resolve(&mut self, offset: i64) -> Option<i64> {
        self.held.remove(&offset);
        let highest = self.highest.map_or(offset, |h| h.max(offset));
        self.highest = Some(highest);
        let position = self.held.first().copied().unwrap_or(highest + 1);
        self.advance(position)
    }

    /// Marks `offset` held: not resolved. Returns the new commit position if it advanced (it
    /// can, up to the held offset).
    pub fn hold(&mut self, offset: i64) -> Option<i64> {
        self.held.insert(offset);
        self.highest = Some(self.highest.map_or(offset, |h| h.max(offset)));
        let position = self.held.first().copied().unwrap_or(offset);
        self.advance(position)
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
}
