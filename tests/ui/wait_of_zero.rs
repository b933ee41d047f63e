use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", wait = "0s")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
