//! Each part of an [`App`]: a consumer group or a relay as a future that ends with the part,
//! and the panic of a part as an [`AppError`].

use super::run::Part;
use super::{App, AppError, ConsumerSpec, RelaySpec, Store};
use crate::consumer::Settings;
use crate::kafka::{KafkaConfig, KafkaProducer, CONSUMER_SETTINGS};
use crate::relay::{IntoRelayStore, Relay};
use crate::shutdown::CancellationToken;
use crate::store::InboxStore;
use crate::Consumer;

impl App {
    /// The consumer group `spec` names, on the app's store and broker.
    pub(super) fn consumer_part(&self, spec: ConsumerSpec) -> Result<Part, AppError> {
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
            #[cfg(feature = "mysql")]
            Store::MySql(store) => consumer(store.clone(), kafka, spec, &self.token),
        }
    }

    /// A relay of the app's store to its broker, as `spec` says.
    pub(super) fn relay_part(&self, spec: RelaySpec) -> Result<Part, AppError> {
        let producer = KafkaProducer::new(self.brokers()).idempotence(spec.idempotence);
        match &self.store {
            Store::Postgres(store) => relay(store.clone(), producer, spec, &self.token),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(store) => relay(store.clone(), producer, spec, &self.token),
            #[cfg(feature = "mysql")]
            Store::MySql(store) => relay(store.clone(), producer, spec, &self.token),
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
    let settings = Settings {
        config: spec.config,
        reports: spec.reports,
        sampling: spec.sampling,
        effects: spec.effects,
        health: spec.health,
    };
    let builder = Consumer::builder(group.clone(), store, kafka).settings(settings);
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
