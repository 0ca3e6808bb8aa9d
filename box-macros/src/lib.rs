//! Procedural macros of inoutbox: `#[inbox_handler]` and `#[derive(OutboxEvent)]`.
//!
//! Use them through the `inoutbox` crate (`use inoutbox::prelude::*;`), which documents them with
//! examples that compile; generated code names only `::inoutbox::__private`.
//!
//! Each macro is a module working on `proc_macro2` (parse -> check -> expand) so that it can be
//! unit-tested; this file only holds the entry points and their documentation.

mod ctxt;
mod inbox_event;
mod inbox_handler;
mod kv;
mod names;
mod outbox_event;
mod suggest;
mod tokens;

use proc_macro::TokenStream;

/// Reference for `#[inbox_handler(event = "...", group = "...")]` and
/// `#[inbox_handler(event = "...", group = "...", batch)]`.
///
/// # Keys
///
/// | key     | value                                                                         |
/// |---------|-------------------------------------------------------------------------------|
/// | `event` | the event type handled; must equal the parameter type's `OutboxEvent::EVENT_TYPE` |
/// | `group` | the consumer group the handler belongs to                                     |
/// | `batch` | optional flag, no value: a batch handler, which takes `events: Vec<E>` (see below) |
/// | `dedup_by` | optional: a field of the event whose `Display` text is the business key (an operation id): a second event with the same key is refused in the group |
/// | `dedup_scope` | optional: the key space of the business keys, shared by the handlers of the group that name it (default: the event type's own, so `OrderPlaced` and `OrderCancelled` with one `order_id` both run) |
/// | `crate` | optional: the path inoutbox is reachable by, e.g. `crate = "my_inoutbox"` (default `::inoutbox`) |
///
/// `event` and `group` are required string literals of ASCII letters, digits, `.`, `_` and `-`
/// (at most 249 bytes). `crate` is for a renamed dependency (`extern crate inoutbox as my_inoutbox;`)
/// or a crate that re-exports inoutbox: generated code then names `my_inoutbox::__private`. An
/// unknown key is one error, with a "did you mean" for a misspelling (`evnt`) or a name from
/// elsewhere (`event_type`, `consumer_group`). `batch` is a flag: `batch = true` is an error that
/// says to write `batch`.
///
/// # Signature
///
/// ```text
/// async fn name(event: E, tx: &mut PgTx<'_>) -> Result<(), Er>
/// async fn name(event: E, tx: &mut PgTx<'_>, meta: &MessageMeta) -> Result<(), Er>
///
/// // with `batch`
/// async fn name(events: Vec<E>, tx: &mut PgTx<'_>) -> Result<(), Er>
/// async fn name(events: Vec<E>, tx: &mut PgTx<'_>, metas: &[MessageMeta]) -> Result<(), Er>
/// ```
///
/// - `E` implements `OutboxEvent` (`#[derive(OutboxEvent)]`), taken by value;
/// - the transaction is the one inoutbox opens for the message, which also holds the inbox row:
///   the handler's writes commit or roll back with it;
/// - `Er` converts into `HandlerError`: `HandlerError` itself, `anyhow::Error`, any
///   `std::error::Error + Send + Sync + 'static`, `Box<dyn Error + Send + Sync>`, `String`;
///   type aliases of such a `Result` work too;
/// - no `self`, no generic parameters (`<T>` or `impl Trait`): the runtime decodes each message
///   into one concrete type;
/// - a free function (at module level or in a block), not an associated function in an `impl`
///   block: the registration names it by its path.
///
/// Parameters in another order (the transaction first, the metadata before the transaction)
/// are one error that shows the signature in order.
///
/// # Batch handlers
///
/// With `batch`, the handler is called once for a run of consecutive new messages of one
/// partition (already deduplicated, in offset order), with their events in a `Vec` and, if it
/// takes them, their metadata in a slice: one per event, in the same order. It runs in the
/// batch's transaction. When a call fails, or a payload of the run does not decode, the run is
/// rolled back and its messages are taken one at a time, each as a one-element batch, so that
/// only the failing message is retried or dead-lettered. The signature is checked for the form
/// the attribute declares: `batch` with one event by value, a `Vec<E>` (or `&[E]`) without
/// `batch`, events by reference (`&[E]`, `&Vec<E>`), and `meta: &MessageMeta` in a batch handler
/// (or `metas: &[MessageMeta]` in another) are each one error saying what to write.
///
/// # What is generated
///
/// The function is emitted unchanged, so it stays callable (tests call handlers directly).
/// Next to it, in `const __inoutbox_register_<name>: () = { .. };`, the type checks, an erased
/// wrapper that decodes the payload, downcasts the transaction and calls the function, and one
/// `inventory::submit!` of a `HandlerRegistration` naming the function (`module::path::name`),
/// its file and the line of its name. For a batch handler, the wrapper decodes a run of
/// payloads and calls the function once with all the events; the registration carries it
/// (`.batch(..)`) next to a one-message wrapper that runs it with a one-element batch, so the
/// function is called from one place. Every handler linked into the binary is found at
/// start-up; two handlers for one (event, group) are a start-up error naming both. (The const is
/// named rather than `_` so that it is also valid in an `impl` block, where the one error is
/// then that the wrapper cannot name an associated function.)
///
/// # Compile-time checks
///
/// Attribute and signature mistakes are reported by the macro on the offending tokens, all at
/// once, with the function kept as written (so no follow-on errors). Type requirements are
/// reported by rustc on the type you wrote, each once, with a note that says the fix: an event
/// type that is not an `OutboxEvent` (for a batch handler, the `E` of `Vec<E>`), a transaction
/// type inoutbox does not hand out, an error type that does not convert (a boxed error needs
/// `+ Send + Sync`), a future that is not `Send`, and an `event = "..."` that disagrees with the
/// type's declared event type (a const-evaluation error naming both strings). The checks are
/// trait-qualified paths on those types, so no note points into inoutbox.
#[proc_macro_attribute]
pub fn inbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    inbox_handler::expand(args.into(), item.into()).into()
}

/// Reference for `#[derive(OutboxEvent)]` and its `#[outbox(...)]` attribute.
///
/// # Keys
///
/// | key              | value                                                          | required |
/// |------------------|----------------------------------------------------------------|----------|
/// | `event_type`     | the CloudEvents `ce_type`, e.g. `"OrderCreated"`               | yes      |
/// | `topic`          | the topic the relay publishes to, e.g. `"orders"`              | yes      |
/// | `key`            | a field; its `Display` text is the message key (same key, same order) | no |
/// | `aggregate_type` | e.g. `"Order"`                                                 | no       |
/// | `aggregate_id`   | a field; its `Display` text is the aggregate id (default: the key) | no   |
/// | `crate`          | the path inoutbox is reachable by, e.g. `"my_inoutbox"` (default `::inoutbox`) | no |
///
/// String values use ASCII letters, digits, `.`, `_` and `-` (at most 249 bytes); a topic
/// cannot be `.` or `..` (Kafka rejects those). Fields are named bare (`key = order_id`, or
/// `key = r#type` for a field named with a keyword), by their Rust name: serde renames change the
/// JSON, not this.
///
/// On a field, `#[outbox(key)]` and `#[outbox(aggregate_id)]` are the same as naming it on the
/// struct. One field carries each; both forms naming different fields is an error, and so is any
/// other field-level `#[outbox(...)]` (nothing written there is ignored).
///
/// # Supported types
///
/// - a struct with named fields: the payload is its serde JSON;
/// - a unit struct (`struct CacheFlushed;`): an event without payload (JSON `null`) and without
///   key.
///
/// Rejected, each with an error saying what to write instead: enums (an event is one type with
/// one `event_type`: derive on one struct per event type), tuple structs (a key must name a
/// field), unions (serde cannot encode them) and generic types (one event type has one payload
/// shape). The type must also implement serde's `Serialize` and `Deserialize`.
///
/// # What is generated
///
/// `impl inoutbox::OutboxEvent for T` in `const _: () = { .. };`. After an error, a placeholder
/// impl with an empty event type is emitted next to the error, so handlers and producers
/// naming the type add no follow-on errors.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    outbox_event::derive(input.into()).into()
}

/// Reference for `#[derive(InboxEvent)]` and its `#[inbox(...)]` attribute: an event type a
/// service consumes and never publishes.
///
/// | key               | value                                                         | required |
/// |-------------------|---------------------------------------------------------------|----------|
/// | `event_type`      | the CloudEvents `ce_type` handlers are found by, e.g. `"OrderPlaced"` | yes |
/// | `idempotency_key` | a field; its `Display` text is the business key               | no       |
/// | `crate`           | the path inoutbox is reachable by (default `::inoutbox`)      | no       |
///
/// No `topic` and no `key`: those are for publishing. The type implements `InboxEvent` only, so
/// handlers take it and `enqueue` refuses it at compile time ("is not an outbox event"). To
/// publish it as well, derive `OutboxEvent` (with a `topic`) instead: every `OutboxEvent` is an
/// `InboxEvent`. The type must implement serde's `Deserialize`; a struct with named fields or a
/// unit struct, not generic.
#[proc_macro_derive(InboxEvent, attributes(inbox))]
pub fn derive_inbox_event(input: TokenStream) -> TokenStream {
    inbox_event::derive(input.into()).into()
}
