//! The outbox: events written in the caller's transaction, published later by the
//! [relay](crate::relay).
//!
//! ```no_run
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize)]
//! # struct OrderCreated { order_id: String, total_cents: i64 }
//! # impl inoutbox::OutboxEvent for OrderCreated {
//! #     const EVENT_TYPE: &'static str = "OrderCreated";
//! #     const TOPIC: &'static str = "orders";
//! #     fn key(&self) -> Option<String> { Some(self.order_id.clone()) }
//! # }
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
//!     .bind("o-1").bind(1200_i64).execute(&mut *tx).await?;
//! inoutbox::outbox::enqueue(&mut tx, &OrderCreated { order_id: "o-1".into(), total_cents: 1200 })
//!     .await?;
//! tx.commit().await?; // the order and its event commit (or roll back) together
//! # Ok(()) }
//! ```
//!
//! # What `enqueue` does
//!
//! One statement in the caller's transaction, nothing else (no broker call):
//!
//! 1. inserts the row (PostgreSQL: with `seq` still to draw) and adds the lock id of the
//!    event's `(topic, key)` to the locks the transaction takes at commit (events without a key
//!    take none);
//! 2. queues a `NOTIFY` on the table's channel (delivered by PostgreSQL only if the transaction
//!    commits), which wakes the relays, unless another transaction in flight already will: only
//!    the holder of the table's wake lock notifies, so notifying commits never queue behind
//!    each other (see `postgres::outbox`).
//!
//! At commit (a deferred trigger, migration outbox v4), the transaction takes its key locks
//! (transaction-level advisory locks, `pg_advisory_xact_lock`) in ascending order, then each of
//! its rows draws its `seq`, in the order the rows were enqueued. This is what makes per-key
//! order well defined across transactions: two transactions that enqueued for the same key are
//! serialised from the moment the first draws its `seq` to its commit, so the one that draws
//! first also commits first. Hence, per key, **`seq` order is commit order**, and once a row of
//! a key is visible no row of that key with a smaller `seq` can still appear. The relay
//! publishes each key's rows in `seq` order (see [`crate::relay`]). [`enqueue_all`] draws its
//! rows' `seq` in the order given. The cost: committing transactions that enqueued for the
//! same key wait for each other's commit; different keys never wait, and nothing waits before
//! the commit. Because every transaction takes its key locks at commit and in one order,
//! enqueues for several keys, in any order and in any number of calls, never deadlock each
//! other. (With `SET CONSTRAINTS ALL IMMEDIATE`, the locks are taken at the end of each
//! enqueue statement instead, as before: lock order across calls is then yours.)
//!
//! # The row
//!
//! Column names follow the Debezium outbox event router where they can, so the same table can
//! be published by CDC instead of the relay:
//!
//! | column           | type          | meaning                                                   |
//! |------------------|---------------|-----------------------------------------------------------|
//! | `id`             | `uuid`        | UUID v7 (time-ordered); becomes `ce_id` (Debezium: `id`)   |
//! | `aggregatetype`  | `text`, null  | `#[outbox(aggregate_type = ...)]` (Debezium: `aggregatetype`) |
//! | `aggregateid`    | `text`, null  | aggregate id, defaults to the key (Debezium: `aggregateid`) |
//! | `type`           | `text`        | event type, becomes `ce_type` (Debezium: `type`)          |
//! | `payload`        | `json`        | the event's JSON as serialised, published byte for byte (Debezium: `payload`) |
//! | `topic`          | `text`        | destination topic (Debezium routes by `aggregatetype`)    |
//! | `message_key`    | `text`, null  | Kafka key (Debezium keys by `aggregateid` by default)     |
//! | `headers`        | `jsonb`       | extra headers, e.g. `traceparent`                         |
//! | `seq`            | `bigint`      | per-key publication order (see above)                     |
//! | `created_at`     | `timestamptz` | enqueue time                                              |
//! | `published_at`   | `timestamptz` | set by the relay; `NULL` = not yet published              |
//! | `attempts`       | `integer`     | failed publication attempts                               |
//! | `last_error`     | `text`, null  | the last publication error                                |
//! | `next_attempt_at`| `timestamptz` | NULL until the row fails; then when to try it again (its key's later rows wait) |
//! | `parked_at`      | `timestamptz` | set when the row was given up on (see the relay)          |
//! | `slot`           | `smallint`    | the key's hash, 0..63 (set by the insert or a trigger); the unit relays claim |
//! | `due_at`         | `timestamptz`, null | NULL: publish at once; else not before this time ([`enqueue_at`]) |
//!
//! # Scheduled publishing
//!
//! [`enqueue_at`] and [`enqueue_after`] write the same row with a due time (`due_at`): the
//! relay publishes it once the database's clock has reached that time, not before. A time in
//! the past (or now) is due at once, as [`enqueue`]. A row not yet due does not hold the later
//! rows of its key: they are published as they come, and the scheduled row goes out when it is
//! due. Among rows that are due, each key's rows are published in `seq` (commit) order, as
//! always. The relay wakes up by itself at the next due time (no enqueue or notification
//! needed). See the guide's "Scheduled publishing" section.
//!
//! # Trace context
//!
//! `traceparent` is captured at enqueue time from a task-local scope, [`with_traceparent`]: run
//! the code that enqueues inside it (a tracing layer or an HTTP middleware usually has the W3C
//! `traceparent` of the current span at hand). With the `otel` feature, an enqueue outside such
//! a scope stores the trace context of the current `tracing` span (through
//! `tracing-opentelemetry`), so the consumer's spans continue the producer's trace. An invalid
//! value is ignored (never stored).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use uuid::Uuid;

use crate::event::OutboxEvent;
use crate::names;
use crate::store::StoreError;

pub use crate::message::Retention;

/// What went wrong while enqueueing an event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The event could not be serialised to JSON.
    #[error("cannot serialise event `{event_type}` for topic `{topic}` to JSON: {source}")]
    Serialize {
        /// Event type.
        event_type: &'static str,
        /// Topic.
        topic: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The due time of a scheduled event cannot be stored (beyond the year 9999).
    #[error("cannot schedule event `{event_type}` for topic `{topic}`: {reason}")]
    DueTime {
        /// Event type.
        event_type: &'static str,
        /// Topic.
        topic: &'static str,
        /// What is wrong with the time.
        reason: String,
    },
    /// The insert failed.
    #[error("cannot insert event into the outbox table {table}: {source}")]
    Store {
        /// The outbox table.
        table: String,
        /// The database error.
        #[source]
        source: StoreError,
    },
}

tokio::task_local! {
    static TRACEPARENT: String;
}

/// Runs `fut` with `traceparent` as the trace context that [`enqueue`] stores with each event.
///
/// `traceparent` is a W3C trace context header value
/// (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`); an invalid value is ignored.
pub async fn with_traceparent<F: Future>(traceparent: impl Into<String>, fut: F) -> F::Output {
    TRACEPARENT.scope(traceparent.into(), fut).await
}

/// The trace context set by [`with_traceparent`] for the current task, if valid; with the
/// `otel` feature, failing that, the current `tracing` span's OpenTelemetry context.
pub fn current_traceparent() -> Option<String> {
    TRACEPARENT
        .try_with(|tp| tp.clone())
        .ok()
        .filter(|tp| is_valid_traceparent(tp))
        .or_else(span_traceparent)
}

/// The current span's trace context (feature `otel`).
#[cfg(feature = "otel")]
fn span_traceparent() -> Option<String> {
    crate::message::trace::current_traceparent()
}

/// Without the `otel` feature, spans carry no trace context.
#[cfg(not(feature = "otel"))]
fn span_traceparent() -> Option<String> {
    None
}

/// Whether `value` is a W3C `traceparent` of version `00` with non-zero ids.
pub fn is_valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

/// An event ready to insert: everything the row holds that the caller decides.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRow {
    /// The event id (UUID v7).
    pub id: Uuid,
    /// Event type.
    pub event_type: String,
    /// Topic.
    pub topic: String,
    /// Kafka key.
    pub key: Option<String>,
    /// Aggregate type.
    pub aggregate_type: Option<String>,
    /// Aggregate id.
    pub aggregate_id: Option<String>,
    /// The JSON payload exactly as serialised: the relay publishes these bytes.
    pub payload: String,
    /// Extra headers (`traceparent`, ...).
    pub headers: Map<String, Value>,
    /// Not before when the relay may publish the row (see [`enqueue_at`]); `None` (what
    /// [`NewRow::from_event`] gives) for at once. A time that has passed when the row is
    /// inserted (by the database's clock) is stored as NULL: due at once.
    pub due_at: Option<SystemTime>,
}

/// The latest due time the stores keep (9999-12-31T23:59:59Z), in seconds since the epoch.
const LATEST_DUE: f64 = 253_402_300_799.0;

/// `when` in seconds since the Unix epoch, as the stores bind it; a time before the epoch is
/// the epoch (long due).
fn epoch_seconds(when: SystemTime) -> f64 {
    when.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `when`, checked: the stores keep due times up to the year 9999.
fn checked_due<E: OutboxEvent>(when: SystemTime) -> Result<SystemTime, EnqueueError> {
    let secs = epoch_seconds(when);
    if secs > LATEST_DUE {
        return Err(EnqueueError::DueTime {
            event_type: E::EVENT_TYPE,
            topic: E::TOPIC,
            reason: format!(
                "the due time is {secs:.0} s after the Unix epoch, beyond the latest the outbox \
                 stores (9999-12-31T23:59:59Z, {LATEST_DUE:.0} s)"
            ),
        });
    }
    Ok(when)
}

impl NewRow {
    /// The row for `event`, with a new UUID v7 and the current task's trace context.
    pub fn from_event<E: OutboxEvent>(event: &E) -> Result<Self, EnqueueError> {
        let payload = serde_json::to_string(event).map_err(|source| EnqueueError::Serialize {
            event_type: E::EVENT_TYPE,
            topic: E::TOPIC,
            source,
        })?;
        let mut headers = Map::new();
        if let Some(tp) = current_traceparent() {
            headers.insert(names::HEADER_TRACEPARENT.to_owned(), Value::String(tp));
        }
        Ok(Self {
            id: Uuid::now_v7(),
            event_type: E::EVENT_TYPE.to_owned(),
            topic: E::TOPIC.to_owned(),
            key: event.key(),
            aggregate_type: E::AGGREGATE_TYPE.map(str::to_owned),
            aggregate_id: event.aggregate_id(),
            payload,
            headers,
            due_at: None,
        })
    }

    /// The row for `event`, published by the relay not before `when` (see [`enqueue_at`]).
    pub fn scheduled<E: OutboxEvent>(event: &E, when: SystemTime) -> Result<Self, EnqueueError> {
        let due_at = checked_due::<E>(when)?;
        Ok(Self {
            due_at: Some(due_at),
            ..Self::from_event(event)?
        })
    }

    /// [`due_at`](Self::due_at) in seconds since the Unix epoch (what the stores bind).
    pub fn due_epoch_seconds(&self) -> Option<f64> {
        self.due_at.map(epoch_seconds)
    }
}

/// A transaction (or connection) that events can be enqueued through, with the default outbox
/// table: PostgreSQL's and, with the `sqlite` feature, SQLite's. `&mut PgTx<'_>` (what an inbox
/// handler receives), `&mut sqlx::Transaction<'_, Postgres>` and `&mut PgConnection` all work.
#[diagnostic::on_unimplemented(
    message = "events cannot be enqueued through `{Self}`",
    note = "pass the transaction of the business write: `&mut tx` where `tx` is a \
            `sqlx::Transaction` of PostgreSQL, SQLite or MySQL (or `&mut PgConnection`)"
)]
///
/// A store written outside this crate implements it for its transaction type, so that
/// [`enqueue`] writes through it.
pub trait OutboxTx: Send {
    /// Inserts the rows in order; returns their ids.
    fn insert_rows(
        &mut self,
        rows: Vec<NewRow>,
    ) -> impl Future<Output = Result<Vec<Uuid>, EnqueueError>> + Send;
}

/// Inserts `event` into the outbox (default table name; on PostgreSQL through the
/// `search_path`) in the caller's transaction; returns the event id (`ce_id`). Nothing is
/// published until the transaction commits and a relay picks the row up.
///
/// `tx` is the transaction of the business write (see [`OutboxTx`]), e.g. the
/// `tx: &mut PgTx<'_>` an inbox handler receives, so handlers can chain events.
pub async fn enqueue<T, E>(tx: &mut T, event: &E) -> Result<Uuid, EnqueueError>
where
    T: OutboxTx + ?Sized,
    E: OutboxEvent,
{
    let ids = tx.insert_rows(vec![NewRow::from_event(event)?]).await?;
    Ok(ids[0])
}

/// Inserts several events of one type in the caller's transaction, in order; see [`enqueue`].
pub async fn enqueue_all<'e, T, E>(
    tx: &mut T,
    events: impl IntoIterator<Item = &'e E>,
) -> Result<Vec<Uuid>, EnqueueError>
where
    T: OutboxTx + ?Sized,
    E: OutboxEvent,
{
    let rows = events
        .into_iter()
        .map(NewRow::from_event)
        .collect::<Result<Vec<_>, _>>()?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    tx.insert_rows(rows).await
}

/// Inserts `event` into the outbox like [`enqueue`], to be published **not before `when`**;
/// returns the event id.
///
/// The row commits (or rolls back) with the caller's transaction like any other; the relay
/// publishes it once the database's clock reaches `when`, and wakes up for it by itself. A time
/// in the past (or now) is due at once. Until it is due, the row does not hold the later rows
/// of its key: they are published as they come; among due rows, each key's rows go out in
/// commit order. A time beyond the year 9999 is refused ([`EnqueueError::DueTime`]) and nothing
/// is written.
///
/// ```no_run
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)]
/// # struct ReviewDue { payment_id: String }
/// # impl inoutbox::OutboxEvent for ReviewDue {
/// #     const EVENT_TYPE: &'static str = "ReviewDue";
/// #     const TOPIC: &'static str = "payments";
/// #     fn key(&self) -> Option<String> { Some(self.payment_id.clone()) }
/// # }
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::{Duration, SystemTime};
///
/// let mut tx = pool.begin().await?;
/// let event = ReviewDue { payment_id: "p-1".into() };
/// // published at midnight UTC, 1 January 2030 ...
/// let midnight = SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000);
/// inoutbox::outbox::enqueue_at(&mut tx, &event, midnight).await?;
/// // ... and this one 3 seconds after the commit (give or take the relay's wake-up)
/// inoutbox::outbox::enqueue_after(&mut tx, &event, Duration::from_secs(3)).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue_at<T, E>(tx: &mut T, event: &E, when: SystemTime) -> Result<Uuid, EnqueueError>
where
    T: OutboxTx + ?Sized,
    E: OutboxEvent,
{
    let ids = tx
        .insert_rows(vec![NewRow::scheduled(event, when)?])
        .await?;
    Ok(ids[0])
}

/// Inserts `event` into the outbox to be published **not before `delay` from now** (this
/// process's clock): [`enqueue_at`] with `SystemTime::now() + delay`. A zero delay is
/// [`enqueue`].
pub async fn enqueue_after<T, E>(
    tx: &mut T,
    event: &E,
    delay: Duration,
) -> Result<Uuid, EnqueueError>
where
    T: OutboxTx + ?Sized,
    E: OutboxEvent,
{
    let when = SystemTime::now()
        .checked_add(delay)
        .ok_or_else(|| EnqueueError::DueTime {
            event_type: E::EVENT_TYPE,
            topic: E::TOPIC,
            reason: format!(
                "a delay of {delay:?} from now is not a time this system can represent"
            ),
        })?;
    enqueue_at(tx, event, when).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Ev;
    impl OutboxEvent for Ev {
        const EVENT_TYPE: &'static str = "Ev";
        const TOPIC: &'static str = "t";
        fn key(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn due_times_are_epoch_seconds_and_beyond_9999_is_refused() {
        let at = UNIX_EPOCH + Duration::from_millis(1_893_456_000_250);
        let row = NewRow::scheduled(&Ev, at).unwrap();
        assert_eq!(row.due_epoch_seconds(), Some(1_893_456_000.25));
        assert_eq!(NewRow::from_event(&Ev).unwrap().due_epoch_seconds(), None);
        let before_epoch = UNIX_EPOCH - Duration::from_secs(10);
        let row = NewRow::scheduled(&Ev, before_epoch).unwrap();
        assert_eq!(row.due_epoch_seconds(), Some(0.0));
        let far = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        let err = NewRow::scheduled(&Ev, far).unwrap_err().to_string();
        assert!(
            err.contains("cannot schedule event `Ev`") && err.contains("9999"),
            "{err}"
        );
    }

    #[test]
    fn traceparent_validation() {
        assert!(is_valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(!is_valid_traceparent(bad), "{bad:?}");
        }
    }
}
