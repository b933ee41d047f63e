#![deny(warnings)]

/// A crate that reaches idem through a re-export of its own (a facade of
/// its company's dependencies, say) points the generated code there.
mod deps {
    pub use ::idem;
}

use deps::idem::{Gate, Rejected, idempotent};

#[idempotent(key = "id", crate = "crate::deps::idem")]
async fn charge(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

#[idempotent(key = "id", crate = "crate::deps::idem", replay, lease = "30s")]
async fn replayed(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

fn main() {
    // Named, so that neither is dead code under deny(warnings).
    let _guarded = (charge, replayed);
}
