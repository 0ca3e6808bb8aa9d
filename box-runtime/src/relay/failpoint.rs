//! Failpoints for crash tests: compiled only with the `failpoints` feature, armed at run time by
//! the `TXBOX_FAILPOINTS` environment variable (a comma-separated list of names).
//!
//! An armed failpoint prints `txbox failpoint reached: <name>` on stdout and then blocks the
//! process forever, so a test can SIGKILL it at exactly that point.

/// Stops here forever if the failpoint `name` is armed.
#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &str) {
    use std::io::Write;

    let armed = std::env::var(crate::names::FAILPOINTS_ENV)
        .map(|v| v.split(',').any(|n| n.trim() == name))
        .unwrap_or(false);
    if armed {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "txbox failpoint reached: {name}");
        let _ = out.flush();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Failpoints are compiled out without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_name: &str) {}
