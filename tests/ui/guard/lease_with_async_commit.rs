// A settle lost in a crash would leave a leased claim pending, and its
// lease would then let a duplicate run the action again.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};
use idem::OutcomeCommit;

async fn charge(gate: &Gate) -> Result<(), Rejected> {
    let id = Identity::new("charge").part(1);
    gate.guard(&id)
        .lease(Duration::from_secs(30))
        .outcome_commit(OutcomeCommit::Async)
        .run(async { Ok(()) })
        .await
}

fn main() {}
