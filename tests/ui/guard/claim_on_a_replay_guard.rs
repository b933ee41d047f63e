// A replay guard may be answered with the stored value, not a claim.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

async fn charge(gate: &Gate) -> Result<(), Rejected> {
    let id = Identity::new("charge").part(1);
    let _ = Duration::ZERO;
    let claim = gate.guard(&id).replay().claim().await?;
    claim.settle().await
}

fn main() {}
