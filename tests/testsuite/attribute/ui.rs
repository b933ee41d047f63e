//! Compile-time behaviour of `#[idempotent]` (and of the guard by hand, in
//! `tests/ui/guard/`, and the tower layer's builder, in `tests/ui/tower/`): every mistake is a compile
//! error pointing at the offending token and saying how to fix it, and valid
//! uses compile cleanly under strict lints.
//!
//! After a deliberate change to a message, regenerate with
//! `TRYBUILD=overwrite cargo test --test testsuite attribute::ui` and review the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    // The guard by hand: what the attribute refuses does not compile there
    // either.
    cases.compile_fail("tests/ui/guard/*.rs");
    cases.pass("tests/ui/pass/*.rs");
    // The tower layer's compile-time guarantees (an unscoped layer is no
    // layer), where the facade has the layer.
    #[cfg(all(feature = "tower", feature = "axum"))]
    cases.compile_fail("tests/ui/tower/*.rs");
}
