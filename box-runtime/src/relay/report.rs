//! What a relay reports: the failure that stops it, and what became of each row.

use std::time::SystemTime;

use uuid::Uuid;

use crate::store::StoreError;
use crate::transport::PublishError;

/// A relay failure that stops it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The publisher could not be created (a bad setting, ...).
    #[error("cannot create the relay's publisher: {0}")]
    Publisher(#[source] PublishError),
    /// The store failed at start-up.
    #[error("relay store: {0}")]
    Store(#[from] StoreError),
}

/// What the relay did with one row; sent to [`RelayBuilder::reports`] (for tests and benches).
#[derive(Clone, Debug)]
pub enum RelayReport {
    /// The broker acknowledged the row; it is being marked published.
    Published {
        /// Event id.
        id: Uuid,
        /// Topic.
        topic: String,
        /// Key.
        key: Option<String>,
        /// Partition written to.
        partition: i32,
        /// Offset written to.
        offset: i64,
        /// When the delivery report arrived.
        acked_at: SystemTime,
    },
    /// Publishing the row failed.
    Failed {
        /// Event id.
        id: Uuid,
        /// The error.
        error: String,
        /// Whether the row was parked (given up on).
        parked: bool,
    },
}
