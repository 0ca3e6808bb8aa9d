//! The derive input, reduced to what the checks and the expansion need.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{Data, DeriveInput, Fields, Generics, Ident};

use super::attr::Attrs;
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
    /// `struct S { a: A, .. }`: the field names.
    Named(Vec<Ident>),
    /// `struct S;`
    Unit,
    /// `struct S(A, ..);`: the parenthesised fields.
    Tuple(TokenStream),
    /// `enum E { .. }`: the `enum` keyword, and the variant names.
    Enum(TokenStream, Vec<Ident>),
    /// `union U { .. }`: the `union` keyword.
    Union(TokenStream),
}

impl Input {
    pub(crate) fn from_syn(cx: &Ctxt, input: &DeriveInput) -> Self {
        let shape = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => {
                    Shape::Named(named.named.iter().filter_map(|f| f.ident.clone()).collect())
                }
                Fields::Unit => Shape::Unit,
                Fields::Unnamed(unnamed) => Shape::Tuple(unnamed.to_token_stream()),
            },
            Data::Enum(data) => Shape::Enum(
                data.enum_token.to_token_stream(),
                data.variants.iter().map(|v| v.ident.clone()).collect(),
            ),
            Data::Union(data) => Shape::Union(data.union_token.to_token_stream()),
        };
        Input {
            ident: input.ident.clone(),
            generics: input.generics.clone(),
            shape,
            attrs: Attrs::from_attrs(cx, &input.attrs),
        }
    }

    /// Whether the placeholder impl emitted after an error would itself compile.
    pub(crate) fn can_hold_fallback(&self) -> bool {
        !matches!(self.shape, Shape::Union(_)) && self.generics.params.is_empty()
    }
}
