//! The `key = value, ...` lists both macros take: `#[inbox_handler(event = "...", group = "...")]`
//! and `#[outbox(event_type = "...", key = field)]`.

use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Token};

use crate::ctxt::Ctxt;
use crate::suggest;

/// One `key = value` pair, kept with its tokens for error spans. `value` is `None` when the key
/// was written without one (`bare`) or with one already reported.
pub(crate) struct KeyValue {
    pub(crate) key: Ident,
    pub(crate) value: Option<Expr>,
    /// Written as a lone `key` (not reported: the caller knows which keys are flags).
    pub(crate) bare: bool,
    /// Written as `key(a, b, ..)`: the parenthesised list (the caller knows which keys take one).
    pub(crate) list: Option<ParenList>,
}

/// The `(a, b, ..)` of `key(a, b, ..)`: its names, and the group for error spans.
pub(crate) struct ParenList {
    pub(crate) group: proc_macro2::TokenStream,
    pub(crate) items: Vec<Ident>,
}

/// The pairs of a list, and whether the whole list parsed (when it did not, the error is
/// reported and "missing key" errors would only repeat it).
pub(crate) struct KvList {
    pub(crate) pairs: Vec<KeyValue>,
    pub(crate) complete: bool,
}

/// How a list is read: its example (for messages), and which keys name a field (their value
/// may be a keyword that needs its raw form).
#[derive(Clone, Copy)]
pub(crate) struct ListSpec<'a> {
    pub(crate) example: &'a str,
    pub(crate) field_keys: &'a [&'a str],
    /// Keys written `key(a, b, ..)`.
    pub(crate) list_keys: &'a [&'a str],
}

/// Parses `key = value, ...`. Syntax errors go to `cx`; what parsed before the error is returned.
pub(crate) fn parse_list(cx: &Ctxt, tokens: proc_macro2::TokenStream, spec: ListSpec) -> KvList {
    let mut out = Vec::new();
    let parser = |input: ParseStream| -> syn::Result<()> {
        while !input.is_empty() {
            out.push(parse_pair(cx, input, spec)?);
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

/// One `key = value` (or a bare `key`, followed by `,` or the end: a flag, or a key whose value
/// is missing; the caller tells which). An error that leaves the rest of the list readable is
/// reported to `cx` and parsing goes on; any other ends the list.
fn parse_pair(cx: &Ctxt, input: ParseStream, spec: ListSpec) -> syn::Result<KeyValue> {
    let example = spec.example;
    if !input.peek(Ident::peek_any) {
        let tt: proc_macro2::TokenTree = input.parse()?;
        return Err(syn::Error::new(
            tt.span(),
            format!("expected `key = value` here, e.g. `{example}`"),
        ));
    }
    let key = input.call(Ident::parse_any)?;
    if input.peek(syn::token::Paren) && spec.list_keys.contains(&key.to_string().as_str()) {
        return parse_paren_list(input, key);
    }
    if !input.peek(Token![=]) {
        if input.is_empty() || input.peek(Token![,]) {
            return Ok(KeyValue {
                key,
                value: None,
                bare: true,
                list: None,
            });
        }
        return Err(syn::Error::new(key.span(), missing_value(&key, example)));
    }
    input.parse::<Token![=]>()?;
    if spec.field_keys.contains(&key.to_string().as_str()) && is_keyword_value(input) {
        // `key = type`: a keyword is no expression; the field is spelled `r#type`.
        let keyword = input.call(Ident::parse_any)?;
        cx.error_spanned_by(
            &keyword,
            format!("`{keyword}` is a keyword: to name the field `r#{keyword}`, write `{key} = r#{keyword}`"),
        );
        return Ok(KeyValue {
            key,
            value: None,
            bare: false,
            list: None,
        });
    }
    let value: Expr = input
        .parse()
        .map_err(|_| syn::Error::new(input.span(), format!("expected a value after `{key} =`")))?;
    Ok(KeyValue {
        key,
        value: Some(value),
        bare: false,
        list: None,
    })
}

/// `key(a, b, ..)`: a list of names.
fn parse_paren_list(input: ParseStream, key: Ident) -> syn::Result<KeyValue> {
    let group: proc_macro2::Group = input.parse()?;
    let items = Punctuated::<Ident, Token![,]>::parse_terminated
        .parse2(group.stream())
        .map_err(|_| {
            syn::Error::new(
                group.span(),
                format!("expected names separated by `,` in `{key}(..)`, e.g. `{key}(postgres, sqlite)`"),
            )
        })?;
    Ok(KeyValue {
        key,
        value: None,
        bare: false,
        list: Some(ParenList {
            group: proc_macro2::TokenTree::Group(group).into(),
            items: items.into_iter().collect(),
        }),
    })
}

/// Whether the value is a lone keyword that a raw identifier can spell (`type`, `match`, `move`,
/// ..), followed by `,` or the end of the list.
fn is_keyword_value(input: ParseStream) -> bool {
    let fork = input.fork();
    if fork.peek(Ident) || !fork.peek(Ident::peek_any) {
        return false;
    }
    let Ok(ident) = fork.call(Ident::parse_any) else {
        return false;
    };
    let no_raw_form = ["_", "true", "false", "self", "Self", "super", "crate"];
    !no_raw_form.contains(&ident.to_string().as_str()) && (fork.is_empty() || fork.peek(Token![,]))
}

/// The message for a key written without the value it needs (`example` is `key = value`).
pub(crate) fn missing_value(key: &Ident, example: &str) -> String {
    format!("expected `{key} = ...`: give `{key}` a value, e.g. `{example}`")
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
    format!("expected one of: {}", ticked(keys).join(", "))
}

/// Each name in backticks.
pub(crate) fn ticked(names: &[&str]) -> Vec<String> {
    names.iter().map(|k| format!("`{k}`")).collect()
}

/// Reports `key` as unknown in `place` (e.g. "`#[inbox_handler(...)]`"), with a "did you mean"
/// when it looks like a misspelling or a known alias of one of `keys`. Returns that key, so that
/// the caller does not also report it as missing.
pub(crate) fn unknown_key(
    cx: &Ctxt,
    key: &Ident,
    place: &str,
    keys: &[&'static str],
    aliases: &[(&str, &'static str)],
) -> Option<&'static str> {
    let name = key.unraw().to_string();
    let meant = suggest::closest(&name, keys, aliases);
    let message = match meant {
        Some(meant) => format!("unknown key `{name}` in {place}; did you mean `{meant}`?"),
        None => format!("unknown key `{name}` in {place}; {}", one_of(keys)),
    };
    cx.error_spanned_by(key, message);
    meant
}

/// `crate = "path"`: the path generated code names the inoutbox facade by, when it is not
/// `::inoutbox` (the crate renamed, or re-exported by another crate). A string that is not a path
/// is an error on the string.
pub(crate) fn crate_path(cx: &Ctxt, kv: &KeyValue) -> Option<syn::Path> {
    let lit = lit_str(cx, kv, "\"my_inoutbox\"")?;
    match lit.parse::<syn::Path>() {
        Ok(path) if path.segments.iter().all(|s| s.arguments.is_none()) => Some(path),
        _ => {
            cx.error_spanned_by(
                &lit,
                format!(
                    "`crate` must be the path the inoutbox crate is reachable by, not `{}`: \
                     write e.g. `crate = \"my_inoutbox\"` or `crate = \"::reexport::inoutbox\"`",
                    lit.value()
                ),
            );
            None
        }
    }
}
