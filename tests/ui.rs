//! Compile-time checks of `#[inbox_handler]`, `#[derive(OutboxEvent)]` and `inoutbox::sql`
//! (trybuild).
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test --test ui` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/inbox_handler/*.rs");
    t.compile_fail("tests/ui/outbox_event/*.rs");
    t.compile_fail("tests/ui/inbox_event/*.rs");
    t.compile_fail("tests/ui/sql/*.rs");
}
