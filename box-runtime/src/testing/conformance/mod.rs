//! The conformance suite of the store traits: [`conformance`] runs the [`InboxStore`] contract
//! against a store, [`relay_conformance`] the outbox writer's and the [`RelayStore`]'s, each
//! rule as a direct call of the trait's methods (no broker, no consumer), so that anyone who
//! implements a store can run the rules the engine and the relay rely on. The built-in stores
//! pass it (`tests/contract.rs`).
//!
//! Each rule checks one promise of the traits' documentation; the first broken one ends the
//! run with a [`ConformanceError`] naming it. Optional parts of the contract (two-phase
//! handlers, effects after commit, deferred messages) are checked when the store says it keeps
//! them (`InboxStore::TWO_PHASE`, `EFFECTS`, `DEFERRAL`) and listed as skipped otherwise.
//!
//! Run it on a migrated database of its own: its rows are written under consumer groups and
//! topics of their own (a new UUID per run), but the retention rules delete every processed
//! inbox row older than a few milliseconds, and the relay rules claim every slot.

use crate::store::InboxStore;

mod effects;
mod inbox;
mod relay;
mod suite;

pub use relay::relay_conformance;
use suite::Suite;
pub use suite::{Conformance, ConformanceError};

/// Runs the [`InboxStore`] rules against `store` (migrated, on a database of its own): claims
/// and duplicates, batch claims, failure records that survive a rollback, dead letters and
/// their replay mark, retention, business keys, and, when the store keeps them, deferred
/// messages, effects after commit and the leases of two-phase handlers. Returns the rules
/// passed, or the first one broken.
///
/// Effects are scheduled in a handler's transaction by [`after_commit`](crate::effects::after_commit),
/// which writes through a `sqlx` transaction of PostgreSQL, SQLite or MySQL: for a store whose
/// transaction is another type the effects rules are skipped.
pub async fn conformance<S: InboxStore>(store: &S) -> Result<Conformance, ConformanceError> {
    let suite = Suite::new(store);
    let mut done = Conformance::default();
    inbox::core(&suite, &mut done).await?;
    match S::DEFERRAL {
        true => inbox::deferral(&suite, &mut done).await?,
        false => done
            .skipped
            .push(("deferral", "the store keeps no deferred messages")),
    }
    match S::TWO_PHASE {
        true => inbox::two_phase(&suite, &mut done).await?,
        false => done
            .skipped
            .push(("two_phase", "the store has no two-phase handlers")),
    }
    match S::EFFECTS {
        true => effects::effects(&suite, &mut done).await?,
        false => done.skipped.push(("effects", "the store keeps no effects")),
    }
    Ok(done)
}
