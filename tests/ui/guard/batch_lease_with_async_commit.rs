// The batch guard takes the guard's options with the guard's refusals: a
// lease and an asynchronous outcome commit do not go together.
use std::time::Duration;

use idem::batch::Batch;
use idem::{Gate, OutcomeCommit, Rejected};

async fn consume(gate: &Gate, batch: Batch<u64>) -> Vec<Result<u64, Rejected>> {
    gate.guard_batch(batch)
        .lease(Duration::from_secs(30))
        .outcome_commit(OutcomeCommit::Async)
        .run(|n| async move { Ok(n) })
        .await
}

fn main() {
    let _ = consume;
}
