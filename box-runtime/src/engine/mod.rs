//! The inbox engine: what happens to one message, whatever the broker and the database.
//!
//! [`Inbox::process`] takes a [`Delivery`] through the consumer's [`AckStrategy`]: the inbox
//! row, the handler and the processed mark in one transaction, retries with backoff, dead
//! letters. It returns an [`Outcome`] saying whether the offset may be committed. The engine
//! knows neither Kafka nor PostgreSQL: stores implement [`InboxStore`], transports feed
//! `partition::run` through a [`PartitionLink`].

mod batch;
pub(crate) mod config;
mod dead_letters;
mod deferred;
#[cfg(test)]
mod fake;
mod inbox;
mod offsets;
pub(crate) mod partition;
mod prepare;
mod process;
mod setup;
mod telemetry;
mod two_phase;

pub(crate) use config::inbox_setters;
pub use config::{
    AckStrategy, CommitOn, EventId, InboxConfig, OnExhausted, Ordering, RetryPolicy, Source,
    UnknownEvent, DEFAULT_RETENTION,
};
pub use dead_letters::ReplayError;
pub use inbox::Inbox;
pub use partition::Report;
pub use setup::SetupError;
