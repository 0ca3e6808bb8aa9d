//! [`App`]: a service's store, broker and parts, run until a signal or its token stops them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use tokio::task::{JoinError, JoinSet};

use super::broker::Broker;
use super::env::{self, BrokerUrl, Choice};
use super::store::{open_store, TempDir};
use super::{AppError, ConsumerSpec, RelaySpec, Store};
use crate::kafka::InProcessKafka;
use crate::shutdown::CancellationToken;
use crate::telemetry::Health;

/// A service: a store, a broker, and the consumer groups and relays that run on them until
/// SIGINT, SIGTERM or [`App::shutdown_token`] is cancelled.
///
/// [`App::from_env`] takes `DATABASE_URL` (`postgres://...` or `sqlite:...`) and
/// `KAFKA_BROKERS` (or, feature `nats`, `NATS_URL`: NATS JetStream) together, or, when neither
/// is set, the embedded parts: a SQLite file in a
/// temporary directory (removed when the app is dropped) and an in-process Kafka
/// (librdkafka's mock cluster, whose consumers get the settings it needs,
/// `kafka::CONSUMER_SETTINGS`). One without the other refuses to start. [`App::run`] returns
/// the first error of any part (a panic included), after stopping the others.
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
    pub(super) store: Store,
    pub(super) broker: Broker,
    describe: String,
    consumers: Vec<ConsumerSpec>,
    relays: Vec<RelaySpec>,
    /// The health of every part added, by name.
    health: Vec<(String, Health)>,
    /// Where the operations endpoint listens, if anywhere.
    #[cfg(feature = "http")]
    pub(super) ops: Option<std::net::SocketAddr>,
    pub(super) token: CancellationToken,
    // Dropped last: the store's pool closes before its directory goes.
    _temp: Option<TempDir>,
}

impl App {
    /// The store and broker the environment names: `DATABASE_URL` and a broker
    /// (`KAFKA_BROKERS`, or `NATS_URL` with the feature `nats`) both set, or none (the
    /// zero-setup SQLite file and the in-process Kafka, said at start-up in a log line);
    /// inoutbox's tables are migrated.
    ///
    /// A database without a broker or a broker without a database, `KAFKA_BROKERS` and
    /// `NATS_URL` both, any of them set to nothing but whitespace, or `NATS_URL` in a build
    /// without the feature `nats`, is an [`AppError::Env`] naming the variable: a service with a
    /// real database never publishes into a broker inside its own process, nor commits a real
    /// group's offsets over a temporary database.
    pub async fn from_env() -> Result<Self, AppError> {
        match env::read()? {
            Choice::External {
                database_url,
                broker: BrokerUrl::Kafka(brokers),
            } => Self::connect(Some(&database_url), Some(&brokers)).await,
            #[cfg(feature = "nats")]
            Choice::External {
                database_url,
                broker: BrokerUrl::Nats(url),
            } => Self::connect_nats(Some(&database_url), &url).await,
            #[cfg(not(feature = "nats"))]
            Choice::External {
                broker: BrokerUrl::Nats(_),
                ..
            } => Err(AppError::Env {
                variable: env::NATS_URL,
                reason: "is set, but this build has no NATS: enable inoutbox's feature `nats` \
                         (or set KAFKA_BROKERS instead)"
                    .to_owned(),
            }),
            Choice::Embedded => Self::connect(None, None).await,
        }
    }

    /// As [`App::from_env`], with the values given: `database_url` `postgres://...`,
    /// `sqlite:...` or `None` (the zero-setup SQLite file), `brokers` or `None` (the in-process
    /// Kafka). A `None` is an explicit choice of that embedded part, said at start-up in a log
    /// line (a warning when the other part is real); an empty value is an [`AppError::Env`].
    pub async fn connect(
        database_url: Option<&str>,
        brokers: Option<&str>,
    ) -> Result<Self, AppError> {
        let database_url = env::given(env::DATABASE_URL, database_url)?;
        let brokers = env::given(env::KAFKA_BROKERS, brokers)?;
        let (store, temp, db_name) = open_store(database_url).await?;
        store.migrate().await?;
        let app = Self::new(store, brokers)?;
        Ok(app.opened(database_url.is_none(), temp, &db_name))
    }

    /// (Feature `nats`.) As [`App::connect`], on the NATS JetStream server at `nats_url`
    /// (`nats://host:4222`, credentials in it are never shown): the consumer groups read and
    /// the relays publish there, [`create_topic`](Self::create_topic) creates streams.
    #[cfg(feature = "nats")]
    pub async fn connect_nats(
        database_url: Option<&str>,
        nats_url: &str,
    ) -> Result<Self, AppError> {
        let database_url = env::given(env::DATABASE_URL, database_url)?;
        let (store, temp, db_name) = open_store(database_url).await?;
        store.migrate().await?;
        let app = Self::new_nats(store, nats_url)?;
        Ok(app.opened(database_url.is_none(), temp, &db_name))
    }

    /// The app on the store it opened: its description, its temporary directory, its start-up
    /// line.
    fn opened(mut self, temp_database: bool, temp: Option<TempDir>, db_name: &str) -> Self {
        self.describe = format!("{db_name} + {}", self.broker.name());
        self._temp = temp;
        self.say_embedded(temp_database);
        self
    }

    /// The start-up line that names the embedded parts in use, if any: information when both
    /// are, a warning when one is beside a real one.
    fn say_embedded(&self, temp_database: bool) {
        let in_process = self.is_in_process();
        let describe = self.describe.as_str();
        match (temp_database, in_process) {
            (false, false) => {}
            (true, true) => tracing::info!(target: "inoutbox::app", parts = describe,
                "running on the embedded parts: a SQLite file removed at exit and the in-process \
                 Kafka; nothing outlives the process (set DATABASE_URL and KAFKA_BROKERS or NATS_URL for a service)"),
            (false, true) => tracing::warn!(target: "inoutbox::app", parts = describe,
                "running on the in-process Kafka: events published here never leave this process"),
            (true, false) => tracing::warn!(target: "inoutbox::app", parts = describe,
                "running on a temporary SQLite file removed at exit: handlers' effects do not \
                 outlive the process, while the group's offsets are committed on the broker"),
        }
    }

    /// An app on a store of your own (migrated by you), and `brokers` or `None` (in-process
    /// Kafka).
    pub fn new(store: Store, brokers: Option<&str>) -> Result<Self, AppError> {
        let broker = match env::given(env::KAFKA_BROKERS, brokers)? {
            Some(brokers) => Broker::External(brokers.to_owned()),
            None => Broker::InProcess(InProcessKafka::start()?),
        };
        Ok(Self::on(store, broker))
    }

    /// (Feature `nats`.) An app on a store of your own (migrated by you) and the NATS
    /// JetStream server at `nats_url`.
    #[cfg(feature = "nats")]
    pub fn new_nats(store: Store, nats_url: &str) -> Result<Self, AppError> {
        let url = env::given(env::NATS_URL, Some(nats_url))?.unwrap_or_default();
        Ok(Self::on(store, Broker::Nats(super::broker::Nats::new(url))))
    }

    fn on(store: Store, broker: Broker) -> Self {
        let describe = format!("{} + {}", store.name(), broker.name());
        Self {
            describe,
            store,
            broker,
            consumers: Vec::new(),
            relays: Vec::new(),
            health: Vec::new(),
            #[cfg(feature = "http")]
            ops: None,
            token: CancellationToken::new(),
            _temp: None,
        }
    }

    /// The store (clone it to write business rows while the app runs).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The bootstrap servers (on NATS, the server's URL as given).
    pub fn brokers(&self) -> &str {
        match &self.broker {
            Broker::External(brokers) => brokers,
            Broker::InProcess(kafka) => kafka.brokers(),
            #[cfg(feature = "nats")]
            Broker::Nats(nats) => &nats.url,
        }
    }

    /// The transport the app's parts run on: `"kafka"` or `"nats"`.
    pub fn transport(&self) -> &'static str {
        self.broker.transport()
    }

    /// Whether the broker is the in-process one.
    pub fn is_in_process(&self) -> bool {
        matches!(self.broker, Broker::InProcess(_))
    }

    /// What the app runs on, for a first log line: e.g. `SQLite (/tmp/../app.db) + in-process
    /// Kafka (librdkafka mock cluster)`, `PostgreSQL (db:5432/app) + NATS JetStream at
    /// nats://app:***@nats:4222` (passwords hidden).
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Creates `topic` with `partitions` partitions unless it exists (the relay does not create
    /// Kafka topics). On NATS it creates the topic's stream and sets the partitions per topic
    /// of the app's consumers and relays (3 otherwise): every topic of an app on NATS has the
    /// same number, and a topic created with another is refused.
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), AppError> {
        self.broker.create_topic(topic, partitions).await
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
        self.health.push((spec.group.clone(), spec.health.clone()));
        self.consumers.push(spec);
        self
    }

    /// Runs a relay with the default settings.
    pub fn relay(self) -> Self {
        self.relay_with(RelaySpec::new())
    }

    /// Runs a relay as `spec` says.
    pub fn relay_with(mut self, spec: RelaySpec) -> Self {
        let name = match self.relays.len() {
            0 => "relay".to_owned(),
            n => format!("relay {}", n + 1),
        };
        self.health.push((name, spec.health.clone()));
        self.relays.push(spec);
        self
    }

    /// The [`Health`] of every part added, named by its consumer group (`relay`, `relay 2`,
    /// ... for relays): live while it runs, ready while it is joined and its database answers.
    /// The handles are those the parts update once [`run`](Self::run) starts them.
    pub fn health(&self) -> &[(String, Health)] {
        &self.health
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
        #[cfg(feature = "http")]
        let ops = self.start_ops().await?;
        let result = self.run_until_stopped().await;
        #[cfg(feature = "http")]
        if let Some(ops) = ops {
            // Served until every part has stopped: the probes see the stop.
            ops.cancel();
        }
        result
    }

    async fn run_until_stopped(&mut self) -> Result<(), AppError> {
        let mut parts = Vec::new();
        for spec in std::mem::take(&mut self.consumers) {
            let name = format!("consumer group `{}`", spec.group);
            match self.consumer_part(spec) {
                Ok(part) => parts.push((name, part)),
                Err(error) => return abort(&self.token, parts, error).await,
            }
        }
        for spec in std::mem::take(&mut self.relays) {
            match self.relay_part(spec) {
                Ok(part) => parts.push(("relay".to_owned(), part)),
                Err(error) => return abort(&self.token, parts, error).await,
            }
        }
        let token = self.token.clone();
        let signal = tokio::spawn(async move {
            tokio::select! {
                () = crate::shutdown::shutdown_signal() => token.cancel(),
                () = token.cancelled() => {}
            }
        });
        let result = run_parts(&self.token, parts).await;
        signal.abort();
        result
    }
}

/// A part's future: a consumer group or a relay, until the app's token is cancelled.
pub(super) type Part = Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>>;

/// Parts built before one failed to build are dropped unstarted; `error` is returned.
async fn abort(
    token: &CancellationToken,
    parts: Vec<(String, Part)>,
    error: AppError,
) -> Result<(), AppError> {
    token.cancel();
    drop(parts);
    Err(error)
}

/// Runs `parts` as tasks until each has ended: the first to fail or panic cancels `token` (the
/// others stop) and its error ([`AppError::Panicked`] for a panic) is returned once all have
/// ended. With no part, waits for `token`.
async fn run_parts(token: &CancellationToken, parts: Vec<(String, Part)>) -> Result<(), AppError> {
    if parts.is_empty() {
        token.cancelled().await;
        return Ok(());
    }
    let mut tasks = JoinSet::new();
    let mut names = HashMap::new();
    for (name, part) in parts {
        names.insert(tasks.spawn(part).id(), name);
    }
    let mut first = None;
    while let Some(joined) = tasks.join_next_with_id().await {
        let error = match joined {
            Ok((_, Ok(()))) => continue,
            Ok((_, Err(error))) => error,
            Err(error) => {
                let part = names.remove(&error.id()).unwrap_or_default();
                panicked(part, error)
            }
        };
        tracing::error!(target: "inoutbox::app", %error, "a part of the app failed; stopping the others");
        first.get_or_insert(error);
        token.cancel();
    }
    first.map_or(Ok(()), Err)
}

/// The panic (or abort) of the task of `part` as [`AppError::Panicked`].
fn panicked(part: String, error: JoinError) -> AppError {
    let message = match error.try_into_panic() {
        Ok(panic) => panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default(),
        Err(_) => "cancelled".to_owned(),
    };
    AppError::Panicked { part, message }
}

#[cfg(test)]
mod tests {
    use super::{run_parts, AppError, Part};
    use crate::shutdown::CancellationToken;

    #[tokio::test]
    async fn a_part_that_panics_is_the_error_of_the_run_and_stops_the_others() {
        let token = CancellationToken::new();
        let other = token.clone();
        // Stops when the token is cancelled (bounded, so that a run that ignores the panic
        // fails this test instead of hanging it).
        let waits: Part = Box::pin(async move {
            tokio::select! {
                () = other.cancelled() => Ok(()),
                () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {
                    Err(AppError::Config("not stopped".to_owned()))
                }
            }
        });
        let panics: Part = Box::pin(async { panic!("the part broke") });
        let parts = vec![
            ("relay".to_owned(), waits),
            ("consumer group `g`".to_owned(), panics),
        ];
        match run_parts(&token, parts).await {
            Err(AppError::Panicked { part, message }) => {
                assert_eq!(part, "consumer group `g`");
                assert_eq!(message, "the part broke");
            }
            other => panic!("expected the panic as the run's error, got {other:?}"),
        }
        assert!(token.is_cancelled(), "the other part was stopped");
    }
}
