use idem::{Gate, Rejected, idempotent};

fn tenant() -> u64 {
    7
}

#[idempotent(key = "tenant(), order_id")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
