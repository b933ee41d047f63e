// A refused duplicate needs somewhere to put its refusal.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

async fn charge(gate: &Gate) -> u64 {
    let id = Identity::new("charge").part(1);
    let _ = Duration::ZERO;
    let _: Option<Rejected> = None;
    gate.guard(&id).run(async { 7_u64 }).await
}

fn main() {}
