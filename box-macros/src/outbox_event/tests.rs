//! Unit tests of the parser, the checks and the expansion, on `proc_macro2` tokens.

use proc_macro2::TokenStream;
use quote::quote;

use super::{ast, valid};
use crate::ctxt::Ctxt;

fn errors(input: TokenStream) -> Vec<String> {
    let input: syn::DeriveInput = syn::parse2(input).expect("valid Rust");
    let cx = Ctxt::new();
    let ast = ast::Input::from_syn(&cx, &input);
    valid::check(&cx, &ast);
    match cx.check() {
        Ok(()) => Vec::new(),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
    }
}

fn single_error(input: TokenStream) -> String {
    let errors = errors(input);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    errors.into_iter().next().unwrap_or_default()
}

#[test]
fn accepts_every_key() {
    let input = quote! {
        #[outbox(event_type = "OrderCreated", topic = "orders", key = order_id,
                 aggregate_type = "Order", aggregate_id = order_id)]
        struct OrderCreated { order_id: u64 }
    };
    assert_eq!(errors(input), Vec::<String>::new());
}

#[test]
fn accepts_a_unit_struct_without_key() {
    let input = quote!(
        #[outbox(event_type = "Ping", topic = "ops")]
        struct Ping;
    );
    assert_eq!(errors(input), Vec::<String>::new());
}

#[test]
fn key_naming_no_field_lists_the_fields() {
    let message = single_error(quote! {
        #[outbox(event_type = "A", topic = "t", key = order)]
        struct A { order_id: u64, total: i64 }
    });
    assert_eq!(
        message,
        "`key = order` names no field; expected one of the fields of `A`: `order_id`, `total`"
    );
}

#[test]
fn unknown_key_lists_the_valid_keys() {
    let message = single_error(quote! {
        #[outbox(event_type = "A", topic = "t", partition = x)]
        struct A { x: u64 }
    });
    assert_eq!(
        message,
        "unknown key `partition` in `#[outbox(...)]`; expected one of: `event_type`, `topic`, \
         `key`, `aggregate_type`, `aggregate_id`, `idempotency_key`, `crate`"
    );
}

#[test]
fn missing_and_rejected_keys_are_not_reported_twice() {
    let message = single_error(quote!(
        #[outbox(topic = "t")]
        struct A {
            x: u64,
        }
    ));
    assert!(
        message.starts_with("missing `event_type` in `#[outbox(...)]`"),
        "{message}"
    );
    // A rejected value is one error, not also "missing".
    let message = single_error(quote!(
        #[outbox(event_type = A, topic = "t")]
        struct A {
            x: u64,
        }
    ));
    assert!(
        message.starts_with("expected a string literal for `event_type`"),
        "{message}"
    );
}

#[test]
fn shapes_without_a_meaning_are_rejected() {
    for (input, expected) in [
        (
            quote!(
                #[outbox(event_type = "A", topic = "t")]
                enum A {
                    B,
                }
            ),
            "`#[derive(OutboxEvent)]` cannot be used on an enum",
        ),
        (
            quote!(#[outbox(event_type = "A", topic = "t")] union A { b: u8 }),
            "`#[derive(OutboxEvent)]` cannot be used on a union",
        ),
        (
            quote!(
                #[outbox(event_type = "A", topic = "t")]
                struct A(u64);
            ),
            "`#[derive(OutboxEvent)]` needs named fields",
        ),
        (
            quote!(
                #[outbox(event_type = "A", topic = "t")]
                struct A<T> {
                    x: T,
                }
            ),
            "`#[derive(OutboxEvent)]` does not support generic parameters",
        ),
        (
            quote!(
                struct A {
                    x: u64,
                }
            ),
            "`#[derive(OutboxEvent)]` needs an `#[outbox(...)]`",
        ),
    ] {
        let message = single_error(input.clone());
        assert!(message.starts_with(expected), "{input}\n  gave: {message}");
    }
}

#[test]
fn every_mistake_is_reported_in_one_pass() {
    let errors = errors(quote! {
        #[outbox(event_type = "", topic = "t", key = id, retries = 3)]
        struct A { order_id: u64 }
    });
    assert_eq!(errors.len(), 3, "{errors:#?}");
}

#[test]
fn expansion_implements_the_trait_through_the_facade() {
    let out = super::derive(quote! {
        #[outbox(event_type = "OrderCreated", topic = "orders", key = order_id)]
        struct OrderCreated { order_id: u64 }
    })
    .to_string();
    for expected in [
        "const _ : () =",
        "impl :: inoutbox :: __private :: OutboxEvent for OrderCreated",
        "const EVENT_TYPE : & 'static str = \"OrderCreated\"",
        "const TOPIC : & 'static str = \"orders\"",
        "< u64 as __inoutbox_Key > :: CHECK",
        ":: inoutbox :: __private :: Probe :: < u64 > :: key_string (& self . order_id)",
    ] {
        assert!(out.contains(expected), "missing `{expected}` in {out}");
    }
}

#[test]
fn an_error_emits_a_placeholder_impl_so_uses_of_the_type_stay_quiet() {
    let out = super::derive(quote! {
        #[outbox(event_type = "A", topic = "t", key = nope)]
        struct A { x: u64 }
    })
    .to_string();
    assert!(out.contains("compile_error"), "{out}");
    assert!(
        out.contains("const EVENT_TYPE : & 'static str = \"\""),
        "{out}"
    );
    // No placeholder where it could not compile.
    let out = super::derive(quote!(#[outbox(event_type = "A", topic = "t")] union A { x: u8 }));
    assert!(!out.to_string().contains("impl"), "{out}");
}

#[test]
fn a_key_meant_for_the_handler_suggests_the_derive_key() {
    let message = single_error(quote! {
        #[outbox(event = "A", topic = "t")]
        struct A { x: u64 }
    });
    assert_eq!(
        message,
        "unknown key `event` in `#[outbox(...)]`; did you mean `event_type`?"
    );
}

#[test]
fn a_keyword_field_is_named_by_its_raw_identifier() {
    let message = single_error(quote! {
        #[outbox(event_type = "A", topic = "t", key = type)]
        struct A { r#type: String }
    });
    assert_eq!(
        message,
        "`type` is a keyword: to name the field `r#type`, write `key = r#type`"
    );
    assert_eq!(
        errors(quote! {
            #[outbox(event_type = "A", topic = "t", key = r#type)]
            struct A { r#type: String }
        }),
        Vec::<String>::new()
    );
}

#[test]
fn kafka_reserved_topics_are_rejected() {
    for topic in [".", ".."] {
        let message = single_error(quote! {
            #[outbox(event_type = "A", topic = #topic)]
            struct A { x: u64 }
        });
        assert_eq!(
            message,
            format!(
                "`topic = \"{topic}\"` is not a topic Kafka accepts: `.` and `..` are reserved; \
                 use a name, e.g. `topic = \"orders\"`"
            )
        );
    }
}

#[test]
fn key_on_a_field_is_the_key() {
    let input = quote! {
        #[outbox(event_type = "A", topic = "t")]
        struct A { #[outbox(aggregate_id)] order_id: u64, #[outbox(key)] customer: String }
    };
    assert_eq!(errors(input.clone()), Vec::<String>::new());
    let out = super::derive(input).to_string();
    assert!(
        out.contains("Probe :: < String > :: key_string (& self . customer)"),
        "{out}"
    );
    assert!(
        out.contains("Probe :: < u64 > :: key_string (& self . order_id)"),
        "{out}"
    );
}

#[test]
fn key_on_a_field_and_on_the_struct_must_agree() {
    // The same field by both forms is fine.
    assert_eq!(
        errors(quote! {
            #[outbox(event_type = "A", topic = "t", key = a)]
            struct A { #[outbox(key)] a: u64 }
        }),
        Vec::<String>::new()
    );
    let message = single_error(quote! {
        #[outbox(event_type = "A", topic = "t", key = a)]
        struct A { a: u64, #[outbox(key)] b: u64 }
    });
    assert_eq!(
        message,
        "`key` is given twice: `key = a` on the struct and `#[outbox(key)]` on `b`; keep one"
    );
    let message = single_error(quote! {
        #[outbox(event_type = "A", topic = "t")]
        struct A { #[outbox(key)] a: u64, #[outbox(key)] b: u64 }
    });
    assert_eq!(
        message,
        "`#[outbox(key)]` is on two fields, `a` and `b`: an event has one key; keep one"
    );
}

#[test]
fn other_field_attributes_are_errors() {
    for (field_attr, expected) in [
        (
            quote!(#[outbox(partition)]),
            "unknown key `partition` in a field's `#[outbox(...)]`; expected one of: `key`, \
             `aggregate_id`, `idempotency_key`",
        ),
        (
            quote!(#[outbox(key = a)]),
            "on a field, `key` takes no value: write `#[outbox(key)]` on the field, or \
             `key = field` in the `#[outbox(...)]` on the struct",
        ),
        (
            quote!(#[outbox]),
            "on a field, write `#[outbox(key)]` (the message key) or `#[outbox(aggregate_id)]`",
        ),
        (
            quote!(#[outbox(event_type = "B")]),
            "`event_type` goes in the `#[outbox(...)]` on the struct, not on a field; on a \
             field, write `#[outbox(key)]` or `#[outbox(aggregate_id)]`",
        ),
    ] {
        let message = single_error(quote! {
            #[outbox(event_type = "A", topic = "t")]
            struct A { #field_attr a: u64 }
        });
        assert_eq!(message, expected);
    }
}

#[test]
fn a_struct_key_written_on_a_field_is_not_also_missing() {
    let message = single_error(quote! {
        #[outbox(event_type = "A")]
        struct A { #[outbox(topic = "t")] a: u64 }
    });
    assert!(
        message.starts_with("`topic` goes in the `#[outbox(...)]` on the struct"),
        "{message}"
    );
}

#[test]
fn a_bare_key_on_the_struct_points_to_both_forms() {
    let message = single_error(quote! {
        #[outbox(event_type = "A", topic = "t", key)]
        struct A { a: u64 }
    });
    assert_eq!(
        message,
        "`key` names a field: write `key = order_id`, or put `#[outbox(key)]` on the field"
    );
}

#[test]
fn crate_path_replaces_inoutbox_in_the_expansion() {
    let out = super::derive(quote! {
        #[outbox(event_type = "A", topic = "t", key = x, crate = "my_inoutbox")]
        struct A { x: u64 }
    })
    .to_string();
    assert!(
        out.contains("impl my_inoutbox :: __private :: OutboxEvent for A"),
        "{out}"
    );
    assert!(
        !out.contains(":: inoutbox"),
        "names `::inoutbox` despite `crate`: {out}"
    );
}
