//! The generated impl. It names only `::txbox::__private` and fully qualified std paths.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Ident;

use super::ast::Input;

/// `impl OutboxEvent for T`, inside `const _: () = { .. };`.
pub(crate) fn impl_outbox_event(input: &Input) -> TokenStream {
    let ident = &input.ident;
    let attrs = &input.attrs;
    let event_type = &attrs.event_type;
    let topic = &attrs.topic;
    let aggregate_type = attrs.aggregate_type.as_ref().map(|lit| {
        quote! {
            const AGGREGATE_TYPE: ::core::option::Option<&'static str> =
                ::core::option::Option::Some(#lit);
        }
    });
    let key = match &attrs.key {
        Some(field) => field_to_string(field),
        None => quote!(::core::option::Option::None),
    };
    let aggregate_id = attrs.aggregate_id.as_ref().map(|field| {
        let value = field_to_string(field);
        quote! {
            fn aggregate_id(&self) -> ::core::option::Option<::std::string::String> {
                #value
            }
        }
    });
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl ::txbox::__private::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = #event_type;
                const TOPIC: &'static str = #topic;
                #aggregate_type

                fn key(&self) -> ::core::option::Option<::std::string::String> {
                    #key
                }

                #aggregate_id
            }
        };
    }
}

/// `Some(key_string(&self.field))`, spanned to the field name in the attribute, so that a field
/// whose type has no `Display` is reported there.
fn field_to_string(field: &Ident) -> TokenStream {
    quote_spanned! {field.span()=>
        ::core::option::Option::Some(::txbox::__private::key_string(&self.#field))
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
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl ::txbox::__private::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = "";
                const TOPIC: &'static str = "";

                fn key(&self) -> ::core::option::Option<::std::string::String> {
                    ::core::option::Option::None
                }
            }
        };
    }
}
