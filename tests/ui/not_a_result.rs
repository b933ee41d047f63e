use idem::{Gate, idempotent};

struct Receipt;

#[idempotent(key = "order_id")]
async fn charge(gate: &Gate, order_id: u64) -> Receipt {
    Receipt
}

fn main() {}
