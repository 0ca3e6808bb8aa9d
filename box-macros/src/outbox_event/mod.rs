//! `#[derive(OutboxEvent)]`: parse ([`ast`], [`attr`]) -> check ([`valid`]) -> generate
//! ([`expand`]).

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro2::TokenStream;

use crate::ctxt::Ctxt;

/// Expands the derive. Errors come out as `compile_error!` plus, where possible, a placeholder
/// impl, so that code using the type reports nothing else.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: syn::DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let cx = Ctxt::new();
    let ast = ast::Input::from_syn(&cx, &input);
    valid::check(&cx, &ast);
    match cx.check() {
        Ok(()) => expand::impl_outbox_event(&ast),
        Err(error) => {
            let mut out = error.to_compile_error();
            out.extend(expand::fallback(&ast));
            out
        }
    }
}

#[cfg(test)]
mod tests;
