//! The `#[outbox(...)]` attribute.

use syn::{Attribute, Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::kv::{self, ListSpec};

/// The attribute's name.
pub(crate) const OUTBOX: &str = "outbox";
/// `event_type = "OrderCreated"`: the CloudEvents `ce_type`; required.
pub(crate) const EVENT_TYPE: &str = "event_type";
/// `topic = "orders"`: where the relay publishes; required.
pub(crate) const TOPIC: &str = "topic";
/// `key = field`: the message key, from the field's `ToString`; optional.
pub(crate) const KEY: &str = "key";
/// `aggregate_type = "Order"`; optional.
pub(crate) const AGGREGATE_TYPE: &str = "aggregate_type";
/// `aggregate_id = field`; optional, defaults to the key.
pub(crate) const AGGREGATE_ID: &str = "aggregate_id";

/// Every key, in the order messages list them.
pub(crate) const KEYS: &[&str] = &[EVENT_TYPE, TOPIC, KEY, AGGREGATE_TYPE, AGGREGATE_ID];

/// Words written for a key, and the key meant (the handler's `event` is this `event_type`).
const ALIASES: &[(&str, &str)] = &[
    ("event", EVENT_TYPE),
    ("type", EVENT_TYPE),
    ("ce_type", EVENT_TYPE),
    ("topic_name", TOPIC),
    ("partition_key", KEY),
    ("message_key", KEY),
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
                field_keys: &[KEY, AGGREGATE_ID],
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
        if let Some(known) = KEYS.iter().find(|k| **k == key) {
            self.seen.push(known);
        }
        match key.as_str() {
            EVENT_TYPE => {
                if kv::first_time(cx, &self.event_type, &pair.key) {
                    self.event_type = kv::lit_str(cx, &pair, "\"OrderCreated\"");
                }
            }
            TOPIC => {
                if kv::first_time(cx, &self.topic, &pair.key) {
                    self.topic = kv::lit_str(cx, &pair, "\"orders\"");
                }
            }
            KEY => {
                if kv::first_time(cx, &self.key, &pair.key) {
                    self.key = kv::field_ident(cx, &pair);
                }
            }
            AGGREGATE_TYPE => {
                if kv::first_time(cx, &self.aggregate_type, &pair.key) {
                    self.aggregate_type = kv::lit_str(cx, &pair, "\"Order\"");
                }
            }
            AGGREGATE_ID => {
                if kv::first_time(cx, &self.aggregate_id, &pair.key) {
                    self.aggregate_id = kv::field_ident(cx, &pair);
                }
            }
            _ => {
                let place = "`#[outbox(...)]`";
                self.seen
                    .extend(kv::unknown_key(cx, &pair.key, place, KEYS, ALIASES));
            }
        }
    }
}
