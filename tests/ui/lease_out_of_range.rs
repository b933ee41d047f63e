use idem::{Gate, Rejected, idempotent};

// One day more than the longest lease, idem::MAX_LEASE ("100y").
#[idempotent(key = "order_id", lease = "100y 1day")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
