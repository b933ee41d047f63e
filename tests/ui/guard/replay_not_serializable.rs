// `replay` keeps the Ok value as JSON.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

struct Receipt;

async fn charge(gate: &Gate) -> Result<Receipt, Rejected> {
    let id = Identity::new("charge").part(1);
    let _ = Duration::ZERO;
    gate.guard(&id).replay().run(async { Ok(Receipt) }).await
}

fn main() {}
