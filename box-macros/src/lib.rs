//! Procedural macros of txbox. Use them through the `txbox` crate.
//!
//! (Interim minimal expansion; the full parser/validator lands separately.)

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{parse_macro_input, DeriveInput, Expr, ExprLit, FnArg, ItemFn, Lit, Meta, Token, Type};

fn lit_str(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s.value()),
        _ => None,
    }
}

/// Registers an `async fn` as the inbox handler of an event type in a consumer group.
#[proc_macro_attribute]
pub fn inbox_handler(attr: TokenStream, item: TokenStream) -> TokenStream {
    let args = match Punctuated::<Meta, Token![,]>::parse_terminated.parse(attr) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    let mut event = None;
    let mut group = None;
    for m in &args {
        if let Meta::NameValue(nv) = m {
            if nv.path.is_ident("event") {
                event = lit_str(&nv.value);
            } else if nv.path.is_ident("group") {
                group = lit_str(&nv.value);
            }
        }
    }
    let func = parse_macro_input!(item as ItemFn);
    let (Some(event), Some(group)) = (event, group) else {
        return syn::Error::new_spanned(
            &func.sig.ident,
            "expected `event = \"...\"` and `group = \"...\"`",
        )
        .to_compile_error()
        .into();
    };
    expand_handler(&func, &event, &group).into()
}

fn expand_handler(func: &ItemFn, event: &str, group: &str) -> TokenStream2 {
    let name = &func.sig.ident;
    let params: Vec<&FnArg> = func.sig.inputs.iter().collect();
    let typed = |i: usize| -> Option<&Type> {
        match params.get(i) {
            Some(FnArg::Typed(p)) => Some(&p.ty),
            _ => None,
        }
    };
    let event_ty = typed(0).cloned();
    let tx_ty = match typed(1) {
        Some(Type::Reference(r)) => Some((*r.elem).clone()),
        _ => None,
    };
    let (Some(event_ty), Some(tx_ty)) = (event_ty, tx_ty) else {
        return syn::Error::new_spanned(&func.sig, "expected `(event: E, tx: &mut PgTx<'_>)`")
            .to_compile_error();
    };
    let call = if params.len() == 3 {
        quote!(#name(event, tx, meta))
    } else {
        quote!(#name(event, tx))
    };
    let invoke = format_ident!("__txbox_invoke_{}", name);
    let tx_type = format_ident!("__txbox_tx_type_{}", name);
    quote! {
        #func
        #[allow(non_snake_case)]
        fn #invoke<'a>(
            payload: &'a [u8],
            tx: &'a mut (dyn ::core::any::Any + ::core::marker::Send),
            meta: &'a ::txbox::__private::MessageMeta,
        ) -> ::txbox::__private::HandlerFuture<'a> {
            ::txbox::__private::invoke::<#event_ty, _, _, _, _>(payload, tx, meta, |event, tx, meta| {
                let _ = &meta;
                #call
            })
        }
        #[allow(non_snake_case)]
        fn #tx_type() -> ::core::any::TypeId {
            ::txbox::__private::tx_type_id::<#tx_ty>()
        }
        ::txbox::__private::inventory::submit! {
            ::txbox::__private::HandlerRegistration::new(
                #event, #group, ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)),
                ::core::file!(), ::core::line!(), #tx_type, #invoke,
            )
        }
    }
}

/// Implements `OutboxEvent` from `#[outbox(event_type = "...", topic = "...", key = field)]`.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(item: TokenStream) -> TokenStream {
    let input = parse_macro_input!(item as DeriveInput);
    let mut event_type = None;
    let mut topic = None;
    let mut key = None;
    for attr in &input.attrs {
        if !attr.path().is_ident("outbox") {
            continue;
        }
        let r = attr.parse_nested_meta(|m| {
            if m.path.is_ident("event_type") {
                event_type = Some(m.value()?.parse::<syn::LitStr>()?.value());
            } else if m.path.is_ident("topic") {
                topic = Some(m.value()?.parse::<syn::LitStr>()?.value());
            } else if m.path.is_ident("key") {
                key = Some(m.value()?.parse::<syn::Ident>()?);
            }
            Ok(())
        });
        if let Err(e) = r {
            return e.to_compile_error().into();
        }
    }
    let name = &input.ident;
    let (Some(event_type), Some(topic)) = (event_type, topic) else {
        return syn::Error::new_spanned(
            name,
            "expected `#[outbox(event_type = \"...\", topic = \"...\")]`",
        )
        .to_compile_error()
        .into();
    };
    let key = match key {
        Some(k) => {
            quote!(::core::option::Option::Some(::std::string::ToString::to_string(&self.#k)))
        }
        None => quote!(::core::option::Option::None),
    };
    quote! {
        impl ::txbox::__private::OutboxEvent for #name {
            const EVENT_TYPE: &'static str = #event_type;
            const TOPIC: &'static str = #topic;
            fn key(&self) -> ::core::option::Option<::std::string::String> { #key }
        }
    }
    .into()
}
