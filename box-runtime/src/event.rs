//! The event side of the contract: what `#[derive(OutboxEvent)]` implements.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// An event type that inoutbox can publish through the outbox and hand to inbox handlers.
///
/// Implement it with `#[derive(OutboxEvent)]` and an `#[outbox(...)]` attribute rather than by
/// hand. For
/// `#[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]` the derive
/// generates what this example writes out:
///
/// ```
/// use inoutbox::OutboxEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// pub struct OrderCreated { pub order_id: String, pub total_cents: i64 }
///
/// impl OutboxEvent for OrderCreated {
///     const EVENT_TYPE: &'static str = "OrderCreated";
///     const TOPIC: &'static str = "orders";
///     fn key(&self) -> Option<String> {
///         Some(self.order_id.to_string())
///     }
/// }
///
/// let event = OrderCreated { order_id: "o-1".into(), total_cents: 1200 };
/// assert_eq!(event.key().as_deref(), Some("o-1"));
/// assert_eq!(event.aggregate_id(), event.key(), "the aggregate id defaults to the key");
/// ```
///
/// The payload on the wire is the event's JSON (serde) representation; the event type travels in
/// the CloudEvents `ce_type` header.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox event",
    label = "this type has no `#[derive(OutboxEvent)]`",
    note = "an event is a struct of your own with `#[derive(Serialize, Deserialize, OutboxEvent)]` \
            and `#[outbox(event_type = \"...\", topic = \"...\")]`; a type from another crate \
            cannot derive them: wrap it in a struct of your own that does",
    note = "a type with `#[derive(InboxEvent)]` is consumed only and has no topic: to publish it, \
            derive `OutboxEvent` with a `topic` instead (its handlers take it as they are)"
)]
pub trait OutboxEvent: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The event type name (`ce_type`), e.g. `"OrderCreated"`.
    const EVENT_TYPE: &'static str;
    /// The topic the event is published to.
    const TOPIC: &'static str;
    /// The aggregate type, when the derive names one (`aggregate_type = "Order"`).
    const AGGREGATE_TYPE: Option<&'static str> = None;

    /// The message key (Kafka key): events with the same key keep their order. `None` when the
    /// derive names no `key` field.
    fn key(&self) -> Option<String>;

    /// The field named by `idempotency_key = field`, if any: inbox handlers of this event then
    /// also refuse a second event with the same business key in their group.
    const IDEMPOTENCY_KEY: Option<&'static str> = None;

    /// The aggregate id, when the derive names one (`aggregate_id = field`); defaults to the key.
    fn aggregate_id(&self) -> Option<String> {
        self.key()
    }

    /// The business key (an operation id), when the derive names one (`idempotency_key =
    /// field`): two events with the same business key are one operation, applied once per
    /// consumer group (see `docs/modes.md`).
    fn idempotency_key(&self) -> Option<String> {
        None
    }
}

/// An event type inbox handlers can take: its event type and how to decode it, the part of an
/// event a consumer needs.
///
/// Every [`OutboxEvent`] is one. A type that a service consumes and never publishes derives
/// this alone, and names no topic:
///
/// ```
/// use inoutbox::prelude::*;
/// use inoutbox::InboxEvent as _;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, InboxEvent)]
/// #[inbox(event_type = "OrderPlaced", idempotency_key = order_id)]
/// pub struct OrderPlaced { pub order_id: String }
///
/// assert_eq!(OrderPlaced::EVENT_TYPE, "OrderPlaced");
/// let event = OrderPlaced { order_id: "o-1".into() };
/// assert_eq!(event.idempotency_key().as_deref(), Some("o-1"));
/// ```
///
/// Such a type is not an `OutboxEvent`: `enqueue` refuses it at compile time. (One trait for
/// both sides with an optional topic would let that mistake through to run time.) The prelude
/// brings the derive only: with both traits in scope, `OrderCreated::EVENT_TYPE` of a type
/// that implements both would be ambiguous.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an event an inbox handler can take",
    label = "this type has no `#[derive(InboxEvent)]` or `#[derive(OutboxEvent)]`",
    note = "an event a handler takes is a struct of your own with `#[derive(Deserialize, \
            InboxEvent)]` and `#[inbox(event_type = \"...\")]` (consumed only), or \
            `#[derive(Serialize, Deserialize, OutboxEvent)]` (also published)"
)]
pub trait InboxEvent: DeserializeOwned + Send + 'static {
    /// The event type name (`ce_type`), e.g. `"OrderPlaced"`.
    const EVENT_TYPE: &'static str;

    /// The field named by `idempotency_key = field`, if any (see
    /// [`OutboxEvent::IDEMPOTENCY_KEY`]).
    const IDEMPOTENCY_KEY: Option<&'static str> = None;

    /// The business key, when the derive names one (`idempotency_key = field`).
    fn idempotency_key(&self) -> Option<String> {
        None
    }
}

impl<T: OutboxEvent> InboxEvent for T {
    const EVENT_TYPE: &'static str = <T as OutboxEvent>::EVENT_TYPE;
    const IDEMPOTENCY_KEY: Option<&'static str> = <T as OutboxEvent>::IDEMPOTENCY_KEY;

    fn idempotency_key(&self) -> Option<String> {
        <T as OutboxEvent>::idempotency_key(self)
    }
}

/// A field named by `key = field` or `aggregate_id = field` in `#[outbox(...)]`: its `Display`
/// text is the key.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an event key",
    label = "the type of this field has no `Display`",
    note = "`key = field` and `aggregate_id = field` use the field's `Display` text: name a field \
            whose type implements `std::fmt::Display` (e.g. `Uuid`, `u64`, `String`), or add one"
)]
pub trait KeyField {
    /// The key text.
    fn key_string(&self) -> String;
}

// `do_not_recommend`: report `KeyField` with the note above, not the `Display` bound.
#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display + ?Sized> KeyField for T {
    fn key_string(&self) -> String {
        self.to_string()
    }
}

/// The key text of a field. Called by the code `#[derive(OutboxEvent)]` generates.
#[doc(hidden)]
pub fn key_string<K: KeyField + ?Sized>(field: &K) -> String {
    field.key_string()
}

/// A field named by `dedup_by = field` in `#[inbox_handler(...)]`: its `Display` text is the
/// business key.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a business key",
    label = "the type of this field has no `Display`",
    note = "`dedup_by = field` uses the field's `Display` text as the business key: name a field \
            whose type implements `std::fmt::Display` (e.g. `Uuid`, `u64`, `String`)"
)]
pub trait BusinessKey {
    /// The business key text.
    fn business_key_text(&self) -> String;
}

// `do_not_recommend`: report `BusinessKey` with the note above, not the `Display` bound.
#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display + ?Sized> BusinessKey for T {
    fn business_key_text(&self) -> String {
        self.to_string()
    }
}
