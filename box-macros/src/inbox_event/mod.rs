//! `#[derive(InboxEvent)]`: an event type a service consumes and never publishes. Its
//! `#[inbox(...)]` attribute takes what a consumer needs: `event_type` (required),
//! `idempotency_key = field` and `crate`; no topic and no key, which only publishing needs.
//! The type implements `InboxEvent` alone, so `enqueue` refuses it at compile time.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Data, DeriveInput, Fields, Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::kv::{self, ListSpec};
use crate::names;

/// The attribute's name.
const INBOX: &str = "inbox";
/// `event_type = "OrderPlaced"`: the CloudEvents `ce_type` handlers are found by; required.
const EVENT_TYPE: &str = "event_type";
/// `idempotency_key = field`: the business key; optional.
const IDEMPOTENCY_KEY: &str = "idempotency_key";
/// `crate = "my_inoutbox"`: the path generated code names inoutbox by; optional.
const CRATE: &str = "crate";
/// Every key, in the order messages list them.
const KEYS: &[&str] = &[EVENT_TYPE, IDEMPOTENCY_KEY, CRATE];
/// Keys of `#[outbox(...)]` that only publishing needs: each is one error saying so.
const PUBLISHING_KEYS: &[&str] = &["topic", "key", "aggregate_type", "aggregate_id"];
/// Words written for a key, and the key meant.
const ALIASES: &[(&str, &str)] = &[
    ("event", EVENT_TYPE),
    ("type", EVENT_TYPE),
    ("ce_type", EVENT_TYPE),
    ("business_key", IDEMPOTENCY_KEY),
    ("dedup_by", IDEMPOTENCY_KEY),
];
/// The attribute written in full, for messages.
const EXAMPLE: &str = "#[inbox(event_type = \"OrderPlaced\")]";

/// What `#[inbox(...)]` says.
#[derive(Default)]
struct Attrs {
    event_type: Option<LitStr>,
    idempotency_key: Option<Ident>,
    krate: Option<syn::Path>,
    /// Keys written (also with a rejected value) or meant by an unknown one.
    seen: Vec<&'static str>,
    /// An attribute did not parse (reported): what is missing is then unknown.
    broken: bool,
}

/// Expands the derive: the impl, or the errors plus a placeholder impl (so that handlers
/// naming the type report nothing else).
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let cx = Ctxt::new();
    let attrs = Attrs::from_attrs(&cx, &input);
    check_shape(&cx, &input, &attrs);
    let private = match &attrs.krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::inoutbox::__private),
    };
    let ident = &input.ident;
    match (cx.check(), &attrs.event_type) {
        (Ok(()), Some(event_type)) => {
            let key = attrs.idempotency_key.as_ref().map(|field| {
                let name = field.to_string();
                quote! {
                    const IDEMPOTENCY_KEY: ::core::option::Option<&'static str> =
                        ::core::option::Option::Some(#name);

                    fn idempotency_key(&self) -> ::core::option::Option<::std::string::String> {
                        ::core::option::Option::Some(
                            #private::BusinessKey::business_key_text(&self.#field),
                        )
                    }
                }
            });
            impl_inbox_event(&private, ident, quote!(#event_type), key)
        }
        (result, _) => {
            let mut out = result
                .err()
                .map_or_else(TokenStream::new, |e| e.to_compile_error());
            if input.generics.params.is_empty() {
                out.extend(impl_inbox_event(&private, ident, quote!(""), None));
            }
            out
        }
    }
}

fn impl_inbox_event(
    private: &TokenStream,
    ident: &Ident,
    event_type: TokenStream,
    key: Option<TokenStream>,
) -> TokenStream {
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl #private::InboxEvent for #ident {
                const EVENT_TYPE: &'static str = #event_type;
                #key
            }
        };
    }
}

impl Attrs {
    fn from_attrs(cx: &Ctxt, input: &DeriveInput) -> Self {
        let mut out = Attrs::default();
        let mut any = false;
        for attr in input.attrs.iter().filter(|a| a.path().is_ident(INBOX)) {
            any = true;
            let syn::Meta::List(list) = &attr.meta else {
                cx.error_spanned_by(attr, format!("expected a list of keys: `{EXAMPLE}`"));
                out.broken = true;
                continue;
            };
            let spec = ListSpec {
                example: "event_type = \"OrderPlaced\"",
                field_keys: &[IDEMPOTENCY_KEY],
                list_keys: &[],
            };
            let list = kv::parse_list(cx, list.tokens.clone(), spec);
            out.broken |= !list.complete;
            for pair in list.pairs {
                out.take(cx, &pair);
            }
        }
        if !any {
            let message = format!(
                "`#[derive(InboxEvent)]` needs its event type: add `{EXAMPLE}` under the derive"
            );
            cx.error_spanned_by(&input.ident, message);
        } else if !out.broken && !out.seen.contains(&EVENT_TYPE) {
            let message =
                format!("missing `{EVENT_TYPE}` in `#[inbox(...)]`; write e.g. `{EXAMPLE}`");
            cx.error_at(Span::call_site(), message);
        }
        out
    }

    fn take(&mut self, cx: &Ctxt, pair: &kv::KeyValue) {
        let key = pair.key.to_string();
        if PUBLISHING_KEYS.contains(&key.as_str()) {
            let message = format!(
                "`{key}` is for publishing, and `#[derive(InboxEvent)]` declares an event this \
                 service only consumes: remove `{key}`, or to publish the event derive \
                 `OutboxEvent` instead, with `#[outbox(event_type = \"..\", topic = \"..\")]`"
            );
            return cx.error_spanned_by(&pair.key, message);
        }
        let Some(known) = KEYS.iter().copied().find(|k| *k == key) else {
            let place = "`#[inbox(...)]`";
            self.seen
                .extend(kv::unknown_key(cx, &pair.key, place, KEYS, ALIASES));
            return;
        };
        if self.seen.contains(&known) {
            return kv::duplicate(cx, &pair.key);
        }
        self.seen.push(known);
        if pair.bare {
            let example = match known {
                EVENT_TYPE => "event_type = \"OrderPlaced\"",
                IDEMPOTENCY_KEY => "idempotency_key = operation_id",
                _ => "crate = \"my_inoutbox\"",
            };
            return cx.error_spanned_by(&pair.key, kv::missing_value(&pair.key, example));
        }
        match known {
            EVENT_TYPE => {
                let Some(lit) = kv::lit_str(cx, pair, "\"OrderPlaced\"") else {
                    return;
                };
                match names::invalid_name(EVENT_TYPE, &lit.value(), "OrderPlaced") {
                    Some(message) => cx.error_spanned_by(&lit, message),
                    None => self.event_type = Some(lit),
                }
            }
            IDEMPOTENCY_KEY => self.idempotency_key = kv::field_ident(cx, pair),
            _ => self.krate = kv::crate_path(cx, pair),
        }
    }
}

/// A struct with named fields (or a unit struct), not generic; the key names one of its fields.
fn check_shape(cx: &Ctxt, input: &DeriveInput, attrs: &Attrs) {
    if !input.generics.params.is_empty() {
        cx.error_spanned_by(
            &input.generics,
            "an event type cannot be generic: one event type has one payload shape",
        );
    }
    let fields = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) => named.named.iter().filter_map(|f| f.ident.clone()).collect(),
            Fields::Unit => Vec::new(),
            Fields::Unnamed(unnamed) => {
                let message = "`#[derive(InboxEvent)]` needs a struct with named fields (or a \
                               unit struct): write `struct Name { field: Type, .. }`";
                return cx.error_spanned_by(unnamed, message);
            }
        },
        Data::Enum(data) => {
            let message = "`#[derive(InboxEvent)]` takes one struct per event type, not an enum";
            return cx.error_spanned_by(data.enum_token, message);
        }
        Data::Union(data) => {
            let message = "`#[derive(InboxEvent)]` takes a struct; serde cannot decode a union";
            return cx.error_spanned_by(data.union_token, message);
        }
    };
    if let Some(field) = &attrs.idempotency_key {
        if !fields.iter().any(|f| f == field) {
            let message = format!("`{}` has no field `{field}`", input.ident);
            cx.error_spanned_by(field, message);
        }
    }
}

#[cfg(test)]
mod tests;
