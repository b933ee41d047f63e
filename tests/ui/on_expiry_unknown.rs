use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "id", lease = "30s", on_expiry = "rerun")]
async fn charge(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

fn main() {}
