#![deny(warnings)]

use idem::{Gate, Rejected, idempotent};

/// A guarded body may open with inner attributes, as any function body may:
/// they stay in the body, and apply to it.
#[idempotent(key = "id")]
async fn charge(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    #![allow(unused_variables)]
    #![deny(unreachable_code)]
    let unused = 1;
    Ok(id)
}

#[idempotent(key = "id", replay)]
async fn replayed(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    #![allow(clippy::needless_return)]
    return Ok(id);
}

#[allow(dead_code)]
async fn exercise(gate: &Gate) -> Result<(), Rejected> {
    charge(gate, 1).await?;
    replayed(gate, 1).await?;
    Ok(())
}

fn main() {}
