//! Handlers: the error type they return, the metadata they may take, the transaction types they
//! may take, and the registry that `#[inbox_handler]` feeds through `inventory`.
//!
//! - `error`: [`HandlerError`], [`ErrorKind`], [`IntoHandlerError`];
//! - `meta`: [`MessageMeta`];
//! - `tx`: [`HandlerTx`], implemented by each backend for its transaction;
//! - `registry`: [`HandlerRegistration`], [`DispatchTable`], [`HandlerMode`];
//! - `glue` and `event_check`: what generated code calls through `crate::__private`.

mod error;
pub(crate) mod event_check;
pub(crate) mod glue;
mod meta;
mod registry;
mod tx;

pub use error::{ErrorKind, HandlerError, IntoHandlerError};
pub use meta::MessageMeta;
pub use registry::{
    registrations, BusinessKeyFn, DispatchTable, HandlerFuture, HandlerMode, HandlerRegistration,
    RegistryError,
};
pub use tx::HandlerTx;
