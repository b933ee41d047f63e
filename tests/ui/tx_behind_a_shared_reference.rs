use idem::sqlx::PgPool;
use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", tx = pool)]
async fn charge(gate: &Gate, pool: &PgPool, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
