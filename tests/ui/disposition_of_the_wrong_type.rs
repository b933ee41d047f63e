use idem::{Disposition, Gate, Rejected, idempotent};

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

// Takes the error by value: a disposition reads it, as `fn(&E) -> Disposition`.
fn by_value(error: ChargeError) -> Disposition {
    match error {
        ChargeError::Declined => Disposition::Keep,
        ChargeError::Rejected(_) => Disposition::Release,
    }
}

#[idempotent(key = "id", disposition = by_value)]
async fn charge(gate: &Gate, id: u64) -> Result<u64, ChargeError> {
    Ok(id)
}

fn main() {}
