use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", fingerprint = "amount_cent")]
async fn charge(gate: &Gate, order_id: u64, amount_cents: i64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
