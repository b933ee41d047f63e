use idem::{Gate, Rejected, idempotent};

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt;

// The value is kept in the slot's row: it cannot be kept longer.
#[idempotent(key = "order_id", replay, keep_value_for = "32d", keep_slot_for = "31d")]
async fn charge(gate: &Gate, order_id: u64) -> Result<Receipt, Rejected> {
    Ok(Receipt)
}

fn main() {}
