use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", keep_slot_for = "a month")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
