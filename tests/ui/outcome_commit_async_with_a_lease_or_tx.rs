use idem::sqlx::{Postgres, Transaction};
use idem::{Gate, Rejected, idempotent};

#[idempotent(key = "order_id", lease = "30s", outcome_commit = "async")]
async fn leased(gate: &Gate, order_id: u64) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "order_id", tx = tx, outcome_commit = "async")]
async fn in_transaction(gate: &Gate, tx: &mut Transaction<'_, Postgres>, order_id: u64) -> Result<(), Rejected> {
    let _ = tx;
    Ok(())
}

fn main() {}
