//! # txbox
//!
//! Transactional inbox and outbox for Rust services on PostgreSQL and Kafka.
//!
//! See the README for the tour.

#![warn(missing_docs)]

pub use box_macros::{inbox_handler, OutboxEvent};
pub use box_runtime::{ErrorKind, HandlerError, IntoHandlerError, MessageMeta, PgTx};

#[doc(hidden)]
pub use box_runtime::__private;

/// The names most services need: `use txbox::prelude::*;`.
pub mod prelude {
    pub use crate::{inbox_handler, HandlerError, MessageMeta, OutboxEvent, PgTx};
}
