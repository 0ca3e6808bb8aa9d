//! `#[inbox_handler]`: parse ([`attr`], [`ast`]) -> check ([`valid`]) -> generate ([`expand`]).

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro2::TokenStream;

use crate::ctxt::Ctxt;

/// Expands the attribute. On any error the item is emitted unchanged next to the errors, and no
/// registration is generated, so the errors are the only ones a build reports.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let attr = attr::HandlerAttr::from_tokens(&cx, args);
    let handler = ast::Handler::from_tokens(&cx, item.clone());
    if let Some(handler) = &handler {
        valid::check(&cx, handler, &attr);
    }
    match (cx.check(), handler) {
        (Ok(()), Some(handler)) => expand::handler(&attr, &handler),
        (Err(error), _) => {
            let mut out = item;
            out.extend(error.to_compile_error());
            out
        }
        // `from_tokens` reports why it returned `None`, so this arm is not reached.
        (Ok(()), None) => item,
    }
}

#[cfg(test)]
mod tests;
