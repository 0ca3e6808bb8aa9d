//! The consumer: an inbox on a store, fed by a transport, until shutdown; with the tasks that
//! run beside it (gauge sampler, retention purge, two-phase workers, effects drain).

mod builder;
mod effects;
mod run;
pub(crate) mod sampler;

pub use builder::ConsumerBuilder;
pub(crate) use builder::{consumer_setters, Settings};
pub use run::Consumer;
