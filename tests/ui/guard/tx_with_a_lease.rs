// By hand as in the attribute: a claim inside the caller's transaction
// takes no lease (nobody can see it, so nobody can take it over).
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

async fn credit(gate: &Gate, tx: &mut idem::sqlx::PgConnection) -> Result<(), Rejected> {
    let id = Identity::new("credit").part(1);
    gate.guard(&id)
        .tx(tx)
        .lease(Duration::from_secs(30))
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await
}

fn main() {}
