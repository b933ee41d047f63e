use idem::{Gate, Rejected, idempotent};

#[idempotent(key)]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
