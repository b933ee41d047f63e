use idem::{Gate, Rejected, idempotent};

// One day more than the longest window, idem::MAX_WINDOW ("100y").
#[idempotent(key = "order_id", keep_slot_for = "100y 1day")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
