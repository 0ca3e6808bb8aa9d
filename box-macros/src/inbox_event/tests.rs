use quote::quote;

use super::derive;

#[test]
fn a_consumed_only_event_implements_inbox_event_alone() {
    let out = derive(quote! {
        #[inbox(event_type = "OrderPlaced", idempotency_key = order_id)]
        struct OrderPlaced { order_id: u64 }
    })
    .to_string();
    assert!(
        out.contains("impl :: inoutbox :: __private :: InboxEvent for OrderPlaced"),
        "{out}"
    );
    assert!(
        out.contains("const EVENT_TYPE : & 'static str = \"OrderPlaced\""),
        "{out}"
    );
    assert!(!out.contains("OutboxEvent"), "{out}");
    assert!(!out.contains("compile_error"), "{out}");
}

#[test]
fn a_topic_is_refused_as_publishing_only_and_the_placeholder_impl_is_kept() {
    let out = derive(quote! {
        #[inbox(event_type = "OrderPlaced", topic = "orders")]
        struct OrderPlaced { order_id: u64 }
    })
    .to_string();
    assert!(out.contains("`topic` is for publishing"), "{out}");
    assert!(out.contains("InboxEvent for OrderPlaced"), "{out}");
}

#[test]
fn a_key_naming_no_field_is_an_error_on_the_key() {
    let out = derive(quote! {
        #[inbox(event_type = "OrderPlaced", idempotency_key = order)]
        struct OrderPlaced { order_id: u64 }
    })
    .to_string();
    assert!(out.contains("`OrderPlaced` has no field `order`"), "{out}");
}
