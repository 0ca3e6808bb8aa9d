//! The generated registration. The user's function is emitted as written; next to it, inside
//! `const __inoutbox_register_<name>: () = { .. };`, the type checks, an erased wrapper and one
//! `inventory::submit!`.
//!
//! The type checks are trait-qualified paths on the user's types (`<Event as OutboxEvent>::key`,
//! `<Tx as __inoutbox_Transaction>::CHECK`, ..): rustc reports an unmet trait on the type the user
//! wrote, with the `#[diagnostic::on_unimplemented]` text of the trait, and, unlike a bound on a
//! function, without a "required by a bound in" note that would point into inoutbox. The traits
//! for the transaction, the metadata and the return type are generated here (with their texts)
//! so that the note names nothing internal. Everything else the wrapper needs from those types
//! goes through `Probe`, whose fallback for types that failed their check keeps the expansion
//! free of follow-on errors; the future's `Send` is required by coercing it to
//! `dyn Future + Send` on the function's name.
//!
//! A batch handler (`#[inbox_handler(.., batch)]`) gets `__inoutbox_invoke_batch`, which decodes a
//! run of payloads and calls the function once with all the events (and their metadata), and a
//! `__inoutbox_invoke` that runs it on one message: the function is called in one place only, so
//! each type error and the `Send` requirement are reported once.
//!
//! The registration is a *named* const rather than `const _`: a named const is also valid in an
//! `impl` block, so `#[inbox_handler]` on an associated function fails with one error (the
//! wrapper cannot name the function) instead of a parse error first.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::{Ident, LitStr, Type};

use super::ast::Handler;
use super::attr::{Form, HandlerAttr, STORE_NAMES};
use crate::tokens::{compact, respan};

/// What the expansion is made of, once the attribute and the signature have been checked.
struct Parts<'a> {
    name: &'a Ident,
    form: Form,
    event: &'a LitStr,
    group: &'a LitStr,
    /// The event type as the generated code names it: `__inoutbox_Event` (see [`Aliases`]), or
    /// for a batch handler the `E` of `Vec<E>` as written.
    event_ty: &'a Type,
    tx_ty: &'a Type,
    /// `::<Store>` for a handler generic over its store, else empty.
    turbofish: TokenStream,
    /// The metadata type; for a batch handler, the `M` of `&[M]`.
    meta_ty: Option<&'a Type>,
    /// The return type as the generated code names it: `__inoutbox_Output`, or as written.
    output: &'a Type,
    /// The aliases of the types the user wrote, and those types, for messages.
    aliases: &'a Aliases<'a>,
    /// `::inoutbox` or the `crate = "..."` path.
    krate: TokenStream,
    /// `dedup_by = field`.
    dedup_by: Option<&'a Ident>,
    /// `dedup_scope = "..."`.
    dedup_scope: Option<&'a LitStr>,
    /// `mode = "two_phase"`, and whether `ordered = true`.
    two_phase: Option<bool>,
}

pub(crate) fn handler(attr: &HandlerAttr, handler: &Handler) -> TokenStream {
    let func = &handler.func;
    let form = attr.form();
    // Not reached without all of them: a missing key or parameter is an error, and errors skip
    // the expansion.
    let (Some(event), Some(group), Some(event_ty), Some(tx_ty), Some(output)) = (
        &attr.event,
        &attr.group,
        handler.event_ty(form),
        handler.param_referent(1),
        handler.output(),
    ) else {
        return quote!(#func);
    };
    let krate = match &attr.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::inoutbox),
    };
    // One registration per store listed (the function called with that store's type), or one
    // for the store the transaction names.
    let registrations: Vec<(Type, TokenStream, String)> = match &attr.stores {
        None => vec![(tx_ty.clone(), TokenStream::new(), String::new())],
        Some(stores) => stores
            .names
            .iter()
            .map(|store| {
                let ty = store_type(store, &krate);
                let tx: Type = syn::parse_quote!(#krate::Tx<'_, #ty>);
                (tx, quote!(::<#ty>), format!("_{store}"))
            })
            .collect(),
    };
    let aliases = Aliases::new(&func.sig.ident, form, event_ty, output);
    let blocks = registrations.iter().map(|(tx_ty, turbofish, suffix)| {
        let parts = Parts {
            name: &func.sig.ident,
            form,
            event,
            group,
            event_ty: aliases.event_ty(),
            tx_ty,
            turbofish: turbofish.clone(),
            meta_ty: handler.meta_ty(form),
            output: aliases.output(),
            aliases: &aliases,
            krate: krate.clone(),
            dedup_by: attr.dedup_by.as_ref(),
            dedup_scope: attr.dedup_scope.as_ref(),
            two_phase: attr.is_two_phase().then(|| attr.is_ordered()),
        };
        let register = format_ident!("__inoutbox_register_{}{}", parts.name.unraw(), suffix);
        parts.registration(&register)
    });
    quote! {
        #func

        #(#blocks)*
    }
}

/// `<krate>::__private::Postgres` for `postgres`, ..: the type a generic handler is called with.
fn store_type(store: &Ident, krate: &TokenStream) -> TokenStream {
    let name = STORE_NAMES
        .iter()
        .find(|(name, _)| store == name)
        .map_or("Postgres", |(_, ty)| ty);
    let ty = Ident::new(name, store.span());
    quote!(#krate::__private::#ty)
}

impl Parts<'_> {
    /// `const __inoutbox_register_<name>: () = { .. };`: checks, wrappers and the registration.
    fn registration(&self, register: &Ident) -> TokenStream {
        let private = self.private();
        let checks = self.checks();
        let invoke = self.invoke();
        let event_type_check = self.event_type_check();
        let submit = self.submit();
        let business_key = self.business_key();
        let scope_check = self.scope_check();
        let aliases = self.aliases.items();
        quote! {
            #[doc(hidden)]
            #[allow(non_upper_case_globals)]
            const #register: () = {
                use #private::ProbeFallback as _;
                #aliases
                #checks
                #invoke
                #event_type_check
                #business_key
                #scope_check
                #submit
            };
        }
    }
}

impl Parts<'_> {
    /// `<krate>::__private`, with the spans of the tokens the path was written with.
    fn private(&self) -> TokenStream {
        let krate = &self.krate;
        quote!(#krate::__private)
    }

    /// `<krate>::__private` with every token at `span`: inside `quote_spanned!`, so that the
    /// interpolated path does not widen an error span to the whole attribute.
    fn private_at(&self, span: Span) -> TokenStream {
        respan(self.private(), span)
    }

    /// The crate as messages name it: `inoutbox`, or the `crate = "..."` path.
    fn krate_name(&self) -> String {
        compact(&self.krate).trim_start_matches("::").to_owned()
    }

    /// The checks of the parameter and return types: one trait-qualified path each.
    fn checks(&self) -> TokenStream {
        let private = self.private();
        // The event type as written: where the signature's own error has no suggestion (a
        // parameter's type), the same error here is the same diagnostic, shown once.
        let (event_ty, tx_ty) = (self.aliases.written_event, self.tx_ty);
        let traits = self.check_traits();
        let meta_check = self.meta_ty.map(|meta_ty| {
            quote! { let () = <#meta_ty as __inoutbox_Metadata>::CHECK; }
        });
        // rustc reports each check of the return type on a whole projection whose first and
        // last tokens take the return type's first and last spans, so that it underlines that
        // type (the alias alone is one token): `<Output as __inoutbox_Same>::It` for the
        // `Result` check, `<.. as __inoutbox_Return>::Error` for the error type's.
        let (first, last) = first_last_span(self.aliases.written_output);
        let output = self.output;
        let (open, same) = (
            quote_spanned!(first=> <),
            quote_spanned!(last=> as __inoutbox_Same>::It),
        );
        let output = quote!(#open #output #same);
        let close = quote_spanned!(last=> as __inoutbox_Return>::Error);
        let error_ty = quote!(#open #output #close);
        quote! {
            #traits

            #[allow(non_camel_case_types)]
            trait __inoutbox_Same {
                type It: ?::core::marker::Sized;
            }
            impl<T: ?::core::marker::Sized> __inoutbox_Same for T {
                type It = T;
            }

            fn __inoutbox_check() {
                let () = <#event_ty as __inoutbox_InboxEvent>::CHECK;
                let () = <#tx_ty as __inoutbox_Transaction>::CHECK;
                #meta_check
                let _ = <#error_ty as #private::IntoHandlerError>::into_handler_error;
            }
        }
    }

    /// The traits the checks name, each with the message rustc shows when a type misses it.
    fn check_traits(&self) -> TokenStream {
        let private = self.private();
        let krate = self.krate_name();
        let tx = on_unimplemented(
            "`{Self}` is not a transaction type inoutbox can hand to a handler",
            "expected `PgTx<'_>` (or `SqliteTx<'_>`) here",
            &[
                &format!(
                    "the second parameter of an inbox handler is the transaction inoutbox opens \
                     for the message: write `tx: &mut {krate}::PgTx<'_>` for PostgreSQL or \
                     `tx: &mut {krate}::SqliteTx<'_>` for SQLite"
                ),
                SQLX_NOTE,
            ],
        );
        let meta_note = match self.form {
            Form::Single => format!(
                "the optional third parameter of an inbox handler is the message metadata: \
                 write `meta: &{krate}::MessageMeta`"
            ),
            Form::Batch => format!(
                "the optional third parameter of a batch handler is the metadata of its \
                 events, one per event: write `metas: &[{krate}::MessageMeta]`"
            ),
        };
        let meta = on_unimplemented(
            "`{Self}` is not the message metadata",
            "expected `MessageMeta` here",
            &[&meta_note],
        );
        let ret = on_unimplemented(
            "`{Self}` is not a return type an inbox handler can have",
            "expected `Result<(), E>` here",
            &[
                "an inbox handler returns `Result<(), HandlerError>`, `anyhow::Result<()>`, or \
               `Result<(), E>` where `E: std::error::Error + Send + Sync + 'static`",
            ],
        );
        let event = self.event_check_trait();
        quote! {
            #event

            #tx
            #[allow(non_camel_case_types)]
            trait __inoutbox_Transaction {
                const CHECK: () = ();
            }
            #[diagnostic::do_not_recommend]
            impl<T: ?::core::marker::Sized + #private::HandlerTx> __inoutbox_Transaction for T {}

            #meta
            #[allow(non_camel_case_types)]
            trait __inoutbox_Metadata {
                const CHECK: () = ();
            }
            #[diagnostic::do_not_recommend]
            impl<T: ?::core::marker::Sized + #private::MetaParam> __inoutbox_Metadata for T {}

            #ret
            #[allow(non_camel_case_types)]
            trait __inoutbox_Return {
                type Error;
            }
            #[diagnostic::do_not_recommend]
            impl<E> __inoutbox_Return for ::core::result::Result<(), E> {
                type Error = E;
            }
        }
    }

    /// The check of the event type. It asks for `InboxEvent` alone: a type whose derived impl
    /// misses a supertrait (no `Deserialize`) is reported once, on that impl, not again here.
    fn event_check_trait(&self) -> TokenStream {
        let private = self.private();
        let event = on_unimplemented(
            "`{Self}` is not an event an inbox handler can take",
            "this type has no `#[derive(InboxEvent)]` or `#[derive(OutboxEvent)]`",
            &[
                "an event is a struct of your own with `#[derive(Deserialize, InboxEvent)]` and \
               `#[inbox(event_type = \"...\")]` (consumed only), or `#[derive(Serialize, \
               Deserialize, OutboxEvent)]` and `#[outbox(event_type = \"...\", topic = \
               \"...\")]` (also published); a type from another crate cannot derive them: wrap \
               it in a struct of your own that does",
            ],
        );
        quote! {
            #event
            #[allow(non_camel_case_types)]
            trait __inoutbox_InboxEvent {
                const CHECK: () = ();
            }
            #[diagnostic::do_not_recommend]
            impl<T: #private::InboxEvent> __inoutbox_InboxEvent for T {}
        }
    }

    /// The erased wrappers, and the transaction type's `TypeId`.
    fn invoke(&self) -> TokenStream {
        let private = self.private();
        let tx_ty = self.tx_ty;
        let wrappers = match self.form {
            Form::Single => self.invoke_single(),
            Form::Batch => self.invoke_batch(),
        };
        quote! {
            #wrappers

            fn __inoutbox_tx_type() -> ::core::any::TypeId {
                #private::Probe::<#tx_ty>::tx_type_id()
            }
        }
    }

    /// `__inoutbox_invoke`: decodes the payload, downcasts the transaction and calls the function.
    fn invoke_single(&self) -> TokenStream {
        let private = self.private();
        let event_ty = self.event_ty;
        let (meta_let, meta_arg) = match self.meta_ty {
            Some(meta_ty) => (
                quote! {
                    let __inoutbox_meta = match #private::Probe::<#meta_ty>::meta(__inoutbox_meta) {
                        ::core::result::Result::Ok(meta) => meta,
                        ::core::result::Result::Err(error) => return #private::fail(error),
                    };
                },
                quote!(, __inoutbox_meta),
            ),
            None => (quote! { let _ = __inoutbox_meta; }, TokenStream::new()),
        };
        let downcast = self.downcast_tx();
        let call = self.call(quote!(__inoutbox_event), meta_arg);
        quote! {
            fn __inoutbox_invoke<'__inoutbox>(
                __inoutbox_payload: &'__inoutbox [u8],
                __inoutbox_tx: &'__inoutbox mut (dyn ::core::any::Any + ::core::marker::Send),
                __inoutbox_meta: &'__inoutbox #private::MessageMeta,
            ) -> #private::HandlerFuture<'__inoutbox> {
                let __inoutbox_event = match #private::Probe::<#event_ty>::decode(__inoutbox_payload) {
                    ::core::result::Result::Ok(event) => event,
                    ::core::result::Result::Err(error) => return #private::fail(error),
                };
                #downcast
                #meta_let
                #call
            }
        }
    }

    /// `__inoutbox_invoke_batch`: decodes every payload, downcasts the transaction and calls the
    /// function once with all the events; `__inoutbox_invoke` runs it on one message. The payloads
    /// have a lifetime of their own: they are decoded before the future is made, so
    /// `__inoutbox_invoke` can pass a slice of its one payload that lives only for the call.
    fn invoke_batch(&self) -> TokenStream {
        let private = self.private();
        let event_ty = self.event_ty;
        let (metas_let, metas_arg) = match self.meta_ty {
            Some(meta_ty) => (
                quote! {
                    let __inoutbox_metas = match #private::Probe::<#meta_ty>::metas(__inoutbox_metas) {
                        ::core::result::Result::Ok(metas) => metas,
                        ::core::result::Result::Err(error) => return #private::fail(error),
                    };
                },
                quote!(, __inoutbox_metas),
            ),
            None => (quote! { let _ = __inoutbox_metas; }, TokenStream::new()),
        };
        let downcast = self.downcast_tx();
        let call = self.call(quote!(__inoutbox_events), metas_arg);
        quote! {
            fn __inoutbox_invoke_batch<'__inoutbox_payloads, '__inoutbox>(
                __inoutbox_payloads: &'__inoutbox_payloads [&'__inoutbox_payloads [u8]],
                __inoutbox_tx: &'__inoutbox mut (dyn ::core::any::Any + ::core::marker::Send),
                __inoutbox_metas: &'__inoutbox [#private::MessageMeta],
            ) -> #private::HandlerFuture<'__inoutbox> {
                let __inoutbox_events =
                    match #private::Probe::<#event_ty>::decode_all(__inoutbox_payloads) {
                        ::core::result::Result::Ok(events) => events,
                        ::core::result::Result::Err(error) => return #private::fail(error),
                    };
                #downcast
                #metas_let
                #call
            }

            fn __inoutbox_invoke<'__inoutbox>(
                __inoutbox_payload: &'__inoutbox [u8],
                __inoutbox_tx: &'__inoutbox mut (dyn ::core::any::Any + ::core::marker::Send),
                __inoutbox_meta: &'__inoutbox #private::MessageMeta,
            ) -> #private::HandlerFuture<'__inoutbox> {
                __inoutbox_invoke_batch(
                    ::core::slice::from_ref(&__inoutbox_payload),
                    __inoutbox_tx,
                    ::core::slice::from_ref(__inoutbox_meta),
                )
            }
        }
    }

    /// `let __inoutbox_tx = ..;`: the store's transaction as the one the function takes.
    fn downcast_tx(&self) -> TokenStream {
        let private = self.private();
        let tx_ty = self.tx_ty;
        quote! {
            let __inoutbox_tx = match #private::Probe::<#tx_ty>::downcast_tx(__inoutbox_tx) {
                ::core::result::Result::Ok(tx) => tx,
                ::core::result::Result::Err(error) => return #private::fail(error),
            };
        }
    }

    /// The call of the function, boxed as the handler future. Coerced to `dyn Future + Send`
    /// with the function name's span: a future that is not `Send` is reported on the name.
    fn call(&self, events: TokenStream, meta_arg: TokenStream) -> TokenStream {
        let private = self.private();
        let (name, output, turbofish) = (self.name, self.output, &self.turbofish);
        let boxed = quote_spanned! {name.span()=>
            ::std::boxed::Box::pin(#name #turbofish (#events, __inoutbox_tx #meta_arg))
        };
        quote! {
            let __inoutbox_future: ::core::pin::Pin<::std::boxed::Box<
                dyn ::core::future::Future<Output = #output>
                    + ::core::marker::Send
                    + '__inoutbox,
            >> = #boxed;
            #private::Probe::<#output>::into_future(__inoutbox_future)
        }
    }

    /// Fails the build when `event = "..."` is not the parameter type's event type. The panic is
    /// written here, on the `event` string, so that rustc shows no frame inside inoutbox.
    fn event_type_check(&self) -> TokenStream {
        let (event, event_ty) = (self.event, self.event_ty);
        let private = self.private_at(event.span());
        let type_name = compact(self.aliases.written_event);
        quote_spanned! {event.span()=>
            const _: () = if let ::core::option::Option::Some(message) =
                &#private::event_type_mismatch(
                    #event,
                    #private::Probe::<#event_ty>::EVENT_TYPE,
                    #type_name,
                )
            {
                ::core::panic!("{}", message.as_str())
            };
        }
    }

    /// The one `inventory::submit!`, with the function's path, file and line (and, for a batch
    /// handler, `.batch(__inoutbox_invoke_batch)`; for a handler without metadata, `.no_meta()`).
    /// With `dedup_by = field`: `__inoutbox_business_key`, which decodes the payload and reads the
    /// field. The field access and its `BusinessKey` check carry the field name's span, so that
    /// a field the event does not have, or one without `Display`, is reported on it.
    fn business_key(&self) -> TokenStream {
        let Some(field) = self.dedup_by else {
            return TokenStream::new();
        };
        let (private, event_ty) = (self.private(), self.event_ty);
        let private_at = self.private_at(field.span());
        let read = quote_spanned! {field.span()=>
            #private_at::BusinessKey::business_key_text(&event.#field)
        };
        quote! {
            fn __inoutbox_business_key(
                payload: &[u8],
            ) -> ::core::result::Result<
                ::core::option::Option<::std::string::String>,
                ::std::string::String,
            > {
                let event = #private::Probe::<#event_ty>::decode(payload)
                    .map_err(|e| ::std::string::ToString::to_string(&e))?;
                ::core::result::Result::Ok(::core::option::Option::Some(#read))
            }
        }
    }

    /// Fails the build when `dedup_scope = "..."` is written but the handler has no business key
    /// (no `dedup_by`, and an event without `idempotency_key`): the scope would scope nothing.
    /// Written on the scope string; silent for an event type that failed its own check.
    fn scope_check(&self) -> TokenStream {
        let Some(scope) = self.dedup_scope.filter(|_| self.dedup_by.is_none()) else {
            return TokenStream::new();
        };
        let private = self.private_at(scope.span());
        let event_ty = self.event_ty;
        let message = format!(
            "`dedup_scope = \"{}\"` scopes the business key, and this handler has none: add \
             `dedup_by = field` (a field of `{}`), or `idempotency_key = field` to the event's \
             `#[outbox(...)]`",
            scope.value(),
            compact(self.aliases.written_event)
        );
        quote_spanned! {scope.span()=>
            const _: () = if #private::Probe::<#event_ty>::EVENT_TYPE.is_some()
                && #private::Probe::<#event_ty>::BUSINESS_KEY.is_none()
            {
                ::core::panic!(#message)
            };
        }
    }

    fn submit(&self) -> TokenStream {
        let private = self.private();
        let (name, event, group) = (self.name, self.event, self.group);
        let name_str = name.unraw().to_string();
        let location = quote_spanned! {name.span()=>
            ::core::concat!(::core::module_path!(), "::", #name_str),
            ::core::file!(),
            ::core::line!(),
        };
        let batch = match self.form {
            Form::Single => TokenStream::new(),
            Form::Batch => quote!(.batch(__inoutbox_invoke_batch)),
        };
        // A handler without the metadata parameter spares the runtime building it.
        let no_meta = match self.meta_ty {
            Some(_) => TokenStream::new(),
            None => quote!(.no_meta()),
        };
        // The handler's `dedup_by`, else the event's `idempotency_key` (if any).
        let event_ty = self.event_ty;
        let business_key = match self.dedup_by {
            Some(_) => quote!(::core::option::Option::Some(__inoutbox_business_key)),
            None => quote!(#private::Probe::<#event_ty>::BUSINESS_KEY),
        };
        let two_phase = match self.two_phase {
            Some(ordered) => quote!(.two_phase(#ordered)),
            None => TokenStream::new(),
        };
        let dedup_scope = self.dedup_scope.map(|scope| quote!(.dedup_scope(#scope)));
        quote! {
            #private::inventory::submit! {
                #private::HandlerRegistration::new(
                    #event,
                    #group,
                    #location
                    __inoutbox_tx_type,
                    __inoutbox_invoke,
                )
                #batch
                #no_meta
                .business_key(#business_key)
                #dedup_scope
                #two_phase
            }
        }
    }
}

/// One alias per type the user wrote that the generated code names several times:
/// `type __inoutbox_Event = OrderCreated;`, `type __inoutbox_Output = Result<(), HandlerError>;`.
/// A misspelt type (`OrderCreatd`, `HandlerErr`) is then resolved in one more place only, and
/// that place reports exactly the error of the function's own signature, which rustc shows
/// once: the alias is named with the function's name span, so that rustc's "you might be
/// missing a type parameter" help (given for a generic argument such as the `E` of
/// `Result<(), E>`) points where the one of the signature does. Everything else names the
/// alias, which stands for the error type after a failed resolution and adds nothing.
/// The event type of a batch handler (the `E` of `Vec<E>`) and the types [`unfit_for_alias`]
/// are named as written.
struct Aliases<'a> {
    name: &'a Ident,
    written_event: &'a Type,
    written_output: &'a Type,
    event: Option<Type>,
    output: Option<Type>,
}

impl<'a> Aliases<'a> {
    fn new(name: &'a Ident, form: Form, event_ty: &'a Type, output: &'a Type) -> Self {
        let alias = |ident: &str, ty: &Type| {
            let ident = Ident::new(ident, first_last_span(ty).0);
            syn::parse_quote!(#ident)
        };
        Self {
            name,
            written_event: event_ty,
            written_output: output,
            event: (form == Form::Single && !unfit_for_alias(event_ty))
                .then(|| alias("__inoutbox_Event", event_ty)),
            output: (!unfit_for_alias(output)).then(|| alias("__inoutbox_Output", output)),
        }
    }

    fn event_ty(&self) -> &Type {
        self.event.as_ref().unwrap_or(self.written_event)
    }

    fn output(&self) -> &Type {
        self.output.as_ref().unwrap_or(self.written_output)
    }

    /// The `type` items.
    fn items(&self) -> TokenStream {
        let pairs = [
            (&self.event, self.written_event, "__inoutbox_Event"),
            (&self.output, self.written_output, "__inoutbox_Output"),
        ];
        pairs
            .into_iter()
            .filter(|(alias, _, _)| alias.is_some())
            .map(|(_, written, ident)| {
                let ident = Ident::new(ident, self.name.span());
                quote! {
                    #[allow(non_camel_case_types)]
                    type #ident = #written;
                }
            })
            .collect()
    }
}

/// Whether `ty` is better named as written than by an alias: it names a lifetime (`'_`, `'a`)
/// or a reference (an alias cannot elide one), or a trait object or `impl Trait` (rustc would
/// print the alias's object lifetime, `Box<(dyn Error + 'static)>`, in its messages).
fn unfit_for_alias(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|tt| match tt {
            proc_macro2::TokenTree::Punct(p) => p.as_char() == '\'' || p.as_char() == '&',
            proc_macro2::TokenTree::Ident(i) => i == "dyn" || i == "impl",
            proc_macro2::TokenTree::Group(g) => walk(g.stream()),
            proc_macro2::TokenTree::Literal(_) => false,
        })
    }
    walk(ty.to_token_stream())
}

/// The spans of the first and last tokens of `tokens` (on stable, `Spanned::span` is the first).
fn first_last_span(tokens: impl ToTokens) -> (Span, Span) {
    let mut spans = tokens.into_token_stream().into_iter().map(|tt| tt.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    (first, spans.last().unwrap_or(first))
}

/// The note on a transaction type inoutbox does not take: a `sqlx::Transaction` of another sqlx
/// major is another type, and rustc's own error would not say so.
const SQLX_NOTE: &str = "inoutbox builds on sqlx 0.9: a transaction of another sqlx major is \
                         another type. Depend on `sqlx = \"0.9\"` (`cargo tree -i sqlx` lists \
                         every sqlx in the build)";

/// `#[diagnostic::on_unimplemented(..)]` with these texts (`{Self}` is the type).
fn on_unimplemented(message: &str, label: &str, notes: &[&str]) -> TokenStream {
    quote! {
        #[diagnostic::on_unimplemented(message = #message, label = #label, #(note = #notes),*)]
    }
}
