//! A crate that depends on idem under another name (`renamed_idem`) and
//! nothing else: `#[idempotent(crate = "renamed_idem")]` must point every
//! path of the expansion, in every mode, at it. The workspace's build is
//! the test; the one below also runs a guarded function against the
//! database.

use renamed_idem::sqlx::{Postgres, Transaction};
use renamed_idem::{Gate, Rejected, idempotent};

/// The plain gate.
#[idempotent(key = "id", crate = "renamed_idem")]
pub async fn plain(gate: &Gate, id: u64) -> Result<u64, Rejected> {
    Ok(id)
}

/// Every failure here is a definite one.
fn disposition(_: &Rejected) -> renamed_idem::Disposition {
    renamed_idem::Disposition::Keep
}

/// Every mode that combines.
#[idempotent(
    key = "id",
    crate = "renamed_idem",
    replay,
    fingerprint = "amount",
    lease = "30s",
    wait = "1s",
    on_unavailable = "run",
    on_expiry = "in_doubt",
    disposition = disposition,
    namespace = "live"
)]
pub async fn every_mode(gate: &Gate, id: u64, amount: i64) -> Result<u64, Rejected> {
    Ok(id + amount.unsigned_abs())
}

/// Inside the caller's transaction.
#[idempotent(key = "id", crate = "renamed_idem", tx = tx, outcome_commit = "durable")]
pub async fn in_transaction(
    gate: &Gate,
    tx: &mut Transaction<'_, Postgres>,
    id: u64,
) -> Result<u64, Rejected> {
    let _ = &mut **tx;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_function_guarded_through_a_renamed_dependency_runs_once() {
        let gate = renamed_idem::testing::gate().await;
        assert_eq!(plain(&gate, 7).await.expect("first run"), 7);
        assert!(matches!(plain(&gate, 7).await, Err(Rejected::AlreadyDone)));
        assert_eq!(every_mode(&gate, 1, -2).await.expect("first run"), 3);
        assert_eq!(every_mode(&gate, 1, -2).await.expect("replayed"), 3);
    }
}
