//! Gauges sampled periodically: one set of queries per tick, which also probes the database
//! for [`Health`](super::Health).

use std::sync::Arc;
use std::time::Duration;

use crate::shutdown::CancellationToken;
use metrics::SharedString;

use crate::engine::Inbox;
use crate::store::{EffectCounts, InboxStore};
use crate::telemetry::metric::{self as m, LABEL_GROUP};
use crate::telemetry::{
    DEFAULT_SAMPLE_INTERVAL, DEFAULT_STUCK_AFTER, DEFAULT_SUMMARY_INTERVAL, MIN_SAMPLE_INTERVAL,
};

/// What a consumer samples, and how often.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sampling {
    pub(crate) interval: Duration,
    pub(crate) stuck_after: Duration,
    /// How often the summary of the group's messages is logged at info.
    pub(crate) summary_interval: Duration,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            interval: DEFAULT_SAMPLE_INTERVAL,
            stuck_after: DEFAULT_STUCK_AFTER,
            summary_interval: DEFAULT_SUMMARY_INTERVAL,
        }
    }
}

/// The gauges of the group's effects (on a store that keeps effects).
struct EffectGauges {
    pending: metrics::Gauge,
    failed: metrics::Gauge,
    oldest: metrics::Gauge,
}

impl EffectGauges {
    fn new(group: &SharedString) -> Self {
        Self {
            pending: metrics::gauge!(m::EFFECTS_PENDING, LABEL_GROUP => group.clone()),
            failed: metrics::gauge!(m::EFFECTS_FAILED, LABEL_GROUP => group.clone()),
            oldest: metrics::gauge!(m::EFFECTS_OLDEST_PENDING_AGE, LABEL_GROUP => group.clone()),
        }
    }

    /// Counts the group's effects not done and sets the gauges. A failure leaves them as they
    /// were and is no verdict on the database (the inbox queries give it): a store wrapper may
    /// keep two-phase rows without counting effects.
    async fn sample<S: InboxStore>(&self, store: &S, group: &str) {
        match store.count_effects(group).await {
            Ok(counts) => self.set(counts),
            Err(e) => {
                tracing::debug!(target: "inoutbox::inbox", group, error = %e,
                    "sampling the effect gauges failed");
            }
        }
    }

    fn set(&self, counts: EffectCounts) {
        self.pending.set(counts.pending as f64);
        self.failed.set(counts.failed as f64);
        self.oldest.set(counts.oldest_pending_secs.unwrap_or(0.0));
    }
}

/// Samples the group's dead letters, stuck rows and (on a store that keeps effects) effects not
/// done every `sampling.interval` until `stop`; the outcome of the queries is the database half
/// of the consumer's health.
pub(crate) async fn sample_inbox<S: InboxStore>(
    inbox: Arc<Inbox<S>>,
    sampling: Sampling,
    stop: CancellationToken,
) {
    let group = SharedString::from(inbox.group().to_owned());
    let dead_letters = metrics::gauge!(m::INBOX_DEAD_LETTERS, LABEL_GROUP => group.clone());
    let stuck = metrics::gauge!(m::INBOX_STUCK, LABEL_GROUP => group.clone());
    let effects = S::EFFECTS.then(|| EffectGauges::new(&group));
    let deferred = metrics::gauge!(m::INBOX_DEFERRED_PENDING, LABEL_GROUP => group);
    let health = inbox.health();
    loop {
        let counted = async {
            let letters = inbox.store().count_dead_letters(inbox.group()).await?;
            let stuck = inbox.stuck(sampling.stuck_after).await?;
            let pending = inbox.deferred_pending().await?;
            Ok::<_, crate::store::StoreError>((letters, stuck, pending))
        };
        match counted.await {
            Ok((letters, rows, pending)) => {
                if let Some(pending) = pending {
                    deferred.set(pending as f64);
                }
                dead_letters.set(letters as f64);
                stuck.set(rows as f64);
                health.set_database(true);
            }
            Err(e) => {
                health.set_database(false);
                tracing::debug!(target: "inoutbox::inbox", group = inbox.group(), error = %e,
                    "sampling the inbox gauges failed");
            }
        }
        if let Some(gauges) = &effects {
            gauges.sample(inbox.store(), inbox.group()).await;
        }
        tokio::select! {
            () = tokio::time::sleep(sampling.interval.max(MIN_SAMPLE_INTERVAL)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Logs the summary of the group every `interval` (see
/// [`Inbox::log_summary`](crate::engine::Inbox)), until aborted; the consumer logs the last
/// one when it stops.
pub(crate) async fn log_summaries<S: InboxStore>(inbox: Arc<Inbox<S>>, interval: Duration) {
    let interval = interval.max(MIN_SAMPLE_INTERVAL);
    loop {
        tokio::time::sleep(interval).await;
        inbox.log_summary();
    }
}
