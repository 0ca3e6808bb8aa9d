//! The seal of traits users call, name as bounds, but do not implement: `Partitions`,
//! `Executes`, `Db`. (The store traits a store author implements are open:
//! `InboxStore`, `OutboxTx`, `RelayStore`, `RelaySession`, `IntoRelayStore`.) Only this crate can
//! implement `Sealed`, so only this crate can implement them, and they may grow methods without
//! a breaking change.

/// Implemented by the crate's own types only.
pub trait Sealed {}
