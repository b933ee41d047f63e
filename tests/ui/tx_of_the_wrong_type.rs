use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", tx = ledger)]
async fn charge(gate: &Gate, ledger: &mut Vec<u64>, order_id: u64) -> Result<(), Rejected> {
    ledger.push(order_id);
    Ok(())
}

fn main() {}
