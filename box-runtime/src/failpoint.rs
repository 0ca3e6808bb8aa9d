//! Failpoints for crash tests, compiled in only with the `failpoints` feature.
//!
//! `INOUTBOX_FAILPOINT=<name>:<n>` makes the process stop at the `n`-th time it reaches the named
//! point: it prints `inoutbox failpoint <name> reached` to stderr and waits forever, so that a test
//! can kill it with SIGKILL exactly there. Names: `after_inbox_insert`, `after_handler`,
//! `after_db_commit` (before the offset commit) in the inbox engine; `relay_after_publish`
//! (after the broker acknowledged a batch, before its rows are marked) in the relay.

/// Reaches the named failpoint. Does nothing without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) async fn hit(_name: &'static str) {}

/// Reaches the named failpoint.
#[cfg(feature = "failpoints")]
pub(crate) async fn hit(name: &'static str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    static CONFIG: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let config = CONFIG.get_or_init(|| {
        let spec = std::env::var(crate::names::FAILPOINT_ENV).ok()?;
        let (point, n) = spec.split_once(':').unwrap_or((spec.as_str(), "1"));
        Some((point.to_owned(), n.parse().unwrap_or(1)))
    });
    let Some((point, n)) = config else { return };
    if point != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n {
        eprintln!("inoutbox failpoint {name} reached");
        std::future::pending::<()>().await;
    }
}
