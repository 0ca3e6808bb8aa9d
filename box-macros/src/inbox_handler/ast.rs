//! The item `#[inbox_handler]` is put on.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{FnArg, GenericArgument, Item, ItemFn, PathArguments, ReturnType, Type, TypePath};

use super::attr::Form;
use crate::ctxt::Ctxt;

/// A function `#[inbox_handler]` was put on (not yet checked).
pub(crate) struct Handler {
    pub(crate) func: ItemFn,
}

impl Handler {
    /// Parses the item; anything but a function with a body is reported and gives `None`.
    pub(crate) fn from_tokens(cx: &Ctxt, tokens: TokenStream) -> Option<Self> {
        let item: Item = match syn::parse2(tokens) {
            Ok(item) => item,
            Err(_) => {
                cx.error_at(Span::call_site(), NOT_A_FN);
                return None;
            }
        };
        let (what, tokens) = match item {
            Item::Fn(func) => return Some(Handler { func }),
            Item::Struct(i) => ("a struct", quote_pair(&i.struct_token, &i.ident)),
            Item::Enum(i) => ("an enum", quote_pair(&i.enum_token, &i.ident)),
            Item::Union(i) => ("a union", quote_pair(&i.union_token, &i.ident)),
            Item::Impl(i) => ("an `impl` block", i.impl_token.to_token_stream()),
            Item::Mod(i) => ("a module", quote_pair(&i.mod_token, &i.ident)),
            Item::Const(i) => ("a const", quote_pair(&i.const_token, &i.ident)),
            Item::Static(i) => ("a static", quote_pair(&i.static_token, &i.ident)),
            Item::Trait(i) => ("a trait", quote_pair(&i.trait_token, &i.ident)),
            Item::Type(i) => ("a type alias", quote_pair(&i.type_token, &i.ident)),
            Item::Use(i) => ("a `use` item", i.use_token.to_token_stream()),
            other => ("this item", first_token(other.to_token_stream())),
        };
        cx.error_spanned_by(
            tokens,
            format!("`#[inbox_handler]` goes on an `async fn`, not on {what}; {NOT_A_FN_HELP}"),
        );
        None
    }

    /// The parameters, receiver included.
    pub(crate) fn inputs(&self) -> impl Iterator<Item = &FnArg> {
        self.func.sig.inputs.iter()
    }

    /// The type of the `index`th parameter, unless it is a receiver.
    pub(crate) fn param_ty(&self, index: usize) -> Option<&Type> {
        match self.func.sig.inputs.iter().nth(index)? {
            FnArg::Typed(typed) => Some(&typed.ty),
            FnArg::Receiver(_) => None,
        }
    }

    /// The referenced type of the `index`th parameter, when it is a reference (`&T`, `&mut T`).
    pub(crate) fn param_referent(&self, index: usize) -> Option<&Type> {
        match self.param_ty(index)? {
            Type::Reference(reference) => Some(&reference.elem),
            _ => None,
        }
    }

    /// The event type: the first parameter's type, or for a batch handler the `E` of its
    /// `events: Vec<E>` (the tokens the user wrote, so that checks on it are reported there).
    pub(crate) fn event_ty(&self, form: Form) -> Option<&Type> {
        let ty = self.param_ty(0)?;
        match form {
            Form::Single => Some(ty),
            Form::Batch => vec_elem(ty),
        }
    }

    /// The metadata type, when there is a third parameter: the `M` of `meta: &M`, or for a
    /// batch handler of `metas: &[M]`.
    pub(crate) fn meta_ty(&self, form: Form) -> Option<&Type> {
        let referent = self.param_referent(2)?;
        match (form, referent) {
            (Form::Single, ty) => Some(ty),
            (Form::Batch, Type::Slice(slice)) => Some(&slice.elem),
            (Form::Batch, _) => None,
        }
    }

    /// The declared return type, if any.
    pub(crate) fn output(&self) -> Option<&Type> {
        match &self.func.sig.output {
            ReturnType::Type(_, ty) => Some(ty),
            ReturnType::Default => None,
        }
    }
}

/// `E` of `Vec<E>` (also written `std::vec::Vec<E>`, ..).
pub(crate) fn vec_elem(ty: &Type) -> Option<&Type> {
    let Type::Path(TypePath {
        qself: None, path, ..
    }) = ty
    else {
        return None;
    };
    let last = path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    if last.ident != "Vec" || args.args.len() != 1 {
        return None;
    }
    match args.args.first()? {
        GenericArgument::Type(elem) => Some(elem),
        _ => None,
    }
}

/// `E` when `ty` is several `E`s, however written: `Vec<E>`, `[E]`, `[E; N]`, or a reference to
/// one of them (`&[E]`, `&Vec<E>`).
pub(crate) fn several_elem(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Reference(reference) => several_elem(&reference.elem),
        Type::Slice(slice) => Some(&slice.elem),
        Type::Array(array) => Some(&array.elem),
        other => vec_elem(other),
    }
}

const NOT_A_FN: &str = "`#[inbox_handler]` goes on an `async fn` with a body, e.g. \
                        `async fn create_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> \
                        Result<(), HandlerError> { .. }`";

const NOT_A_FN_HELP: &str = "write `async fn name(event: OrderCreated, tx: &mut PgTx<'_>) -> \
                             Result<(), HandlerError> { .. }`";

fn quote_pair(a: &impl ToTokens, b: &impl ToTokens) -> TokenStream {
    let mut tokens = a.to_token_stream();
    b.to_tokens(&mut tokens);
    tokens
}

fn first_token(tokens: TokenStream) -> TokenStream {
    tokens.into_iter().next().into_iter().collect()
}
