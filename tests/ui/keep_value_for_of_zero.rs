use idem::{Gate, Rejected, idempotent};

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt;

#[idempotent(key = "order_id", replay, keep_value_for = "0s")]
async fn charge(gate: &Gate, order_id: u64) -> Result<Receipt, Rejected> {
    Ok(Receipt)
}

fn main() {}
