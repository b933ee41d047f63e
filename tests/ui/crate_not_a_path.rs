use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "id", crate = "idem renamed")]
async fn charge(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

fn main() {}
