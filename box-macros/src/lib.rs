//! Procedural macros of txbox. Use them through the `txbox` crate.

use proc_macro::TokenStream;

/// Placeholder: see the txbox documentation.
#[proc_macro_attribute]
pub fn inbox_handler(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Placeholder: see the txbox documentation.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(item: TokenStream) -> TokenStream {
    let _ = item;
    TokenStream::new()
}
