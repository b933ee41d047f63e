// A store that is down has taken the caller's transaction with it: there is
// nothing to run the body in.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};
use idem::OnUnavailable;

async fn credit(gate: &Gate, tx: &mut idem::sqlx::PgConnection) -> Result<(), Rejected> {
    let id = Identity::new("credit").part(1);
    let _ = Duration::ZERO;
    gate.guard(&id)
        .tx(tx)
        .on_unavailable(OnUnavailable::Run)
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await
}

fn main() {}
