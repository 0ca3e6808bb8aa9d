//! Consumer lag on JetStream. A partition's position is its current lease's durable consumer
//! (`<group>-<topic>_p<partition>_<revision>`, see `reader`): its lag is the messages of its
//! subject not yet delivered (`num_pending`) plus those delivered and not yet acknowledged
//! (`num_ack_pending`). Read from outside the group by [`consumer_lag`] (`inoutbox status
//! --nats-url`), and by each member for the partitions it owns into the lag gauge
//! ([`LagSampler`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream::Stream};
use futures_util::StreamExt;

use super::{connect, token, NatsTransportError};
use crate::telemetry::metric::{self as m, LABEL_GROUP, LABEL_PARTITION, LABEL_TOPIC};

/// How far one consumer group is behind on one partition of a topic on NATS.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerLag {
    /// The consumer group.
    pub group: String,
    /// The topic (its stream's subjects are `<topic>.<partition>`).
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The durable consumer of the partition's current lease.
    pub consumer: String,
    /// Messages of the partition not yet delivered to the group.
    pub pending: u64,
    /// Messages delivered and not yet acknowledged.
    pub ack_pending: u64,
    /// `pending + ack_pending`.
    pub lag: u64,
}

/// A consumer's lag: what it has not delivered plus what it has not had acknowledged.
fn lag_of(info: &consumer::Info) -> (u64, u64, u64) {
    let pending = info.num_pending;
    let ack_pending = u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX);
    (pending, ack_pending, pending.saturating_add(ack_pending))
}

/// The lag of each of `groups` on every partition where it has a consumer, asking the server
/// at `url` (its password never shown); the whole reading takes at most `timeout`.
pub async fn consumer_lag(
    url: &str,
    groups: &[String],
    timeout: Duration,
) -> Result<Vec<ConsumerLag>, NatsTransportError> {
    let read = async {
        let js = jetstream::new(connect(url, timeout).await?);
        let mut lags = Vec::new();
        let mut names = js.stream_names();
        let mut streams = Vec::new();
        while let Some(name) = names.next().await {
            streams.push(name.map_err(|e| setup(format!("stream names: {e}")))?);
        }
        for name in streams {
            let stream = js
                .get_stream(&name)
                .await
                .map_err(|e| setup(format!("stream {name}: {e}")))?;
            lags.extend(stream_lag(&stream, groups).await?);
        }
        lags.sort_by(|a, b| {
            (&a.group, &a.topic, a.partition).cmp(&(&b.group, &b.topic, b.partition))
        });
        Ok(lags)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err(setup(format!("no answer within {timeout:?}"))))
}

fn setup(message: String) -> NatsTransportError {
    NatsTransportError::Setup(format!("consumer lag: {message}"))
}

/// The lag of `groups` on the partition of one stream (a partition's: the one subject
/// `<topic>.<partition>`, named [`stream_name`](super::stream_name); any other stream has
/// none): per group the consumer of the highest revision, the current lease's (its
/// predecessors are deleted when it is created).
async fn stream_lag(
    stream: &Stream,
    groups: &[String],
) -> Result<Vec<ConsumerLag>, NatsTransportError> {
    let Some((topic, partition)) = partition_of(&stream.cached_info().config) else {
        return Ok(Vec::new());
    };
    let mut names = stream.consumer_names();
    // Per group (by its index), the consumer of the highest revision.
    let mut current: BTreeMap<usize, (u64, String)> = BTreeMap::new();
    while let Some(name) = names.next().await {
        let name = name.map_err(|e| setup(format!("consumer names: {e}")))?;
        for (g, group) in groups.iter().enumerate() {
            if let Some((_, revision)) = parse(&name, group, topic).filter(|p| p.0 == partition) {
                let entry = current.entry(g).or_default();
                if revision >= entry.0 {
                    *entry = (revision, name.clone());
                }
            }
        }
    }
    let mut lags = Vec::new();
    for (g, (_, name)) in current {
        let info = stream
            .consumer_info(&name)
            .await
            .map_err(|e| setup(format!("consumer {name}: {e}")))?;
        let (pending, ack_pending, lag) = lag_of(&info);
        lags.push(ConsumerLag {
            group: groups[g].clone(),
            topic: topic.to_owned(),
            partition,
            consumer: name,
            pending,
            ack_pending,
            lag,
        });
    }
    Ok(lags)
}

/// The topic and partition of a partition's stream, if `config` is one.
fn partition_of(config: &jetstream::stream::Config) -> Option<(&str, u32)> {
    let [subject] = config.subjects.as_slice() else {
        return None;
    };
    let (topic, partition) = subject.rsplit_once('.')?;
    let partition: u32 = partition.parse().ok()?;
    (super::stream_name(topic, partition) == config.name).then_some((topic, partition))
}

/// The partition and revision of a consumer named `<group>-<topic>_p<partition>_<revision>`
/// (as `reader` names them), if it is one of `group` on `topic`.
fn parse(name: &str, group: &str, topic: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix(&token(&format!("{group}-{topic}")))?;
    let (partition, revision) = rest.strip_prefix("_p")?.split_once('_')?;
    Some((partition.parse().ok()?, revision.parse().ok()?))
}

/// One owned partition to sample: its topic, number, stream and consumer.
pub(super) type Sampled = (std::sync::Arc<str>, u32, Stream, String);

/// A member's lag gauges (`inoutbox_consumer_lag{group, topic, partition}`): at most once per
/// sample interval, a task reads the consumers of the partitions the member owns then. A
/// partition's gauge keeps its last value once it is given up (the next owner reports it).
pub(super) struct LagSampler {
    group: String,
    every: Duration,
    last: Option<Instant>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl LagSampler {
    /// The gauges of `group`, sampled at most every `every`.
    pub(super) fn new(group: &str, every: Duration) -> Self {
        Self {
            group: group.to_owned(),
            every,
            last: None,
            running: None,
        }
    }

    /// Starts a sample of `owned` if the interval has passed and the last one has finished.
    pub(super) fn tick(&mut self, owned: Vec<Sampled>) {
        let due = self.last.is_none_or(|last| last.elapsed() >= self.every);
        let idle = self.running.as_ref().is_none_or(|r| r.is_finished());
        if !due || !idle || owned.is_empty() {
            return;
        }
        self.last = Some(Instant::now());
        let group = self.group.clone();
        self.running = Some(tokio::spawn(async move {
            for (topic, partition, stream, name) in owned {
                match stream.consumer_info(&name).await {
                    Ok(info) => {
                        let lag = lag_of(&info).2;
                        metrics::gauge!(m::CONSUMER_LAG,
                            LABEL_GROUP => group.clone(),
                            LABEL_TOPIC => topic.to_string(),
                            LABEL_PARTITION => partition.to_string())
                        .set(lag as f64);
                    }
                    Err(e) => {
                        tracing::debug!(target: "inoutbox::nats", consumer = %name, error = %e, "sampling the consumer lag failed");
                    }
                }
            }
        }));
    }
}

impl Drop for LagSampler {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, partition_of};

    #[test]
    fn a_partitions_stream_gives_its_topic_and_partition_and_no_other_stream_does() {
        let stream = |name: &str, subjects: &[&str]| async_nats::jetstream::stream::Config {
            name: name.to_owned(),
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        let orders = stream("shop_orders_12", &["shop.orders.12"]);
        assert_eq!(partition_of(&orders), Some(("shop.orders", 12)));
        assert_eq!(partition_of(&stream("other", &["shop.orders.12"])), None);
        assert_eq!(partition_of(&stream("orders", &["orders.*"])), None);
        assert_eq!(partition_of(&stream("orders_0", &["orders.0", "x"])), None);
        assert_eq!(partition_of(&stream("dlq", &["orders.dlq"])), None);
    }

    #[test]
    fn a_consumer_name_gives_its_partition_and_revision_for_its_group_only() {
        assert_eq!(
            parse("billing-orders_p2_17", "billing", "orders"),
            Some((2, 17))
        );
        assert_eq!(
            parse("bill_ing-shop_orders_p0_3", "bill.ing", "shop.orders"),
            Some((0, 3))
        );
        assert_eq!(parse("billing-orders_p2_17", "bill", "orders"), None);
        assert_eq!(parse("billing-orders_p2_17", "billing", "order"), None);
        assert_eq!(parse("billing-orders_px_17", "billing", "orders"), None);
        assert_eq!(parse("billing-orders_p2", "billing", "orders"), None);
    }
}
