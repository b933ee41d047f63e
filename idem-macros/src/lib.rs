//! The `#[idempotent]` attribute of idem, the implementation only.
//!
//! Use it through the facade crate: its reference, with a section and an
//! example for every option, is
//! [`idem::idempotent`](https://docs.rs/idem-pg/latest/idem/attr.idempotent.html)
//! (the facade's `src/idempotent.md`; a test here fails when an option the
//! parser accepts has no section there).
//!
//! This crate parses, validates and generates code; it holds no runtime
//! logic. The expansion calls plain functions of `idem_runtime::expansion`
//! through the absolute path `::idem::__private` (or the path given with
//! `crate = "..."`).

// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod expand;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod reference;
mod signature;

use proc_macro::TokenStream;

// The reference is the facade's: it re-exports this attribute with
// `src/idempotent.md` as its docs, and rustdoc appends the docs this item has
// when compiled as a dependency. So those stay empty, and only this crate's
// own docs (built with `cfg(doc)`) say where the reference is.
#[allow(missing_docs)]
#[cfg_attr(
    doc,
    doc = "Makes an async function run at most once per identity. The reference, \
           with every option, is the facade's \
           [`idem::idempotent`](https://docs.rs/idem-pg/latest/idem/attr.idempotent.html)."
)]
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
