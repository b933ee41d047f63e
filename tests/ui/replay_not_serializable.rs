use idem::{Gate, Rejected, idempotent};

struct Receipt;

#[idempotent(key = "order_id", replay)]
async fn charge(gate: &Gate, order_id: u64) -> Result<Receipt, Rejected> {
    Ok(Receipt)
}

fn main() {}
