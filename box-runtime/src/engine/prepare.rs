//! Before a handler runs: the message's inbox key, event type and handler, or why it is bad.

use super::config::{EventId, Source, UnknownEvent};
use super::Inbox;
use crate::handler::HandlerRegistration;
use crate::message::Delivery;
use crate::store::{text, InboxKey, InboxStore};

/// A message ready for its handler.
pub(super) struct Ready<'d> {
    pub(super) d: &'d Delivery,
    pub(super) reg: &'static HandlerRegistration,
    pub(super) key: InboxKey,
    pub(super) event_type: &'d str,
    pub(super) payload: &'d [u8],
    /// The message's span: the handler runs in it.
    pub(super) span: tracing::Span,
    /// For a two-phase worker's run: the owner of the lease on the received row (the handler's
    /// transaction checks it and marks that row processed instead of inserting one).
    pub(super) lease: Option<&'d str>,
}

/// What a message is, before any handler runs.
pub(super) enum Prepared<'d> {
    Ready(Ready<'d>),
    /// Dead-letter it, with the reason (and the key and type, when known).
    Bad {
        reason: String,
        key: Option<InboxKey>,
        event_type: Option<&'d str>,
    },
    /// Acknowledge it without running anything.
    Skip(String),
}

impl Prepared<'_> {
    /// The message's handler runs in `span`.
    pub(super) fn with_span(mut self, span: &tracing::Span) -> Self {
        if let Prepared::Ready(ready) = &mut self {
            ready.span = span.clone();
        }
        self
    }
}

/// Why a message is bad, for [`Prepared::Bad`].
struct Bad<'d>(String, Option<Box<InboxKey>>, Option<&'d str>);

impl<'d> From<Bad<'d>> for Prepared<'d> {
    fn from(Bad(reason, key, event_type): Bad<'d>) -> Self {
        Prepared::Bad {
            reason,
            key: key.map(|k| *k),
            event_type,
        }
    }
}

impl<S: InboxStore> Inbox<S> {
    pub(super) fn prepare<'d>(&self, d: &'d Delivery) -> Prepared<'d> {
        match self.try_prepare(d) {
            Ok(ready) => ready,
            Err(bad) => bad.into(),
        }
    }

    fn try_prepare<'d>(&self, d: &'d Delivery) -> Result<Prepared<'d>, Bad<'d>> {
        let event_type = d.header_str(&self.config.event_type_header);
        let payload = self.payload(d).map_err(|r| Bad(r, None, event_type))?;
        let mut key = self.key(d).map_err(|r| Bad(r, None, event_type))?;
        let Some(event_type) = event_type else {
            let header = &self.config.event_type_header;
            let reason = format!("missing or empty event type header `{header}`");
            return Err(Bad(reason, Some(Box::new(key)), None));
        };
        let Some(reg) = self.handlers.get(event_type) else {
            let reason = format!(
                "no handler for event type `{event_type}` in group `{}` (handled: {})",
                self.group(),
                self.handlers.event_types().collect::<Vec<_>>().join(", ")
            );
            return match self.config.unknown_event {
                UnknownEvent::Skip => Ok(Prepared::Skip(reason)),
                UnknownEvent::DeadLetter => Err(Bad(reason, Some(Box::new(key)), Some(event_type))),
            };
        };
        if let Some(business_key) = reg.business_key.filter(|_| self.config.ack.uses_inbox()) {
            // The key's field is user code run on producer data (its `Display`, say): a panic
            // there is this message's fault, dead-lettered like a payload that does not parse.
            let found =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| business_key(payload)))
                    .unwrap_or_else(|panic| Err(business_key_panic(&*panic)));
            match found {
                // Held as `scope:key`: unique per group, event type (or shared scope) and key.
                Ok(found) => {
                    key.business_key = found.map(|k| reg.scoped_business_key(&text::inbox_id(&k)))
                }
                Err(reason) => return Err(Bad(reason, Some(Box::new(key)), Some(event_type))),
            }
        }
        Ok(Prepared::Ready(Ready {
            d,
            reg,
            key,
            event_type,
            payload,
            span: tracing::Span::none(),
            lease: None,
        }))
    }

    fn payload<'d>(&self, d: &'d Delivery) -> Result<&'d [u8], String> {
        let Some(payload) = d.payload.as_deref() else {
            return Err("message has no payload".into());
        };
        let limit = self.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(format!(
                "payload of {} bytes exceeds the limit of {limit} bytes",
                payload.len()
            ));
        }
        Ok(payload)
    }

    /// The inbox key: ids and sources are taken verbatim (never trimmed), and stored as their
    /// digest when they are too long or hold NUL (see [`text::inbox_id`]).
    fn key(&self, d: &Delivery) -> Result<InboxKey, String> {
        let source = match &self.config.source {
            Source::None => String::new(),
            Source::Header(name) => match header(d, name, "source")? {
                Some(s) => text::inbox_id(s).into_owned(),
                None => return Err(format!("missing or empty source header `{name}`")),
            },
        };
        let event_id = match &self.config.event_id {
            EventId::Header(name) => match header(d, name, "event id")? {
                Some(id) => text::inbox_id(id).into_owned(),
                None if !self.config.ack.uses_inbox() => d.coordinates(),
                None => return Err(format!("missing or empty event id header `{name}`")),
            },
            EventId::BrokerCoordinates => d.coordinates(),
        };
        Ok(InboxKey {
            group: self.group().to_owned(),
            source,
            event_id,
            business_key: None,
        })
    }
}

/// A header as text, or why it cannot be one.
fn header<'d>(d: &'d Delivery, name: &str, what: &str) -> Result<Option<&'d str>, String> {
    d.header_text(name)
        .map_err(|()| format!("the {what} header `{name}` is not valid UTF-8"))
}

/// The reason of a message whose business key panicked while it was read.
fn business_key_panic(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("reading the business key of this event panicked: {text}")
}
