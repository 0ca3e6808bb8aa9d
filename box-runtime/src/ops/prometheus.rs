//! The Prometheus recorder behind `/metrics`: installed once per process, with histogram
//! buckets for inoutbox's durations and batch sizes, and the description of every metric.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::OpsError;
use crate::telemetry::metric;

/// Buckets of the `_seconds` histograms: 1 ms to 2 minutes.
const SECONDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];
/// Buckets of the batch size histogram.
const SIZES: &[f64] = &[1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0];
/// How often the recorder's histograms are drained when nobody scrapes.
pub(super) const UPKEEP: Duration = Duration::from_secs(5);

/// The installed Prometheus recorder: renders every metric of the process in the Prometheus
/// text format. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Prometheus(PrometheusHandle);

impl Prometheus {
    /// Every metric of the process, in the Prometheus text format (what `/metrics` serves).
    pub fn render(&self) -> String {
        self.0.render()
    }

    /// Drains the histograms' pending samples (the endpoint does it every few seconds).
    pub(super) fn upkeep(&self) {
        self.0.run_upkeep();
    }
}

/// The recorder this function installed, if it did.
static INSTALLED: Mutex<Option<Prometheus>> = Mutex::new(None);

/// Installs the process-wide Prometheus recorder, with histogram buckets for inoutbox's
/// durations (`_seconds`) and batch sizes, and describes every inoutbox metric (`# HELP`);
/// once installed, later calls return the same recorder. Call it before building consumers
/// and relays (they take their metric handles when built). Fails when another `metrics`
/// recorder is already installed.
pub fn install_prometheus() -> Result<Prometheus, OpsError> {
    install_labelled(&[])
}

/// As [`install_prometheus`], with `labels` on every metric it records (an app's
/// `transport`); the labels of the call that installed it stay.
pub(crate) fn install_labelled(labels: &[(&str, &str)]) -> Result<Prometheus, OpsError> {
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(prometheus) = &*installed {
        return Ok(prometheus.clone());
    }
    let prometheus = install(labels)?;
    *installed = Some(prometheus.clone());
    Ok(prometheus)
}

fn install(labels: &[(&str, &str)]) -> Result<Prometheus, OpsError> {
    let recorder = |e: metrics_exporter_prometheus::BuildError| OpsError::Recorder(e.to_string());
    let builder = labels
        .iter()
        .fold(PrometheusBuilder::new(), |b, (name, value)| {
            b.add_global_label(*name, *value)
        });
    let handle = builder
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
        .map_err(recorder)?
        .set_buckets_for_metric(Matcher::Full(metric::INBOX_BATCH_SIZE.into()), SIZES)
        .map_err(recorder)?
        .install_recorder()
        .map_err(recorder)?;
    metric::describe();
    Ok(Prometheus(handle))
}
