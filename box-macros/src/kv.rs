//! The `key = value, ...` lists both macros take: `#[inbox_handler(event = "...", group = "...")]`
//! and `#[outbox(event_type = "...", key = field)]`.

use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Token};

use crate::ctxt::Ctxt;

/// One `key = value` pair, kept with its tokens for error spans. `value` is `None` when the key
/// was written without one (already reported).
pub(crate) struct KeyValue {
    pub(crate) key: Ident,
    pub(crate) value: Option<Expr>,
}

/// The pairs of a list, and whether the whole list parsed (when it did not, the error is
/// reported and "missing key" errors would only repeat it).
pub(crate) struct KvList {
    pub(crate) pairs: Vec<KeyValue>,
    pub(crate) complete: bool,
}

/// Parses `key = value, ...`. Syntax errors go to `cx`; what parsed before the error is returned.
pub(crate) fn parse_list(cx: &Ctxt, tokens: proc_macro2::TokenStream, example: &str) -> KvList {
    let mut out = Vec::new();
    let parser = |input: ParseStream| -> syn::Result<()> {
        while !input.is_empty() {
            if !(input.peek(Ident::peek_any)) {
                let tt: proc_macro2::TokenTree = input.parse()?;
                return Err(syn::Error::new(
                    tt.span(),
                    format!("expected `key = value` here, e.g. `{example}`"),
                ));
            }
            let key = input.call(Ident::parse_any)?;
            if !input.peek(Token![=]) {
                let error = syn::Error::new(
                    key.span(),
                    format!("expected `{key} = ...`: give `{key}` a value, e.g. `{example}`"),
                );
                if !(input.is_empty() || input.peek(Token![,])) {
                    return Err(error);
                }
                // `key,`: report it and go on with the rest of the list.
                cx.syn_error(error);
                out.push(KeyValue { key, value: None });
            } else {
                input.parse::<Token![=]>()?;
                let value: Expr = input.parse().map_err(|_| {
                    syn::Error::new(input.span(), format!("expected a value after `{key} =`"))
                })?;
                out.push(KeyValue {
                    key,
                    value: Some(value),
                });
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>().map_err(|_| {
                syn::Error::new(input.span(), "expected `,` between `key = value` pairs")
            })?;
        }
        Ok(())
    };
    let complete = match parser.parse2(tokens) {
        Ok(()) => true,
        Err(error) => {
            cx.syn_error(error);
            false
        }
    };
    KvList {
        pairs: out,
        complete,
    }
}

/// The value as a string literal, or an error on it that shows the expected form.
pub(crate) fn lit_str(cx: &Ctxt, kv: &KeyValue, example: &str) -> Option<LitStr> {
    match kv.value.as_ref()? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit.clone()),
        other => {
            cx.error_spanned_by(
                other,
                format!(
                    "expected a string literal for `{}`, e.g. `{} = {example}`",
                    kv.key, kv.key
                ),
            );
            None
        }
    }
}

/// The value as a field name (a bare identifier), or an error on it that shows the expected form.
pub(crate) fn field_ident(cx: &Ctxt, kv: &KeyValue) -> Option<Ident> {
    match kv.value.as_ref()? {
        Expr::Path(ExprPath {
            path,
            qself: None,
            attrs,
        }) if attrs.is_empty() => {
            if let Some(ident) = path.get_ident() {
                return Some(ident.clone());
            }
            cx.error_spanned_by(
                path,
                format!(
                    "expected a field name for `{}`, e.g. `{} = order_id`",
                    kv.key, kv.key
                ),
            );
            None
        }
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "expected a field name, not a string: write `{} = {}`",
                    kv.key,
                    lit.value()
                ),
            );
            None
        }
        other => {
            cx.error_spanned_by(
                other,
                format!(
                    "expected a field name for `{}`, e.g. `{} = order_id`",
                    kv.key, kv.key
                ),
            );
            None
        }
    }
}

/// Reports a second occurrence of a key. Returns whether `slot` was still empty.
pub(crate) fn first_time<T>(cx: &Ctxt, slot: &Option<T>, key: &Ident) -> bool {
    if slot.is_some() {
        duplicate(cx, key);
        false
    } else {
        true
    }
}

/// Reports `key` as given twice, on its second occurrence.
pub(crate) fn duplicate(cx: &Ctxt, key: &Ident) {
    cx.error_spanned_by(key, format!("`{key}` is given twice; keep one"));
}

/// `expected one of: `a`, `b``, for unknown-key messages.
pub(crate) fn one_of(keys: &[&str]) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    format!("expected one of: {}", list.join(", "))
}
