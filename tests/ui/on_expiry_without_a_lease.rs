use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "id", on_expiry = "in_doubt")]
async fn charge(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

fn main() {}
