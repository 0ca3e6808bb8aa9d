//! The error a handler returns: [`HandlerError`], its [`ErrorKind`], and [`IntoHandlerError`],
//! which converts what a handler returns in its `Err`.

use std::error::Error as StdError;
use std::fmt;

/// The error a handler returns. Any `std::error::Error + Send + Sync + 'static` converts into it
/// with `?`. A handler may also return `anyhow::Result<()>` or its own error type (see
/// [`IntoHandlerError`]).
///
/// An ordinary error is *transient*: the transaction is rolled back and the message retried. An
/// error made with [`HandlerError::permanent`] is not retried. [`HandlerError::defer`] is not a
/// failure but an answer: "not yet, again in 30 s" (see [`defer`](HandlerError::defer)).
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
    /// Not a failure: the handler asked to run the message again later
    /// ([`HandlerError::defer`]).
    Deferred,
}

#[derive(Debug)]
struct Message(String);

/// What [`HandlerError::defer`] carries: how long to wait, and why.
#[derive(Debug)]
struct Deferral {
    after: std::time::Duration,
    reason: String,
}

impl fmt::Display for Deferral {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (again in {:?})", self.reason, self.after)
    }
}

impl StdError for Deferral {}

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

    /// Not yet: the handler's transaction is rolled back (nothing it wrote stays), the message
    /// is kept in the inbox with its due time, `after` from now, and its handler runs again
    /// once it is due, exactly once, in a transaction with its inbox row.
    ///
    /// The partition does not wait: its offset is committed past the message and the messages
    /// after it (of its key too) are handled at once; a redelivery of the deferred message is a
    /// duplicate. A message may be deferred at most
    /// [`max_deferrals`](crate::engine::InboxConfig::max_deferrals) times: deferred once more,
    /// it is dead-lettered with the reason. Deferral needs the inbox
    /// ([`AckStrategy::ExactlyOnceInbox`](crate::engine::AckStrategy::ExactlyOnceInbox)); under
    /// another strategy it counts as a failure that cannot be retried.
    ///
    /// The typical case is an event that arrives before the one it depends on: a cancel
    /// before its order.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inoutbox::HandlerError;
    /// # fn cancel(order_exists: bool) -> Result<(), HandlerError> {
    /// if !order_exists {
    ///     return Err(HandlerError::defer(Duration::from_secs(30)));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn defer(after: std::time::Duration) -> Self {
        Self::defer_because(after, "not yet")
    }

    /// [`defer`](Self::defer), with the reason (logged, and kept in the dead letter when the
    /// message is deferred once more than the limit allows).
    pub fn defer_because(after: std::time::Duration, reason: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Deferred,
            explicit: true,
            source: Box::new(Deferral {
                after,
                reason: reason.into(),
            }),
        }
    }

    /// How long the handler asked to wait when it deferred the message
    /// ([`defer`](Self::defer)); `None` for every other kind.
    pub fn deferred_for(&self) -> Option<std::time::Duration> {
        match self.kind {
            ErrorKind::Deferred => self.source.downcast_ref::<Deferral>().map(|d| d.after),
            _ => None,
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
            ErrorKind::Deferred => write!(f, "deferred: {}", self.chain()),
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
