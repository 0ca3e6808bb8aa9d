//! The attribute's arguments: `#[inbox_handler(event = "OrderCreated", group = "billing")]`,
//! and the `batch` flag.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::{Expr, ExprLit, Ident, Lit, LitStr};

use crate::ctxt::Ctxt;
use crate::kv::{self, ListSpec};
use crate::names;
use crate::tokens::compact;

/// `event = "OrderCreated"`: the event type handled; must equal the parameter type's
/// `OutboxEvent::EVENT_TYPE`.
pub(crate) const EVENT: &str = "event";
/// `group = "billing"`: the consumer group the handler belongs to.
pub(crate) const GROUP: &str = "group";
/// `batch`: a flag; the handler takes a run of events at once (`events: Vec<OrderCreated>`).
pub(crate) const BATCH: &str = "batch";
/// `dedup_by = field`: a field of the event whose `Display` text is the business key; the
/// inbox then also refuses a second event with the same key in the group.
pub(crate) const DEDUP_BY: &str = "dedup_by";
/// `dedup_scope = "orders"`: the key space of the handler's business keys in its group, shared
/// with the handlers of the group that name the same scope; by default each event type has its
/// own.
pub(crate) const DEDUP_SCOPE: &str = "dedup_scope";
/// `stores(postgres, sqlite, mysql)`: the handler is generic over its store (`D: inoutbox::Db`)
/// and is registered once per store listed.
pub(crate) const STORES: &str = "stores";
/// `crate = "my_inoutbox"`: the path generated code names inoutbox by; optional, `::inoutbox` by default.
pub(crate) const CRATE: &str = "crate";
/// `mode = "two_phase"`: store the message and acknowledge it, then run the handler in a
/// worker (for handlers that take seconds); `"one_phase"` (the default) runs it on receipt.
pub(crate) const MODE: &str = "mode";
/// `ordered = true`: a two-phase handler runs one message per key at a time, in order.
pub(crate) const ORDERED: &str = "ordered";

/// The values `mode` takes.
pub(crate) const MODES: &[&str] = &[ONE_PHASE, TWO_PHASE];
/// `mode = "one_phase"`, the default.
pub(crate) const ONE_PHASE: &str = "one_phase";
/// `mode = "two_phase"`.
pub(crate) const TWO_PHASE: &str = "two_phase";

/// Every key, in the order messages list them.
pub(crate) const KEYS: &[&str] = &[
    EVENT,
    GROUP,
    BATCH,
    DEDUP_BY,
    DEDUP_SCOPE,
    MODE,
    ORDERED,
    STORES,
    CRATE,
];

/// The stores `stores(..)` may list, and the type of each (under `__private`).
pub(crate) const STORE_NAMES: &[(&str, &str)] = &[
    ("postgres", "Postgres"),
    ("sqlite", "Sqlite"),
    ("mysql", "MySql"),
];

/// The required keys.
const REQUIRED: &[&str] = &[EVENT, GROUP];

/// Words written for a key, and the key meant (the derive's `event_type` is this `event`).
const ALIASES: &[(&str, &str)] = &[
    ("event_type", EVENT),
    ("type", EVENT),
    ("consumer_group", GROUP),
    ("group_id", GROUP),
    ("batching", BATCH),
    ("idempotency_key", DEDUP_BY),
    ("business_key", DEDUP_BY),
    ("dedup", DEDUP_BY),
    ("scope", DEDUP_SCOPE),
    ("key_scope", DEDUP_SCOPE),
    ("business_key_scope", DEDUP_SCOPE),
    ("two_phase", MODE),
    ("phase", MODE),
    ("ordering", ORDERED),
    ("in_order", ORDERED),
    ("store", STORES),
    ("databases", STORES),
];

/// The attribute written in full, for messages.
pub(crate) const EXAMPLE: &str = "#[inbox_handler(event = \"OrderCreated\", group = \"billing\")]";

/// Where unknown keys are reported, for messages.
const PLACE: &str = "`#[inbox_handler(...)]`";

/// The parsed arguments. A value is `None` when it was missing or rejected (and reported).
pub(crate) struct HandlerAttr {
    pub(crate) event: Option<LitStr>,
    pub(crate) group: Option<LitStr>,
    /// `crate = "..."`, parsed; `None` for the default `::inoutbox`.
    pub(crate) krate: Option<syn::Path>,
    /// The `batch` flag as written (also when it was wrongly given a value, which is reported:
    /// the signature is then checked as the batch handler's it was meant to be).
    pub(crate) batch: Option<Ident>,
    /// `dedup_by = field`: the event's field, as written (for spans).
    pub(crate) dedup_by: Option<Ident>,
    /// `dedup_scope = "..."`, a valid name.
    pub(crate) dedup_scope: Option<LitStr>,
    /// `mode = "..."`, when written with a known value.
    pub(crate) mode: Option<LitStr>,
    /// `ordered = <bool>`, with the key for spans.
    pub(crate) ordered: Option<(Ident, bool)>,
    /// `stores(..)`: the stores listed (each once, known), with the list for error spans.
    pub(crate) stores: Option<Stores>,
}

/// The stores of `stores(postgres, sqlite)`.
pub(crate) struct Stores {
    /// The `(..)` as written.
    pub(crate) group: TokenStream,
    /// The stores listed, known ones only, each once.
    pub(crate) names: Vec<Ident>,
}

/// Which handler the attribute declares: of one event per call, or of a run of events.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// `async fn h(event: E, tx: &mut PgTx<'_>, meta: &MessageMeta)`.
    Single,
    /// `#[inbox_handler(.., batch)]`:
    /// `async fn h(events: Vec<E>, tx: &mut PgTx<'_>, metas: &[MessageMeta])`.
    Batch,
}

impl HandlerAttr {
    pub(crate) fn from_tokens(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut attr = HandlerAttr {
            event: None,
            group: None,
            krate: None,
            batch: None,
            dedup_by: None,
            dedup_scope: None,
            mode: None,
            ordered: None,
            stores: None,
        };
        // Keys written, and the keys unknown ones were probably meant to be: neither is
        // reported as missing (the "did you mean" says it already).
        let mut seen: Vec<&str> = Vec::new();
        let mut meant: Vec<&str> = Vec::new();
        let spec = ListSpec {
            example: "event = \"OrderCreated\"",
            field_keys: &[DEDUP_BY],
            list_keys: &[STORES],
        };
        let list = kv::parse_list(cx, tokens, spec);
        for pair in list.pairs {
            let key = pair.key.to_string();
            let Some(known) = KEYS.iter().copied().find(|k| *k == key) else {
                meant.extend(kv::unknown_key(cx, &pair.key, PLACE, KEYS, ALIASES));
                continue;
            };
            if seen.contains(&known) {
                kv::duplicate(cx, &pair.key);
                continue;
            }
            seen.push(known);
            attr.take(cx, known, &pair);
        }
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|k| !seen.contains(k) && !meant.contains(k))
            .collect();
        if list.complete && !missing.is_empty() {
            cx.error_at(
                Span::call_site(),
                format!(
                    "missing {} in `#[inbox_handler(...)]`; write e.g. `{EXAMPLE}`",
                    kv::ticked(&missing).join(" and ")
                ),
            );
        }
        attr
    }

    /// Reads the value of a known key, given for the first time.
    fn take(&mut self, cx: &Ctxt, key: &str, pair: &kv::KeyValue) {
        let example = match key {
            EVENT => "OrderCreated",
            GROUP => "billing",
            DEDUP_SCOPE => "orders",
            BATCH => return self.take_flag(cx, pair),
            DEDUP_BY => {
                if pair.bare {
                    let message =
                        "`dedup_by` names a field of the event: write `dedup_by = operation_id`";
                    return cx.error_spanned_by(&pair.key, message);
                }
                self.dedup_by = kv::field_ident(cx, pair);
                return;
            }
            MODE => return self.take_mode(cx, pair),
            ORDERED => return self.take_ordered(cx, pair),
            STORES => return self.take_stores(cx, pair),
            _ => "my_inoutbox",
        };
        if pair.bare {
            let example = format!("{key} = \"{example}\"");
            return cx.error_spanned_by(&pair.key, kv::missing_value(&pair.key, &example));
        }
        let slot = match key {
            EVENT => &mut self.event,
            GROUP => &mut self.group,
            DEDUP_SCOPE => &mut self.dedup_scope,
            _ => {
                self.krate = kv::crate_path(cx, pair);
                return;
            }
        };
        let Some(lit) = kv::lit_str(cx, pair, &format!("\"{example}\"")) else {
            return;
        };
        if let Some(message) = names::invalid_name(key, &lit.value(), example) {
            cx.error_spanned_by(&lit, message);
            return;
        }
        *slot = Some(lit);
    }

    /// `batch`, a flag: a value is an error on `batch = value`. Any value but `false` still
    /// makes the handler a batch handler (for the checks of its signature).
    fn take_flag(&mut self, cx: &Ctxt, pair: &kv::KeyValue) {
        let key = &pair.key;
        let Some(value) = &pair.value else {
            self.batch = Some(key.clone());
            return;
        };
        let written = quote!(#key = #value);
        let message = match value {
            Expr::Lit(ExprLit {
                lit: Lit::Bool(flag),
                ..
            }) if !flag.value => format!(
                "`{key}` is a flag and takes no value: a handler of one event per call has no \
                 `{key}`; remove `{}`",
                compact(&written)
            ),
            _ => {
                self.batch = Some(key.clone());
                format!(
                    "`{key}` is a flag and takes no value: write `{key}`, not `{}`",
                    compact(&written)
                )
            }
        };
        cx.error_spanned_by(written, message);
    }

    /// `mode = "one_phase" | "two_phase"`.
    fn take_mode(&mut self, cx: &Ctxt, pair: &kv::KeyValue) {
        if pair.bare {
            let message = kv::missing_value(&pair.key, "mode = \"two_phase\"");
            return cx.error_spanned_by(&pair.key, message);
        }
        let Some(lit) = kv::lit_str(cx, pair, "\"two_phase\"") else {
            return;
        };
        if !MODES.contains(&lit.value().as_str()) {
            let message = format!(
                "unknown mode `{}`: expected one of: {}",
                lit.value(),
                kv::ticked(MODES).join(", ")
            );
            return cx.error_spanned_by(&lit, message);
        }
        self.mode = Some(lit);
    }

    /// `ordered = true` or `ordered = false`; a bare `ordered` means `true`.
    fn take_ordered(&mut self, cx: &Ctxt, pair: &kv::KeyValue) {
        let key = pair.key.clone();
        match &pair.value {
            None => self.ordered = Some((key, true)),
            Some(Expr::Lit(ExprLit {
                lit: Lit::Bool(flag),
                ..
            })) => self.ordered = Some((key, flag.value)),
            Some(value) => cx.error_spanned_by(
                value,
                format!("`{key}` takes `true` or `false`, not `{}`", compact(value)),
            ),
        }
    }

    /// Whether `mode = "two_phase"` was written.
    pub(crate) fn is_two_phase(&self) -> bool {
        self.mode.as_ref().is_some_and(|m| m.value() == TWO_PHASE)
    }

    /// Whether `ordered = true` was written.
    pub(crate) fn is_ordered(&self) -> bool {
        self.ordered.as_ref().is_some_and(|(_, ordered)| *ordered)
    }

    /// `stores(postgres, sqlite)`: each name known and listed once, at least one.
    fn take_stores(&mut self, cx: &Ctxt, pair: &kv::KeyValue) {
        let Some(list) = &pair.list else {
            let key = &pair.key;
            cx.error_spanned_by(
                key,
                format!("`{key}` takes a list of stores: write `{key}(postgres, sqlite)`"),
            );
            // Still a handler for several stores: its signature is checked as one.
            self.stores = Some(Stores {
                group: key.to_token_stream(),
                names: Vec::new(),
            });
            return;
        };
        let known: Vec<&'static str> = STORE_NAMES.iter().map(|(name, _)| *name).collect();
        let mut names: Vec<Ident> = Vec::new();
        for name in &list.items {
            if !known.iter().any(|k| name == k) {
                let typo = crate::suggest::closest(&name.to_string(), &known, &[]);
                let hint = typo.map_or_else(String::new, |t| format!("did you mean `{t}`? "));
                cx.error_spanned_by(
                    name,
                    format!("unknown store `{name}`; {hint}{}", kv::one_of(&known)),
                );
            } else if names.iter().any(|n| n == name) {
                cx.error_spanned_by(name, format!("store `{name}` is listed twice; keep one"));
            } else {
                names.push(name.clone());
            }
        }
        if list.items.is_empty() {
            cx.error_spanned_by(
                &list.group,
                "list at least one store: write `stores(postgres, sqlite)`",
            );
        }
        self.stores = Some(Stores {
            group: list.group.clone(),
            names,
        });
    }

    /// Which handler the attribute declares.
    pub(crate) fn form(&self) -> Form {
        match self.batch {
            Some(_) => Form::Batch,
            None => Form::Single,
        }
    }

    /// The attribute as written, with `batch` added, for messages.
    pub(crate) fn with_batch(&self) -> String {
        let event = self
            .event
            .as_ref()
            .map_or("OrderCreated".into(), LitStr::value);
        let group = self.group.as_ref().map_or("billing".into(), LitStr::value);
        let krate = match &self.krate {
            Some(path) => format!(", crate = \"{}\"", compact(path)),
            None => String::new(),
        };
        format!("#[inbox_handler(event = \"{event}\", group = \"{group}\", batch{krate})]")
    }
}
