//! Consumer lag from the broker: each group's committed offset against the partition's high
//! watermark (read by the Kafka room, `kafka::group_lag`).

use std::time::Duration;

use super::AdminError;
use crate::kafka::{group_lag, PartitionLag};

/// The lag of each of `groups` on every partition where it has a committed offset, asking the
/// brokers at `brokers` with the extra librdkafka `settings` (credentials, TLS). Each request
/// waits at most `timeout`.
pub async fn consumer_lag(
    brokers: &str,
    groups: &[String],
    settings: &[(String, String)],
    timeout: Duration,
) -> Result<Vec<PartitionLag>, AdminError> {
    let (brokers, groups, settings) = (brokers.to_owned(), groups.to_vec(), settings.to_vec());
    tokio::task::spawn_blocking(move || {
        let mut lags = Vec::new();
        for group in &groups {
            lags.extend(
                group_lag(&brokers, group, &settings, timeout)
                    .map_err(|e| AdminError::Kafka(format!("group `{group}`: {e}")))?,
            );
        }
        Ok(lags)
    })
    .await
    .map_err(|e| AdminError::Kafka(e.to_string()))?
}
