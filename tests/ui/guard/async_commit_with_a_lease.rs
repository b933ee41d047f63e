// The same refusal written the other way round.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};
use idem::OutcomeCommit;

async fn charge(gate: &Gate) -> Result<(), Rejected> {
    let id = Identity::new("charge").part(1);
    gate.guard(&id)
        .outcome_commit(OutcomeCommit::Async)
        .lease(Duration::from_secs(30))
        .run(async { Ok(()) })
        .await
}

fn main() {}
