use idem::{Gate, Rejected, idempotent};

// Every mistake is reported in one build, each at its own token.
#[idempotent(key = "ordr", retries = 3, action = 7)]
async fn charge(gate: &Gate, order: u64) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
