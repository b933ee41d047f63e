use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", on_unavailable = "retry")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
