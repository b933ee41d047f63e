use idem::{Gate, Rejected, idempotent};

#[idempotent(action = "charge")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
