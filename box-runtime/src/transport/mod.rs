//! The transport contract: what a broker does for inoutbox. Kafka (`kafka/`) implements it, and
//! so can a crate of its own: nothing in the engine, the consumer or the relay names a broker.
//!
//! **The consumer side** ([`Transport`]): a transport joins the consumer group and, for every
//! partition or stream it owns, hands the engine its messages in order through
//! [`Partitions::start`], with a [`PartitionLink`] the engine commits through. Ownership
//! changes go through the link ([`PartitionLink::owned`]) and the cancellation token it started
//! the run with; a dead-lettered message comes back through
//! [`PartitionLink::dead_lettered`], for a copy on the broker.
//!
//! **The relay side** ([`Publisher`]): publish one keyed message with headers, and learn when
//! the broker has it ([`Receipt`]) or why it refused it ([`PublishError`]).
//!
//! What the engine guarantees in return: it commits a position only after every message
//! before it is resolved (processed in a committed transaction, a duplicate, or dead-lettered),
//! and only through the link of the run that delivered it; once a run's token is cancelled or
//! its link says the partition is no longer owned, it takes no new message, and what it had in
//! hand is either finished within the grace period or left uncommitted for the next owner.

mod consume;
mod publish;

pub use consume::{PartitionLink, Partitions, Transport};
pub use publish::{IntoPublisher, OutgoingMessage, PublishError, Publisher, Receipt};
