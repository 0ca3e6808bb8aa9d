//! Retention of published outbox rows and processed inbox rows: how long they are kept, and
//! how the purge runs.

use std::time::Duration;

/// How long published outbox rows (purged by the relay) or processed inbox rows (purged by
/// the consumer) are kept, how many are deleted per statement, and how often.
///
/// ```
/// use std::time::Duration;
/// let retention = inoutbox::outbox::Retention::default().older_than(Duration::from_secs(86_400));
/// assert_eq!(retention.batch_size, 1000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct Retention {
    /// Rows published (outbox) or processed (inbox) longer ago than this are deleted (default
    /// 7 days).
    pub older_than: Duration,
    /// Rows per `DELETE` (default 1000); each batch is its own short transaction.
    pub batch_size: u32,
    /// How often the relay (outbox) or the consumer (inbox) runs the purge (default every
    /// minute).
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            older_than: Duration::from_secs(7 * 24 * 3600),
            batch_size: 1000,
            interval: Duration::from_secs(60),
        }
    }
}

impl Retention {
    /// Rows published (processed) longer ago than this are deleted.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = age;
        self
    }

    /// Rows per `DELETE` (at least 1).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// How often the purge runs.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
}
