//! Compile-time behaviour of `#[idempotent]`: every mistake is a compile
//! error pointing at the offending token and saying how to fix it, and valid
//! uses compile cleanly under strict lints.
//!
//! After a deliberate change to a message, regenerate with
//! `TRYBUILD=overwrite cargo test --test ui` and review the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
