// Only a lease can run out.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};
use idem::OnExpiry;

async fn charge(gate: &Gate) -> Result<(), Rejected> {
    let id = Identity::new("charge").part(1);
    let _ = Duration::ZERO;
    gate.guard(&id)
        .on_expiry(OnExpiry::InDoubt)
        .run(async { Ok(()) })
        .await
}

fn main() {}
