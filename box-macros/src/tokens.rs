//! Printing and re-spanning tokens for messages and generated code.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::ToTokens;

/// Tokens as a human writes them, for messages: `PgTx<'_>`, `&mut PgTx<'_>`,
/// `Vec<(String, Vec<u8>)>`, `Box<dyn Error + Send>`, never `PgTx < '_ >`.
pub(crate) fn compact(tokens: &impl ToTokens) -> String {
    let mut out = String::new();
    write_stream(&mut out, tokens.to_token_stream());
    out
}

fn write_stream(out: &mut String, tokens: TokenStream) {
    // What the previous token was, to decide on a space before the next one.
    let mut prev = Prev::Start;
    for tt in tokens {
        match &tt {
            TokenTree::Group(group) => {
                if prev == Prev::Word && group.delimiter() == Delimiter::Brace {
                    out.push(' ');
                }
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                write_stream(out, group.stream());
                out.push_str(close);
                prev = Prev::Close;
            }
            TokenTree::Ident(_) | TokenTree::Literal(_) => {
                if matches!(prev, Prev::Word | Prev::Close | Prev::SpaceAfter) && !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(&tt.to_string());
                prev = Prev::Word;
            }
            TokenTree::Punct(punct) => {
                let c = punct.as_char();
                match c {
                    // Spaced on both sides: `A + B`, `Item = u8`, `-> T`.
                    '+' | '=' => {
                        out.push(' ');
                        out.push(c);
                        prev = Prev::SpaceAfter;
                    }
                    '-' if punct.spacing() == proc_macro2::Spacing::Joint => {
                        out.push_str(" -");
                        prev = Prev::Glued;
                    }
                    '>' if prev == Prev::Glued && out.ends_with('-') => {
                        out.push('>');
                        prev = Prev::SpaceAfter;
                    }
                    // Followed by a space: `A, B`, `[u8; 4]`.
                    ',' | ';' => {
                        out.push(c);
                        prev = Prev::SpaceAfter;
                    }
                    // A lifetime's quote, `&`, `*`, `::`, `<`, `?`: glued to what follows.
                    _ => {
                        if prev == Prev::SpaceAfter && !out.ends_with(' ') {
                            out.push(' ');
                        }
                        out.push(c);
                        prev = if c == '>' { Prev::Close } else { Prev::Glued };
                    }
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Prev {
    Start,
    /// An identifier or literal: another one needs a space (`mut T`, `dyn Error`).
    Word,
    /// A closing `>` or group: a following word needs a space (`for<'a> fn`).
    Close,
    /// Glued to the next token (`&`, `'`, `::`, `<`).
    Glued,
    /// `,`, `;`, `+`, `=`, `->`: the next token follows a space.
    SpaceAfter,
}

/// The same tokens with every span set to `span`, so that an error rustc reports on them
/// points at `span` (e.g. at `key = order_id` in the attribute rather than at the field).
pub(crate) fn respan(tokens: impl ToTokens, span: Span) -> TokenStream {
    tokens
        .into_token_stream()
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(group) => {
                let mut new =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                TokenTree::Group(new)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::compact;

    fn ty(source: &str) -> String {
        compact(&syn::parse_str::<syn::Type>(source).expect("a type"))
    }

    #[test]
    fn prints_types_without_token_spacing() {
        for source in [
            "PgTx<'_>",
            "&mut PgTx<'_>",
            "&'a mut sqlx::PgConnection",
            "Vec<(String, Vec<u8>)>",
            "Result<(), Box<dyn std::error::Error + Send + Sync>>",
            "[u8; 4]",
            "*const u8",
            "impl Iterator<Item = u8> + Send",
            "fn(u8) -> u8",
            "for<'a> fn(&'a u8)",
            "<T as Trait>::Assoc",
            "Box<dyn Fn() -> u8 + ?Sized>",
            "()",
            "!",
            "r#type",
        ] {
            assert_eq!(ty(source), source);
        }
    }
}
