//! The `#[idempotent]` attribute of [idem](https://docs.rs/idem). Use it
//! through the `idem` crate, whose documentation describes it in full.
//!
//! This crate parses, validates and generates code; it holds no runtime
//! logic. The expansion calls plain functions of `idem_runtime::expansion`
//! through the absolute path `::idem::__private`.

// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod expand;
#[cfg(test)]
mod properties;
mod signature;

use proc_macro::TokenStream;

/// Makes an async function run at most once per identity. See the `idem`
/// crate's documentation.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
