//! The NATS JetStream transport (feature `nats`, async-nats): the second broker on the
//! transport contract. See `docs/nats.md` for the design and its timings.
//!
//! - A topic's partitions are subjects, each in a stream of its own: topic `orders` with 3
//!   partitions is the subjects `orders.0`, `orders.1`, `orders.2` in the streams `orders_0`,
//!   `orders_1`, `orders_2` (as a Kafka partition is a log of its own: a partition's consumer
//!   reads its stream whole, unfiltered, and its sequences have no gaps); a message's partition
//!   is the hash of its key, as Kafka's default partitioner computes it ([`partition_for`]).
//! - `config`: [`NatsConfig`], the consumer's settings; it implements `Transport`;
//! - `member`: a member of a group: takes the leases of free partitions, renews them, runs each
//!   owned partition through the engine and gives it up when its lease is lost;
//! - `lease`: the leases in a JetStream key-value bucket (revision-checked updates, a TTL), and
//!   the [`PartitionLink`](crate::transport::PartitionLink) of one owned partition, which
//!   acknowledges only while its lease holds;
//! - `reader`: one partition's durable pull consumer, per lease, started at the acknowledgement
//!   floor of the previous one;
//! - `lost`: deliveries lost on the way (a header async-nats cannot read drops its connection),
//!   read from the stream itself through its message-get API;
//! - `publisher`: [`NatsPublisher`], the relay's side (`Nats-Msg-Id` = the event id);
//! - `dead_letter`: the optional dead-letter subject;
//! - `lag`: each partition's lag (its consumer's pending and unacknowledged messages): the
//!   lag gauge of a member's partitions, and [`consumer_lag`] for `inoutbox status`.
//!
//! async-nats is named in this room only.

mod config;
mod dead_letter;
mod headers;
mod lag;
mod lease;
mod lost;
mod member;
mod publisher;
mod reader;

pub use config::NatsConfig;
pub use lag::{consumer_lag, ConsumerLag};
pub use publisher::NatsPublisher;

use async_nats::jetstream;
use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};

/// The header that carries a message's key: NATS messages have none of their own (the
/// CloudEvents partitioning extension's `partitionkey`, with the `ce_` prefix of the other
/// attributes).
pub const HEADER_KEY: &str = "ce_partitionkey";

/// A failure of the NATS consumer itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsTransportError {
    /// No server answered within the start-up timeout.
    #[error("no NATS server at {url} answered within {timeout:?}: {message}")]
    Unreachable {
        /// The URL, its password hidden.
        url: String,
        /// The start-up timeout.
        timeout: std::time::Duration,
        /// The last error.
        message: String,
    },
    /// Creating a stream, the lease bucket or a consumer failed.
    #[error("NATS JetStream setup failed: {0}")]
    Setup(String),
    /// A partition task died.
    #[error("partition task for {topic}/{partition} failed: {message}")]
    Task {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// What happened.
        message: String,
    },
}

/// The partition of a message of `key` among `partitions`: Kafka's default partitioner
/// (`murmur2(key) & 0x7fffffff % partitions`), so that a key lands on the same partition
/// number on both brokers. A message without a key goes by its event id.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    let hash = u32::from_ne_bytes(murmur2(key).to_ne_bytes()) & 0x7fff_ffff;
    hash % partitions.max(1)
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() == 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// The subject of one partition of a topic.
pub fn subject(topic: &str, partition: u32) -> String {
    format!("{topic}.{partition}")
}

/// The stream of one partition of a topic: the topic's name with what a stream name may not
/// hold (`.`, `*`, `>`, spaces, path separators) replaced by `_`, then `_<partition>`.
pub fn stream_name(topic: &str, partition: u32) -> String {
    format!("{}_{partition}", token(topic))
}

/// `text` as a token of a stream, consumer or key name: letters, digits, `-` and `_`.
pub(crate) fn token(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Creates the stream of one partition of `topic` (the one subject `<topic>.<partition>`, on
/// file storage) unless it exists.
pub(crate) async fn ensure_stream(
    js: &jetstream::Context,
    topic: &str,
    partition: u32,
) -> Result<jetstream::stream::Stream, String> {
    let config = jetstream::stream::Config {
        name: stream_name(topic, partition),
        subjects: vec![subject(topic, partition)],
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    get_or_create_stream(js, config).await.map_err(|e| {
        let hint = if subjects_overlap(&e) {
            format!(
                " (another stream takes the subject `{}`: each partition of a topic has a stream \
                 of its own, and a stream of subjects `{topic}.*` must be deleted first; see \
                 docs/nats.md)",
                subject(topic, partition)
            )
        } else {
            String::new()
        };
        format!("stream of {topic} partition {partition}: {e}{hint}")
    })
}

/// Whether the server refused a stream because another stream takes one of its subjects
/// (JetStream's error 10065).
fn subjects_overlap(e: &CreateStreamError) -> bool {
    matches!(e.kind(), CreateStreamErrorKind::JetStream(err)
        if err.error_code() == jetstream::ErrorCode::STREAM_SUBJECT_OVERLAP)
}

/// The streams of every partition of `topic`, created unless they exist.
pub(crate) async fn ensure_streams(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
) -> Result<Vec<jetstream::stream::Stream>, String> {
    let mut streams = Vec::with_capacity(partitions as usize);
    for partition in 0..partitions {
        streams.push(ensure_stream(js, topic, partition).await?);
    }
    Ok(streams)
}

/// The stream of `config`, created unless it exists. Processes starting at once race to
/// create it: the loser's create can fail (`subjects overlap with an existing stream`, 10065)
/// though the stream is there by then, so it looks again, five tries in all, after the waits of
/// [`stream_race`].
pub(crate) async fn get_or_create_stream(
    js: &jetstream::Context,
    config: jetstream::stream::Config,
) -> Result<jetstream::stream::Stream, CreateStreamError> {
    let mut attempts = stream_race().start();
    for _ in 1..5 {
        match js.get_or_create_stream(config.clone()).await {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                tracing::debug!(target: "inoutbox::nats", stream = %config.name, error = %e,
                    "creating a stream raced: looking again");
                tokio::time::sleep(attempts.next_delay()).await;
            }
        }
    }
    js.get_or_create_stream(config).await
}

/// The waits between tries of [`get_or_create_stream`]: 50 ms doubling up to 400 ms, jittered
/// so that racing processes come back apart.
fn stream_race() -> crate::backoff::Backoff {
    crate::backoff::Backoff::new(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_millis(400),
    )
    .jitter(0.5)
}

/// Connects to `url` within `timeout`; the error names the URL without its password.
pub(crate) async fn connect(
    url: &str,
    timeout: std::time::Duration,
) -> Result<async_nats::Client, NatsTransportError> {
    let unreachable = |message: String| NatsTransportError::Unreachable {
        url: crate::redact::redact_url(url),
        timeout,
        message: crate::redact::hide_secrets(&message, &crate::redact::url_secrets(url)),
    };
    let (address, credentials) = split_credentials(url);
    let options = async_nats::ConnectOptions::new()
        .connection_timeout(timeout)
        .max_reconnects(None);
    let options = match credentials {
        Some(Credentials::User(user, password)) => options.user_and_password(user, password),
        Some(Credentials::Token(token)) => options.token(token),
        None => options,
    };
    match tokio::time::timeout(timeout, options.connect(address.as_str())).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable("timed out".to_owned())),
    }
}

/// The credentials of a server URL.
#[derive(Debug, PartialEq, Eq)]
enum Credentials {
    /// `nats://user:password@host`.
    User(String, String),
    /// `nats://token@host`.
    Token(String),
}

/// `url` without its user information, and the credentials it held (percent-decoded).
/// async-nats 0.51 neither sends the credentials of a URL (only those of its options) nor keeps
/// them out of its debug log (which shows its server address whole): they go as options. The
/// user information ends at the last `@`, as [`redact_url`](crate::redact::redact_url) reads it.
fn split_credentials(url: &str) -> (String, Option<Credentials>) {
    // async-nats takes an address without a scheme as `nats://`.
    let (scheme, rest) = url.split_once("://").unwrap_or(("nats", url));
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return (url.to_owned(), None);
    };
    let decode = crate::redact::percent_decode;
    let credentials = match userinfo.split_once(':') {
        Some((user, password)) => Credentials::User(decode(user), decode(password)),
        None => Credentials::Token(decode(userinfo)),
    };
    (format!("{scheme}://{host}"), Some(credentials))
}

#[cfg(test)]
mod tests {
    use super::{murmur2, partition_for, split_credentials, stream_name, Credentials};

    #[test]
    fn a_urls_credentials_are_taken_out_of_it() {
        let user = |u: &str, p: &str| Some(Credentials::User(u.to_owned(), p.to_owned()));
        assert_eq!(
            split_credentials("nats://app:s3cret@n:4222"),
            ("nats://n:4222".to_owned(), user("app", "s3cret"))
        );
        assert_eq!(
            split_credentials("nats://app:a%40b:c@d@n:4222"),
            ("nats://n:4222".to_owned(), user("app", "a@b:c@d"))
        );
        assert_eq!(
            split_credentials("tls://t0ken@n"),
            (
                "tls://n".to_owned(),
                Some(Credentials::Token("t0ken".to_owned()))
            )
        );
        assert_eq!(
            split_credentials("nats://n:4222"),
            ("nats://n:4222".to_owned(), None)
        );
        assert_eq!(split_credentials("n:4222"), ("n:4222".to_owned(), None));
        assert_eq!(
            split_credentials("app:pw@n:4222"),
            ("nats://n:4222".to_owned(), user("app", "pw"))
        );
    }

    /// Kafka's own test vectors (`UtilsTest.testMurmur2`).
    #[test]
    fn murmur2_is_kafkas() {
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (key, hash) in cases {
            assert_eq!(murmur2(key.as_bytes()), hash, "{key}");
        }
    }

    #[test]
    fn a_key_always_lands_on_one_partition_within_range() {
        for key in ["a", "b", "customer-17", ""] {
            let p = partition_for(key.as_bytes(), 6);
            assert!(p < 6);
            assert_eq!(p, partition_for(key.as_bytes(), 6));
        }
    }

    #[test]
    fn stream_names_hold_no_subject_wildcards() {
        assert_eq!(stream_name("shop.orders v2>*", 3), "shop_orders_v2___3");
    }
}
