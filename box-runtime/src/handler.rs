//! Handlers: the error type they return, the metadata they may take, and the registry that
//! `#[inbox_handler]` feeds through `inventory`.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::event::OutboxEvent;

/// The error a handler returns. Any `std::error::Error + Send + Sync + 'static` converts into it
/// with `?`. A handler may also return `anyhow::Result<()>` or its own error type (see
/// [`IntoHandlerError`]).
///
/// An ordinary error is *transient*: the transaction is rolled back and the message retried. An
/// error made with [`HandlerError::permanent`] is not retried.
pub struct HandlerError {
    kind: ErrorKind,
    /// Whether the handler chose the kind (`transient`, `permanent`), rather than `?` on an
    /// error: only then does inoutbox's classification of database errors leave it alone.
    explicit: bool,
    source: Box<dyn StdError + Send + Sync + 'static>,
}

/// What kind of failure a [`HandlerError`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Worth retrying: the transaction is rolled back and the message delivered again.
    Transient,
    /// Retrying cannot help (the handler said so).
    Permanent,
    /// The message itself is unusable (payload does not decode into the event type, ...).
    BadMessage,
}

#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

impl HandlerError {
    /// A transient error: the message is retried.
    pub fn transient(error: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            kind: ErrorKind::Transient,
            explicit: true,
            source: error.into(),
        }
    }

    /// A permanent error: retrying cannot help, so the message is not retried.
    pub fn permanent(error: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            kind: ErrorKind::Permanent,
            explicit: true,
            source: error.into(),
        }
    }

    /// The message cannot be used at all (e.g. its payload does not match the event type).
    pub fn bad_message(reason: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::BadMessage,
            explicit: true,
            source: Box::new(Message(reason.into())),
        }
    }

    /// Which kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether the handler chose the kind itself ([`transient`](Self::transient),
    /// [`permanent`](Self::permanent)), rather than converting an error with `?`.
    pub(crate) fn is_explicit(&self) -> bool {
        self.explicit
    }

    /// The same error, permanent (a database that rejects the data, SQLSTATE class 22 or 23).
    pub(crate) fn into_permanent(self) -> Self {
        Self {
            kind: ErrorKind::Permanent,
            ..self
        }
    }

    /// Whether retrying the message may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }

    /// The error and its chain of causes, joined by `: `; a cause whose text the message
    /// already holds (many errors repeat their source's text) is not repeated.
    pub fn chain(&self) -> String {
        let mut out = self.source.to_string();
        let mut next = self.source.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            next = cause.source();
        }
        out
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.kind)
            .field("error", &self.chain())
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Transient => write!(f, "{}", self.chain()),
            ErrorKind::Permanent => write!(f, "permanent: {}", self.chain()),
            ErrorKind::BadMessage => write!(f, "bad message: {}", self.chain()),
        }
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self {
            kind: ErrorKind::Transient,
            explicit: false,
            source: Box::new(error),
        }
    }
}

/// Converts what a handler returns in its `Err` into a [`HandlerError`]: implemented for
/// `HandlerError` itself, every `std::error::Error + Send + Sync + 'static`, `anyhow::Error`,
/// `Box<dyn Error + Send + Sync>`, `String` and `&str`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as the error type of an inbox handler",
    label = "this error type does not convert into `inoutbox::HandlerError`",
    note = "return `Result<(), HandlerError>`, `anyhow::Result<()>`, or an error type that \
            implements `std::error::Error + Send + Sync + 'static`; a boxed error must be \
            `Send + Sync` too: add `+ Send + Sync`, as in `Box<dyn std::error::Error + Send + Sync>`"
)]
pub trait IntoHandlerError {
    /// Performs the conversion.
    fn into_handler_error(self) -> HandlerError;
}

// `do_not_recommend`: when the conversion is missing, rustc reports `IntoHandlerError` (with the
// note above) instead of the `std::error::Error` bound behind this impl.
#[diagnostic::do_not_recommend]
impl<E: Into<Box<dyn StdError + Send + Sync + 'static>>> IntoHandlerError for E {
    fn into_handler_error(self) -> HandlerError {
        match self.into().downcast::<Kinded>() {
            Ok(kinded) => kinded.0,
            Err(source) => HandlerError {
                kind: ErrorKind::Transient,
                explicit: false,
                source,
            },
        }
    }
}

/// A `HandlerError` travelling as a boxed error, so that its kind survives the round trip.
#[derive(Debug)]
struct Kinded(HandlerError);

impl fmt::Display for Kinded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for Kinded {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source.source()
    }
}

impl From<HandlerError> for Box<dyn StdError + Send + Sync + 'static> {
    fn from(error: HandlerError) -> Self {
        Box::new(Kinded(error))
    }
}

/// What a handler may know about the message it handles (its optional third parameter,
/// `meta: &MessageMeta`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageMeta {
    /// The consumer group handling the message.
    pub group: String,
    /// The event id the inbox deduplicates on.
    pub event_id: String,
    /// The event source, when the consumer is configured to key the inbox by (source, id).
    pub source: Option<String>,
    /// The event type (`ce_type`).
    pub event_type: String,
    /// Broker coordinates.
    pub topic: String,
    /// Broker coordinates.
    pub partition: i32,
    /// Broker coordinates.
    pub offset: i64,
    /// The message key, if any.
    pub key: Option<Vec<u8>>,
    /// The message headers, in broker order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Which attempt this is: 1 for the first delivery, 2 for the first retry, ...
    pub attempt: u32,
    /// The effects table of the store the handler runs on (`None`: the default name).
    pub(crate) effects_table: Option<std::sync::Arc<str>>,
}

impl MessageMeta {
    /// Metadata for calling a handler directly (in tests): the given group, event id and event
    /// type; no source, key or headers; empty topic, partition 0, offset 0; attempt 1.
    pub fn new(
        group: impl Into<String>,
        event_id: impl Into<String>,
        event_type: impl Into<String>,
    ) -> Self {
        Self {
            group: group.into(),
            event_id: event_id.into(),
            source: None,
            event_type: event_type.into(),
            topic: String::new(),
            partition: 0,
            offset: 0,
            key: None,
            headers: Vec::new(),
            attempt: 1,
            effects_table: None,
        }
    }

    /// The first header with this name, as bytes.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// The future an erased handler returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// An erased handler: decodes the payload into its event type, downcasts the transaction to the
/// type it declared and runs.
pub type InvokeFn =
    for<'a> fn(&'a [u8], &'a mut (dyn Any + Send), &'a MessageMeta) -> HandlerFuture<'a>;

/// A transaction type a handler may take as its second parameter (`tx: &mut PgTx<'_>`, or
/// `tx: &mut SqliteTx<'_>` with the `sqlite` feature). It also says which store the handler
/// runs on.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction type inoutbox can hand to a handler",
    label = "expected `&mut PgTx<'_>` (or `&mut SqliteTx<'_>`) here",
    note = "the second parameter of an inbox handler is the transaction inoutbox opens for the \
            message: write `tx: &mut inoutbox::PgTx<'_>` for PostgreSQL or \
            `tx: &mut inoutbox::SqliteTx<'_>` for SQLite",
    note = "inoutbox builds on sqlx 0.9: a transaction of another sqlx major is another type. \
            Depend on `sqlx = \"0.9\"` (`cargo tree -i sqlx` lists every sqlx in the build)"
)]
pub trait HandlerTx: Send {
    /// The same type with its lifetime made `'static`: what the store hands out.
    type Static: Any + Send;
}

impl HandlerTx for sqlx::Transaction<'_, sqlx::Postgres> {
    type Static = sqlx::Transaction<'static, sqlx::Postgres>;
}

/// An erased batch handler: decodes every payload into its event type and runs once for all.
pub type InvokeBatchFn =
    for<'a> fn(&'a [&'a [u8]], &'a mut (dyn Any + Send), &'a [MessageMeta]) -> HandlerFuture<'a>;

/// Decodes the payloads of a batch handler's run; the first that does not decode fails the run
/// (the engine then runs the messages one by one, which finds the bad one).
#[doc(hidden)]
pub fn decode_all<E: OutboxEvent>(payloads: &[&[u8]]) -> Result<Vec<E>, HandlerError> {
    payloads.iter().map(|p| decode::<E>(p)).collect()
}

/// One `#[inbox_handler]`, as registered through `inventory`.
pub struct HandlerRegistration {
    /// The event type it handles (`event = "..."`).
    pub event_type: &'static str,
    /// The consumer group it belongs to (`group = "..."`).
    pub group: &'static str,
    /// The function's path (`module::name`).
    pub name: &'static str,
    /// Where it is defined.
    pub file: &'static str,
    /// Where it is defined.
    pub line: u32,
    /// The `TypeId` of the transaction type it takes.
    pub tx_type: fn() -> TypeId,
    /// The erased handler.
    pub invoke: InvokeFn,
    /// For a batch handler (`#[inbox_handler(.., batch)]`): the erased handler of a whole run
    /// of messages. `invoke` then calls the same function with a one-element batch.
    pub invoke_batch: Option<InvokeBatchFn>,
    /// Whether the handler takes the message metadata (when it does not, the runtime does not
    /// build it).
    pub takes_meta: bool,
    /// Reads the business key from a payload, when the handler dedups by one (`dedup_by =
    /// field`, or the event's `idempotency_key = field`).
    pub business_key: Option<BusinessKeyFn>,
    /// How its messages are handled: in the receiving transaction, or stored first and handled
    /// by workers (`mode = "two_phase"`).
    pub mode: HandlerMode,
}

/// Reads a message's business key from its payload: `Ok(None)` when it has none, `Err` with
/// the reason when the payload cannot be read.
pub type BusinessKeyFn = fn(&[u8]) -> Result<Option<String>, String>;

/// The business key of an event type that declares `idempotency_key = field`.
fn event_business_key<E: OutboxEvent>(payload: &[u8]) -> Result<Option<String>, String> {
    let event = decode::<E>(payload).map_err(|e| e.to_string())?;
    Ok(event.idempotency_key())
}

/// How the messages of a handler are handled (`#[inbox_handler(.., mode = "...")]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerMode {
    /// The default: the inbox row, the handler and the processed mark in the transaction of
    /// the receiving partition; the offset is committed after it.
    #[default]
    OnePhase,
    /// `mode = "two_phase"`: the message is stored as `received` (payload and headers) and its
    /// offset committed; workers claim stored rows with leases and run the handler in a
    /// transaction that also marks the row processed. For handlers that take seconds.
    TwoPhase {
        /// `ordered = true`: one message per key in flight at a time, in offset order.
        ordered: bool,
    },
}

impl HandlerMode {
    /// Whether messages are stored first and handled by workers.
    pub fn is_two_phase(self) -> bool {
        matches!(self, Self::TwoPhase { .. })
    }

    /// Whether a two-phase handler keeps per-key order.
    pub fn is_ordered(self) -> bool {
        matches!(self, Self::TwoPhase { ordered: true })
    }
}

impl HandlerRegistration {
    /// Used by the code `#[inbox_handler]` generates.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub const fn new(
        event_type: &'static str,
        group: &'static str,
        name: &'static str,
        file: &'static str,
        line: u32,
        tx_type: fn() -> TypeId,
        invoke: InvokeFn,
    ) -> Self {
        Self {
            event_type,
            group,
            name,
            file,
            line,
            tx_type,
            invoke,
            invoke_batch: None,
            takes_meta: true,
            business_key: None,
            mode: HandlerMode::OnePhase,
        }
    }

    /// The registration of a handler that deduplicates by a business key (the event's
    /// `idempotency_key`, or the handler's `dedup_by`), or not (`None`). Used by generated code.
    #[doc(hidden)]
    pub const fn business_key(self, business_key: Option<BusinessKeyFn>) -> Self {
        Self {
            business_key,
            ..self
        }
    }

    /// The registration of a two-phase handler (`mode = "two_phase"`, `ordered = ..`). Used by
    /// generated code.
    #[doc(hidden)]
    pub const fn two_phase(self, ordered: bool) -> Self {
        Self {
            mode: HandlerMode::TwoPhase { ordered },
            ..self
        }
    }

    /// The registration of a handler that takes no metadata. Used by generated code.
    #[doc(hidden)]
    pub const fn no_meta(self) -> Self {
        Self {
            takes_meta: false,
            ..self
        }
    }

    /// The registration of a batch handler: `invoke` runs it on one message, `invoke_batch` on
    /// several. Used by the code `#[inbox_handler(.., batch)]` generates.
    #[doc(hidden)]
    pub const fn batch(self, invoke_batch: InvokeBatchFn) -> Self {
        Self {
            invoke_batch: Some(invoke_batch),
            ..self
        }
    }

    /// `path (file:line)`, for messages.
    pub fn location(&self) -> String {
        format!("{} ({}:{})", self.name, self.file, self.line)
    }
}

impl fmt::Debug for HandlerRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerRegistration")
            .field("event_type", &self.event_type)
            .field("group", &self.group)
            .field("name", &self.name)
            .field("file", &self.file)
            .field("line", &self.line)
            .field("mode", &self.mode)
            .finish()
    }
}

inventory::collect!(HandlerRegistration);

/// Every handler linked into this binary.
pub fn registrations() -> impl Iterator<Item = &'static HandlerRegistration> {
    inventory::iter::<HandlerRegistration>.into_iter()
}

/// The handlers of one consumer group, by event type.
#[derive(Debug, Clone)]
pub struct DispatchTable {
    group: String,
    handlers: BTreeMap<&'static str, &'static HandlerRegistration>,
}

/// Why a dispatch table could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two handlers claim the same (event, group).
    #[error(
        "two handlers for event `{event_type}` in group `{group}`: {first} and {second}; keep \
         one (one handler per event type, group and store: a handler written once for several \
         stores with `stores(postgres, sqlite)` counts once on each)"
    )]
    Duplicate {
        /// The event type.
        event_type: String,
        /// The group.
        group: String,
        /// The first handler, `path (file:line)`.
        first: String,
        /// The second handler, `path (file:line)`.
        second: String,
    },
    /// No handler is registered for the group.
    #[error("no #[inbox_handler] with group = \"{group}\" is linked into this binary")]
    Empty {
        /// The group.
        group: String,
    },
    /// A handler takes a transaction of another database than the consumer's store.
    #[error(
        "handler {handler} takes a transaction of another database than this consumer's store \
         ({store}); to run it on both, make it generic over its store and add \
         `stores(postgres, sqlite)`"
    )]
    WrongStore {
        /// The handler, `path (file:line)`.
        handler: String,
        /// The store's name.
        store: &'static str,
    },
}

impl DispatchTable {
    /// Builds the table of `group` from every handler linked into the binary.
    pub fn for_group(group: &str) -> Result<Self, RegistryError> {
        Self::from_registrations(group, registrations())
    }

    /// Builds the table of `group` for a store whose transaction type is `T`: the handlers of
    /// the group that take that transaction. A group may have handlers for several stores (the
    /// same event handled on PostgreSQL and on SQLite); only a group with handlers for other
    /// stores alone is an error.
    pub fn for_store<T: Any>(group: &str, store: &'static str) -> Result<Self, RegistryError> {
        let wanted = TypeId::of::<T>();
        match Self::from_registrations(group, registrations().filter(|r| (r.tx_type)() == wanted)) {
            Err(RegistryError::Empty { .. }) => match registrations().find(|r| r.group == group) {
                Some(other) => Err(RegistryError::WrongStore {
                    handler: other.location(),
                    store,
                }),
                None => Err(RegistryError::Empty {
                    group: group.to_owned(),
                }),
            },
            other => other,
        }
    }

    /// Builds the table of `group` from the given registrations.
    pub fn from_registrations<'r>(
        group: &str,
        regs: impl IntoIterator<Item = &'r HandlerRegistration>,
    ) -> Result<Self, RegistryError>
    where
        'r: 'static,
    {
        let mut handlers: BTreeMap<&'static str, &'static HandlerRegistration> = BTreeMap::new();
        let mut all: Vec<&'static HandlerRegistration> =
            regs.into_iter().filter(|r| r.group == group).collect();
        // Deterministic order, so the error names the same pair on every start.
        all.sort_by_key(|r| (r.event_type, r.file, r.line));
        for reg in all {
            if let Some(first) = handlers.insert(reg.event_type, reg) {
                return Err(RegistryError::Duplicate {
                    event_type: reg.event_type.to_owned(),
                    group: group.to_owned(),
                    first: first.location(),
                    second: reg.location(),
                });
            }
        }
        if handlers.is_empty() {
            return Err(RegistryError::Empty {
                group: group.to_owned(),
            });
        }
        Ok(Self {
            group: group.to_owned(),
            handlers,
        })
    }

    /// Checks that every handler takes the transaction type `T` of the consumer's store.
    pub fn check_tx_type<T: Any>(&self, store: &'static str) -> Result<(), RegistryError> {
        for reg in self.handlers.values() {
            if (reg.tx_type)() != TypeId::of::<T>() {
                return Err(RegistryError::WrongStore {
                    handler: reg.location(),
                    store,
                });
            }
        }
        Ok(())
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The handler for an event type.
    pub fn get(&self, event_type: &str) -> Option<&'static HandlerRegistration> {
        self.handlers.get(event_type).copied()
    }

    /// The event types handled.
    pub fn event_types(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.handlers.keys().copied()
    }

    /// The event types whose handlers are two-phase (`mode = "two_phase"`), and among them
    /// those that keep per-key order (`ordered = true`).
    pub fn two_phase_types(&self) -> (Vec<&'static str>, Vec<&'static str>) {
        let two_phase = self.handlers.values().filter(|r| r.mode.is_two_phase());
        let ordered = two_phase.clone().filter(|r| r.mode.is_ordered());
        (
            two_phase.map(|r| r.event_type).collect(),
            ordered.map(|r| r.event_type).collect(),
        )
    }
}

/// The `TypeId` of the store transaction behind a handler's transaction parameter.
#[doc(hidden)]
pub fn tx_type_id<T: HandlerTx + ?Sized>() -> TypeId {
    TypeId::of::<T::Static>()
}

// ---------------------------------------------------------------------------------------------
// Used by the code `#[inbox_handler]` and `#[derive(OutboxEvent)]` generate.
//
// The generated code checks the user's types itself, with trait-qualified paths
// (`<Type as Trait>::item`) on traits whose `#[diagnostic::on_unimplemented]` text is written for
// the user: rustc then reports one error on the type the user wrote, and no "required by a bound
// in" note pointing in here. What else the generated code needs from those types goes through
// `Probe`, whose fallback answers for a type that failed its check, so that the failed check
// stays the only error.
// ---------------------------------------------------------------------------------------------

/// Decodes a payload into the handler's event type.
#[doc(hidden)]
pub fn decode<E: OutboxEvent>(payload: &[u8]) -> Result<E, HandlerError> {
    serde_json::from_slice::<E>(payload).map_err(|error| {
        HandlerError::bad_message(format!(
            "payload does not decode into `{}` (event type `{}`): {error}",
            std::any::type_name::<E>(),
            E::EVENT_TYPE
        ))
    })
}

/// Downcasts the store's transaction to the one the handler takes (`tx: &mut T`).
#[doc(hidden)]
pub fn downcast_tx<T: HandlerTx + ?Sized>(
    tx: &mut (dyn Any + Send),
) -> Result<&mut T::Static, HandlerError> {
    tx.downcast_mut::<T::Static>().ok_or_else(|| {
        HandlerError::permanent(format!(
            "handler takes `{}`, which is not the transaction type of this consumer's store",
            std::any::type_name::<T::Static>()
        ))
    })
}

/// The metadata as the type the handler's third parameter names.
#[doc(hidden)]
pub fn meta_param<M: MetaParam + ?Sized>(meta: &MessageMeta) -> &M {
    M::from_meta(meta)
}

/// Boxes a handler's future, converting its error.
#[doc(hidden)]
pub fn into_future<'a, Fut, O>(fut: Fut) -> HandlerFuture<'a>
where
    Fut: Future<Output = O> + Send + 'a,
    O: HandlerOutput,
{
    Box::pin(async move { fut.await.into_handler_result() })
}

/// A handler future that fails at once (undecodable payload, wrong transaction type).
#[doc(hidden)]
pub fn fail<'a>(error: HandlerError) -> HandlerFuture<'a> {
    Box::pin(std::future::ready(Err(error)))
}

/// What an inbox handler may return: `Result<(), E>` where `E` converts into [`HandlerError`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a return type an inbox handler can have",
    label = "expected `Result<(), E>` here",
    note = "an inbox handler returns `Result<(), HandlerError>`, `anyhow::Result<()>`, or \
            `Result<(), E>` where `E: std::error::Error + Send + Sync + 'static`"
)]
pub trait HandlerOutput {
    /// The outcome as the runtime sees it.
    fn into_handler_result(self) -> Result<(), HandlerError>;
}

impl<E: IntoHandlerError> HandlerOutput for Result<(), E> {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        self.map_err(IntoHandlerError::into_handler_error)
    }
}

/// The type of a handler's optional third parameter: only [`MessageMeta`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the message metadata",
    label = "expected `MessageMeta` here",
    note = "the optional third parameter of an inbox handler is the message metadata: write \
            `meta: &inoutbox::MessageMeta`"
)]
pub trait MetaParam {
    /// The metadata, as this type.
    fn from_meta(meta: &MessageMeta) -> &Self;
}

impl MetaParam for MessageMeta {
    fn from_meta(meta: &MessageMeta) -> &Self {
        meta
    }
}

/// Reads facts about a type that may not implement the traits involved, without a second error:
/// the inherent items apply when the bound holds, else [`ProbeFallback`]'s defaults do. Generated
/// code uses it for every use of a type that it checks separately (see above).
#[doc(hidden)]
pub struct Probe<T: ?Sized>(std::marker::PhantomData<T>);

impl<E: OutboxEvent> Probe<E> {
    /// The declared event type.
    pub const EVENT_TYPE: Option<&'static str> = Some(E::EVENT_TYPE);

    /// The business key of the event's `idempotency_key = field`, if it declares one.
    pub const BUSINESS_KEY: Option<BusinessKeyFn> = match E::IDEMPOTENCY_KEY {
        Some(_) => Some(event_business_key::<E>),
        None => None,
    };

    /// See [`decode`].
    pub fn decode(payload: &[u8]) -> Result<E, HandlerError> {
        decode::<E>(payload)
    }

    /// See [`decode_all`] (a batch handler's events).
    pub fn decode_all(payloads: &[&[u8]]) -> Result<Vec<E>, HandlerError> {
        decode_all::<E>(payloads)
    }
}

impl<T: HandlerTx + ?Sized> Probe<T> {
    /// See [`downcast_tx`].
    pub fn downcast_tx(tx: &mut (dyn Any + Send)) -> Result<&mut T::Static, HandlerError> {
        downcast_tx::<T>(tx)
    }

    /// See [`tx_type_id`].
    pub fn tx_type_id() -> TypeId {
        tx_type_id::<T>()
    }
}

impl<M: MetaParam + ?Sized> Probe<M> {
    /// See [`meta_param`].
    pub fn meta(meta: &MessageMeta) -> Result<&M, HandlerError> {
        Ok(meta_param::<M>(meta))
    }
}

impl Probe<MessageMeta> {
    /// The metadata of a batch handler's events (`metas: &[MessageMeta]`), one per event.
    pub fn metas(metas: &[MessageMeta]) -> Result<&[MessageMeta], HandlerError> {
        Ok(metas)
    }
}

impl<O: HandlerOutput> Probe<O> {
    /// Boxes the handler's future (already `Send`: the generated code coerces it to
    /// `dyn Future + Send` on the handler's name), converting its error.
    pub fn into_future<'a>(fut: Pin<Box<dyn Future<Output = O> + Send + 'a>>) -> HandlerFuture<'a>
    where
        O: 'a,
    {
        into_future(fut)
    }
}

impl<K: fmt::Display + ?Sized> Probe<K> {
    /// The `Display` text of a field named by `key` or `aggregate_id` (`#[derive(OutboxEvent)]`).
    pub fn key_string(key: &K) -> String {
        key.to_string()
    }
}

/// The defaults of [`Probe`] for types that miss the bound (the build fails on that elsewhere,
/// once: these keep the rest of the generated code free of follow-on errors). Nothing here runs:
/// a build that selects one of them fails.
#[doc(hidden)]
pub trait ProbeFallback {
    /// No event type known.
    const EVENT_TYPE: Option<&'static str> = None;
    /// No business key.
    const BUSINESS_KEY: Option<BusinessKeyFn> = None;
    /// The probed type.
    type Target: ?Sized;

    /// Never succeeds.
    fn decode(_payload: &[u8]) -> Result<Self::Target, HandlerError>
    where
        Self::Target: Sized,
    {
        Err(HandlerError::bad_message("not an outbox event"))
    }

    /// Never succeeds.
    fn decode_all(_payloads: &[&[u8]]) -> Result<Vec<Self::Target>, HandlerError>
    where
        Self::Target: Sized,
    {
        Err(HandlerError::bad_message("not an outbox event"))
    }

    /// Never succeeds.
    fn downcast_tx(_tx: &mut (dyn Any + Send)) -> Result<&mut Self::Target, HandlerError> {
        Err(HandlerError::permanent(
            "not a transaction type inoutbox can hand to a handler",
        ))
    }

    /// A type no store hands out.
    fn tx_type_id() -> TypeId {
        TypeId::of::<ProbeFailed>()
    }

    /// Never succeeds.
    fn meta(_meta: &MessageMeta) -> Result<&Self::Target, HandlerError> {
        Err(HandlerError::permanent("not the message metadata"))
    }

    /// Never succeeds.
    fn metas(_metas: &[MessageMeta]) -> Result<&[Self::Target], HandlerError>
    where
        Self::Target: Sized,
    {
        Err(HandlerError::permanent("not the message metadata"))
    }

    /// Fails at once.
    fn into_future<'a, F>(_fut: F) -> HandlerFuture<'a> {
        fail(HandlerError::permanent(
            "not a return type an inbox handler can have",
        ))
    }

    /// No key.
    fn key_string(_key: &Self::Target) -> String {
        String::new()
    }
}

impl<T: ?Sized> ProbeFallback for Probe<T> {
    type Target = T;
}

/// The type whose `TypeId` stands for "no transaction type" in [`ProbeFallback`].
struct ProbeFailed;

/// Fails the build (in const evaluation) when `#[inbox_handler(event = "...")]` disagrees with
/// the event type declared by the handler's parameter type. The generated code panics with
/// [`event_type_mismatch`] itself, so that the error shows no frame in here; this is the same
/// check as one call.
#[doc(hidden)]
pub const fn check_event_type(declared: &str, actual: Option<&str>, type_name: &str) {
    if let Some(message) = &event_type_mismatch(declared, actual, type_name) {
        panic!("{}", message.as_str())
    }
}

/// Why `#[inbox_handler(event = "...")]` disagrees with the event type of the parameter's type,
/// or `None` when it agrees (or the type declares none: its own error says why).
#[doc(hidden)]
pub const fn event_type_mismatch(
    declared: &str,
    actual: Option<&str>,
    type_name: &str,
) -> Option<ConstMessage> {
    let actual = match actual {
        // An empty event type is the derive's placeholder after its own error: nothing to add.
        Some(actual) if !actual.is_empty() => actual,
        _ => return None,
    };
    if str_eq(declared, actual) {
        return None;
    }
    Some(ConstMessage::concat(&[
        "`event = \"",
        declared,
        "\"` does not match the event type of `",
        type_name,
        "`, which is \"",
        actual,
        "\": write `event = \"",
        actual,
        "\"`, or take an event type declared with `#[outbox(event_type = \"",
        declared,
        "\")]`",
    ]))
}

/// A message built in const evaluation (at most 1 KiB; longer ones are cut at a character).
#[doc(hidden)]
pub struct ConstMessage {
    buf: [u8; 1024],
    len: usize,
}

impl ConstMessage {
    const fn concat(parts: &[&str]) -> Self {
        let mut buf = [0u8; 1024];
        let mut len = 0;
        let mut part = 0;
        while part < parts.len() {
            let bytes = parts[part].as_bytes();
            let mut i = 0;
            while i < bytes.len() && len < buf.len() {
                buf[len] = bytes[i];
                len += 1;
                i += 1;
            }
            part += 1;
        }
        Self { buf, len }
    }

    /// The message.
    pub const fn as_str(&self) -> &str {
        let (message, _) = self.buf.split_at(self.len);
        match std::str::from_utf8(message) {
            Ok(message) => message,
            Err(error) => {
                let (valid, _) = message.split_at(error.valid_up_to());
                match std::str::from_utf8(valid) {
                    Ok(valid) => valid,
                    Err(_) => "",
                }
            }
        }
    }
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
