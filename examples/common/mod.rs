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

/// The benches' NATS JetStream side.
#[cfg(feature = "nats")]
pub mod nats;

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

/// `GET path` on `addr` over HTTP/1.1: the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((status, body))
}

/// `DATABASE_URL` (`None` when unset or empty: the zero-setup store); on PostgreSQL with the
/// schema `schema` dropped, created again and chosen by the URL's `search_path`, so each run
/// of an example starts from empty tables.
pub async fn database_url_in_schema(schema: &str) -> Result<Option<String>, BoxError> {
    let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    if !url.starts_with("postgres") {
        return Ok(Some(url));
    }
    let admin = sqlx::PgPool::connect(&url).await?;
    let recreate = format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(recreate))
        .execute(&admin)
        .await?;
    admin.close().await;
    let sep = if url.contains('?') { '&' } else { '?' };
    Ok(Some(format!(
        "{url}{sep}options=-c%20search_path%3D{schema}"
    )))
}

/// A database of a run's own on the MySQL/MariaDB server of a `mysql://` URL: created empty,
/// dropped by [`MySqlDatabase::remove`].
#[cfg(feature = "mysql")]
pub struct MySqlDatabase {
    /// Its name (`{prefix}_{random}`).
    pub name: String,
    /// `url` with this database in place of the URL's own.
    pub url: String,
    admin: sqlx::MySqlPool,
}

#[cfg(feature = "mysql")]
impl MySqlDatabase {
    /// Creates `{prefix}_{8 random hex digits}` on `url`'s server.
    pub async fn create(url: &str, prefix: &str) -> Result<Self, BoxError> {
        let name = format!("{prefix}_{}", &Uuid::new_v4().simple().to_string()[..8]);
        let admin = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&admin)
            .await?;
        let (main, query) = url
            .split_once('?')
            .map_or((url, None), |(m, q)| (m, Some(q)));
        let authority = main.find("://").map_or(0, |i| i + 3);
        let server = main[authority..]
            .find('/')
            .map_or(main, |i| &main[..authority + i]);
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        Ok(Self {
            url: format!("{server}/{name}{query}"),
            name,
            admin,
        })
    }

    /// A pool on the URL's own database (name this one's tables `database.table`).
    pub fn admin(&self) -> &sqlx::MySqlPool {
        &self.admin
    }

    /// Drops the database.
    pub async fn remove(self) -> Result<(), BoxError> {
        let drop = format!("DROP DATABASE IF EXISTS `{}`", self.name);
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(&self.admin)
            .await?;
        self.admin.close().await;
        Ok(())
    }
}
