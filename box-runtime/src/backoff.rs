//! The one backoff of inoutbox: exponential, bounded, optionally jittered. Handler retries, store
//! outages, relay failures, offset commits and dead-letter publishing all wait by it.

use std::time::Duration;

/// Exponential backoff: the wait after the `n`-th failure is `initial × factorⁿ⁻¹`, at most
/// `max`, shortened by up to `jitter` (a fraction) so that many waiters do not retry in step.
///
/// ```
/// use std::time::Duration;
/// use inoutbox::inbox::Backoff;
///
/// let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(b.delay(1), Duration::from_millis(100));
/// assert_eq!(b.delay(2), Duration::from_millis(200));
/// assert_eq!(b.delay(10), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[must_use]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    factor: f64,
    jitter: f64,
}

impl Backoff {
    /// Doubling from `initial` up to `max` (`max` is raised to `initial` if lower), no jitter.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        let max = if max.as_nanos() < initial.as_nanos() {
            initial
        } else {
            max
        };
        Self {
            initial,
            max,
            factor: 2.0,
            jitter: 0.0,
        }
    }

    /// Growth per failure (at least 1; default 2).
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = if factor.is_finite() {
            factor.max(1.0)
        } else {
            2.0
        };
        self
    }

    /// Shortens each wait by a random fraction up to `fraction` (0 to 1; default 0).
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// The first wait.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest wait.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The wait after `failures` failures (1-based; 0 is treated as 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = self.factor.powi(failures.saturating_sub(1).min(64) as i32);
        let base = (self.initial.as_secs_f64() * exp).min(self.max.as_secs_f64());
        let jitter = 1.0 - self.jitter * crate::util::unit_random();
        Duration::from_secs_f64((base * jitter).max(0.0))
    }

    /// A counter of consecutive failures over this backoff.
    pub(crate) fn start(self) -> Attempts {
        Attempts {
            backoff: self,
            failures: 0,
        }
    }
}

/// Consecutive failures of one operation, and the wait each calls for.
#[derive(Debug, Clone)]
pub(crate) struct Attempts {
    backoff: Backoff,
    failures: u32,
}

impl Attempts {
    /// Counts a failure; returns the wait before the next try.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    /// The operation succeeded: the next failure waits the initial time again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_factor_and_stops_at_max() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350)).factor(3.0);
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(300));
        assert_eq!(b.delay(3), Duration::from_millis(350));
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(350));
    }

    #[test]
    fn jitter_only_shortens() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).jitter(0.25);
        for _ in 0..100 {
            let d = b.delay(1);
            assert!(
                d <= Duration::from_millis(100) && d >= Duration::from_millis(75),
                "{d:?}"
            );
        }
    }

    #[test]
    fn attempts_count_and_reset() {
        let mut a = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).start();
        assert_eq!(a.next_delay(), Duration::from_millis(10));
        assert_eq!(a.next_delay(), Duration::from_millis(20));
        a.reset();
        assert_eq!(a.next_delay(), Duration::from_millis(10));
    }
}
