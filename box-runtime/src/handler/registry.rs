//! The registry: every `#[inbox_handler]` registers itself through `inventory`
//! ([`HandlerRegistration`]); a consumer group's handlers are gathered into a [`DispatchTable`].

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::{HandlerError, MessageMeta};

/// The future an erased handler returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// An erased handler: decodes the payload into its event type, downcasts the transaction to the
/// type it declared and runs.
pub type InvokeFn =
    for<'a> fn(&'a [u8], &'a mut (dyn Any + Send), &'a MessageMeta) -> HandlerFuture<'a>;

/// An erased batch handler: decodes every payload into its event type and runs once for all.
pub type InvokeBatchFn =
    for<'a> fn(&'a [&'a [u8]], &'a mut (dyn Any + Send), &'a [MessageMeta]) -> HandlerFuture<'a>;

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
    /// The key space its business keys share with other handlers of the group
    /// (`dedup_scope = "..."`); `None`: its own event type's (see [`key_scope`](Self::key_scope)).
    pub dedup_scope: Option<&'static str>,
    /// How its messages are handled: in the receiving transaction, or stored first and handled
    /// by workers (`mode = "two_phase"`).
    pub mode: HandlerMode,
}

/// Reads a message's business key from its payload: `Ok(None)` when it has none, `Err` with
/// the reason when the payload cannot be read.
pub type BusinessKeyFn = fn(&[u8]) -> Result<Option<String>, String>;

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
            dedup_scope: None,
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

    /// The registration of a handler whose business keys live in the shared key space `scope`
    /// of its group (`dedup_scope = "..."`). Used by generated code.
    #[doc(hidden)]
    pub const fn dedup_scope(self, scope: &'static str) -> Self {
        Self {
            dedup_scope: Some(scope),
            ..self
        }
    }

    /// The key space of its business keys in its group: the `dedup_scope` it names, else its
    /// event type. Two events of a group are duplicates by meaning only when their business
    /// keys are equal in one key space, so `OrderPlaced` and `OrderCancelled` with the same
    /// `order_id` both run unless their handlers name one `dedup_scope`.
    pub fn key_scope(&self) -> &'static str {
        self.dedup_scope.unwrap_or(self.event_type)
    }

    /// A business key as the inbox holds it: `scope:key` (see [`key_scope`](Self::key_scope)).
    /// Scopes and event types never hold `:` (the macros accept letters, digits, `.`, `_` and
    /// `-`), so two (scope, key) pairs never share a text.
    pub fn scoped_business_key(&self, key: &str) -> String {
        format!("{}:{key}", self.key_scope())
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
            .field("dedup_scope", &self.dedup_scope)
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
    /// Two handlers of the group put business keys in conflicting key spaces (`dedup_scope`):
    /// one event type in two scopes (handlers of one event for several stores), or a shared
    /// scope named like another handler's event type, whose own keys live in that space
    /// without sharing it.
    #[error(
        "handlers {first} and {second} of group `{group}` declare conflicting business-key \
         scopes: {detail}"
    )]
    ScopeConflict {
        /// The group.
        group: String,
        /// The first handler, `path (file:line)`.
        first: String,
        /// The second handler, `path (file:line)`.
        second: String,
        /// What conflicts, and what to write instead.
        detail: String,
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
        // Scopes are checked across the stores: one group means one set of key spaces.
        check_scopes(group, registrations())?;
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
        check_scopes(group, all.iter().copied())?;
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

/// Refuses business-key scopes of `group` that conflict (see [`RegistryError::ScopeConflict`]).
/// Only handlers that deduplicate by a business key have a scope.
fn check_scopes<'r>(
    group: &str,
    regs: impl IntoIterator<Item = &'r HandlerRegistration>,
) -> Result<(), RegistryError> {
    let mut keyed: Vec<&HandlerRegistration> = regs
        .into_iter()
        .filter(|r| r.group == group && r.business_key.is_some())
        .collect();
    keyed.sort_by_key(|r| (r.event_type, r.file, r.line));
    let conflict = |first: &HandlerRegistration, second: &HandlerRegistration, detail: String| {
        RegistryError::ScopeConflict {
            group: group.to_owned(),
            first: first.location(),
            second: second.location(),
            detail,
        }
    };
    for (i, a) in keyed.iter().enumerate() {
        for b in &keyed[i + 1..] {
            if a.event_type == b.event_type && a.key_scope() != b.key_scope() {
                let detail = format!(
                    "event `{}` is deduplicated in scope `{}` by one and `{}` by the other; \
                     write the same `dedup_scope` on both (or none)",
                    a.event_type,
                    a.key_scope(),
                    b.key_scope()
                );
                return Err(conflict(a, b, detail));
            }
        }
        for b in &keyed {
            // `b` names a shared scope that is `a`'s event type, while `a` keeps its keys in
            // its own (default) scope: `b` would share a key space `a` did not open.
            if b.event_type != a.event_type
                && a.dedup_scope.is_none()
                && b.dedup_scope == Some(a.event_type)
            {
                let detail = format!(
                    "`dedup_scope = \"{scope}\"` on the second is the scope of event \
                     `{scope}`'s own keys; to share keys with it, write the same `dedup_scope` \
                     on both, named for what they share (e.g. `dedup_scope = \"orders\"`)",
                    scope = a.event_type
                );
                return Err(conflict(a, b, detail));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invoke<'a>(
        _: &'a [u8],
        _: &'a mut (dyn Any + Send),
        _: &'a MessageMeta,
    ) -> HandlerFuture<'a> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn key(_: &[u8]) -> Result<Option<String>, String> {
        Ok(Some("o-1".into()))
    }

    fn handler(event_type: &'static str, line: u32) -> HandlerRegistration {
        let tx = TypeId::of::<()>;
        HandlerRegistration::new(event_type, "payments", "h", "f.rs", line, tx, invoke)
            .business_key(Some(key))
    }

    fn leak(reg: HandlerRegistration) -> &'static HandlerRegistration {
        Box::leak(Box::new(reg))
    }

    #[test]
    fn a_business_key_is_held_in_its_event_types_scope_unless_a_shared_one_is_named() {
        let placed = handler("OrderPlaced", 1);
        assert_eq!(placed.scoped_business_key("o-1"), "OrderPlaced:o-1");
        let shared = handler("OrderCancelled", 2).dedup_scope("orders");
        assert_eq!(shared.scoped_business_key("o-1"), "orders:o-1");
    }

    #[test]
    fn handlers_of_two_event_types_with_the_same_key_field_do_not_conflict() {
        let regs = [
            leak(handler("OrderPlaced", 1)),
            leak(handler("OrderCancelled", 2)),
        ];
        assert!(DispatchTable::from_registrations("payments", regs).is_ok());
        let shared = [
            leak(handler("OrderPlaced", 1).dedup_scope("orders")),
            leak(handler("OrderCancelled", 2).dedup_scope("orders")),
        ];
        assert!(DispatchTable::from_registrations("payments", shared).is_ok());
    }

    #[test]
    fn one_event_type_in_two_scopes_is_refused_naming_both_handlers() {
        // Two stores' handlers of one event, one of them in a shared scope.
        let regs = [
            leak(handler("OrderPlaced", 1)),
            leak(handler("OrderPlaced", 2).dedup_scope("orders")),
        ];
        let error = check_scopes("payments", regs).unwrap_err().to_string();
        assert!(error.contains("h (f.rs:1) and h (f.rs:2)"), "{error}");
        assert!(error.contains("scope `OrderPlaced`"), "{error}");
        assert!(error.contains("`orders`"), "{error}");
    }

    #[test]
    fn a_shared_scope_named_like_another_handlers_event_type_is_refused() {
        let regs = [
            leak(handler("OrderPlaced", 1)),
            leak(handler("OrderCancelled", 2).dedup_scope("OrderPlaced")),
        ];
        let error = DispatchTable::from_registrations("payments", regs)
            .unwrap_err()
            .to_string();
        assert!(error.contains("h (f.rs:1) and h (f.rs:2)"), "{error}");
        assert!(error.contains("dedup_scope = \"OrderPlaced\""), "{error}");
    }
}
