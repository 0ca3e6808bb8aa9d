//! What the examples share: command-line flags, environment variables with a hint, the
//! `OrderCreated` event and a few Kafka helpers. Each example includes this file with
//! `#[path = "common/mod.rs"] mod common;`; being in a subdirectory, it is not an example itself.
//!
//! Handlers are not here: each example registers the handlers it runs.

use std::time::Duration;

use inoutbox::kafka as names;
use inoutbox::prelude::*;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The error of the examples' helpers and async code.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What `main` returns: any error, printed on exit as its message and causes (rather than as
/// a `Debug` struct).
pub struct Failure(BoxError);

impl<E: Into<BoxError>> From<E> for Failure {
    fn from(error: E) -> Self {
        Self(error.into())
    }
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, "\n  caused by: {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

/// An order was created: the event the orders service enqueues and billing consumes.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub total_cents: i64,
}

/// The value after `name` in `args`, or `default` if `name` is absent.
pub fn flag(args: &[String], name: &str, default: &str) -> Result<String, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .cloned()
            .ok_or_else(|| format!("{name} needs a value")),
        None => Ok(default.to_owned()),
    }
}

/// The environment variable `name`, or an error that shows an `example` value.
pub fn env(name: &str, example: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("set {name} (e.g. {example})"))
}

/// Creates `topic` with `partitions` partitions (replication 1) unless it exists.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&new_topic], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic}: {code}").into()),
        }
    }
    Ok(())
}

/// The headers of an `OrderCreated` in CloudEvents binary mode, as the relay sends them.
pub fn order_created_headers(id: &str, source: &str) -> OwnedHeaders {
    [
        (names::HEADER_ID, id),
        (
            names::HEADER_TYPE,
            <OrderCreated as OutboxEvent>::EVENT_TYPE,
        ),
        (names::HEADER_SOURCE, source),
        (names::HEADER_SPECVERSION, names::SPECVERSION),
        (names::HEADER_CONTENT_TYPE, names::CONTENT_TYPE_JSON),
    ]
    .into_iter()
    .fold(OwnedHeaders::new(), |headers, (key, value)| {
        headers.insert(Header {
            key,
            value: Some(value),
        })
    })
}
