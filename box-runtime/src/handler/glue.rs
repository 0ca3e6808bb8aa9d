//! What the code `#[inbox_handler]` and `#[derive(OutboxEvent)]` generate calls, through
//! `crate::__private`; not a public API.
//!
//! The generated code checks the user's types itself, with trait-qualified paths
//! (`<Type as Trait>::item`) on traits whose `#[diagnostic::on_unimplemented]` text is written for
//! the user: rustc then reports one error on the type the user wrote, and no "required by a bound
//! in" note pointing in here. What else the generated code needs from those types goes through
//! [`Probe`], whose fallback answers for a type that failed its check, so that the failed check
//! stays the only error.

use std::any::{Any, TypeId};
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::{BusinessKeyFn, HandlerError, HandlerFuture, HandlerTx, IntoHandlerError, MessageMeta};
use crate::event::InboxEvent;

/// Decodes a payload into the handler's event type.
#[doc(hidden)]
pub fn decode<E: InboxEvent>(payload: &[u8]) -> Result<E, HandlerError> {
    serde_json::from_slice::<E>(payload).map_err(|error| {
        HandlerError::bad_message(format!(
            "payload does not decode into `{}` (event type `{}`): {error}",
            std::any::type_name::<E>(),
            E::EVENT_TYPE
        ))
    })
}

/// Decodes the payloads of a batch handler's run; the first that does not decode fails the run
/// (the engine then runs the messages one by one, which finds the bad one).
#[doc(hidden)]
pub fn decode_all<E: InboxEvent>(payloads: &[&[u8]]) -> Result<Vec<E>, HandlerError> {
    payloads.iter().map(|p| decode::<E>(p)).collect()
}

/// The business key of an event type that declares `idempotency_key = field`.
fn event_business_key<E: InboxEvent>(payload: &[u8]) -> Result<Option<String>, String> {
    let event = decode::<E>(payload).map_err(|e| e.to_string())?;
    Ok(InboxEvent::idempotency_key(&event))
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

/// The `TypeId` of the store transaction behind a handler's transaction parameter.
#[doc(hidden)]
pub fn tx_type_id<T: HandlerTx + ?Sized>() -> TypeId {
    TypeId::of::<T::Static>()
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

impl<E: InboxEvent> Probe<E> {
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
