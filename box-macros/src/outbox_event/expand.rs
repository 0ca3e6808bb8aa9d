//! The generated impl. It names only `<krate>::__private` (`::inoutbox::__private` unless
//! `crate = "..."` says otherwise) and fully qualified std paths.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use super::ast::{Input, KeyField};
use super::attr::{AGGREGATE_ID, IDEMPOTENCY_KEY, KEY};
use crate::tokens::respan;

/// `impl OutboxEvent for T`, inside `const _: () = { .. };`.
pub(crate) fn impl_outbox_event(input: &Input) -> TokenStream {
    let ident = &input.ident;
    let attrs = &input.attrs;
    let private = private(input);
    let event_type = &attrs.event_type;
    let topic = &attrs.topic;
    let aggregate_type = attrs.aggregate_type.as_ref().map(|lit| {
        quote! {
            const AGGREGATE_TYPE: ::core::option::Option<&'static str> =
                ::core::option::Option::Some(#lit);
        }
    });
    let key_field = input.key_field(KEY);
    let aggregate_field = input.key_field(AGGREGATE_ID);
    let idempotency_field = input.key_field(IDEMPOTENCY_KEY);
    let key_checks = [
        (KEY, &key_field),
        (AGGREGATE_ID, &aggregate_field),
        (IDEMPOTENCY_KEY, &idempotency_field),
    ]
    .into_iter()
    .filter_map(|(key, field)| Some(key_check(key, field.as_ref()?)));
    let key = match &key_field {
        Some(field) => key_string(&private, KEY, field),
        None => quote!(::core::option::Option::None),
    };
    let aggregate_id = aggregate_field.as_ref().map(|field| {
        let value = key_string(&private, AGGREGATE_ID, field);
        quote! {
            fn aggregate_id(&self) -> ::core::option::Option<::std::string::String> {
                #value
            }
        }
    });
    let idempotency_key = idempotency_field.as_ref().map(|field| {
        let value = key_string(&private, IDEMPOTENCY_KEY, field);
        let name = field.field.ident.to_string();
        quote! {
            const IDEMPOTENCY_KEY: ::core::option::Option<&'static str> =
                ::core::option::Option::Some(#name);

            fn idempotency_key(&self) -> ::core::option::Option<::std::string::String> {
                #value
            }
        }
    });
    quote! {
        #[doc(hidden)]
        const _: () = {
            use #private::ProbeFallback as _;
            #(#key_checks)*

            #[automatically_derived]
            impl #private::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = #event_type;
                const TOPIC: &'static str = #topic;
                #aggregate_type

                fn key(&self) -> ::core::option::Option<::std::string::String> {
                    #key
                }

                #aggregate_id
                #idempotency_key
            }
        };
    }
}

/// `<krate>::__private`.
fn private(input: &Input) -> TokenStream {
    match &input.attrs.krate {
        Some(path) => quote!(#path::__private),
        None => quote!(::inoutbox::__private),
    }
}

/// The trait a key field's type must implement (`Display`, under a name and a message of this
/// derive), so that a field without `Display` is reported on the key, in words about the key.
fn key_check(key: &str, field: &KeyField) -> TokenStream {
    let check = check_trait(key);
    let name = &field.field.ident;
    let written = &field.written;
    let message = format!(
        "the type of `{name}`, `{{Self}}`, does not implement `Display`, which `{written}` needs"
    );
    let label = "`{Self}` does not implement `std::fmt::Display`";
    let note = format!(
        "the {} is the field's `Display` text: implement `std::fmt::Display` for `{{Self}}`, or \
         name a field whose type implements it (e.g. `Uuid`, `u64`, `String`)",
        match key {
            KEY => "message key",
            AGGREGATE_ID => "aggregate id",
            _ => "idempotency key (business key)",
        }
    );
    quote! {
        #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
        #[allow(non_camel_case_types)]
        trait #check {
            const CHECK: () = ();
        }
        #[diagnostic::do_not_recommend]
        impl<T: ?::core::marker::Sized + ::core::fmt::Display> #check for T {}
    }
}

fn check_trait(key: &str) -> syn::Ident {
    format_ident!(
        "__inoutbox_{}",
        match key {
            KEY => "Key",
            AGGREGATE_ID => "AggregateId",
            _ => "IdempotencyKey",
        }
    )
}

/// `Some(text of self.field)`, after the field type's check. The check names the type with
/// every token at the key as written (`key = order_id`, or `key` in `#[outbox(key)]`), so that
/// rustc reports a missing `Display` there.
fn key_string(private: &TokenStream, key: &str, field: &KeyField) -> TokenStream {
    let check = check_trait(key);
    let ty = &field.field.ty;
    let checked_ty = respan(ty, field.span);
    let name = &field.field.ident;
    quote! {
        let () = <#checked_ty as #check>::CHECK;
        ::core::option::Option::Some(#private::Probe::<#ty>::key_string(&self.#name))
    }
}

/// After an error: a placeholder impl, so that handlers and `enqueue` calls naming the type do
/// not add "not an outbox event" errors to the one that matters. An empty event type never
/// matches a handler (the handler check skips it), and nothing runs since the build fails.
pub(crate) fn fallback(input: &Input) -> TokenStream {
    if !input.can_hold_fallback() {
        return TokenStream::new();
    }
    let ident = &input.ident;
    let private = private(input);
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl #private::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = "";
                const TOPIC: &'static str = "";

                fn key(&self) -> ::core::option::Option<::std::string::String> {
                    ::core::option::Option::None
                }
            }
        };
    }
}
