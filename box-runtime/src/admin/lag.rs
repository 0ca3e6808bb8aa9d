//! Consumer lag from the broker: each group's committed offset against the partition's high
//! watermark (read by the Kafka room, `kafka::group_lag`), and the rows that cannot be right.

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

/// Why `lag` cannot be right, with what to do, or `None` when it can: a committed offset past
/// the end of the partition (its high watermark) has no lag of 0, it has no meaning. The topic
/// was deleted and created again, or lost data the group had read (an unclean leader election,
/// a broker that lost its log); on its next fetch the group jumps to where
/// `auto.offset.reset` says, skipping or reading again what lies between.
pub fn impossible_lag(lag: &PartitionLag) -> Option<String> {
    (lag.committed > lag.high_watermark).then(|| {
        format!(
            "group `{}` committed offset {} on {}/{}, past its end ({}): was the topic deleted \
             and created again, or did the broker lose data? The group will jump to where its \
             auto.offset.reset says; check what the topic holds, then reset the group's offsets \
             (e.g. kafka-consumer-groups --reset-offsets) to where processing should resume",
            lag.group, lag.committed, lag.topic, lag.partition, lag.high_watermark
        )
    })
}

#[cfg(test)]
mod tests {
    use super::impossible_lag;
    use crate::kafka::PartitionLag;

    #[test]
    fn a_committed_offset_past_the_end_is_flagged_and_others_are_not() {
        let lag = |committed, high_watermark| PartitionLag {
            group: "billing".into(),
            topic: "orders".into(),
            partition: 2,
            committed,
            high_watermark,
            lag: (high_watermark - committed).max(0),
        };
        let hint = impossible_lag(&lag(120, 100)).expect("flagged");
        assert!(
            hint.contains("committed offset 120 on orders/2, past its end (100)"),
            "{hint}"
        );
        assert_eq!(impossible_lag(&lag(100, 100)), None, "caught up");
        assert_eq!(impossible_lag(&lag(40, 100)), None, "behind");
    }
}
