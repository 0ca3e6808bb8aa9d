//! The generated registration. The user's function is emitted as written; next to it, inside
//! `const _: () = { .. };`, an erased wrapper, the checks and one `inventory::submit!`.
//!
//! Type requirements are the bounds of small runtime functions called with the user's types as
//! turbofish arguments (`decode::<Event>`, `downcast_tx::<Tx>`, ...), so rustc reports an unmet
//! bound on the type the user wrote, with the `#[diagnostic::on_unimplemented]` text of the
//! runtime trait. Each bound is required exactly once, so each mistake is reported once.

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

    let decode = quote_spanned! {event_ty.span()=> #private::decode::<#event_ty> };
    let downcast = quote_spanned! {tx_ty.span()=> #private::downcast_tx::<#tx_ty> };
    let into_future = quote_spanned! {output.span()=> #private::into_future::<_, #output> };
    let (meta_let, meta_arg) = match handler.param_referent(2) {
        Some(meta_ty) => {
            let meta_param = quote_spanned! {meta_ty.span()=> #private::meta_param::<#meta_ty> };
            (
                quote! { let __txbox_meta = #meta_param(__txbox_meta); },
                quote! { , __txbox_meta },
            )
        }
        None => (quote! { let _ = __txbox_meta; }, TokenStream::new()),
    };
    let check_event_type = quote_spanned! {event.span()=>
        #private::check_event_type(
            #event,
            #private::Probe::<#event_ty>::EVENT_TYPE,
            ::core::stringify!(#event_ty),
        )
    };
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
                #private::Probe::<#tx_ty>::tx_type_id()
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
