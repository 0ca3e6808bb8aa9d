//! Consumer lag per assigned partition: the broker's high watermark minus the group's
//! committed offset, sampled on a blocking thread (the broker calls wait).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Gauge, SharedString};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Offset;

use super::ownership::{lock, PartitionKey, RebalanceContext};
use crate::telemetry::metric::{self as m, LABEL_GROUP, LABEL_PARTITION, LABEL_TOPIC};

/// How long one broker call of a sample may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The lag gauges of one consumer, built once per partition.
pub(super) struct LagGauges {
    group: SharedString,
    gauges: Mutex<HashMap<PartitionKey, Gauge>>,
    /// A sample is running: the next tick does not start another.
    busy: AtomicBool,
}

impl LagGauges {
    pub(super) fn new(group: &str) -> Arc<Self> {
        Arc::new(Self {
            group: SharedString::from(group.to_owned()),
            gauges: Mutex::new(HashMap::new()),
            busy: AtomicBool::new(false),
        })
    }

    fn gauge(&self, key: &PartitionKey) -> Gauge {
        let mut gauges = lock(&self.gauges);
        gauges
            .entry(key.clone())
            .or_insert_with(|| {
                metrics::gauge!(m::CONSUMER_LAG,
                    LABEL_GROUP => self.group.clone(),
                    LABEL_TOPIC => key.0.clone(),
                    LABEL_PARTITION => key.1.to_string())
            })
            .clone()
    }
}

/// Starts a sample on a blocking thread, unless one is still running.
pub(super) fn sample(consumer: &Arc<StreamConsumer<RebalanceContext>>, gauges: &Arc<LagGauges>) {
    if gauges.busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let (consumer, gauges) = (consumer.clone(), gauges.clone());
    tokio::task::spawn_blocking(move || {
        if let Err(e) = measure(&consumer, &gauges) {
            tracing::debug!(target: "inoutbox::kafka", error = %e, "sampling the consumer lag failed");
        }
        gauges.busy.store(false, Ordering::Release);
    });
}

fn measure(
    consumer: &StreamConsumer<RebalanceContext>,
    gauges: &LagGauges,
) -> Result<(), rdkafka::error::KafkaError> {
    let assignment = consumer.assignment()?;
    if assignment.count() == 0 {
        return Ok(());
    }
    let committed = consumer.committed_offsets(assignment, CALL_TIMEOUT)?;
    for e in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(e.topic(), e.partition(), CALL_TIMEOUT)?;
        // Nothing committed yet: everything from the low watermark on is behind.
        let position = match e.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        let key = (e.topic().into(), e.partition());
        gauges.gauge(&key).set((high - position).max(0) as f64);
    }
    Ok(())
}
