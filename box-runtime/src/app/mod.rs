//! One runner for a service: the store and the broker chosen from the environment, and every
//! consumer group and relay of the process run together under one shutdown token.
//!
//! - `env`: what `DATABASE_URL`, `KAFKA_BROKERS` and `NATS_URL` name;
//! - `broker`: the broker: Kafka outside or in-process, or NATS JetStream (feature `nats`);
//! - `store`: [`Store`], opened from a URL or the zero-setup SQLite file;
//! - `spec`: [`ConsumerSpec`] and [`RelaySpec`], the parts to run;
//! - `run`: [`App`] and its run; `parts`: each part as a future;
//! - `ops`: (feature `http`) the operations endpoint of the app's parts;
//! - `error`: [`AppError`].

mod broker;
mod env;
mod error;
#[cfg(feature = "http")]
mod ops;
mod parts;
mod run;
mod spec;
mod store;

pub use error::AppError;
pub use run::App;
pub use spec::{ConsumerSpec, RelaySpec};
pub use store::Store;
