//! The generated registration. The user's function is emitted as written; next to it, inside
//! `const _: () = { .. };`, an erased wrapper, the checks and one `inventory::submit!`.
//!
//! Type requirements are the bounds of small runtime functions called with the user's types as
//! turbofish arguments (`decode::<Event>`, `tx_type_id::<Tx>`, `meta_param::<Meta>`,
//! `into_future::<_, Output>`), so rustc reports an unmet bound on the type the user wrote, with
//! the `#[diagnostic::on_unimplemented]` text of the runtime trait. Each bound is required once;
//! where the expansion needs more from a type that may fail its check (the transaction's
//! `'static` form, the declared event type) it asks `Probe`, whose fallback for types missing
//! the bound keeps the rest of the expansion free of follow-on errors.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::ast::Handler;
use super::attr::HandlerAttr;

pub(crate) fn handler(attr: &HandlerAttr, handler: &Handler) -> TokenStream {
    let func = &handler.func;
    let (Some(event), Some(group)) = (&attr.event, &attr.group) else {
        // Not reached: a missing key is an error, and errors skip the expansion.
        return quote!(#func);
    };
    let (Some(event_ty), Some(tx_ty), Some(output)) = (
        handler.param_ty(0),
        handler.param_referent(1),
        handler.output(),
    ) else {
        return quote!(#func);
    };
    let name = &func.sig.ident;
    let name_str = name.unraw().to_string();
    let private = quote!(::txbox::__private);

    // Inside `quote_spanned!`, paths are written out rather than interpolated from `private`:
    // interpolated tokens keep their own (call-site) span, which would widen the error span to
    // the whole attribute.
    let decode = quote_spanned! {event_ty.span()=> ::txbox::__private::decode::<#event_ty> };
    let downcast =
        quote_spanned! {tx_ty.span()=> ::txbox::__private::Probe::<#tx_ty>::downcast_tx };
    // `_` (the future) carries the function name's span, so a future that is not `Send` is
    // reported on the name; the output type keeps its own span for the `HandlerOutput` check.
    let into_future = quote_spanned! {name.span()=> ::txbox::__private::into_future::<_, #output> };
    let (meta_let, meta_arg) = match handler.param_referent(2) {
        Some(meta_ty) => {
            let meta_param =
                quote_spanned! {meta_ty.span()=> ::txbox::__private::meta_param::<#meta_ty> };
            (
                quote! { let __txbox_meta = #meta_param(__txbox_meta); },
                quote! { , __txbox_meta },
            )
        }
        None => (quote! { let _ = __txbox_meta; }, TokenStream::new()),
    };
    let check_event_type = quote_spanned! {event.span()=>
        ::txbox::__private::check_event_type(
            #event,
            ::txbox::__private::Probe::<#event_ty>::EVENT_TYPE,
            ::core::stringify!(#event_ty),
        )
    };
    let tx_type_id = quote_spanned! {tx_ty.span()=> ::txbox::__private::tx_type_id::<#tx_ty>() };
    let location = quote_spanned! {name.span()=>
        ::core::concat!(::core::module_path!(), "::", #name_str),
        ::core::file!(),
        ::core::line!(),
    };

    quote! {
        #func

        #[doc(hidden)]
        const _: () = {
            use #private::ProbeFallback as _;

            fn __txbox_invoke<'__txbox>(
                __txbox_payload: &'__txbox [u8],
                __txbox_tx: &'__txbox mut (dyn ::core::any::Any + ::core::marker::Send),
                __txbox_meta: &'__txbox #private::MessageMeta,
            ) -> #private::HandlerFuture<'__txbox> {
                let __txbox_event = match #decode(__txbox_payload) {
                    ::core::result::Result::Ok(event) => event,
                    ::core::result::Result::Err(error) => return #private::fail(error),
                };
                let __txbox_tx = match #downcast(__txbox_tx) {
                    ::core::result::Result::Ok(tx) => tx,
                    ::core::result::Result::Err(error) => return #private::fail(error),
                };
                #meta_let
                #into_future(#name(__txbox_event, __txbox_tx #meta_arg))
            }

            fn __txbox_tx_type() -> ::core::any::TypeId {
                #tx_type_id
            }

            const _: () = #check_event_type;

            #private::inventory::submit! {
                #private::HandlerRegistration::new(
                    #event,
                    #group,
                    #location
                    __txbox_tx_type,
                    __txbox_invoke,
                )
            }
        };
    }
}
