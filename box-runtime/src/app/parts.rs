//! Each part of an [`App`]: a consumer group or a relay as a future that ends with the part,
//! and the panic of a part as an [`AppError`].

#[cfg(feature = "nats")]
use super::broker::Broker;
use super::run::Part;
use super::{App, AppError, ConsumerSpec, RelaySpec, Store};
use crate::consumer::Settings;
use crate::kafka::{KafkaConfig, KafkaProducer, CONSUMER_SETTINGS};
use crate::relay::{IntoRelayStore, Relay};
use crate::shutdown::CancellationToken;
use crate::store::InboxStore;
use crate::transport::{IntoPublisher, Transport};
use crate::Consumer;

/// Runs `$run(store, ...)` on the store of the app, whichever it is.
macro_rules! on_store {
    ($app:expr, $run:ident($($arg:expr),*)) => {
        match &$app.store {
            Store::Postgres(store) => $run(store.clone(), $($arg),*),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(store) => $run(store.clone(), $($arg),*),
            #[cfg(feature = "mysql")]
            Store::MySql(store) => $run(store.clone(), $($arg),*),
        }
    };
}

/// A consumer member's failure as the app's error.
fn kafka_failed(group: String, source: crate::kafka::KafkaTransportError) -> AppError {
    AppError::Consumer {
        group,
        source: Box::new(source),
    }
}

impl App {
    /// The consumer group `spec` names, on the app's store and broker.
    pub(super) fn consumer_part(&self, spec: ConsumerSpec) -> Result<Part, AppError> {
        #[cfg(feature = "nats")]
        if let Broker::Nats(nats) = &self.broker {
            let config = nats_consumer(&nats.url, nats.partitions(), &spec);
            return on_store!(self, consumer(config, spec, &self.token, nats_failed));
        }
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
        on_store!(self, consumer(kafka, spec, &self.token, kafka_failed))
    }

    /// A relay of the app's store to its broker, as `spec` says.
    pub(super) fn relay_part(&self, spec: RelaySpec) -> Result<Part, AppError> {
        #[cfg(feature = "nats")]
        if let Broker::Nats(nats) = &self.broker {
            let (url, partitions) = (nats.url.clone(), nats.partitions());
            return Ok(on_store!(
                self,
                nats_relay(url, partitions, spec, self.token.clone())
            ));
        }
        let producer = KafkaProducer::new(self.brokers()).idempotence(spec.idempotence);
        on_store!(self, relay(producer, spec, &self.token))
    }
}

fn consumer<S: InboxStore, T: Transport>(
    store: S,
    transport: T,
    spec: ConsumerSpec,
    token: &CancellationToken,
    failed: fn(String, T::Error) -> AppError,
) -> Result<Part, AppError> {
    let group = spec.group;
    let settings = Settings {
        config: spec.config,
        reports: spec.reports,
        sampling: spec.sampling,
        effects: spec.effects,
        health: spec.health,
    };
    let builder = Consumer::builder(group.clone(), store, transport).settings(settings);
    let consumer = builder.build().map_err(|source| AppError::Setup {
        group: group.clone(),
        source: Box::new(source),
    })?;
    let shutdown = token.clone().cancelled_owned();
    Ok(Box::pin(async move {
        consumer
            .run(shutdown)
            .await
            .map_err(|source| failed(group, source))
    }))
}

fn relay<T: IntoRelayStore, P: IntoPublisher>(
    store: T,
    producer: P,
    spec: RelaySpec,
    token: &CancellationToken,
) -> Result<Part, AppError>
where
    T::Store: Send + Sync + 'static,
{
    let relay = Relay::builder(store, producer)
        .config(spec.config)
        .handed(spec.reports, spec.sample_interval, spec.health)
        .build()?;
    let shutdown = token.clone().cancelled_owned();
    Ok(Box::pin(async move { Ok(relay.run(shutdown).await?) }))
}

/// A NATS consumer member's failure as the app's error.
#[cfg(feature = "nats")]
fn nats_failed(group: String, source: crate::nats::NatsTransportError) -> AppError {
    AppError::NatsConsumer {
        group,
        source: Box::new(source),
    }
}

/// The NATS settings of the consumer group `spec`: the app's server and partitions, the
/// spec's start-up timeout. Its Kafka settings and group id have no meaning on NATS: said in
/// a warning (the names only: a value may be a secret).
#[cfg(feature = "nats")]
fn nats_consumer(url: &str, partitions: u32, spec: &ConsumerSpec) -> crate::nats::NatsConfig {
    let mut config = crate::nats::NatsConfig::new(url, spec.topics.iter().map(String::as_str))
        .partitions(partitions);
    if let Some(timeout) = spec.startup_timeout {
        config = config.startup_timeout(timeout);
    }
    if !spec.settings.is_empty() || spec.group_id.is_some() {
        let settings: Vec<&str> = spec.settings.iter().map(|(k, _)| k.as_str()).collect();
        tracing::warn!(target: "inoutbox::app", group = spec.group.as_str(),
            ?settings, group_id = spec.group_id.is_some(),
            "Kafka settings of a consumer group ignored: the app runs on NATS");
    }
    config
}

/// A relay to NATS: connects its publisher (until the app's token is cancelled), then runs as
/// a relay to Kafka does.
#[cfg(feature = "nats")]
fn nats_relay<T: IntoRelayStore + Send + 'static>(
    store: T,
    url: String,
    partitions: u32,
    spec: RelaySpec,
    token: CancellationToken,
) -> Part
where
    T::Store: Send + Sync + 'static,
{
    Box::pin(async move {
        let publisher = tokio::select! {
            publisher = crate::nats::NatsPublisher::connect(&url, partitions) => {
                publisher.map_err(crate::relay::RelayError::Publisher)?
            }
            () = token.cancelled() => return Ok(()),
        };
        relay(store, publisher, spec, &token)?.await
    })
}
