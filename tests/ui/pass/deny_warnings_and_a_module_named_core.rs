//! Generated code is warning-free and uses absolute paths only: a user
//! module named `core` (or `idem`-like names) cannot capture it.
#![deny(warnings, missing_docs, unused_qualifications)]

use idem::{Gate, Rejected, idempotent};

/// Shadows `core` for relative paths.
pub mod core {
    /// Shadows `core::result`.
    pub mod result {}
    /// Shadows `Result`.
    pub struct Result;
}

/// Shadows std names the expansion must not rely on.
#[allow(dead_code)]
struct Option;
#[allow(dead_code)]
struct Box;

/// Documented, public, and guarded: docs survive (missing_docs is denied).
#[idempotent(key = "order_id, note")]
pub async fn charge(gate: &Gate, order_id: u64, note: &str) -> ::core::result::Result<u64, Rejected> {
    Ok(order_id)
}

fn main() {
    let _ = charge;
}
