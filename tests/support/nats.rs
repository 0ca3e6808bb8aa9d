//! NATS fixtures: a `nats-server -js` process of its own per test (a free port, a store
//! directory of its own, killed and removed when dropped; it can be killed and restarted on
//! the same store), raw JetStream publishing and reading, and a consumer on NATS run in a task.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use inoutbox::nats::{partition_for, stream_name, subject, NatsConfig};

/// A `nats-server -js` of its own.
pub struct NatsServer {
    child: Option<Child>,
    /// Further arguments of the server (`--user`, `--pass`).
    args: Vec<String>,
    pub port: u16,
    pub url: String,
    store: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl NatsServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server started with further arguments (e.g. `--user app --pass s3cret`).
    pub fn start_with(args: &[&str]) -> Self {
        let port = free_port();
        let store = std::env::temp_dir().join(format!(
            "inoutbox-nats-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        let mut server = Self {
            child: None,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            port,
            url: format!("nats://127.0.0.1:{port}"),
            store,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".to_owned());
        let child = Command::new(&bin)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `{bin}`: {e}\ninstall it with: apt-get install nats-server \
                     (scripts/test does it: ensure_nats_server in scripts/services.sh)"
                )
            });
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {addr} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL (the store directory is kept).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A JetStream context on this server (JetStream answering).
    pub async fn js(&self) -> jetstream::Context {
        let client = async_nats::connect(&self.url)
            .await
            .expect("connect to nats");
        let js = jetstream::new(client);
        let deadline = Instant::now() + Duration::from_secs(20);
        let probe = || async {
            js.get_or_create_stream(jetstream::stream::Config {
                name: "inoutbox_probe".to_owned(),
                subjects: vec!["inoutbox_probe".to_owned()],
                storage: jetstream::stream::StorageType::Memory,
                ..Default::default()
            })
            .await
        };
        while let Err(e) = probe().await {
            assert!(Instant::now() < deadline, "JetStream did not answer: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        js
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Consumer settings for tests: a short lease, a short grace.
pub fn config(server: &NatsServer, topic: &str, partitions: u32) -> NatsConfig {
    NatsConfig::new(server.url.clone(), [topic])
        .partitions(partitions)
        .lease_ttl(Duration::from_secs(2))
        .shutdown_grace(Duration::from_secs(10))
}

/// What most NATS tests start from: a JetStream context on `server`, a migrated database
/// `db_name` with its store, and a fresh stream for a topic named from `topic`.
pub struct Setup {
    pub js: jetstream::Context,
    pub db: crate::support::TestDb,
    pub store: inoutbox::PgStore,
    pub topic: String,
}

impl Setup {
    pub async fn new(server: &NatsServer, db_name: &str, topic: &str) -> Self {
        let js = server.js().await;
        let db = crate::support::TestDb::new(db_name).await;
        let store = db.migrated_store().await;
        let topic = crate::support::unique(topic);
        create_stream(&js, &topic).await;
        Self {
            js,
            db,
            store,
            topic,
        }
    }
}

/// Partitions whose streams [`create_stream`] creates: as many as any test's topic has (a
/// member creates the streams of its partitions too; these are there for what a test publishes
/// before a member starts).
pub const STREAM_PARTITIONS: u32 = 12;

/// Creates the streams of `topic`'s first [`STREAM_PARTITIONS`] partitions.
pub async fn create_stream(js: &jetstream::Context, topic: &str) {
    create_streams(js, topic, STREAM_PARTITIONS).await;
}

/// Creates the streams of `topic`'s `partitions` partitions as inoutbox does (one a partition,
/// its one subject `<topic>.<partition>`), with `config`'s other settings.
pub async fn create_streams_with(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
    config: jetstream::stream::Config,
) {
    for partition in 0..partitions {
        js.get_or_create_stream(jetstream::stream::Config {
            name: stream_name(topic, partition),
            subjects: vec![subject(topic, partition)],
            ..config.clone()
        })
        .await
        .expect("create stream");
    }
}

/// Creates the streams of `topic`'s `partitions` partitions.
pub async fn create_streams(js: &jetstream::Context, topic: &str, partitions: u32) {
    create_streams_with(js, topic, partitions, jetstream::stream::Config::default()).await;
}

/// The streams of `topic`, in partition order: a partition's stream each (`<topic>_<p>`, from
/// 0 up to the first missing one), or else the one stream of a subject (a dead-letter
/// subject's, named as a token of it).
async fn streams_of(js: &jetstream::Context, topic: &str) -> Vec<jetstream::stream::Stream> {
    let mut streams = Vec::new();
    while let Ok(stream) = js
        .get_stream(stream_name(
            topic,
            u32::try_from(streams.len()).expect("partitions"),
        ))
        .await
    {
        streams.push(stream);
    }
    if streams.is_empty() {
        streams.push(js.get_stream(name_token(topic)).await.expect("get stream"));
    }
    streams
}

/// Publishes a raw message and waits for JetStream's acknowledgement; returns its sequence.
pub async fn publish(
    js: &jetstream::Context,
    subject: &str,
    headers: &[(&str, &str)],
    payload: Vec<u8>,
) -> u64 {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.append(*name, *value);
    }
    js.publish_with_headers(subject.to_owned(), map, payload.into())
        .await
        .expect("publish")
        .await
        .expect("publish ack")
        .sequence
}

/// Publishes an `OrderCreated` with event id `id`, keyed by the order, to its partition.
pub async fn publish_order(
    js: &jetstream::Context,
    topic: &str,
    partitions: u32,
    id: &str,
    order_id: uuid::Uuid,
    total_cents: i64,
) -> u64 {
    let key = order_id.to_string();
    let payload =
        serde_json::to_vec(&serde_json::json!({"order_id": order_id, "total_cents": total_cents}))
            .expect("json");
    let subject = subject(topic, partition_for(key.as_bytes(), partitions));
    let headers = [
        ("ce_id", id),
        ("ce_type", "OrderCreated"),
        ("ce_source", "tests"),
        ("ce_specversion", "1.0"),
        ("content-type", "application/json"),
        ("ce_partitionkey", key.as_str()),
    ];
    publish(js, &subject, &headers, payload).await
}

/// The highest acknowledgement floor (a stream sequence) of the consumers of one group's
/// partition: what the group has acknowledged there.
pub async fn ack_floor(js: &jetstream::Context, topic: &str, group: &str, partition: u32) -> u64 {
    lease_consumers(js, topic, group, partition)
        .await
        .iter()
        .map(|info| info.ack_floor.stream_sequence)
        .max()
        .unwrap_or(0)
}

/// The consumers of one group's leases on one partition (as the transport names them,
/// `<group>-<topic>_p<partition>_<revision>`); one deleted meanwhile (a lease handed over) is
/// left out.
async fn lease_consumers(
    js: &jetstream::Context,
    topic: &str,
    group: &str,
    partition: u32,
) -> Vec<jetstream::consumer::Info> {
    let prefix = format!("{}_p{partition}_", name_token(&format!("{group}-{topic}")));
    let stream = js
        .get_stream(stream_name(topic, partition))
        .await
        .expect("get stream");
    let mut names = stream.consumer_names();
    let mut infos = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.expect("consumer name");
        if name.starts_with(&prefix) {
            if let Ok(info) = stream.consumer_info(&name).await {
                infos.push(info);
            }
        }
    }
    infos
}

/// Every message of `topic`'s streams, each read from the start by a consumer until none comes
/// for `quiet`: partition after partition, each in its order.
pub async fn read_stream(
    js: &jetstream::Context,
    topic: &str,
    quiet: Duration,
) -> Vec<async_nats::jetstream::Message> {
    let mut out = Vec::new();
    for stream in streams_of(js, topic).await {
        // Each reader made when its turn comes: a pull left waiting while the others are read
        // can expire.
        let mut messages = reader(&stream).await;
        while let Ok(Some(m)) = tokio::time::timeout(quiet, messages.next()).await {
            out.push(m.expect("message"));
        }
    }
    out
}

/// The messages of `stream` from its first, through a consumer of the test's own that
/// acknowledges nothing (the groups' consumers and positions are left as they are).
async fn reader(stream: &jetstream::stream::Stream) -> jetstream::consumer::pull::Stream {
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("reader consumer");
    consumer.messages().await.expect("messages")
}

/// The key of a lease in the lease bucket: `<group>.<topic>.<partition>`.
pub fn lease_key(group: &str, topic: &str, partition: u32) -> String {
    format!("{}.{}.{partition}", name_token(group), name_token(topic))
}

/// `text` as a token of a consumer or key name (as the transport makes them).
fn name_token(text: &str) -> String {
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

/// The first `n` messages of `topic`'s streams, each partition's in its order, as the suite's
/// `Received` (partition from the subject, offset the sequence in the partition's stream, key
/// from `ce_partitionkey`); panics if they do not come within `within`.
pub async fn read_n(
    js: &jetstream::Context,
    topic: &str,
    n: usize,
    within: Duration,
) -> Vec<crate::support::Received> {
    let mut readers = Vec::new();
    for stream in streams_of(js, topic).await {
        readers.push(reader(&stream).await);
    }
    let mut messages = futures_util::stream::select_all(readers);
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let m = match tokio::time::timeout_at(deadline, messages.next()).await {
            Ok(Some(m)) => m.expect("message"),
            _ => panic!(
                "expected {n} messages on {topic} within {within:?}, got {}",
                out.len()
            ),
        };
        let headers: Vec<(String, String)> = m
            .headers
            .iter()
            .flat_map(|map| map.iter())
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().to_owned()))
            })
            .collect();
        let partition = m
            .subject
            .rsplit('.')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a partition subject");
        let offset = m.info().expect("JetStream message").stream_sequence;
        out.push(crate::support::Received {
            partition,
            offset: i64::try_from(offset).expect("sequence"),
            key: headers
                .iter()
                .find(|(name, _)| name == inoutbox::nats::HEADER_KEY)
                .map(|(_, v)| v.clone()),
            payload: serde_json::from_slice(&m.payload).expect("JSON payload"),
            bytes: m.payload.to_vec(),
            headers,
        });
    }
    out
}

/// What one group has acknowledged on one partition, as a stream sequence: the highest, over
/// the consumers of its leases, of each one's acknowledgement floor and of the sequence before
/// its start (a lease's consumer starts right after what its predecessors acknowledged, and
/// reports a floor of 0 until it acknowledges something itself).
pub async fn acknowledged(
    js: &jetstream::Context,
    topic: &str,
    group: &str,
    partition: u32,
) -> u64 {
    lease_consumers(js, topic, group, partition)
        .await
        .iter()
        .map(|info| {
            let before_start = match info.config.deliver_policy {
                jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence } => {
                    start_sequence.saturating_sub(1)
                }
                _ => 0,
            };
            info.ack_floor.stream_sequence.max(before_start)
        })
        .max()
        .unwrap_or(0)
}
