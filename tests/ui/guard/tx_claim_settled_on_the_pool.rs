// A claim won inside a transaction is recorded on that transaction: through
// the pool it would wait forever on the row the transaction holds.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

async fn credit(gate: &Gate, tx: &mut idem::sqlx::PgConnection) -> Result<(), Rejected> {
    let id = Identity::new("credit").part(1);
    let _ = Duration::ZERO;
    let claim = gate.guard(&id).tx(tx).claim().await?;
    claim.settle().await
}

fn main() {}
