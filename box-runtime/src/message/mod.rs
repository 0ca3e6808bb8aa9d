//! The ground floor: what every other room speaks of. A message as a transport delivers it
//! ([`Delivery`]), what became of it ([`Outcome`]), how long rows are kept ([`Retention`]),
//! and (feature `otel`) the W3C trace context a message carries.

mod delivery;
mod outcome;
mod retention;
#[cfg(feature = "otel")]
pub(crate) mod trace;

pub use delivery::Delivery;
pub use outcome::Outcome;
pub use retention::Retention;
