use idem::{Gate, Rejected, idempotent};

// The generated code's paths to the glue carry the span of the `crate`
// value, so a path that names nothing is reported there.
#[idempotent(key = "id", crate = "::not_a_dependency")]
async fn refund(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

fn main() {}
