use idem::{Gate, idempotent};

#[idempotent(key = "order_id")]
async fn charge(gate: &Gate, order_id: u64) {}

fn main() {}
