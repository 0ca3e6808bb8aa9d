//! The checks an inbox's setup must pass before it runs a message.

use super::config::{AckStrategy, InboxConfig};
use crate::handler::DispatchTable;
use crate::store::InboxStore;

/// Checks that a group with two-phase handlers runs on a store that supports them, with the
/// inbox acknowledgement strategy.
pub(super) fn check_two_phase<S: InboxStore>(
    handlers: &DispatchTable,
    config: &InboxConfig,
) -> Result<(), SetupError> {
    let (two_phase, _) = handlers.two_phase_types();
    let Some(first) = two_phase.first().and_then(|t| handlers.get(t)) else {
        return Ok(());
    };
    // The received row is stored before any handler code runs: a business key (read from
    // the payload for the one-phase claim) is not checked there.
    if let Some(keyed) =
        (two_phase.iter().filter_map(|t| handlers.get(t))).find(|r| r.business_key.is_some())
    {
        return Err(SetupError::Config(format!(
            "handler {} is two-phase (`mode = \"two_phase\"`) and deduplicates by a business key \
             (`dedup_by` or the event's `idempotency_key`), which the two-phase inbox does not \
             support: drop one of them",
            keyed.location()
        )));
    }
    if !S::TWO_PHASE {
        return Err(SetupError::Config(format!(
            "handler {} is two-phase (`mode = \"two_phase\"`), which the {} store does not \
             support; use PostgreSQL, MySQL/MariaDB or SQLite, or remove `mode = \"two_phase\"`",
            first.location(),
            S::NAME
        )));
    }
    if config.ack != AckStrategy::ExactlyOnceInbox {
        return Err(SetupError::Config(format!(
            "handler {} is two-phase (`mode = \"two_phase\"`), which needs the inbox: use \
             `AckStrategy::ExactlyOnceInbox` (the default), not {:?}",
            first.location(),
            config.ack
        )));
    }
    Ok(())
}

/// Why an inbox could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The handlers of the group are inconsistent.
    #[error(transparent)]
    Registry(#[from] crate::handler::RegistryError),
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}
