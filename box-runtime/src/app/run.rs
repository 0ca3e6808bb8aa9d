//! [`App`]: a service's store, broker and parts, run until a signal or its token stops them.

use std::future::Future;
use std::pin::Pin;

use tokio::task::JoinSet;

use super::env::Env;
use super::store::{open_store, TempDir};
use super::{AppError, ConsumerSpec, RelaySpec, Store};
use crate::kafka::{create_topic, InProcessKafka};
use crate::shutdown::CancellationToken;

/// Where the app's events go: a broker outside, or librdkafka's mock cluster in this process.
enum Broker {
    External(String),
    InProcess(InProcessKafka),
}

/// A service: a store, a broker, and the consumer groups and relays that run on them until
/// SIGINT, SIGTERM or [`App::shutdown_token`] is cancelled.
///
/// [`App::from_env`] chooses like the quickstart: `DATABASE_URL` (`postgres://...` or
/// `sqlite:...`) or else a SQLite file in a temporary directory (removed when the app is
/// dropped); `KAFKA_BROKERS` or else an in-process Kafka (librdkafka's mock cluster, whose
/// consumers get the settings it needs, `kafka::CONSUMER_SETTINGS`). [`App::run`] returns the
/// first error of any part, after stopping the others.
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
    broker: Broker,
    describe: String,
    consumers: Vec<ConsumerSpec>,
    relays: Vec<RelaySpec>,
    pub(super) token: CancellationToken,
    // Dropped last: the store's pool closes before its directory goes.
    _temp: Option<TempDir>,
}

impl App {
    /// The store and broker the environment names (`DATABASE_URL`, `KAFKA_BROKERS`; empty is
    /// unset), or the zero-setup ones; inoutbox's tables are migrated.
    pub async fn from_env() -> Result<Self, AppError> {
        let env = Env::read();
        Self::connect(env.database_url.as_deref(), env.brokers.as_deref()).await
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
}

/// A part's future: a consumer group or a relay, until the app's token is cancelled.
pub(super) type Part = Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>>;

/// A part whose panic becomes [`AppError::Panicked`] naming it.
pub(super) async fn named(
    part: String,
    future: Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>>,
) -> Result<(), AppError> {
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
