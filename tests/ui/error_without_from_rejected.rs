use idem::{Gate, idempotent};

#[derive(Debug)]
enum ChargeError {
    Declined,
}

#[idempotent(key = "order_id")]
async fn charge(gate: &Gate, order_id: u64) -> Result<(), ChargeError> {
    Err(ChargeError::Declined)
}

fn main() {}
