//! Effects after commit: work a handler schedules (an e-mail, a call to another service) that
//! runs only if the handler's transaction commits, at least once, with a stable idempotency key.
//!
//! [`after_commit`] writes the effect into the effects table *in the handler's transaction*:
//! a rollback (a failed or retried run) leaves nothing, a commit leaves a durable row. The
//! consumer drains its group's effects after each commit (and at start-up, which picks up rows
//! a dead process left) and runs the executor registered for the effect's kind
//! ([`ConsumerBuilder::effect`](crate::ConsumerBuilder::effect)). A process may die after the
//! external call and before the row is marked done: the effect then runs again, with the same
//! [`Effect::idempotency_key`], so the receiving side must deduplicate on it.
//!
//! Slow calls belong here rather than in the handler: the handler's transaction commits at once
//! with the effect's row, and the call runs afterwards with no transaction open. The consumer
//! runs up to [`ConsumerBuilder::effect_concurrency`](crate::ConsumerBuilder::effect_concurrency)
//! effects at once ([`DEFAULT_EFFECT_CONCURRENCY`], 8), each in a task of its own.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use inoutbox::prelude::*;
//!
//! #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
//! #[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
//! pub struct OrderCreated { pub order_id: u64, pub email: String }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { to: String, order_id: u64 }
//!
//! #[inbox_handler(event = "OrderCreated", group = "mailing")]
//! async fn send_receipt(event: OrderCreated, tx: &mut PgTx<'_>, meta: &MessageMeta) -> Result<(), HandlerError> {
//!     // ... database writes through `tx` ...
//!     let receipt = Receipt { to: event.email, order_id: event.order_id };
//!     inoutbox::effects::after_commit(tx, meta, "send_receipt", &receipt).await?;
//!     Ok(())
//! }
//!
//! # async fn demo(store: inoutbox::PgStore, kafka: inoutbox::KafkaConfig) -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = inoutbox::Consumer::builder("mailing", store, kafka)
//!     .effect("send_receipt", |effect: inoutbox::effects::Effect| async move {
//!         let receipt: Receipt = effect.payload_as()?;
//!         // Call the mail service with `effect.idempotency_key` (e.g. an `Idempotency-Key`
//!         // header): a retried effect must not send a second e-mail.
//!         let _ = (receipt.to, effect.idempotency_key);
//!         Ok(())
//!     })
//!     .build()?;
//! # Ok(()) }

mod drain;
mod schedule;

pub(crate) use drain::{drain, DrainSource, Executors};
#[cfg(feature = "testing")]
pub(crate) use drain::{owner_name, run_one, EFFECT_BATCH, EFFECT_LEASE};
pub use drain::{Effect, EffectFuture, DEFAULT_EFFECT_CONCURRENCY};
pub use schedule::{after_commit, idempotency_key, EffectsDb};
pub(crate) use schedule::{schedule_effect_with, ScheduleEffect, ScheduledEffect};
