//! The error-collecting context: every check reports into it, so a user sees all mistakes of one
//! macro invocation in one build (the `serde_derive::internals::ctxt` pattern).

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use quote::ToTokens;

/// Collects errors while an invocation is parsed and checked.
///
/// It must be consumed by [`Ctxt::check`]: dropping it unchecked panics, so an error reported
/// into it cannot be lost. As `check` takes it by value, nothing can report into it afterwards.
pub(crate) struct Ctxt {
    /// `None` once checked, which is what the drop guard looks at.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    /// An empty context. It has no errors, but must still be `check`ed.
    pub(crate) fn new() -> Self {
        Self {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error on the tokens of `tokens` (first to last token).
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&self, tokens: T, message: M) {
        self.push(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    /// An error at one span.
    pub(crate) fn error_at<M: Display>(&self, span: proc_macro2::Span, message: M) {
        self.push(syn::Error::new(span, message));
    }

    /// An error from syn (a parse error).
    pub(crate) fn syn_error(&self, error: syn::Error) {
        self.push(error);
    }

    fn push(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("`check` consumes the context, so it is not checked yet")
            .push(error);
    }

    /// Every error reported, combined into one in the order reported, or `Ok` when there was
    /// none.
    pub(crate) fn check(self) -> Result<(), syn::Error> {
        let errors = self
            .errors
            .borrow_mut()
            .take()
            .expect("`check` consumes the context, so it runs once");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        // While a panic unwinds, a second one would abort and hide the first.
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::Span;
    use quote::quote;

    use super::Ctxt;

    #[test]
    #[should_panic(expected = "forgot to check for errors")]
    fn dropping_an_unchecked_context_panics() {
        let cx = Ctxt::new();
        drop(cx);
    }

    #[test]
    #[should_panic(expected = "forgot to check for errors")]
    fn dropping_an_unchecked_context_with_errors_panics() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "lost");
        drop(cx);
    }

    #[test]
    #[should_panic(expected = "a bug elsewhere")]
    fn a_panic_elsewhere_is_not_turned_into_a_double_panic() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "never checked");
        // Unwinding drops `cx` unchecked; without the guard the process would abort.
        panic!("a bug elsewhere");
    }

    #[test]
    fn a_checked_context_without_errors_is_ok() {
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    fn a_checked_context_combines_its_errors_in_order() {
        let cx = Ctxt::new();
        cx.error_spanned_by(quote!(a b), "first");
        cx.error_at(Span::call_site(), "second");
        cx.syn_error(syn::Error::new(Span::call_site(), "third"));
        cx.error_spanned_by(quote!(c), "fourth");
        let error = cx.check().expect_err("four errors were reported");
        let messages: Vec<String> = error.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages, ["first", "second", "third", "fourth"]);
    }
}
