// The layer takes the guard's options with the guard's refusals: a lease
// and an asynchronous outcome commit do not go together (a settle lost in
// a crash would leave the claim pending, and once its lease ran out a
// retry would run the action again).
use std::time::Duration;

use idem::http::IdempotencyLayer;
use idem::{Gate, OutcomeCommit};

fn layer(gate: Gate) -> impl Clone {
    IdempotencyLayer::new(gate)
        .single_tenant()
        .lease(Duration::from_secs(30))
        .outcome_commit(OutcomeCommit::Async)
}

fn main() {
    let _ = layer;
}
