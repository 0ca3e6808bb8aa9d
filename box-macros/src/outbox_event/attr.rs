//! The `#[outbox(...)]` attributes: on the struct (`event_type`, `topic`, ..) and on a field
//! (`#[outbox(key)]`, `#[outbox(aggregate_id)]`).

use syn::{Attribute, Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::kv::{self, ListSpec};

/// The attribute's name.
pub(crate) const OUTBOX: &str = "outbox";
/// `event_type = "OrderCreated"`: the CloudEvents `ce_type`; required.
pub(crate) const EVENT_TYPE: &str = "event_type";
/// `topic = "orders"`: where the relay publishes; required.
pub(crate) const TOPIC: &str = "topic";
/// `key = field`: the message key, from the field's `Display`; optional. On a field:
/// `#[outbox(key)]`.
pub(crate) const KEY: &str = "key";
/// `aggregate_type = "Order"`; optional.
pub(crate) const AGGREGATE_TYPE: &str = "aggregate_type";
/// `aggregate_id = field`; optional, defaults to the key. On a field: `#[outbox(aggregate_id)]`.
pub(crate) const AGGREGATE_ID: &str = "aggregate_id";
/// `idempotency_key = field`: the business key (an operation id); optional. Inbox handlers of
/// the event also refuse a second event with the same key. On a field:
/// `#[outbox(idempotency_key)]`.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency_key";
/// `crate = "my_inoutbox"`: the path generated code names inoutbox by; optional, `::inoutbox` by default.
pub(crate) const CRATE: &str = "crate";

/// Every key of the struct's attribute, in the order messages list them.
pub(crate) const KEYS: &[&str] = &[
    EVENT_TYPE,
    TOPIC,
    KEY,
    AGGREGATE_TYPE,
    AGGREGATE_ID,
    IDEMPOTENCY_KEY,
    CRATE,
];

/// The keys a field's attribute takes.
pub(crate) const FIELD_KEYS: &[&str] = &[KEY, AGGREGATE_ID, IDEMPOTENCY_KEY];

/// Words written for a key, and the key meant (the handler's `event` is this `event_type`).
const ALIASES: &[(&str, &str)] = &[
    ("event", EVENT_TYPE),
    ("type", EVENT_TYPE),
    ("ce_type", EVENT_TYPE),
    ("topic_name", TOPIC),
    ("partition_key", KEY),
    ("message_key", KEY),
    ("business_key", IDEMPOTENCY_KEY),
    ("dedup_by", IDEMPOTENCY_KEY),
];

/// How the attribute looks when written in full, for messages.
pub(crate) const EXAMPLE: &str = "#[outbox(event_type = \"OrderCreated\", topic = \"orders\")]";

/// What the `#[outbox(...)]` attributes of a type say. Each value keeps its tokens for spans.
#[derive(Default)]
pub(crate) struct Attrs {
    /// The first `#[outbox]` attribute, for errors about missing keys.
    pub(crate) attr: Option<Attribute>,
    pub(crate) event_type: Option<LitStr>,
    pub(crate) topic: Option<LitStr>,
    pub(crate) key: Option<Ident>,
    pub(crate) aggregate_type: Option<LitStr>,
    pub(crate) aggregate_id: Option<Ident>,
    pub(crate) idempotency_key: Option<Ident>,
    /// `crate = "..."`, parsed.
    pub(crate) krate: Option<syn::Path>,
    /// Every key written, even with a rejected value, and every key an unknown one was probably
    /// meant to be: none of them is also reported as missing.
    pub(crate) seen: Vec<&'static str>,
    /// An attribute did not parse (reported): which keys are missing is then unknown.
    pub(crate) broken: bool,
}

impl Attrs {
    /// Reads every `#[outbox(...)]` among `attrs`; other attributes are ignored.
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = Attrs::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident(OUTBOX)) {
            if out.attr.is_none() {
                out.attr = Some(attr.clone());
            }
            let list = match &attr.meta {
                syn::Meta::List(list) => list,
                other => {
                    cx.error_spanned_by(other, format!("expected a list of keys: `{EXAMPLE}`"));
                    out.broken = true;
                    continue;
                }
            };
            let spec = ListSpec {
                example: "event_type = \"OrderCreated\"",
                field_keys: FIELD_KEYS,
                list_keys: &[],
            };
            let list = kv::parse_list(cx, list.tokens.clone(), spec);
            out.broken |= !list.complete;
            for pair in list.pairs {
                out.take(cx, pair);
            }
        }
        out
    }

    fn take(&mut self, cx: &Ctxt, pair: kv::KeyValue) {
        let key = pair.key.to_string();
        let Some(known) = KEYS.iter().copied().find(|k| *k == key) else {
            let place = "`#[outbox(...)]`";
            self.seen
                .extend(kv::unknown_key(cx, &pair.key, place, KEYS, ALIASES));
            return;
        };
        self.seen.push(known);
        if pair.bare {
            return no_value(cx, &pair.key);
        }
        match known {
            EVENT_TYPE => take_lit(cx, &mut self.event_type, &pair),
            TOPIC => take_lit(cx, &mut self.topic, &pair),
            AGGREGATE_TYPE => take_lit(cx, &mut self.aggregate_type, &pair),
            KEY => {
                if kv::first_time(cx, &self.key, &pair.key) {
                    self.key = kv::field_ident(cx, &pair);
                }
            }
            AGGREGATE_ID => {
                if kv::first_time(cx, &self.aggregate_id, &pair.key) {
                    self.aggregate_id = kv::field_ident(cx, &pair);
                }
            }
            IDEMPOTENCY_KEY => {
                if kv::first_time(cx, &self.idempotency_key, &pair.key) {
                    self.idempotency_key = kv::field_ident(cx, &pair);
                }
            }
            _ => {
                if kv::first_time(cx, &self.krate, &pair.key) {
                    self.krate = kv::crate_path(cx, &pair);
                }
            }
        }
    }
}

fn take_lit(cx: &Ctxt, slot: &mut Option<LitStr>, pair: &kv::KeyValue) {
    if kv::first_time(cx, slot, &pair.key) {
        *slot = kv::lit_str(cx, pair, example_value(&pair.key.to_string()));
    }
}

/// A value for a key that takes a string, for messages.
fn example_value(key: &str) -> &'static str {
    match key {
        EVENT_TYPE => "\"OrderCreated\"",
        TOPIC => "\"orders\"",
        AGGREGATE_TYPE => "\"Order\"",
        _ => "\"my_inoutbox\"",
    }
}

/// A key of the struct's attribute written without a value.
fn no_value(cx: &Ctxt, key: &Ident) {
    let message = match key.to_string().as_str() {
        k @ (KEY | AGGREGATE_ID | IDEMPOTENCY_KEY) => format!(
            "`{k}` names a field: write `{k} = order_id`, or put `#[outbox({k})]` on the field"
        ),
        k => kv::missing_value(key, &format!("{k} = {}", example_value(k))),
    };
    cx.error_spanned_by(key, message);
}

/// What a field's `#[outbox(...)]` says: `#[outbox(key)]`, `#[outbox(aggregate_id)]`. Each
/// flag keeps the word written, for spans.
#[derive(Default)]
pub(crate) struct FieldFlags {
    pub(crate) key: Option<Ident>,
    pub(crate) aggregate_id: Option<Ident>,
    pub(crate) idempotency_key: Option<Ident>,
    /// Keys of the struct's attribute written here instead (reported): not also "missing".
    pub(crate) misplaced: Vec<&'static str>,
}

impl FieldFlags {
    /// Reads every `#[outbox(...)]` of a field. Anything but `key` and `aggregate_id` is an
    /// error: a field attribute inoutbox ignored would be a key that silently is none.
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = FieldFlags::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident(OUTBOX)) {
            let syn::Meta::List(list) = &attr.meta else {
                cx.error_spanned_by(
                    attr,
                    "on a field, write `#[outbox(key)]` (the message key) or \
                     `#[outbox(aggregate_id)]`",
                );
                continue;
            };
            let spec = ListSpec {
                example: "key",
                field_keys: &[],
                list_keys: &[],
            };
            for pair in kv::parse_list(cx, list.tokens.clone(), spec).pairs {
                out.take(cx, pair);
            }
        }
        out
    }

    fn take(&mut self, cx: &Ctxt, pair: kv::KeyValue) {
        let key = pair.key.to_string();
        let slot = match key.as_str() {
            KEY => &mut self.key,
            AGGREGATE_ID => &mut self.aggregate_id,
            IDEMPOTENCY_KEY => &mut self.idempotency_key,
            k if KEYS.contains(&k) => {
                self.misplaced
                    .extend(KEYS.iter().find(|known| **known == k));
                return cx.error_spanned_by(
                    &pair.key,
                    format!(
                        "`{k}` goes in the `#[outbox(...)]` on the struct, not on a field; on a \
                         field, write `#[outbox(key)]` or `#[outbox(aggregate_id)]`"
                    ),
                );
            }
            _ => {
                let place = "a field's `#[outbox(...)]`";
                kv::unknown_key(cx, &pair.key, place, FIELD_KEYS, &[("partition_key", KEY)]);
                return;
            }
        };
        if !pair.bare {
            let Some(value) = &pair.value else { return };
            return cx.error_spanned_by(
                value,
                format!(
                    "on a field, `{key}` takes no value: write `#[outbox({key})]` on the field, \
                     or `{key} = field` in the `#[outbox(...)]` on the struct"
                ),
            );
        }
        if kv::first_time(cx, slot, &pair.key) {
            *slot = Some(pair.key);
        }
    }

    /// The flag for `key` (`KEY` or `AGGREGATE_ID`), if set.
    pub(crate) fn get(&self, key: &str) -> Option<&Ident> {
        match key {
            KEY => self.key.as_ref(),
            AGGREGATE_ID => self.aggregate_id.as_ref(),
            _ => self.idempotency_key.as_ref(),
        }
    }
}
