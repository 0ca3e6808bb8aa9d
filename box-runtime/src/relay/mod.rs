//! The relay: publishes committed outbox rows to Kafka, at least once, in per-key commit order,
//! with any number of relay processes running at once.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use inoutbox::{kafka::KafkaProducer, PgStore, Relay};
//!
//! Relay::builder(PgStore::new(pool), KafkaProducer::new("127.0.0.1:9092"))
//!     .source("orders-service")     // ce_source
//!     .idempotence(false)           // e.g. for Tansu, which rejects the idempotent producer
//!     .build()?
//!     .run_until_signal()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! * **Slots.** Every row has a `slot`, a hash of its key (PostgreSQL: 64 slots, computed by
//!   the enqueue's INSERT or by a trigger), so all rows of one key share a slot. A relay runs
//!   [`RelayBuilder::workers`] workers (default 2); each opens a session of its own
//!   (PostgreSQL: a dedicated connection) and claims a contiguous block of about
//!   `64 / (workers of all relays)` slots with session advisory locks (`pg_try_advisory_lock`,
//!   never waited for). Workers recount each other every
//!   [`RelayBuilder::rebalance_interval`] (in `pg_locks`) and give back or take slots, so a
//!   second relay gets half the slots within a second, and the slots of a relay that died
//!   (its connections, and so its locks, gone) are taken over as quickly.
//! * **A batch.** A worker reads up to [`RelayBuilder::batch_size`] publishable rows of its
//!   slots, oldest first: PostgreSQL walks the partial index of ready rows `(seq, slot)` in
//!   `seq` order for each run of contiguous slots held, skipping other slots' entries inside
//!   the index (no sort, no per-key query, a cost that does not grow with the backlog, and the
//!   table visited in the order it was written), merged in `seq` order with the run's
//!   scheduled rows that are due (from the front of the index by due time, `(due_at, slot)`). It produces them in that order, waits for
//!   every delivery report, marks the delivered rows published in one `UPDATE` and the failed
//!   ones in another, then reads again.
//! * **Overlap.** The workers run concurrently: while one waits for the broker, others read or
//!   mark. Per-key order needs no cross-batch bookkeeping, because a worker never has two
//!   batches in flight.
//!
//! # Why per-key order holds with several relays
//!
//! * **Commit order = `seq` order per key.** A transaction that enqueued takes the
//!   transaction-level advisory locks of its `(topic, key)`s at commit, in ascending order,
//!   before its rows draw their `seq` (see [`crate::outbox`]), and keeps them until the commit
//!   ends. Two transactions of one key are therefore serialised, and the one that draws the
//!   smaller `seq` commits first. So in any snapshot in which a row is visible, every row of its
//!   key with a smaller `seq` is visible too (or rolled back). Ordering by `created_at` or by
//!   the UUID would not do: both are taken before commit, and a transaction that started
//!   earlier can commit later.
//! * **One worker per key at a time.** A key's rows are all in one slot, and a slot is held by
//!   one session; it is given back only between batches, with nothing in flight.
//! * **From the oldest row, in one snapshot.** Each read starts at the slot's oldest
//!   publishable row and is one statement, so it never returns a row of a key while an older
//!   publishable row of that key is left behind. A row scheduled for later
//!   ([`crate::outbox::enqueue_at`]) is not publishable until it is due and holds nothing: the
//!   key's later rows go out before it; among due rows, `seq` order holds. (A cursor that moved on past a row still uncommitted
//!   could: that row's key could commit a later row before the cursor's next read.)
//! * **One batch at a time per worker, in order to the producer.** A batch is fully
//!   acknowledged and marked before the next read, which starts again from the oldest row.
//! * **Kafka keeps the order it is given** within a partition (one key maps to one partition):
//!   with the idempotent producer (the default) even across internal retries; with
//!   `idempotence(false)` the relay sets `max.in.flight.requests.per.connection = 1` so a retry
//!   cannot overtake an earlier message.
//! * **Crashes**: a relay that dies between publish and mark leaves the rows unpublished; its
//!   locks go with its connections, and the next holder of the slot publishes them again, from
//!   the oldest (at least once: the inbox on the consumer side drops the duplicates). The first
//!   copies of a key's events are still in order: every copy is part of a run that starts at
//!   the oldest unmarked row of the key.
//!
//! * **A failed delivery holds the rest of its key.** If the broker refuses a row while later
//!   rows of its key in the same batch were already handed to the publisher, those later rows
//!   are not marked published even when acknowledged: they go out again after the failed row,
//!   in order. (Kafka's idempotent producer fails them together anyway; without it, the first
//!   copy of such a later row may reach the topic before the failed row, and its second copy
//!   follows it, in order.)
//!
//! Limits, stated plainly: if a worker's connection breaks while its batch is in flight,
//! another worker can take the slot and publish the same rows again at the same moment
//! (duplicates; the first copies stay in order).
//!
//! # Failures
//!
//! A failed row counts an attempt, keeps its error (`attempts`, `last_error`) and waits for its
//! retry (`next_attempt_at`, exponential backoff); the later rows of its key wait behind it, so
//! the order holds, while other keys flow. Errors that are about the message itself (too large,
//! topic unknown, invalid or not authorised, invalid record) park the row (`parked_at`) after
//! [`RelayBuilder::max_attempts`]. A parked row **holds its key**: none of the key's later rows
//! is published until it is unparked (`inoutbox unpark`, or `Admin::unpark`),
//! and then they go out after it, in order. Other keys flow. Held keys are visible: in
//! `inoutbox status` (the rows held behind each parked key) and in the gauge
//! `inoutbox_outbox_held_keys`. Broker outages (timeouts, transport errors) are retried
//! forever with backoff and never park.
//!
//! # Wake-up
//!
//! An enqueue notifies (delivered at commit) if no other transaction in flight already will
//! (see `postgres::outbox`); the relay `LISTEN`s on a connection of its own and wakes its idle
//! workers at once. Polling at [`RelayBuilder::poll_interval`] (default 1 s) covers a missed
//! notification. A worker that finds rows reads again without waiting. A worker that finds
//! none also asks when the next scheduled row of its slots is due
//! ([`RelaySession::next_due`]: due times still ahead only, so a due row that is held never
//! makes it spin) and sleeps no longer than that.
//!
//! # Stopping
//!
//! [`Relay::run`] watches its shutdown future from its first moment. On shutdown no new batch
//! is read; batches in flight are acknowledged and marked, for at most
//! [`RelayBuilder::grace`] (default 10 s), after which they are abandoned unmarked (published
//! again later). During a broker outage the relay therefore stops after the grace period, not
//! after `message.timeout.ms`.

mod builder;
mod config;
mod publish;
mod report;
mod run;
mod service;
mod shared;
mod store;
mod telemetry;
mod worker;

pub(crate) use builder::relay_builder_setters;
pub use builder::{IntoRelayStore, RelayBuilder};
pub(crate) use config::relay_setters;
pub use config::RelayConfig;
pub use report::{RelayError, RelayReport};
pub use service::Relay;
pub(crate) use store::{due_in, parse_headers};
pub use store::{Backlog, Failure, KeyRef, Members, PendingRow, RelaySession, RelayStore};
