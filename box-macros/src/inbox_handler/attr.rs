//! The attribute's arguments: `#[inbox_handler(event = "OrderCreated", group = "billing")]`.

use proc_macro2::{Span, TokenStream};
use syn::LitStr;

use crate::ctxt::Ctxt;
use crate::{kv, names};

/// `event = "OrderCreated"`: the event type handled; must equal the parameter type's
/// `OutboxEvent::EVENT_TYPE`.
pub(crate) const EVENT: &str = "event";
/// `group = "billing"`: the consumer group the handler belongs to.
pub(crate) const GROUP: &str = "group";

/// Every key, in the order messages list them.
pub(crate) const KEYS: &[&str] = &[EVENT, GROUP];

/// The attribute written in full, for messages.
pub(crate) const EXAMPLE: &str = "#[inbox_handler(event = \"OrderCreated\", group = \"billing\")]";

/// The parsed arguments. A value is `None` when it was missing or rejected (and reported).
pub(crate) struct HandlerAttr {
    pub(crate) event: Option<LitStr>,
    pub(crate) group: Option<LitStr>,
}

impl HandlerAttr {
    pub(crate) fn from_tokens(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut event = None;
        let mut group = None;
        let mut seen: Vec<&str> = Vec::new();
        let list = kv::parse_list(cx, tokens, "event = \"OrderCreated\"");
        for pair in list.pairs {
            let key = pair.key.to_string();
            let (slot, example) = match key.as_str() {
                EVENT => (&mut event, "OrderCreated"),
                GROUP => (&mut group, "billing"),
                _ => {
                    cx.error_spanned_by(
                        &pair.key,
                        format!(
                            "unknown key `{key}` in `#[inbox_handler(...)]`; {}",
                            kv::one_of(KEYS)
                        ),
                    );
                    continue;
                }
            };
            let Some(known) = KEYS.iter().find(|k| **k == key) else {
                continue;
            };
            if seen.contains(known) {
                kv::duplicate(cx, &pair.key);
                continue;
            }
            seen.push(known);
            let Some(lit) = kv::lit_str(cx, &pair, &format!("\"{example}\"")) else {
                continue;
            };
            if let Some(message) = names::invalid_name(&key, &lit.value(), example) {
                cx.error_spanned_by(&lit, message);
                continue;
            }
            *slot = Some(lit);
        }
        let missing: Vec<String> = KEYS
            .iter()
            .filter(|k| !seen.contains(k))
            .map(|k| format!("`{k}`"))
            .collect();
        if list.complete && !missing.is_empty() {
            cx.error_at(
                Span::call_site(),
                format!(
                    "missing {} in `#[inbox_handler(...)]`; write e.g. `{EXAMPLE}`",
                    missing.join(" and ")
                ),
            );
        }
        HandlerAttr { event, group }
    }
}
