//! The attribute's arguments: `#[inbox_handler(event = "OrderCreated", group = "billing")]`.

use proc_macro2::{Span, TokenStream};
use syn::LitStr;

use crate::ctxt::Ctxt;
use crate::kv::{self, Bare, ListSpec};
use crate::names;

/// `event = "OrderCreated"`: the event type handled; must equal the parameter type's
/// `OutboxEvent::EVENT_TYPE`.
pub(crate) const EVENT: &str = "event";
/// `group = "billing"`: the consumer group the handler belongs to.
pub(crate) const GROUP: &str = "group";
/// `crate = "my_txbox"`: the path generated code names txbox by; optional, `::txbox` by default.
pub(crate) const CRATE: &str = "crate";

/// Every key, in the order messages list them.
pub(crate) const KEYS: &[&str] = &[EVENT, GROUP, CRATE];

/// The required keys.
const REQUIRED: &[&str] = &[EVENT, GROUP];

/// Words written for a key, and the key meant (the derive's `event_type` is this `event`).
const ALIASES: &[(&str, &str)] = &[
    ("event_type", EVENT),
    ("type", EVENT),
    ("consumer_group", GROUP),
    ("group_id", GROUP),
];

/// The attribute written in full, for messages.
pub(crate) const EXAMPLE: &str = "#[inbox_handler(event = \"OrderCreated\", group = \"billing\")]";

/// Where unknown keys are reported, for messages.
const PLACE: &str = "`#[inbox_handler(...)]`";

/// The parsed arguments. A value is `None` when it was missing or rejected (and reported).
pub(crate) struct HandlerAttr {
    pub(crate) event: Option<LitStr>,
    pub(crate) group: Option<LitStr>,
    /// `crate = "..."`, parsed; `None` for the default `::txbox`.
    pub(crate) krate: Option<syn::Path>,
}

impl HandlerAttr {
    pub(crate) fn from_tokens(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut attr = HandlerAttr {
            event: None,
            group: None,
            krate: None,
        };
        // Keys written, and the keys unknown ones were probably meant to be: neither is
        // reported as missing (the "did you mean" says it already).
        let mut seen: Vec<&str> = Vec::new();
        let mut meant: Vec<&str> = Vec::new();
        let spec = ListSpec {
            example: "event = \"OrderCreated\"",
            bare: Bare::Error,
            field_keys: &[],
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
        let (slot, example) = match key {
            EVENT => (&mut self.event, "OrderCreated"),
            GROUP => (&mut self.group, "billing"),
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
}
