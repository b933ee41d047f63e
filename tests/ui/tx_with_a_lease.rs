use idem::sqlx::{Postgres, Transaction};
use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", tx = tx, lease = "30s")]
async fn charge(gate: &Gate, tx: &mut Transaction<'_, Postgres>, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
