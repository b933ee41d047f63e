use idem::{Rejected, idempotent};

#[idempotent(key = "order_id")]
async fn charge(gate: &str, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
