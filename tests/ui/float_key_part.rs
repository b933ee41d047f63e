use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id, amount")]
async fn charge(gate: &Gate, order_id: u64, amount: f64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
