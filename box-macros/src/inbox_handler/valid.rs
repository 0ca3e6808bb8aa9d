//! Checks of the handler's signature that need no types: async, no receiver, no generics, the
//! parameter list and the reference kinds. Type requirements are checked by the expansion, on
//! the user's types (see `expand.rs`).

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::{FnArg, Type};

use super::ast::Handler;
use crate::ctxt::Ctxt;
use crate::tokens::compact;

/// The signature written in full, for messages.
const SIGNATURE: &str = "(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError>";

pub(crate) fn check(cx: &Ctxt, handler: &Handler) {
    check_qualifiers(cx, handler);
    check_generics(cx, handler);
    if check_receiver(cx, handler) && check_no_self_type(cx, handler) {
        check_arity(cx, handler);
        if check_order(cx, handler) {
            check_params(cx, handler);
        }
    }
    check_output(cx, handler);
}

fn check_qualifiers(cx: &Ctxt, handler: &Handler) {
    let sig = &handler.func.sig;
    let name = &sig.ident;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!("an inbox handler must be an `async fn`: write `async fn {name}{SIGNATURE}`"),
        );
    }
    if let Some(token) = &sig.unsafety {
        cx.error_spanned_by(
            token,
            "an inbox handler cannot be `unsafe`: txbox calls it like any safe function; \
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

fn check_generics(cx: &Ctxt, handler: &Handler) {
    let generics = &handler.func.sig.generics;
    let message = "an inbox handler cannot be generic: txbox decodes each message into one \
                   concrete event type; remove the parameters and name the types, e.g. \
                   `event: OrderCreated, tx: &mut PgTx<'_>`";
    if !generics.params.is_empty() {
        let (lt, params, gt) = (&generics.lt_token, &generics.params, &generics.gt_token);
        cx.error_spanned_by(quote!(#lt #params #gt), message);
    } else if let Some(clause) = &generics.where_clause {
        cx.error_spanned_by(clause, message);
    }
    for arg in handler.inputs() {
        if let FnArg::Typed(typed) = arg {
            if let Type::ImplTrait(ty) = &*typed.ty {
                cx.error_spanned_by(ty, message);
            }
        }
    }
}

/// Reports a `self` parameter. Returns whether there was none (the other checks then apply).
fn check_receiver(cx: &Ctxt, handler: &Handler) -> bool {
    for arg in handler.inputs() {
        if let FnArg::Receiver(receiver) = arg {
            cx.error_spanned_by(
                receiver,
                format!(
                    "an inbox handler cannot take `self`: txbox calls it with the event and a \
                     transaction only; remove `self` and move `{}` out of the `impl` block",
                    handler.func.sig.ident
                ),
            );
            return false;
        }
    }
    true
}

/// Reports `Self` in the signature: the function is an associated function, which txbox cannot
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

fn check_arity(cx: &Ctxt, handler: &Handler) {
    let sig = &handler.func.sig;
    match sig.inputs.len() {
        0 => cx.error_at(
            sig.paren_token.span.join(),
            format!(
                "an inbox handler takes the event and the transaction: write `async fn {}{SIGNATURE}`",
                sig.ident
            ),
        ),
        1 => cx.error_spanned_by(
            &sig.inputs,
            "missing the transaction parameter: add `tx: &mut PgTx<'_>` after the event",
        ),
        2 | 3 => {}
        _ => {
            let extra: proc_macro2::TokenStream =
                sig.inputs.iter().skip(3).map(ToTokens::to_token_stream).collect();
            cx.error_spanned_by(
                extra,
                "too many parameters: an inbox handler takes `(event, tx)` or \
                 `(event, tx, meta: &MessageMeta)`; remove these",
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
fn check_order(cx: &Ctxt, handler: &Handler) -> bool {
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
    let message = if expected.len() == 2 {
        "the event comes first and the transaction second: swap the parameters"
    } else {
        "the parameters go in the order event, transaction, metadata"
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

fn check_params(cx: &Ctxt, handler: &Handler) {
    if let Some(Type::Reference(reference)) = handler.param_ty(0) {
        cx.error_spanned_by(
            quote!(#reference),
            format!(
                "the event is passed by value: write `event: {}` without `&`",
                compact(&reference.elem)
            ),
        );
    }
    match handler.param_ty(1) {
        Some(Type::Reference(reference)) if reference.mutability.is_some() => {}
        Some(Type::ImplTrait(_)) | None => {}
        Some(other) => cx.error_spanned_by(
            other,
            "the transaction is passed by mutable reference: write `tx: &mut PgTx<'_>`",
        ),
    }
    match handler.param_ty(2) {
        Some(Type::Reference(reference)) if reference.mutability.is_none() => {}
        Some(Type::ImplTrait(_)) | None => {}
        Some(other) => cx.error_spanned_by(
            other,
            "the metadata is passed by shared reference: write `meta: &MessageMeta`",
        ),
    }
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
