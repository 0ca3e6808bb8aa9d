//! What every task of one relay shares.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::telemetry::RelayTelemetry;
use super::{RelayConfig, RelayReport};
use crate::shutdown::CancellationToken;

/// What every task of one relay shares.
pub(super) struct Shared<S, P> {
    pub(super) store: Arc<S>,
    pub(super) publisher: P,
    pub(super) config: RelayConfig,
    pub(super) reports: Option<mpsc::UnboundedSender<RelayReport>>,
    /// `true` once the relay stops: no new batch is read.
    pub(super) stop: CancellationToken,
    /// Bumped by every notification (and every poll interval): idle workers read again.
    pub(super) wake: watch::Sender<u64>,
    pub(super) telemetry: RelayTelemetry,
    pub(super) sample_interval: Duration,
}

impl<S, P> Shared<S, P> {
    pub(super) fn report(&self, report: RelayReport) {
        if let Some(tx) = &self.reports {
            let _ = tx.send(report);
        }
    }
}
