// A duplicate of a claim inside a transaction already waits for it.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

async fn credit(gate: &Gate, tx: &mut idem::sqlx::PgConnection) -> Result<(), Rejected> {
    let id = Identity::new("credit").part(1);
    gate.guard(&id)
        .tx(tx)
        .wait(Duration::from_secs(1))
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await
}

fn main() {}
