//! Checks of a parsed derive input. Each error sits on the tokens it is about.

use quote::ToTokens;
use syn::Ident;

use super::ast::{Input, Shape};
use super::attr::{self, AGGREGATE_ID, EVENT_TYPE, EXAMPLE, IDEMPOTENCY_KEY, KEY, TOPIC};
use crate::ctxt::Ctxt;
use crate::names;

pub(crate) fn check(cx: &Ctxt, input: &Input) {
    check_shape(cx, input);
    check_generics(cx, input);
    check_required(cx, input);
    check_names(cx, input);
    check_fields(cx, input, KEY, input.attrs.key.as_ref());
    check_fields(cx, input, AGGREGATE_ID, input.attrs.aggregate_id.as_ref());
    check_field_flags(cx, input, KEY, input.attrs.key.as_ref());
    check_field_flags(cx, input, AGGREGATE_ID, input.attrs.aggregate_id.as_ref());
    let idempotency_key = input.attrs.idempotency_key.as_ref();
    check_fields(cx, input, IDEMPOTENCY_KEY, idempotency_key);
    check_field_flags(cx, input, IDEMPOTENCY_KEY, idempotency_key);
}

fn check_shape(cx: &Ctxt, input: &Input) {
    let ident = &input.ident;
    match &input.shape {
        Shape::Named(_) | Shape::Unit => {}
        Shape::Tuple(fields) => cx.error_spanned_by(
            fields,
            format!(
                "`#[derive(OutboxEvent)]` needs named fields, so that `key = ...` can name one; \
                 write `struct {ident} {{ name: Type, .. }}` instead of a tuple struct"
            ),
        ),
        Shape::Enum(token, variants) => {
            let example = match variants.as_slice() {
                [] => String::new(),
                [first, ..] => {
                    format!(", e.g. `struct {first} {{ .. }}` with its own `#[outbox(...)]`")
                }
            };
            cx.error_spanned_by(
                token,
                format!(
                    "`#[derive(OutboxEvent)]` cannot be used on an enum: an event is one struct \
                     with one `event_type`; declare one struct per event type instead of the \
                     variants of `{ident}`{example}"
                ),
            )
        }
        Shape::Union(token) => cx.error_spanned_by(
            token,
            "`#[derive(OutboxEvent)]` cannot be used on a union: an event is serialized with \
             serde, which does not support unions; use a struct with named fields",
        ),
    }
}

fn check_generics(cx: &Ctxt, input: &Input) {
    let generics = &input.generics;
    if generics.params.is_empty() && generics.where_clause.is_none() {
        return;
    }
    let tokens = if generics.params.is_empty() {
        generics.where_clause.to_token_stream()
    } else {
        let (lt, params, gt) = (&generics.lt_token, &generics.params, &generics.gt_token);
        quote::quote!(#lt #params #gt)
    };
    cx.error_spanned_by(
        tokens,
        format!(
            "`#[derive(OutboxEvent)]` does not support generic parameters: one event type has \
             one `event_type` and one payload shape; remove the parameters and name concrete \
             field types in `{}`",
            input.ident
        ),
    );
}

fn check_required(cx: &Ctxt, input: &Input) {
    let attrs = &input.attrs;
    let missing: Vec<&str> = [
        (EVENT_TYPE, attrs.event_type.is_none()),
        (TOPIC, attrs.topic.is_none()),
    ]
    .into_iter()
    .filter_map(|(key, missing)| (missing && !attrs.seen.contains(&key)).then_some(key))
    .collect();
    if missing.is_empty() || attrs.broken {
        return;
    }
    let list: Vec<String> = missing.iter().map(|k| format!("`{k}`")).collect();
    let list = list.join(" and ");
    match &attrs.attr {
        Some(attr) => cx.error_spanned_by(
            attr,
            format!("missing {list} in `#[outbox(...)]`; write e.g. `{EXAMPLE}`"),
        ),
        None => cx.error_spanned_by(
            &input.ident,
            format!(
                "`#[derive(OutboxEvent)]` needs an `#[outbox(...)]` attribute: add `{EXAMPLE}`"
            ),
        ),
    }
}

fn check_names(cx: &Ctxt, input: &Input) {
    let attrs = &input.attrs;
    for (key, lit, example) in [
        (EVENT_TYPE, &attrs.event_type, "OrderCreated"),
        (TOPIC, &attrs.topic, "orders"),
        (attr::AGGREGATE_TYPE, &attrs.aggregate_type, "Order"),
    ] {
        if let Some(lit) = lit {
            if let Some(message) = names::invalid_name(key, &lit.value(), example) {
                cx.error_spanned_by(lit, message);
            } else if key == TOPIC && matches!(lit.value().as_str(), "." | "..") {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "`topic = \"{}\"` is not a topic Kafka accepts: `.` and `..` are \
                         reserved; use a name, e.g. `topic = \"orders\"`",
                        lit.value()
                    ),
                );
            }
        }
    }
}

fn check_fields(cx: &Ctxt, input: &Input, key: &str, field: Option<&Ident>) {
    let Some(field) = field else { return };
    let ident = &input.ident;
    match &input.shape {
        Shape::Named(fields) => {
            if fields.iter().any(|f| f.ident == *field) {
                return;
            }
            let list: Vec<String> = fields.iter().map(|f| format!("`{}`", f.ident)).collect();
            let expected = if list.is_empty() {
                format!("`{ident}` has no fields; remove `{key}`")
            } else {
                format!(
                    "expected one of the fields of `{ident}`: {}",
                    list.join(", ")
                )
            };
            cx.error_spanned_by(
                field,
                format!("`{key} = {field}` names no field; {expected}"),
            );
        }
        Shape::Unit => cx.error_spanned_by(
            field,
            format!("`{ident}` is a unit struct and has no fields; remove `{key} = {field}`"),
        ),
        // The shape error says what to do.
        Shape::Tuple(_) | Shape::Enum(..) | Shape::Union(_) => {}
    }
}

/// A field's `#[outbox(key)]` (or `#[outbox(aggregate_id)]`): on one field at most, and naming
/// the same field as `key = field` on the struct when both are written.
fn check_field_flags(cx: &Ctxt, input: &Input, key: &str, by_name: Option<&Ident>) {
    let flagged: Vec<(&Ident, &Ident)> = input
        .fields()
        .iter()
        .filter_map(|f| Some((&f.ident, f.flags.get(key)?)))
        .collect();
    if let [(first, _), rest @ ..] = flagged.as_slice() {
        for (field, flag) in rest {
            cx.error_spanned_by(
                flag,
                format!(
                    "`#[outbox({key})]` is on two fields, `{first}` and `{field}`: an event has \
                     one {}; keep one",
                    match key {
                        KEY => "key",
                        AGGREGATE_ID => "aggregate id",
                        _ => "idempotency key",
                    }
                ),
            );
        }
    }
    let Some(name) = by_name else { return };
    for (field, flag) in &flagged {
        if *field != name {
            cx.error_spanned_by(
                flag,
                format!(
                    "`{key}` is given twice: `{key} = {name}` on the struct and \
                     `#[outbox({key})]` on `{field}`; keep one"
                ),
            );
        }
    }
}
