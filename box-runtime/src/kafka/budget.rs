//! The byte budget of a consumer: how much of the messages it received its partition runs
//! hold (in their channels, or in hand), across partitions. A message is handed to its
//! partition's run only while the runs hold less than the budget, or while that partition's
//! run holds nothing: a message larger than the whole budget is still handed on alone, and a
//! partition whose run holds its messages (halted, slow) never keeps the others from theirs.
//! Messages that must wait stay with the member and their partition is paused, so that the
//! broker sends no more of it until they are taken.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::ownership::PartitionKey;
use crate::message::Delivery;

/// The messages handed to partition runs, with their sizes; one is released when its run
/// dropped it (the member's copy of the `Arc` is the last).
#[derive(Debug)]
pub(super) struct Budget {
    limit: usize,
    bytes: usize,
    held: VecDeque<(Arc<Delivery>, usize)>,
    per_partition: HashMap<PartitionKey, usize>,
}

impl Budget {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            bytes: 0,
            held: VecDeque::new(),
            per_partition: HashMap::new(),
        }
    }

    /// Whether `d` may be handed to its partition's run now.
    pub(super) fn admits(&mut self, d: &Delivery) -> bool {
        self.release_front();
        let size = size_of(d);
        let fits = |b: &Self| {
            b.bytes.saturating_add(size) <= b.limit
                || b.per_partition
                    .get(&(d.topic.clone(), d.partition))
                    .is_none_or(|n| *n == 0)
        };
        if fits(self) {
            return true;
        }
        self.release_all();
        fits(self)
    }

    /// `d` was handed to its partition's run.
    pub(super) fn hold(&mut self, d: &Arc<Delivery>) {
        let size = size_of(d);
        self.bytes += size;
        *self
            .per_partition
            .entry((d.topic.clone(), d.partition))
            .or_default() += size;
        self.held.push_back((d.clone(), size));
    }

    /// The bytes the runs hold now.
    #[cfg(test)]
    pub(super) fn bytes(&mut self) -> usize {
        self.release_all();
        self.bytes
    }

    /// Releases the oldest messages their runs dropped (cheap: most are dropped in order).
    fn release_front(&mut self) {
        while let Some((d, size)) = self.held.front() {
            if Arc::strong_count(d) > 1 {
                break;
            }
            let size = *size;
            let (d, _) = self.held.pop_front().expect("a front");
            self.forget(&d, size);
        }
    }

    /// Releases every message its run dropped.
    fn release_all(&mut self) {
        let held = std::mem::take(&mut self.held);
        for (d, size) in held {
            if Arc::strong_count(&d) > 1 {
                self.held.push_back((d, size));
            } else {
                self.forget(&d, size);
            }
        }
    }

    fn forget(&mut self, d: &Delivery, size: usize) {
        self.bytes -= size;
        let pk = (d.topic.clone(), d.partition);
        if let Some(n) = self.per_partition.get_mut(&pk) {
            *n -= size;
            if *n == 0 {
                self.per_partition.remove(&pk);
            }
        }
    }
}

/// What a message occupies: its payload, key and headers, and the fixed part.
pub(super) fn size_of(d: &Delivery) -> usize {
    let headers: usize = d
        .headers
        .iter()
        .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len) + 48)
        .sum();
    std::mem::size_of::<Delivery>()
        + d.payload.as_ref().map_or(0, Vec::len)
        + d.key.as_ref().map_or(0, Vec::len)
        + headers
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Budget;
    use crate::message::Delivery;

    fn message(partition: i32, bytes: usize) -> Arc<Delivery> {
        Arc::new(Delivery {
            topic: "t".into(),
            partition,
            offset: 0,
            key: None,
            payload: Some(vec![0; bytes]),
            headers: Vec::new(),
        })
    }

    #[test]
    fn runs_hold_at_most_the_budget_but_every_partition_may_hold_one_message() {
        let mut budget = Budget::new(3_000_000);
        let (a, b) = (message(0, 1_000_000), message(0, 1_000_000));
        assert!(budget.admits(&a));
        budget.hold(&a);
        assert!(budget.admits(&b));
        budget.hold(&b);
        let c = message(0, 1_000_000);
        assert!(!budget.admits(&c), "over the budget");
        // Another partition holding nothing still gets one message, even larger than the budget.
        let huge = message(1, 10_000_000);
        assert!(budget.admits(&huge));
        budget.hold(&huge);
        assert!(!budget.admits(&message(1, 10)));
        // The runs drop what they finished: released.
        drop((a, huge));
        assert!(budget.admits(&c));
        drop(b);
        assert_eq!(budget.bytes(), 0);
    }
}
