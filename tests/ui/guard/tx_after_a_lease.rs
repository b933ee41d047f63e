// The same refusal written the other way round: once leased, a guard
// claims on the pool, and has no `tx`.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

async fn credit(gate: &Gate, tx: &mut idem::sqlx::PgConnection) -> Result<(), Rejected> {
    let id = Identity::new("credit").part(1);
    gate.guard(&id)
        .lease(Duration::from_secs(30))
        .tx(tx)
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await
}

fn main() {}
