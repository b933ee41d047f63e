// The classifier takes the body's own error.
use std::time::Duration;

use idem::{Gate, Identity, Rejected};
use idem::Disposition;

#[derive(Debug)]
enum ChargeError {
    Rejected(Rejected),
    Declined,
}

impl From<Rejected> for ChargeError {
    fn from(rejected: Rejected) -> Self {
        ChargeError::Rejected(rejected)
    }
}

async fn charge(gate: &Gate) -> Result<(), ChargeError> {
    let id = Identity::new("charge").part(1);
    let _ = Duration::ZERO;
    let _ = ChargeError::Declined;
    gate.guard(&id)
        .disposition(|_: &std::io::Error| Disposition::Keep)
        .run(async { Ok(()) })
        .await
}

fn main() {}
