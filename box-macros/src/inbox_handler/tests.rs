//! Unit tests of the parser, the checks and the expansion, on `proc_macro2` tokens.

use proc_macro2::TokenStream;
use quote::quote;

use super::{ast, attr, valid};
use crate::ctxt::Ctxt;

/// The messages `#[inbox_handler(args)]` on `item` reports, in order.
fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
    let cx = Ctxt::new();
    let attr = attr::HandlerAttr::from_tokens(&cx, args);
    if let Some(handler) = ast::Handler::from_tokens(&cx, item) {
        valid::check(&cx, &handler, &attr);
    }
    match cx.check() {
        Ok(()) => Vec::new(),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
    }
}

fn good_args() -> TokenStream {
    quote!(event = "OrderCreated", group = "billing")
}

fn good_fn() -> TokenStream {
    quote! {
        async fn create_invoice(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
            Ok(())
        }
    }
}

fn single_error(args: TokenStream, item: TokenStream) -> String {
    let errors = errors(args, item);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    errors.into_iter().next().unwrap_or_default()
}

#[test]
fn accepts_a_well_formed_handler() {
    assert_eq!(errors(good_args(), good_fn()), Vec::<String>::new());
}

#[test]
fn accepts_the_metadata_parameter() {
    let item = quote! {
        async fn h(e: E, tx: &mut PgTx<'_>, meta: &MessageMeta) -> anyhow::Result<()> { Ok(()) }
    };
    assert_eq!(errors(good_args(), item), Vec::<String>::new());
}

#[test]
fn reads_event_and_group() {
    let cx = Ctxt::new();
    let attr = attr::HandlerAttr::from_tokens(&cx, good_args());
    assert!(cx.check().is_ok());
    assert_eq!(
        attr.event.map(|l| l.value()).as_deref(),
        Some("OrderCreated")
    );
    assert_eq!(attr.group.map(|l| l.value()).as_deref(), Some("billing"));
}

#[test]
fn missing_keys_are_named() {
    let message = single_error(quote!(group = "billing"), good_fn());
    assert!(message.starts_with("missing `event`"), "{message}");
    let message = single_error(quote!(), good_fn());
    assert!(
        message.starts_with("missing `event` and `group`"),
        "{message}"
    );
}

#[test]
fn unknown_key_lists_the_valid_keys() {
    let message = single_error(quote!(event = "A", group = "b", topic = "t"), good_fn());
    assert_eq!(
        message,
        "unknown key `topic` in `#[inbox_handler(...)]`; expected one of: `event`, `group`, `batch`, \
         `dedup_by`, `dedup_scope`, `mode`, `ordered`, `stores`, `crate`"
    );
}

#[test]
fn duplicate_key_is_reported_once() {
    let message = single_error(quote!(event = "A", group = "b", group = "c"), good_fn());
    assert_eq!(message, "`group` is given twice; keep one");
}

#[test]
fn wrong_value_kind_shows_the_expected_form() {
    let message = single_error(quote!(event = "A", group = 3), good_fn());
    assert_eq!(
        message,
        "expected a string literal for `group`, e.g. `group = \"billing\"`"
    );
}

#[test]
fn names_are_validated() {
    let message = single_error(quote!(event = "A", group = ""), good_fn());
    assert!(message.starts_with("`group` is empty"), "{message}");
    let message = single_error(quote!(event = "Order Created", group = "b"), good_fn());
    assert!(message.contains("contains a space"), "{message}");
    assert!(
        message.contains("ASCII letters, digits, `.`, `_` and `-`"),
        "{message}"
    );
}

#[test]
fn signature_mistakes_of_the_function() {
    let cases = [
        (
            quote!(
                fn h(e: E, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
                    Ok(())
                }
            ),
            "an inbox handler must be an `async fn`",
        ),
        (
            quote!(
                async fn h(&self, e: E, tx: &mut PgTx<'_>) -> Result<(), X> {
                    Ok(())
                }
            ),
            "an inbox handler cannot take `self`",
        ),
        (
            quote!(
                async fn h<T>(e: T, tx: &mut PgTx<'_>) -> Result<(), X> {
                    Ok(())
                }
            ),
            "an inbox handler cannot be generic",
        ),
        (
            quote!(
                async fn h() -> Result<(), X> {
                    Ok(())
                }
            ),
            "an inbox handler takes the event",
        ),
    ];
    for (item, expected) in cases {
        let message = single_error(good_args(), item.clone());
        assert!(
            message.starts_with(expected),
            "{item}\n  gave: {message}\n  want: {expected}"
        );
    }
}

#[test]
fn signature_mistakes_of_the_parameters_and_return_type() {
    let cases = [
        (
            quote!(
                async fn h(e: E) -> Result<(), X> {
                    Ok(())
                }
            ),
            "missing the transaction",
        ),
        (
            quote!(
                async fn h(e: E, tx: &mut T, m: &M, x: u8) -> Result<(), X> {
                    Ok(())
                }
            ),
            "too many parameters",
        ),
        (
            quote!(
                async fn h(e: &E, tx: &mut PgTx<'_>) -> Result<(), X> {
                    Ok(())
                }
            ),
            "the event is passed by value: write `event: E` without `&`",
        ),
        (
            quote!(
                async fn h(e: E, tx: PgTx<'_>) -> Result<(), X> {
                    Ok(())
                }
            ),
            "the transaction is passed by mutable reference",
        ),
        (
            quote!(
                async fn h(e: E, tx: &mut T, m: MessageMeta) -> Result<(), X> {
                    Ok(())
                }
            ),
            "the metadata is passed by shared reference",
        ),
        (
            quote!(
                async fn h(e: E, tx: &mut T) {}
            ),
            "an inbox handler returns `Result<(), E>`",
        ),
        (
            quote!(
                async fn h(e: E, tx: &mut T) -> () {}
            ),
            "an inbox handler returns `Result<(), E>`, not `()`",
        ),
        (
            quote!(
                struct S;
            ),
            "`#[inbox_handler]` goes on an `async fn`, not on a struct",
        ),
    ];
    for (item, expected) in cases {
        let message = single_error(good_args(), item.clone());
        assert!(
            message.starts_with(expected),
            "{item}\n  gave: {message}\n  want: {expected}"
        );
    }
}

#[test]
fn every_mistake_is_reported_in_one_pass() {
    let errors = errors(
        quote!(event = "", group = "b", retries = 3),
        quote!(
            fn h(e: E, tx: &mut PgTx<'_>) -> Result<(), X> {
                Ok(())
            }
        ),
    );
    assert_eq!(errors.len(), 3, "{errors:#?}");
}

#[test]
fn an_error_keeps_the_item_and_generates_no_registration() {
    let item = quote!(
        fn create_invoice(e: E, tx: &mut T) -> Result<(), X> {
            Ok(())
        }
    );
    let out = super::expand(good_args(), item.clone()).to_string();
    assert!(out.starts_with(&item.to_string()), "{out}");
    assert!(out.contains("compile_error"), "{out}");
    assert!(!out.contains("submit"), "{out}");
}

#[test]
fn expansion_registers_through_the_facade_only() {
    let out = super::expand(good_args(), good_fn()).to_string();
    assert!(
        out.starts_with(&good_fn().to_string()),
        "the function is kept as written: {out}"
    );
    for expected in [
        "const __inoutbox_register_create_invoice : () =",
        ":: inoutbox :: __private :: inventory :: submit !",
        ":: inoutbox :: __private :: HandlerRegistration :: new",
        // The event and return types are named once each by an alias, and then by it (the
        // event check names the type as written: see `checks`).
        "type __inoutbox_Event = OrderCreated ;",
        "type __inoutbox_Output = Result < () , HandlerError > ;",
        ":: inoutbox :: __private :: Probe :: < __inoutbox_Event > :: decode",
        "< OrderCreated as __inoutbox_InboxEvent > :: CHECK",
        "impl < T : :: inoutbox :: __private :: InboxEvent > __inoutbox_InboxEvent for T",
        "< PgTx < '_ > as __inoutbox_Transaction > :: CHECK",
        ":: inoutbox :: __private :: Probe :: < PgTx < '_ > > :: tx_type_id ()",
        ":: inoutbox :: __private :: Probe :: < __inoutbox_Output > :: into_future",
        ":: inoutbox :: __private :: event_type_mismatch",
        ":: core :: line ! ()",
        "\"create_invoice\"",
    ] {
        assert!(out.contains(expected), "missing `{expected}` in {out}");
    }
    // inventory is reached through the facade, and registers once.
    assert_eq!(out.matches("inventory").count(), 1, "{out}");
    assert_eq!(
        out.matches(":: inoutbox :: __private :: inventory :: submit !")
            .count(),
        1,
        "{out}"
    );
    // No path into sqlx or serde_json (the transaction check's note names sqlx's version, in
    // a string).
    assert!(
        !out.contains("sqlx ::") && !out.contains(":: sqlx") && !out.contains("serde_json"),
        "{out}"
    );
}

#[test]
fn parameters_in_the_wrong_order_are_one_error() {
    let message = single_error(
        good_args(),
        quote!(
            async fn h(tx: &mut PgTx<'_>, event: OrderCreated) -> Result<(), X> {
                Ok(())
            }
        ),
    );
    assert_eq!(
        message,
        "the event comes first and the transaction second: swap the parameters: write \
         `async fn h(event: OrderCreated, tx: &mut PgTx<'_>)`"
    );
    let message = single_error(
        good_args(),
        quote!(
            async fn h(e: E, meta: &MessageMeta, tx: &mut PgTx<'_>) -> Result<(), X> {
                Ok(())
            }
        ),
    );
    assert_eq!(
        message,
        "the parameters go in the order event, transaction, metadata: write \
         `async fn h(e: E, tx: &mut PgTx<'_>, meta: &MessageMeta)`"
    );
}

#[test]
fn self_in_the_signature_says_to_move_the_function() {
    let message = single_error(
        good_args(),
        quote!(
            async fn h(e: E, tx: &mut PgTx<'_>) -> Result<(), Self> {
                Ok(())
            }
        ),
    );
    assert_eq!(
        message,
        "`#[inbox_handler]` goes on a free function, not on an associated function: move `h` \
         out of the `impl` block and name its types instead of `Self`"
    );
}

#[test]
fn types_in_messages_are_printed_as_written() {
    let message = single_error(
        good_args(),
        quote!(
            async fn h(e: &Option<(String, Vec<u8>)>, tx: &mut PgTx<'_>) -> Result<(), X> {
                Ok(())
            }
        ),
    );
    assert_eq!(
        message,
        "the event is passed by value: write `event: Option<(String, Vec<u8>)>` without `&`"
    );
    // `&Vec<..>` is several events: see `events_by_reference_are_one_error_in_either_form`.
    let message = single_error(
        good_args(),
        quote!(
            async fn h(e: &Vec<(String, Vec<u8>)>, tx: &mut PgTx<'_>) -> Result<(), X> {
                Ok(())
            }
        ),
    );
    assert!(
        message.ends_with(
            "and write `events: Vec<(String, Vec<u8>)>`; or take one event: \
             `event: (String, Vec<u8>)`"
        ),
        "{message}"
    );
}

#[test]
fn misspelled_key_is_one_error_with_a_suggestion() {
    for (args, expected) in [
        (
            quote!(evnt = "A", group = "b"),
            "unknown key `evnt` in `#[inbox_handler(...)]`; did you mean `event`?",
        ),
        (
            quote!(event = "A", consumer_group = "b"),
            "unknown key `consumer_group` in `#[inbox_handler(...)]`; did you mean `group`?",
        ),
        (
            quote!(event_type = "A", group = "b"),
            "unknown key `event_type` in `#[inbox_handler(...)]`; did you mean `event`?",
        ),
    ] {
        assert_eq!(single_error(args, good_fn()), expected);
    }
}

#[test]
fn a_misspelling_next_to_the_right_key_is_not_a_duplicate() {
    let message = single_error(quote!(evnt = "A", event = "A", group = "b"), good_fn());
    assert_eq!(
        message,
        "unknown key `evnt` in `#[inbox_handler(...)]`; did you mean `event`?"
    );
}

#[test]
fn crate_path_replaces_inoutbox_in_the_expansion() {
    let args = quote!(
        event = "OrderCreated",
        group = "billing",
        crate = "my_inoutbox"
    );
    let out = super::expand(args, good_fn()).to_string();
    assert!(
        out.contains("my_inoutbox :: __private :: inventory :: submit !"),
        "{out}"
    );
    assert!(
        !out.contains(":: inoutbox"),
        "names `::inoutbox` despite `crate`: {out}"
    );
    assert!(out.contains("`tx: &mut my_inoutbox::PgTx<'_>`"), "{out}");
}

#[test]
fn malformed_crate_path_is_an_error_on_the_string() {
    let message = single_error(
        quote!(event = "A", group = "b", crate = "my inoutbox"),
        good_fn(),
    );
    assert!(
        message.starts_with(
            "`crate` must be the path the inoutbox crate is reachable by, not `my inoutbox`"
        ),
        "{message}"
    );
    let message = single_error(
        quote!(event = "A", group = "b", crate = my_inoutbox),
        good_fn(),
    );
    assert_eq!(
        message,
        "expected a string literal for `crate`, e.g. `crate = \"my_inoutbox\"`"
    );
}

// ---------------------------------------------------------------------------------------------
// Batch handlers: `#[inbox_handler(.., batch)]`.

fn batch_args() -> TokenStream {
    quote!(event = "OrderCreated", group = "billing", batch)
}

fn batch_fn() -> TokenStream {
    quote! {
        async fn create_invoices(
            events: Vec<OrderCreated>,
            tx: &mut PgTx<'_>,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    }
}

#[test]
fn accepts_a_batch_handler_with_and_without_metadata() {
    assert_eq!(errors(batch_args(), batch_fn()), Vec::<String>::new());
    let item = quote! {
        async fn h(
            events: std::vec::Vec<E>,
            tx: &mut PgTx<'_>,
            metas: &[MessageMeta],
        ) -> anyhow::Result<()> {
            Ok(())
        }
    };
    assert_eq!(errors(batch_args(), item), Vec::<String>::new());
}

#[test]
fn batch_is_a_flag() {
    let cx = Ctxt::new();
    let attr = attr::HandlerAttr::from_tokens(&cx, batch_args());
    assert!(cx.check().is_ok());
    assert!(attr.form() == attr::Form::Batch);
    for (args, expected) in [
        (
            quote!(event = "A", group = "b", batch = true),
            "`batch` is a flag and takes no value: write `batch`, not `batch = true`",
        ),
        (
            quote!(event = "A", group = "b", batch = "yes"),
            "`batch` is a flag and takes no value: write `batch`, not `batch = \"yes\"`",
        ),
    ] {
        // Still a batch handler: the signature raises no second error.
        assert_eq!(single_error(args, batch_fn()), expected);
    }
    assert_eq!(
        single_error(quote!(event = "A", group = "b", batch = false), good_fn()),
        "`batch` is a flag and takes no value: a handler of one event per call has no `batch`; \
         remove `batch = false`"
    );
}

#[test]
fn batch_given_twice_is_reported_once() {
    let message = single_error(quote!(event = "A", group = "b", batch, batch), batch_fn());
    assert_eq!(message, "`batch` is given twice; keep one");
}

#[test]
fn a_key_without_its_value_names_an_example_of_that_key() {
    let message = single_error(quote!(event = "A", group, batch), batch_fn());
    assert_eq!(
        message,
        "expected `group = ...`: give `group` a value, e.g. `group = \"billing\"`"
    );
}

#[test]
fn batch_without_a_vec_of_events_says_how_to_write_it() {
    let message = single_error(batch_args(), good_fn());
    assert_eq!(
        message,
        "a batch handler takes its events as `events: Vec<OrderCreated>`; write that instead of \
         `OrderCreated`, or remove `batch` for a handler of one event per call"
    );
}

#[test]
fn a_vec_of_events_without_batch_says_to_add_it() {
    let message = single_error(good_args(), batch_fn());
    assert_eq!(
        message,
        "a handler that takes `Vec<OrderCreated>` is a batch handler: add `batch` to the \
         attribute, as in `#[inbox_handler(event = \"OrderCreated\", group = \"billing\", \
         batch)]`; or take one event: `event: OrderCreated`"
    );
}

#[test]
fn events_by_reference_are_one_error_in_either_form() {
    for ty in [quote!(&[OrderCreated]), quote!(&Vec<OrderCreated>)] {
        let item = quote! {
            async fn h(events: #ty, tx: &mut PgTx<'_>) -> Result<(), X> {
                Ok(())
            }
        };
        assert_eq!(
            single_error(batch_args(), item.clone()),
            "the events are passed by value: write `events: Vec<OrderCreated>` without `&`"
        );
        let message = single_error(good_args(), item);
        assert!(
            message.starts_with(
                "a handler of several events is a batch handler, and takes them by value: add \
                 `batch` to the attribute"
            ),
            "{message}"
        );
    }
}

#[test]
fn metadata_of_a_batch_is_a_slice() {
    let item = quote! {
        async fn h(events: Vec<E>, tx: &mut PgTx<'_>, meta: &MessageMeta) -> Result<(), X> {
            Ok(())
        }
    };
    assert_eq!(
        single_error(batch_args(), item),
        "a batch handler takes the metadata of its events as a slice, one per event: write \
         `metas: &[MessageMeta]`"
    );
    let item = quote! {
        async fn h(event: E, tx: &mut PgTx<'_>, metas: &[MessageMeta]) -> Result<(), X> {
            Ok(())
        }
    };
    let message = single_error(good_args(), item);
    assert!(
        message.starts_with("a handler of one event takes that event's metadata"),
        "{message}"
    );
}

#[test]
fn batch_signature_messages_speak_of_events() {
    let item = quote! {
        async fn h(tx: &mut PgTx<'_>, events: Vec<E>) -> Result<(), X> {
            Ok(())
        }
    };
    assert_eq!(
        single_error(batch_args(), item),
        "the events come first and the transaction second: swap the parameters: write \
         `async fn h(events: Vec<E>, tx: &mut PgTx<'_>)`"
    );
    let item = quote! {
        async fn h(events: Vec<E>, tx: &mut T, m: &[M], x: u8) -> Result<(), X> {
            Ok(())
        }
    };
    assert!(single_error(batch_args(), item).starts_with(
        "too many parameters: a batch handler takes `(events, tx)` or \
         `(events, tx, metas: &[MessageMeta])`"
    ));
}

#[test]
fn batch_expansion_calls_the_function_once_from_both_wrappers() {
    let item = quote! {
        async fn create_invoices(
            events: Vec<OrderCreated>,
            tx: &mut PgTx<'_>,
            metas: &[MessageMeta],
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    };
    let out = super::expand(batch_args(), item.clone()).to_string();
    assert!(out.starts_with(&item.to_string()), "{out}");
    for expected in [
        ":: inoutbox :: __private :: Probe :: < OrderCreated > :: decode_all",
        ":: inoutbox :: __private :: Probe :: < MessageMeta > :: metas",
        "< OrderCreated as __inoutbox_InboxEvent > :: CHECK",
        "< MessageMeta as __inoutbox_Metadata > :: CHECK",
        ":: core :: slice :: from_ref (& __inoutbox_payload)",
        ":: core :: slice :: from_ref (__inoutbox_meta)",
        ". batch (__inoutbox_invoke_batch)",
        "`metas: &[inoutbox::MessageMeta]`",
    ] {
        assert!(out.contains(expected), "missing `{expected}` in {out}");
    }
    // The user's function is called once, by `__inoutbox_invoke_batch`; `__inoutbox_invoke` calls that.
    assert_eq!(
        out.matches("create_invoices (__inoutbox_events , __inoutbox_tx , __inoutbox_metas)")
            .count(),
        1,
        "{out}"
    );
    assert_eq!(out.matches("create_invoices (").count(), 2, "{out}");
    assert_eq!(out.matches("inventory :: submit !").count(), 1, "{out}");
}

#[test]
fn single_expansion_has_no_batch_wrapper() {
    let out = super::expand(good_args(), good_fn()).to_string();
    assert!(!out.contains("batch"), "{out}");
}

/// Property tests: random token streams into the attribute parsers and the whole expansions of
/// both macros. Whatever the tokens, parsing reports errors and never panics; an expansion
/// that fails still emits the user's item.
mod prop {
    use proc_macro2::{
        Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree,
    };
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use quote::quote;

    use super::{attr, good_fn};
    use crate::ctxt::Ctxt;

    const CASES: u32 = 1500;

    fn leaf() -> impl Strategy<Value = TokenTree> {
        let keys = prop_oneof![
            Just("event"),
            Just("group"),
            Just("event_type"),
            Just("topic"),
            Just("key"),
            Just("aggregate_type"),
            Just("aggregate_id"),
            Just("fn"),
            Just("async"),
            Just("self"),
            Just("r#type"),
        ];
        prop_oneof![
            4 => keys.prop_map(|k| match k.strip_prefix("r#") {
                Some(raw) => TokenTree::Ident(Ident::new_raw(raw, Span::call_site())),
                None => TokenTree::Ident(Ident::new(k, Span::call_site())),
            }),
            2 => "[a-zA-Z][a-zA-Z0-9_]{0,8}"
                .prop_map(|s| TokenTree::Ident(Ident::new(&s, Span::call_site()))),
            3 => any::<String>().prop_map(|s| TokenTree::Literal(Literal::string(&s))),
            1 => "[A-Za-z0-9._\\-]{0,300}".prop_map(|s| TokenTree::Literal(Literal::string(&s))),
            1 => any::<Vec<u8>>().prop_map(|b| TokenTree::Literal(Literal::byte_string(&b))),
            1 => any::<i64>().prop_map(|n| TokenTree::Literal(Literal::i64_unsuffixed(n))),
            1 => any::<char>().prop_map(|c| TokenTree::Literal(Literal::character(c))),
            4 => (prop::sample::select(&['=', ',', ';', ':', '#', '!', '&', '<', '>', '.', '-', '\''][..]), any::<bool>())
                .prop_map(|(c, joint)| TokenTree::Punct(Punct::new(
                    c,
                    if joint { Spacing::Joint } else { Spacing::Alone },
                ))),
        ]
    }

    fn tree() -> impl Strategy<Value = TokenTree> {
        leaf().prop_recursive(3, 48, 6, |inner| {
            (
                prop::sample::select(
                    &[
                        Delimiter::Parenthesis,
                        Delimiter::Brace,
                        Delimiter::Bracket,
                        Delimiter::None,
                    ][..],
                ),
                prop::collection::vec(inner, 0..6),
            )
                .prop_map(|(d, trees)| TokenTree::Group(Group::new(d, trees.into_iter().collect())))
        })
    }

    /// Random tokens, some shaped like `key = value, ...` lists.
    fn tokens() -> impl Strategy<Value = TokenStream> {
        prop_oneof![
            prop::collection::vec(tree(), 0..12).prop_map(|t| t.into_iter().collect()),
            prop::collection::vec((leaf(), tree()), 0..5).prop_map(|pairs| {
                let mut out = TokenStream::new();
                for (i, (key, value)) in pairs.into_iter().enumerate() {
                    if i > 0 {
                        out.extend(quote!(,));
                    }
                    out.extend([key]);
                    out.extend(quote!(=));
                    out.extend([value]);
                }
                out
            }),
            "[a-z_=, \"()\\[\\]#:<>'0-9]{0,40}".prop_filter_map("lexes", |s| s.parse().ok()),
        ]
    }

    fn run(name: &str, test: impl Fn(TokenStream) -> Result<(), TestCaseError>) {
        let mut runner = TestRunner::new(Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        });
        let runs = std::cell::Cell::new(0u32);
        runner
            .run(&tokens(), |t| {
                runs.set(runs.get() + 1);
                test(t)
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name}: {} random token streams, no panic", runs.get());
        assert!(runs.get() >= CASES);
    }

    #[test]
    fn handler_attribute_parser_never_panics_on_random_tokens() {
        run("#[inbox_handler(..)] arguments", |t| {
            let cx = Ctxt::new();
            let parsed = attr::HandlerAttr::from_tokens(&cx, t);
            // Checked before the assertions, which return early on failure.
            let _ = cx.check();
            // A value is kept only when it is valid.
            for lit in [parsed.event, parsed.group].into_iter().flatten() {
                prop_assert!(crate::names::invalid_name("event", &lit.value(), "x").is_none());
            }
            Ok(())
        });
    }

    #[test]
    fn handler_expansion_keeps_the_item_whatever_the_arguments() {
        run("#[inbox_handler(..)] expansion", |t| {
            let item = good_fn();
            let out = super::super::expand(t, item.clone()).to_string();
            prop_assert!(out.starts_with(&item.to_string()), "{out}");
            Ok(())
        });
    }

    #[test]
    fn handler_expansion_never_panics_on_a_random_item() {
        run("#[inbox_handler] on random items", |t| {
            let item = quote!(async fn h #t);
            let _ = super::super::expand(quote!(event = "E", group = "g"), item);
            let _ = super::super::expand(quote!(event = "E", group = "g"), t);
            Ok(())
        });
    }

    #[test]
    fn outbox_attribute_never_panics_on_random_tokens() {
        run("#[outbox(..)] derive", |t| {
            let input = quote! {
                #[outbox(#t)]
                struct OrderCreated { order_id: u64, total_cents: i64 }
            };
            let out = crate::outbox_event::derive(input).to_string();
            prop_assert!(!out.is_empty());
            let _ = crate::outbox_event::derive(quote!(#[outbox = #t] struct S;));
            let _ =
                crate::outbox_event::derive(quote!(#[outbox(event_type = "E", topic = "t")] #t));
            Ok(())
        });
    }
}

fn stores_args(stores: TokenStream) -> TokenStream {
    quote!(event = "OrderCreated", group = "billing", stores #stores)
}

fn generic_fn() -> TokenStream {
    quote! {
        async fn create_invoice<D: Db>(event: OrderCreated, tx: &mut Tx<'_, D>) -> Result<(), HandlerError> {
            Ok(())
        }
    }
}

#[test]
fn a_handler_generic_over_its_store_is_registered_once_per_store() {
    let args = stores_args(quote!((postgres, sqlite, mysql)));
    assert_eq!(errors(args.clone(), generic_fn()), Vec::<String>::new());
    let expanded = super::expand(args, generic_fn()).to_string();
    for store in ["postgres", "sqlite", "mysql"] {
        assert!(
            expanded.contains(&format!("__inoutbox_register_create_invoice_{store}")),
            "{expanded}"
        );
    }
    assert!(expanded.contains("create_invoice :: < :: inoutbox :: __private :: Postgres >"));
    assert!(expanded.contains("create_invoice :: < :: inoutbox :: __private :: Sqlite >"));
    assert!(expanded.contains("create_invoice :: < :: inoutbox :: __private :: MySql >"));
    assert_eq!(expanded.matches("inventory :: submit !").count(), 3);
}

#[test]
fn misuse_of_stores_is_reported_with_what_to_write() {
    let message = single_error(stores_args(quote!((postgres, oracle))), generic_fn());
    assert_eq!(
        message,
        "unknown store `oracle`; expected one of: `postgres`, `sqlite`, `mysql`"
    );
    let message = single_error(stores_args(quote!((postgres, mysq))), generic_fn());
    assert_eq!(
        message,
        "unknown store `mysq`; did you mean `mysql`? expected one of: `postgres`, `sqlite`, `mysql`"
    );
    let message = single_error(stores_args(quote!((sqlite, sqlite))), generic_fn());
    assert!(
        message.starts_with("store `sqlite` is listed twice"),
        "{message}"
    );
    let message = single_error(stores_args(quote!(())), generic_fn());
    assert!(message.starts_with("list at least one store"), "{message}");
    let message = single_error(stores_args(quote!((postgres, sqlite))), good_fn());
    assert!(
        message.starts_with("`stores(..)` registers a handler generic over its store"),
        "{message}"
    );
    let message = single_error(
        quote!(
            event = "OrderCreated",
            group = "billing",
            stores = "postgres"
        ),
        generic_fn(),
    );
    assert!(
        message.starts_with("`stores` takes a list of stores"),
        "{message}"
    );
    let message = single_error(good_args(), generic_fn());
    assert!(message.contains("`stores(postgres, sqlite)`"), "{message}");
    let item = quote! {
        async fn h<D: Db>(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> { Ok(()) }
    };
    let message = single_error(stores_args(quote!((postgres))), item);
    assert!(
        message.starts_with("with `stores(..)` the transaction is generic over the store"),
        "{message}"
    );
}

#[test]
fn sqlx_on_the_transaction_says_to_write_its_connection() {
    let item = quote! {
        async fn h(event: OrderCreated, tx: &mut PgTx<'_>) -> Result<(), HandlerError> {
            sqlx::query("SELECT 1").bind(1).execute(&mut *tx).await?;
            sqlx::query("SELECT 1").execute(&mut **tx).await?;
            inoutbox::sql("SELECT 1").execute(&mut *tx).await?;
            inoutbox::outbox::enqueue(&mut *tx, &event).await?;
            Ok(())
        }
    };
    let message = single_error(good_args(), item);
    assert!(
        message.starts_with("sqlx runs queries on the connection"),
        "{message}"
    );
    assert!(message.contains("write `&mut **tx`"), "{message}");
}
