//! One runner for a service: the store and the broker chosen from the environment, and every
//! consumer group and relay of the process run together under one shutdown token.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::engine::{InboxConfig, Report, RetryPolicy, SetupError, UnknownEvent};
use crate::kafka::{
    create_topic, InProcessKafka, KafkaConfig, KafkaError, KafkaProducer, KafkaTransportError,
    CONSUMER_SETTINGS,
};
use crate::postgres::PgStore;
use crate::relay::{IntoRelayStore, Relay, RelayConfig, RelayError, RelayReport};
use crate::shutdown::CancellationToken;
use crate::store::{InboxStore, StoreError};
use crate::Consumer;

/// Connections of the PostgreSQL pool [`App::from_env`] opens: each relay holds three (two
/// workers and its listener), each consumer partition in flight one.
pub const PG_POOL_CONNECTIONS: u32 = 16;

/// The store of an [`App`]: PostgreSQL or SQLite, with inoutbox's tables migrated.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Store {
    /// PostgreSQL (`DATABASE_URL=postgres://...`).
    Postgres(PgStore),
    /// SQLite (`DATABASE_URL=sqlite:...`, or the zero-setup file).
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::SqliteStore),
}

impl Store {
    /// `"postgres"` or `"sqlite"`.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Postgres(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "sqlite",
        }
    }

    /// Applies inoutbox's migrations (idempotent).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Postgres(store) => store.migrate().await,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(store) => store.migrate().await,
        }
    }
}

/// Why an [`App`] could not start, or the first error of one of its parts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// The configuration is unusable (e.g. `DATABASE_URL` of an unknown scheme).
    #[error("{0}")]
    Config(String),
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(Box<StoreError>),
    /// The in-process Kafka could not start, or a topic could not be created.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A temporary directory for the zero-setup database could not be made.
    #[error("cannot create the zero-setup database directory {path}: {source}")]
    TempDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A consumer group could not be set up (no handler, two handlers for one event, ...).
    #[error("consumer group `{group}`: {source}")]
    Setup {
        /// The group.
        group: String,
        /// The cause.
        source: Box<SetupError>,
    },
    /// A consumer group member failed.
    #[error("consumer group `{group}`: {source}")]
    Consumer {
        /// The group.
        group: String,
        /// The cause.
        source: Box<KafkaTransportError>,
    },
    /// A relay failed.
    #[error("relay: {0}")]
    Relay(Box<RelayError>),
    /// A part panicked.
    #[error("{part} panicked: {message}")]
    Panicked {
        /// `consumer group `..`` or `relay`.
        part: String,
        /// The panic's message, when it has one.
        message: String,
    },
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        AppError::Store(Box::new(error))
    }
}

impl From<RelayError> for AppError {
    fn from(error: RelayError) -> Self {
        AppError::Relay(Box::new(error))
    }
}

/// A consumer group to run in an [`App`]: its group, topics and settings.
#[must_use]
pub struct ConsumerSpec {
    group: String,
    topics: Vec<String>,
    config: InboxConfig,
    settings: Vec<(String, String)>,
    group_id: Option<String>,
    startup_timeout: Option<Duration>,
    reports: Option<mpsc::UnboundedSender<Report>>,
}

impl ConsumerSpec {
    /// The handlers of `group`, fed from `topics`, with the default settings.
    pub fn new(
        group: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            config: InboxConfig::default(),
            settings: Vec::new(),
            group_id: None,
            startup_timeout: None,
            reports: None,
        }
    }

    /// The Kafka group id, when it is not the group's name (e.g. a fresh one per run on a
    /// shared broker).
    pub fn group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    /// Replaces the inbox configuration (see [`ConsumerBuilder`](crate::ConsumerBuilder)).
    pub fn config(mut self, config: InboxConfig) -> Self {
        self.config = config;
        self
    }

    /// Retries of failed handler runs.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.config.retry = retry;
        self
    }

    /// What happens to event types the group has no handler for (default: dead letter; `Skip`
    /// for a topic shared with other consumers).
    pub fn unknown_event(mut self, unknown: UnknownEvent) -> Self {
        self.config.unknown_event = unknown;
        self
    }

    /// How long the member may wait for a broker at start-up before it fails (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = Some(timeout);
        self
    }

    /// A librdkafka consumer setting (applied after inoutbox's own).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Sends a [`Report`] for every message handled.
    pub fn reports(mut self, sender: mpsc::UnboundedSender<Report>) -> Self {
        self.reports = Some(sender);
        self
    }
}

/// A relay to run in an [`App`]: its settings (the brokers are the app's).
#[must_use]
pub struct RelaySpec {
    config: RelayConfig,
    idempotence: bool,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
}

impl Default for RelaySpec {
    fn default() -> Self {
        Self {
            config: RelayConfig::default(),
            idempotence: true,
            reports: None,
        }
    }
}

impl RelaySpec {
    /// A relay with the default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces every setting (its `brokers` are replaced by the app's).
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// `ce_source` of published events; name your service.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.config.source = source.into();
        self
    }

    /// The poll interval, the fallback for missed notifications (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Whether to use the idempotent producer (default true; Tansu needs `false`).
    pub fn idempotence(mut self, on: bool) -> Self {
        self.idempotence = on;
        self
    }

    /// Sends a [`RelayReport`] per row.
    pub fn reports(mut self, sender: mpsc::UnboundedSender<RelayReport>) -> Self {
        self.reports = Some(sender);
        self
    }
}

/// Where the app's events go: a broker outside, or librdkafka's mock cluster in this process.
enum Broker {
    External(String),
    InProcess(InProcessKafka),
}

/// The zero-setup database's directory, removed with the app.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A service: a store, a broker, and the consumer groups and relays that run on them until
/// SIGINT, SIGTERM or [`App::shutdown_token`] is cancelled.
///
/// [`App::from_env`] chooses like the quickstart: `DATABASE_URL` (`postgres://...` or
/// `sqlite:...`) or else a SQLite file in a temporary directory (removed when the app is
/// dropped); `KAFKA_BROKERS` or else an in-process Kafka (librdkafka's mock cluster, whose
/// consumers get [`CONSUMER_SETTINGS`]). [`App::run`] returns the first error of any part, after
/// stopping the others.
///
/// ```no_run
/// use inoutbox::prelude::*;
///
/// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// # #[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
/// # pub struct OrderCreated { pub order_id: uuid::Uuid }
/// #[inbox_handler(event = "OrderCreated", group = "billing", stores(postgres, sqlite))]
/// async fn invoice<D: inoutbox::Db>(event: OrderCreated, tx: &mut inoutbox::Tx<'_, D>) -> Result<(), HandlerError> {
///     inoutbox::sql("INSERT INTO invoices (order_id) VALUES ($1)").bind(event.order_id).execute(tx).await?;
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), inoutbox::AppError> {
///     let mut app = inoutbox::App::from_env().await?;  // DATABASE_URL, KAFKA_BROKERS, or zero setup
///     app.create_topic("orders", 3).await?;
///     app.consumer("billing", ["orders"]).relay().run().await  // until SIGINT/SIGTERM
/// }
/// ```
#[must_use = "an app does nothing until `run` is awaited"]
pub struct App {
    store: Store,
    broker: Broker,
    describe: String,
    consumers: Vec<ConsumerSpec>,
    relays: Vec<RelaySpec>,
    token: CancellationToken,
    // Dropped last: the store's pool closes before its directory goes.
    _temp: Option<TempDir>,
}

/// A part's future.
type Part = Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>>;

impl App {
    /// The store and broker the environment names (`DATABASE_URL`, `KAFKA_BROKERS`; empty is
    /// unset), or the zero-setup ones; inoutbox's tables are migrated.
    pub async fn from_env() -> Result<Self, AppError> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Self::connect(
            var("DATABASE_URL").as_deref(),
            var("KAFKA_BROKERS").as_deref(),
        )
        .await
    }

    /// As [`App::from_env`], with the values given: `database_url` `postgres://...`,
    /// `sqlite:...` or `None` (zero setup), `brokers` or `None` (in-process Kafka).
    pub async fn connect(
        database_url: Option<&str>,
        brokers: Option<&str>,
    ) -> Result<Self, AppError> {
        let (store, temp, db_name) = open_store(database_url).await?;
        store.migrate().await?;
        let mut app = Self::new(store, brokers)?;
        app.describe = format!("{db_name} + {}", app.broker_name());
        app._temp = temp;
        Ok(app)
    }

    /// An app on a store of your own (migrated by you), and `brokers` or `None` (in-process
    /// Kafka).
    pub fn new(store: Store, brokers: Option<&str>) -> Result<Self, AppError> {
        let broker = match brokers {
            Some(brokers) => Broker::External(brokers.to_owned()),
            None => Broker::InProcess(InProcessKafka::start()?),
        };
        let mut app = Self {
            describe: String::new(),
            store,
            broker,
            consumers: Vec::new(),
            relays: Vec::new(),
            token: CancellationToken::new(),
            _temp: None,
        };
        app.describe = format!("{} + {}", app.store.name(), app.broker_name());
        Ok(app)
    }

    fn broker_name(&self) -> String {
        match &self.broker {
            Broker::External(brokers) => format!("Kafka at {brokers}"),
            Broker::InProcess(_) => "in-process Kafka (librdkafka mock cluster)".to_owned(),
        }
    }

    /// The store (clone it to write business rows while the app runs).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The bootstrap servers.
    pub fn brokers(&self) -> &str {
        match &self.broker {
            Broker::External(brokers) => brokers,
            Broker::InProcess(kafka) => kafka.brokers(),
        }
    }

    /// Whether the broker is the in-process one.
    pub fn is_in_process(&self) -> bool {
        matches!(self.broker, Broker::InProcess(_))
    }

    /// What the app runs on, for a first log line: e.g. `SQLite (/tmp/../app.db) + in-process
    /// Kafka (librdkafka mock cluster)`.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Creates `topic` with `partitions` partitions unless it exists (the relay does not create
    /// topics).
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), AppError> {
        match &self.broker {
            Broker::InProcess(kafka) => Ok(kafka.create_topic(topic, partitions)?),
            Broker::External(brokers) => Ok(create_topic(brokers, topic, partitions).await?),
        }
    }

    /// Runs the handlers of `group` on `topics` with the default settings.
    pub fn consumer(
        self,
        group: &str,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.consumer_with(ConsumerSpec::new(group, topics))
    }

    /// Runs a consumer group as `spec` says.
    pub fn consumer_with(mut self, spec: ConsumerSpec) -> Self {
        self.consumers.push(spec);
        self
    }

    /// Runs a relay with the default settings.
    pub fn relay(self) -> Self {
        self.relay_with(RelaySpec::new())
    }

    /// Runs a relay as `spec` says.
    pub fn relay_with(mut self, spec: RelaySpec) -> Self {
        self.relays.push(spec);
        self
    }

    /// The token every part stops on: cancel it to stop the app as a signal would.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Runs every consumer group and relay added until SIGINT, SIGTERM or the token is
    /// cancelled; each then stops gracefully. The first error of any part cancels the token
    /// (the others stop) and is returned once all have stopped. The parts are taken: a second
    /// call runs nothing and returns at the next shutdown.
    pub async fn run(&mut self) -> Result<(), AppError> {
        let mut parts = JoinSet::new();
        for spec in std::mem::take(&mut self.consumers) {
            let group = spec.group.clone();
            match self.consumer_part(spec) {
                Ok(part) => parts.spawn(named(format!("consumer group `{group}`"), part)),
                Err(error) => return self.abort(parts, error).await,
            };
        }
        for spec in std::mem::take(&mut self.relays) {
            match self.relay_part(spec) {
                Ok(part) => parts.spawn(named("relay".to_owned(), part)),
                Err(error) => return self.abort(parts, error).await,
            };
        }
        let token = self.token.clone();
        let signal = tokio::spawn(async move {
            tokio::select! {
                () = crate::shutdown::shutdown_signal() => token.cancel(),
                () = token.cancelled() => {}
            }
        });
        let mut first = None;
        if parts.is_empty() {
            self.token.cancelled().await;
        }
        while let Some(joined) = parts.join_next().await {
            if let Ok(Err(error)) = joined {
                tracing::error!(target: "inoutbox::app", %error, "a part of the app failed; stopping the others");
                first.get_or_insert(error);
                self.token.cancel();
            }
        }
        signal.abort();
        first.map_or(Ok(()), Err)
    }

    /// Stops the parts already started and returns `error`.
    async fn abort(
        &self,
        mut parts: JoinSet<Result<(), AppError>>,
        error: AppError,
    ) -> Result<(), AppError> {
        self.token.cancel();
        while parts.join_next().await.is_some() {}
        Err(error)
    }

    fn consumer_part(&self, spec: ConsumerSpec) -> Result<Part, AppError> {
        let mut kafka = KafkaConfig::new(self.brokers(), spec.topics.iter().map(String::as_str));
        if self.is_in_process() {
            for (key, value) in CONSUMER_SETTINGS {
                kafka = kafka.set(*key, *value);
            }
        }
        for (key, value) in &spec.settings {
            kafka = kafka.set(key.as_str(), value.as_str());
        }
        if let Some(group_id) = &spec.group_id {
            kafka = kafka.group_id(group_id.as_str());
        }
        if let Some(timeout) = spec.startup_timeout {
            kafka.startup_timeout = timeout;
        }
        match &self.store {
            Store::Postgres(store) => consumer(store.clone(), kafka, spec, &self.token),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(store) => consumer(store.clone(), kafka, spec, &self.token),
        }
    }

    fn relay_part(&self, spec: RelaySpec) -> Result<Part, AppError> {
        let producer = KafkaProducer::new(self.brokers()).idempotence(spec.idempotence);
        let (config, reports, token) = (spec.config, spec.reports, &self.token);
        match &self.store {
            Store::Postgres(store) => relay(store.clone(), producer, config, reports, token),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(store) => relay(store.clone(), producer, config, reports, token),
        }
    }
}

/// A part whose panic becomes [`AppError::Panicked`] naming it.
async fn named(part: String, future: Part) -> Result<(), AppError> {
    match tokio::spawn(future).await {
        Ok(result) => result,
        Err(error) => {
            let message = match error.try_into_panic() {
                Ok(panic) => panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default(),
                Err(_) => "cancelled".to_owned(),
            };
            Err(AppError::Panicked { part, message })
        }
    }
}

fn consumer<S: InboxStore>(
    store: S,
    kafka: KafkaConfig,
    spec: ConsumerSpec,
    token: &CancellationToken,
) -> Result<Part, AppError> {
    let group = spec.group;
    let mut builder = Consumer::builder(group.clone(), store, kafka).config(spec.config);
    if let Some(reports) = spec.reports {
        builder = builder.reports(reports);
    }
    let consumer = builder.build().map_err(|source| AppError::Setup {
        group: group.clone(),
        source: Box::new(source),
    })?;
    let shutdown = token.clone().cancelled_owned();
    Ok(Box::pin(async move {
        consumer
            .run(shutdown)
            .await
            .map_err(|source| AppError::Consumer {
                group,
                source: Box::new(source),
            })
    }))
}

fn relay<T: IntoRelayStore>(
    store: T,
    producer: KafkaProducer,
    config: RelayConfig,
    reports: Option<mpsc::UnboundedSender<RelayReport>>,
    token: &CancellationToken,
) -> Result<Part, AppError>
where
    T::Store: Send + Sync + 'static,
{
    let mut builder = Relay::builder(store, producer).config(config);
    if let Some(reports) = reports {
        builder = builder.reports(reports);
    }
    let relay = builder.build()?;
    let shutdown = token.clone().cancelled_owned();
    Ok(Box::pin(async move { Ok(relay.run(shutdown).await?) }))
}

/// The store `database_url` names, or the zero-setup SQLite file; with the directory to remove
/// and the name for [`App::describe`].
async fn open_store(
    database_url: Option<&str>,
) -> Result<(Store, Option<TempDir>, String), AppError> {
    match database_url {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = PgStore::connect(url, PG_POOL_CONNECTIONS).await?;
            let redacted = crate::store::redact_url(url);
            let target = redacted.split('?').next().unwrap_or_default();
            let target = target.rsplit('@').next().unwrap_or_default();
            let target = target
                .trim_start_matches("postgres://")
                .trim_start_matches("postgresql://");
            Ok((
                Store::Postgres(store),
                None,
                format!("PostgreSQL ({target})"),
            ))
        }
        #[cfg(feature = "sqlite")]
        Some(url) if url.starts_with("sqlite:") => {
            let store = crate::sqlite::SqliteStore::connect(url).await?;
            Ok((Store::Sqlite(store), None, format!("SQLite ({url})")))
        }
        #[cfg(feature = "sqlite")]
        None => {
            let dir =
                std::env::temp_dir().join(format!("inoutbox-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir).map_err(|source| AppError::TempDir {
                path: dir.clone(),
                source,
            })?;
            let temp = TempDir(dir);
            let path = temp.0.join("app.db");
            let store =
                crate::sqlite::SqliteStore::connect(&format!("sqlite:{}", path.display())).await?;
            let name = format!("SQLite ({})", path.display());
            Ok((Store::Sqlite(store), Some(temp), name))
        }
        #[cfg(not(feature = "sqlite"))]
        None => Err(AppError::Config(
            "set DATABASE_URL=postgres://... (zero setup needs the `sqlite` feature)".to_owned(),
        )),
        Some(url) => Err(AppError::Config(format!(
            "DATABASE_URL must start with postgres://, postgresql:// or sqlite:, got `{}`",
            crate::store::redact_url(url)
        ))),
    }
}
