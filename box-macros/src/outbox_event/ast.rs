//! The derive input, reduced to what the checks and the expansion need.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{Data, DeriveInput, Fields, Generics, Ident, Type};

use super::attr::{self, Attrs, FieldFlags};
use crate::ctxt::Ctxt;

/// A type `#[derive(OutboxEvent)]` was put on.
pub(crate) struct Input {
    pub(crate) ident: Ident,
    pub(crate) generics: Generics,
    pub(crate) shape: Shape,
    pub(crate) attrs: Attrs,
}

/// The shape of the type; unsupported shapes keep the tokens their error points at.
pub(crate) enum Shape {
    /// `struct S { a: A, .. }`: the fields.
    Named(Vec<Field>),
    /// `struct S;`
    Unit,
    /// `struct S(A, ..);`: the parenthesised fields.
    Tuple(TokenStream),
    /// `enum E { .. }`: the `enum` keyword, and the variant names.
    Enum(TokenStream, Vec<Ident>),
    /// `union U { .. }`: the `union` keyword.
    Union(TokenStream),
}

/// A named field, with what its own `#[outbox(...)]` says.
pub(crate) struct Field {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
    pub(crate) flags: FieldFlags,
}

/// The field a key (`key` or `aggregate_id`) names, by either form.
pub(crate) struct KeyField<'a> {
    pub(crate) field: &'a Field,
    /// Where an error about the key goes: the field name in `key = order_id`, or `key` in the
    /// field's `#[outbox(key)]`.
    pub(crate) span: Span,
    /// The form written, for messages: `key = order_id` or `#[outbox(key)]`.
    pub(crate) written: String,
}

impl Input {
    pub(crate) fn from_syn(cx: &Ctxt, input: &DeriveInput) -> Self {
        let shape = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => Shape::Named(
                    named
                        .named
                        .iter()
                        .filter_map(|f| {
                            Some(Field {
                                ident: f.ident.clone()?,
                                ty: f.ty.clone(),
                                flags: FieldFlags::from_attrs(cx, &f.attrs),
                            })
                        })
                        .collect(),
                ),
                Fields::Unit => Shape::Unit,
                Fields::Unnamed(unnamed) => Shape::Tuple(unnamed.to_token_stream()),
            },
            Data::Enum(data) => Shape::Enum(
                data.enum_token.to_token_stream(),
                data.variants.iter().map(|v| v.ident.clone()).collect(),
            ),
            Data::Union(data) => Shape::Union(data.union_token.to_token_stream()),
        };
        let mut attrs = Attrs::from_attrs(cx, &input.attrs);
        if let Shape::Named(fields) = &shape {
            // A struct key written on a field is reported there, not also as missing.
            for field in fields {
                attrs.seen.extend(field.flags.misplaced.iter().copied());
            }
        }
        Input {
            ident: input.ident.clone(),
            generics: input.generics.clone(),
            shape,
            attrs,
        }
    }

    /// Whether the placeholder impl emitted after an error would itself compile.
    pub(crate) fn can_hold_fallback(&self) -> bool {
        !matches!(self.shape, Shape::Union(_)) && self.generics.params.is_empty()
    }

    /// The named fields (none for other shapes).
    pub(crate) fn fields(&self) -> &[Field] {
        match &self.shape {
            Shape::Named(fields) => fields,
            _ => &[],
        }
    }

    /// The field `key` (`attr::KEY` or `attr::AGGREGATE_ID`) names: by `key = field` on the
    /// struct, else by `#[outbox(key)]` on a field. `None` when neither names an existing field.
    pub(crate) fn key_field(&self, key: &str) -> Option<KeyField<'_>> {
        let by_name = match key {
            attr::KEY => self.attrs.key.as_ref(),
            attr::AGGREGATE_ID => self.attrs.aggregate_id.as_ref(),
            _ => self.attrs.idempotency_key.as_ref(),
        };
        if let Some(name) = by_name {
            let field = self.fields().iter().find(|f| f.ident == *name)?;
            return Some(KeyField {
                field,
                span: name.span(),
                written: format!("{key} = {name}"),
            });
        }
        self.fields().iter().find_map(|field| {
            let flag = field.flags.get(key)?;
            Some(KeyField {
                field,
                span: flag.span(),
                written: format!("#[outbox({key})]"),
            })
        })
    }
}
