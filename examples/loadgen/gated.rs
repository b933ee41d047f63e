//! The gate, as users meet it: an `async fn` under `#[idempotent]`.

use idem::{Gate, Rejected, idempotent};

use crate::body::Body;

/// The action of [`guarded`]. The duplicates group settles identities of
/// this action up front; if the two ever differ, its refusals turn into wins
/// and the run stops saying so.
pub const ACTION: &str = "loadgen";

/// Claims `n`, runs the body, settles: the whole gate, nothing added.
#[idempotent(key = "n", action = "loadgen")]
pub async fn guarded(gate: &Gate, n: u64, body: Body) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}
