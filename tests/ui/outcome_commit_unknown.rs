use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", outcome_commit = "lazy")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
