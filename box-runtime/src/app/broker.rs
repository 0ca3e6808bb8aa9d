//! The broker of an [`App`](super::App): Kafka outside, librdkafka's mock cluster in this
//! process, or (feature `nats`) a NATS JetStream server; its name for
//! [`App::describe`](super::App::describe) (a URL's password hidden) and its topics.

use super::AppError;
use crate::kafka::{create_topic, InProcessKafka};

/// Where the app's events go.
pub(super) enum Broker {
    /// Kafka brokers outside (`KAFKA_BROKERS`).
    External(String),
    /// librdkafka's mock cluster in this process.
    InProcess(InProcessKafka),
    /// A NATS JetStream server (`NATS_URL`).
    #[cfg(feature = "nats")]
    Nats(Nats),
}

/// A NATS server and the partitions per topic of its consumers and publisher: they must agree,
/// so the app has one number for all its topics (3 unless [`App::create_topic`] says another).
///
/// [`App::create_topic`]: super::App::create_topic
#[cfg(feature = "nats")]
pub(super) struct Nats {
    pub(super) url: String,
    /// 0 until a topic is created: then [`DEFAULT_NATS_PARTITIONS`].
    partitions: std::sync::atomic::AtomicU32,
}

/// Partitions per topic on NATS when no topic was created by the app (`NatsConfig`'s default).
#[cfg(feature = "nats")]
pub(super) const DEFAULT_NATS_PARTITIONS: u32 = 3;

#[cfg(feature = "nats")]
impl Nats {
    /// The server at `url`.
    pub(super) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            partitions: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Partitions per topic.
    pub(super) fn partitions(&self) -> u32 {
        match self.partitions.load(std::sync::atomic::Ordering::SeqCst) {
            0 => DEFAULT_NATS_PARTITIONS,
            n => n,
        }
    }

    /// Creates `topic`'s streams (one a partition) unless they exist, and fixes the partitions
    /// per topic: a second topic of another number is refused (the publisher has one number for
    /// every topic).
    async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), AppError> {
        use std::sync::atomic::Ordering;
        let wanted = u32::try_from(partitions)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                AppError::Config(format!(
                    "topic `{topic}`: {partitions} partitions (at least 1)"
                ))
            })?;
        if let Err(had) =
            self.partitions
                .compare_exchange(0, wanted, Ordering::SeqCst, Ordering::SeqCst)
        {
            if had != wanted {
                return Err(AppError::Config(format!(
                    "topic `{topic}` with {wanted} partitions: on NATS every topic of an app has \
                     the same number, and another topic was created with {had}"
                )));
            }
        }
        let timeout = std::time::Duration::from_secs(30);
        let client = crate::nats::connect(&self.url, timeout).await?;
        let js = async_nats::jetstream::new(client);
        crate::nats::ensure_streams(&js, topic, wanted)
            .await
            .map_err(crate::nats::NatsTransportError::Setup)?;
        Ok(())
    }
}

impl Broker {
    /// What and where it is, without a password.
    pub(super) fn name(&self) -> String {
        match self {
            Broker::External(brokers) => format!("Kafka at {brokers}"),
            Broker::InProcess(_) => "in-process Kafka (librdkafka mock cluster)".to_owned(),
            #[cfg(feature = "nats")]
            Broker::Nats(nats) => {
                format!("NATS JetStream at {}", crate::redact::redact_url(&nats.url))
            }
        }
    }

    /// `"kafka"` or `"nats"`.
    pub(super) fn transport(&self) -> &'static str {
        match self {
            Broker::External(_) | Broker::InProcess(_) => "kafka",
            #[cfg(feature = "nats")]
            Broker::Nats(_) => "nats",
        }
    }

    /// Creates `topic` with `partitions` partitions unless it exists.
    pub(super) async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), AppError> {
        match self {
            Broker::InProcess(kafka) => Ok(kafka.create_topic(topic, partitions)?),
            Broker::External(brokers) => Ok(create_topic(brokers, topic, partitions).await?),
            #[cfg(feature = "nats")]
            Broker::Nats(nats) => nats.create_topic(topic, partitions).await,
        }
    }
}
