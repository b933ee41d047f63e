use idem::{Gate, Rejected, idempotent};

struct Order {
    id: u64,
}

#[idempotent(key = "ordr.id")]
async fn charge(gate: &Gate, order: &Order) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
