//! Checks of the handler's signature that need no types: async, no receiver, no generics, the
//! parameter list, the reference kinds, and the shapes a batch handler takes (`Vec<E>`,
//! `&[MessageMeta]`). Type requirements are checked by the expansion, on the user's types (see
//! `expand.rs`).

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::{FnArg, Type};

use super::ast::{several_elem, vec_elem, Handler};
use super::attr::{Form, HandlerAttr, Stores};
use crate::ctxt::Ctxt;
use crate::tokens::compact;

/// The signature written in full, for messages.
fn signature(form: Form) -> &'static str {
    match form {
        Form::Single => "(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError>",
        Form::Batch => "(events: Vec<OrderCreated>, tx: &mut PgTx<'_>) -> Result<(), HandlerError>",
    }
}

pub(crate) fn check(cx: &Ctxt, handler: &Handler, attr: &HandlerAttr) {
    let form = attr.form();
    check_mode(cx, attr);
    check_qualifiers(cx, handler, form);
    check_generics(cx, handler, attr);
    if check_receiver(cx, handler) && check_no_self_type(cx, handler) {
        check_arity(cx, handler, form);
        if check_order(cx, handler, form) {
            check_event_param(cx, handler, attr);
            check_tx_param(cx, handler);
            check_meta_param(cx, handler, form);
        }
    }
    check_output(cx, handler);
    check_sqlx_executor(cx, handler);
}

/// sqlx's functions that start a query whose `.execute(..)`, `.fetch_*(..)` take an executor.
const SQLX_QUERIES: &[&str] = &[
    "query",
    "query_as",
    "query_scalar",
    "query_with",
    "query_as_with",
    "query_scalar_with",
    "raw_sql",
];

/// The methods of a sqlx query that take the executor.
const SQLX_RUNS: &[&str] = &[
    "execute",
    "execute_many",
    "fetch",
    "fetch_all",
    "fetch_many",
    "fetch_one",
    "fetch_optional",
];

/// `sqlx::query(..).execute(&mut *tx)` with the handler's `tx: &mut PgTx<'_>`: `&mut *tx` is
/// the transaction, which sqlx 0.8 runs nothing on (its connection, `&mut **tx`, it does).
/// Reported on the argument with what to write, instead of only sqlx's trait error.
fn check_sqlx_executor(cx: &Ctxt, handler: &Handler) {
    let Some(FnArg::Typed(typed)) = handler.func.sig.inputs.iter().nth(1) else {
        return;
    };
    let syn::Pat::Ident(pat) = &*typed.pat else {
        return;
    };
    let tx = &pat.ident;
    let mut found = Vec::new();
    find_sqlx_on(handler.func.block.to_token_stream(), tx, &mut found);
    for arg in found {
        cx.error_spanned_by(
            arg,
            format!(
                "sqlx runs queries on the connection inside the transaction, not on the \
                 transaction: write `&mut **{tx}` (`{tx}` is `&mut PgTx<'_>`, `*{tx}` the \
                 transaction, `**{tx}` its connection)"
            ),
        );
    }
}

/// Collects the `(&mut *tx)` groups passed to `.execute`, `.fetch_*` of a method chain that
/// starts with one of sqlx's query functions or macros (`sqlx::query(..).bind(..).execute(..)`),
/// at any depth of `tokens`.
fn find_sqlx_on(tokens: TokenStream, tx: &syn::Ident, found: &mut Vec<proc_macro2::Group>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, token) in tokens.iter().enumerate() {
        let TokenTree::Group(group) = token else {
            continue;
        };
        let runs = i >= 2
            && matches!(&tokens[i - 1], TokenTree::Ident(m) if SQLX_RUNS.iter().any(|r| m == r))
            && matches!(&tokens[i - 2], TokenTree::Punct(p) if p.as_char() == '.');
        if runs && is_reborrow_of(group, tx) && chain_starts_with_sqlx(&tokens[..i - 2]) {
            found.push(group.clone());
        }
        find_sqlx_on(group.stream(), tx, found);
    }
}

/// Whether the method chain ending at the end of `before` starts with a sqlx query: walks back
/// over `.method(..)` links to the first call, `query(..)` or `query!(..)`.
fn chain_starts_with_sqlx(before: &[TokenTree]) -> bool {
    let mut end = before.len();
    loop {
        // `name(..)` or `name!(..)` at the end, or the chain is something else.
        let Some(TokenTree::Group(_)) = end.checked_sub(1).map(|i| &before[i]) else {
            return false;
        };
        let mut at = end - 1;
        if matches!(at.checked_sub(1).map(|i| &before[i]), Some(TokenTree::Punct(p)) if p.as_char() == '!')
        {
            at -= 1;
        }
        let Some(TokenTree::Ident(name)) = at.checked_sub(1).map(|i| &before[i]) else {
            return false;
        };
        match at.checked_sub(2).map(|i| &before[i]) {
            // `.name(..)`: one more link of the chain.
            Some(TokenTree::Punct(p)) if p.as_char() == '.' => end = at - 2,
            _ => return SQLX_QUERIES.iter().any(|q| name == q),
        }
    }
}

/// `(&mut *tx)`.
fn is_reborrow_of(group: &proc_macro2::Group, tx: &syn::Ident) -> bool {
    let inner: Vec<String> = group.stream().into_iter().map(|t| t.to_string()).collect();
    inner == ["&", "mut", "*", &tx.to_string()]
}

/// `ordered` only with `mode = "two_phase"`; `mode = "two_phase"` not with `batch`.
fn check_mode(cx: &Ctxt, attr: &HandlerAttr) {
    if let (Some(mode), Some(batch)) = (&attr.mode, &attr.batch) {
        if attr.is_two_phase() {
            cx.error_spanned_by(
                mode,
                format!(
                    "a batch handler cannot be two-phase: its workers run one message per \
                     transaction; remove `{batch}`, or remove `mode = \"two_phase\"`"
                ),
            );
        }
    }
    if let Some((key, _)) = &attr.ordered {
        if !attr.is_two_phase() {
            cx.error_spanned_by(
                key,
                "`ordered` applies to two-phase handlers (one-phase handlers keep the order of \
                 the consumer's `ordering`): add `mode = \"two_phase\"`, or remove `ordered`",
            );
        }
    }
}

fn check_qualifiers(cx: &Ctxt, handler: &Handler, form: Form) {
    let sig = &handler.func.sig;
    let name = &sig.ident;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!(
                "an inbox handler must be an `async fn`: write `async fn {name}{}`",
                signature(form)
            ),
        );
    }
    if let syn::Safety::Unsafe(token) = &sig.safety {
        cx.error_spanned_by(
            token,
            "an inbox handler cannot be `unsafe`: inoutbox calls it like any safe function; \
             remove `unsafe` and put any unsafe code in an `unsafe` block in the body",
        );
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(
            abi,
            "an inbox handler cannot have an `extern` ABI; remove it",
        );
    }
    if let Some(token) = &sig.constness {
        cx.error_spanned_by(
            token,
            "an inbox handler cannot be a `const fn`; remove `const`",
        );
    }
}

fn check_generics(cx: &Ctxt, handler: &Handler, attr: &HandlerAttr) {
    let generics = &handler.func.sig.generics;
    if let Some(stores) = &attr.stores {
        return check_store_generic(cx, handler, stores);
    }
    let message = "an inbox handler cannot be generic: inoutbox decodes each message into one \
                   concrete event type; remove the parameters and name the types, e.g. \
                   `event: OrderCreated, tx: &mut PgTx<'_>` (a handler for several stores is \
                   generic over its store alone and lists them: `stores(postgres, sqlite)`)";
    if !generics.params.is_empty() {
        let (lt, params, gt) = (&generics.lt_token, &generics.params, &generics.gt_token);
        cx.error_spanned_by(quote!(#lt #params #gt), message);
    } else if let Some(clause) = &generics.where_clause {
        cx.error_spanned_by(clause, message);
    }
    check_no_impl_trait(cx, handler, message);
}

fn check_no_impl_trait(cx: &Ctxt, handler: &Handler, message: &str) {
    for arg in handler.inputs() {
        if let FnArg::Typed(typed) = arg {
            if let Type::ImplTrait(ty) = &*typed.ty {
                cx.error_spanned_by(ty, message);
            }
        }
    }
}

/// With `stores(..)`: generic over one type parameter, the store, which the transaction names.
fn check_store_generic(cx: &Ctxt, handler: &Handler, stores: &Stores) {
    let sig = &handler.func.sig;
    let generics = &sig.generics;
    let example = format!(
        "write `async fn {}<D: Db>(event: OrderCreated, tx: &mut Tx<'_, D>)`",
        sig.ident
    );
    check_no_impl_trait(
        cx,
        handler,
        &format!("a handler for several stores is generic over its store alone: {example}"),
    );
    let types: Vec<&syn::TypeParam> = generics.type_params().collect();
    let others = generics.params.len() - types.len();
    let [param] = types.as_slice() else {
        let message = match types.len() {
            0 => format!(
                "`stores(..)` registers a handler generic over its store once per store: {example}, \
                 or remove `stores(..)` to run on the one store the transaction type names"
            ),
            _ => format!("a handler for several stores has one type parameter, the store: {example}"),
        };
        let (lt, params, gt) = (&generics.lt_token, &generics.params, &generics.gt_token);
        return match types.len() {
            0 => cx.error_spanned_by(&stores.group, message),
            _ => cx.error_spanned_by(quote!(#lt #params #gt), message),
        };
    };
    if others > 0 {
        let (lt, params, gt) = (&generics.lt_token, &generics.params, &generics.gt_token);
        cx.error_spanned_by(
            quote!(#lt #params #gt),
            format!("a handler for several stores has one type parameter, the store, and no other: {example}"),
        );
    }
    if let Some(tx) = handler.param_ty(1) {
        if !mentions(tx.to_token_stream(), &param.ident) {
            let d = &param.ident;
            cx.error_spanned_by(
                tx,
                format!(
                    "with `stores(..)` the transaction is generic over the store: write \
                     `tx: &mut Tx<'_, {d}>` (the handler then runs on every store listed)"
                ),
            );
        }
    }
}

/// Whether `tokens` name `ident`.
fn mentions(tokens: TokenStream, ident: &syn::Ident) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => i == *ident,
        TokenTree::Group(group) => mentions(group.stream(), ident),
        _ => false,
    })
}

/// Reports a `self` parameter. Returns whether there was none (the other checks then apply).
fn check_receiver(cx: &Ctxt, handler: &Handler) -> bool {
    for arg in handler.inputs() {
        if let FnArg::Receiver(receiver) = arg {
            cx.error_spanned_by(
                receiver,
                format!(
                    "an inbox handler cannot take `self`: inoutbox calls it with the event and a \
                     transaction only; remove `self` and move `{}` out of the `impl` block",
                    handler.func.sig.ident
                ),
            );
            return false;
        }
    }
    true
}

/// Reports `Self` in the signature: the function is an associated function, which inoutbox cannot
/// name from the registration it generates. Returns whether there was none.
fn check_no_self_type(cx: &Ctxt, handler: &Handler) -> bool {
    let sig = &handler.func.sig;
    let mut types: Vec<TokenStream> = handler.inputs().map(ToTokens::to_token_stream).collect();
    types.push(sig.output.to_token_stream());
    if !types.into_iter().any(mentions_self) {
        return true;
    }
    cx.error_spanned_by(
        &sig.ident,
        format!(
            "`#[inbox_handler]` goes on a free function, not on an associated function: move \
             `{}` out of the `impl` block and name its types instead of `Self`",
            sig.ident
        ),
    );
    false
}

fn mentions_self(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(ident) => ident == "Self",
        TokenTree::Group(group) => mentions_self(group.stream()),
        _ => false,
    })
}

fn check_arity(cx: &Ctxt, handler: &Handler, form: Form) {
    let sig = &handler.func.sig;
    let (handler_of, event, params) = match form {
        Form::Single => (
            "an inbox handler takes the event",
            "the event",
            "an inbox handler takes `(event, tx)` or `(event, tx, meta: &MessageMeta)`",
        ),
        Form::Batch => (
            "a batch handler takes the events",
            "the events",
            "a batch handler takes `(events, tx)` or `(events, tx, metas: &[MessageMeta])`",
        ),
    };
    match sig.inputs.len() {
        0 => cx.error_at(
            sig.paren_token.span.join(),
            format!(
                "{handler_of} and the transaction: write `async fn {}{}`",
                sig.ident,
                signature(form)
            ),
        ),
        1 => cx.error_spanned_by(
            &sig.inputs,
            format!("missing the transaction parameter: add `tx: &mut PgTx<'_>` after {event}"),
        ),
        2 | 3 => {}
        _ => {
            let extra: proc_macro2::TokenStream = sig
                .inputs
                .iter()
                .skip(3)
                .map(ToTokens::to_token_stream)
                .collect();
            cx.error_spanned_by(
                extra,
                format!("too many parameters: {params}; remove these"),
            );
        }
    }
    if let Some(variadic) = &sig.variadic {
        cx.error_spanned_by(
            variadic,
            "an inbox handler cannot be variadic; remove `...`",
        );
    }
}

/// What a parameter's type says it is meant to be.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    /// By value: the event.
    Event,
    /// `&mut T`: the transaction.
    Tx,
    /// `&T`: the metadata.
    Meta,
}

fn role(ty: &Type) -> Option<Role> {
    match ty {
        Type::Reference(reference) if reference.mutability.is_some() => Some(Role::Tx),
        Type::Reference(_) => Some(Role::Meta),
        Type::ImplTrait(_) => None,
        _ => Some(Role::Event),
    }
}

/// Reports the right parameters in the wrong order (`tx` before the event, `meta` before `tx`)
/// as one mistake, with the signature in order. Returns whether the order was right (or the
/// parameters are not just a permutation of the right ones: the other checks say why).
fn check_order(cx: &Ctxt, handler: &Handler, form: Form) -> bool {
    let sig = &handler.func.sig;
    let typed: Vec<&syn::PatType> = handler
        .inputs()
        .filter_map(|arg| match arg {
            FnArg::Typed(typed) => Some(typed),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let Some(roles) = typed
        .iter()
        .map(|t| role(&t.ty))
        .collect::<Option<Vec<Role>>>()
    else {
        return true;
    };
    let mut sorted = roles.clone();
    sorted.sort();
    let expected: &[Role] = match roles.len() {
        2 => &[Role::Event, Role::Tx],
        3 => &[Role::Event, Role::Tx, Role::Meta],
        _ => return true,
    };
    if roles == expected || sorted != expected {
        return true;
    }
    let mut in_order: Vec<(Role, &syn::PatType)> = roles.into_iter().zip(typed).collect();
    in_order.sort_by_key(|(role, _)| *role);
    let written: Vec<String> = in_order
        .iter()
        .map(|(_, t)| format!("{}: {}", compact(&t.pat), compact(&t.ty)))
        .collect();
    let message = match (form, expected.len()) {
        (Form::Single, 2) => {
            "the event comes first and the transaction second: swap the parameters"
        }
        (Form::Batch, 2) => "the events come first and the transaction second: swap the parameters",
        (Form::Single, _) => "the parameters go in the order event, transaction, metadata",
        (Form::Batch, _) => "the parameters go in the order events, transaction, metadata",
    };
    cx.error_spanned_by(
        &sig.inputs,
        format!(
            "{message}: write `async fn {}({})`",
            sig.ident,
            written.join(", ")
        ),
    );
    false
}

/// The first parameter: one event by value, or for a batch handler `events: Vec<E>`.
fn check_event_param(cx: &Ctxt, handler: &Handler, attr: &HandlerAttr) {
    let Some(ty) = handler.param_ty(0) else {
        return;
    };
    match attr.form() {
        Form::Single => check_single_event(cx, ty, attr),
        Form::Batch => check_batch_events(cx, ty),
    }
}

/// One event, by value: several (`Vec<E>`, `&[E]`) mean a batch handler without `batch`.
fn check_single_event(cx: &Ctxt, ty: &Type, attr: &HandlerAttr) {
    if let Some(elem) = vec_elem(ty) {
        cx.error_spanned_by(
            ty,
            format!(
                "a handler that takes `{}` is a batch handler: add `batch` to the attribute, as \
                 in `{}`; or take one event: `event: {}`",
                compact(ty),
                attr.with_batch(),
                compact(elem)
            ),
        );
        return;
    }
    let Type::Reference(reference) = ty else {
        return;
    };
    let message = match several_elem(&reference.elem) {
        Some(elem) => format!(
            "a handler of several events is a batch handler, and takes them by value: add \
             `batch` to the attribute, as in `{}`, and write `events: Vec<{elem}>`; or take one \
             event: `event: {elem}`",
            attr.with_batch(),
            elem = compact(elem)
        ),
        None => format!(
            "the event is passed by value: write `event: {}` without `&`",
            compact(&reference.elem)
        ),
    };
    cx.error_spanned_by(quote!(#reference), message);
}

/// A batch handler's events: `Vec<E>`, by value.
fn check_batch_events(cx: &Ctxt, ty: &Type) {
    if vec_elem(ty).is_some() {
        return;
    }
    let message = match ty {
        Type::ImplTrait(_) => return, // reported as a generic parameter
        Type::Reference(reference) => format!(
            "the events are passed by value: write `events: Vec<{}>` without `&`",
            compact(several_elem(&reference.elem).unwrap_or(&reference.elem))
        ),
        other => format!(
            "a batch handler takes its events as `events: Vec<{}>`; write that instead of `{}`, \
             or remove `batch` for a handler of one event per call",
            compact(several_elem(other).unwrap_or(other)),
            compact(other)
        ),
    };
    cx.error_spanned_by(ty, message);
}

fn check_tx_param(cx: &Ctxt, handler: &Handler) {
    match handler.param_ty(1) {
        Some(Type::Reference(reference)) if reference.mutability.is_some() => {}
        Some(Type::ImplTrait(_)) | None => {}
        Some(other) => cx.error_spanned_by(
            other,
            "the transaction is passed by mutable reference: write `tx: &mut PgTx<'_>`",
        ),
    }
}

/// The optional third parameter: `meta: &MessageMeta`, or a batch handler's
/// `metas: &[MessageMeta]`, one per event. (The type itself is checked by the expansion.)
fn check_meta_param(cx: &Ctxt, handler: &Handler, form: Form) {
    let Some(ty) = handler.param_ty(2) else {
        return;
    };
    let referent = match ty {
        Type::ImplTrait(_) => return,
        Type::Reference(reference) if reference.mutability.is_none() => Some(&*reference.elem),
        _ => None,
    };
    let message = match (form, referent) {
        (Form::Single, Some(Type::Slice(_))) => {
            "a handler of one event takes that event's metadata: write `meta: &MessageMeta` \
             (`metas: &[MessageMeta]` is for a batch handler, with `batch` in the attribute)"
        }
        (Form::Single, Some(_)) | (Form::Batch, Some(Type::Slice(_))) => return,
        (Form::Single, None) => {
            "the metadata is passed by shared reference: write `meta: &MessageMeta`"
        }
        (Form::Batch, _) => {
            "a batch handler takes the metadata of its events as a slice, one per event: write \
             `metas: &[MessageMeta]`"
        }
    };
    cx.error_spanned_by(ty, message);
}

fn check_output(cx: &Ctxt, handler: &Handler) {
    let sig = &handler.func.sig;
    let Some(ty) = handler.output() else {
        cx.error_at(
            sig.paren_token.span.close(),
            format!(
                "an inbox handler returns `Result<(), E>`: add `-> Result<(), HandlerError>` \
                 after the parameters of `{}`",
                sig.ident
            ),
        );
        return;
    };
    let found = match ty {
        Type::Tuple(_) | Type::Never(_) | Type::Reference(_) | Type::Slice(_) | Type::Array(_) => {
            compact(ty)
        }
        Type::ImplTrait(_) => "`impl Trait`".to_owned(),
        _ => return, // checked on the type by the expansion
    };
    cx.error_spanned_by(
        ty,
        format!(
            "an inbox handler returns `Result<(), E>`, not `{}`: write `-> Result<(), HandlerError>`",
            found.trim_matches('`')
        ),
    );
}
