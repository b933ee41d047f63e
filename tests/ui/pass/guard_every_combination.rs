//! Every combination the attribute accepts (`every_mode.rs`) written by hand
//! with the guard, plus the hand-only ends (a claim, a claim or a replay, a
//! claim inside a transaction, a batch), compiles cleanly under strict lints.
#![deny(warnings)]

use std::time::Duration;

use idem::sqlx::{PgConnection, Postgres, Transaction};
use idem::batch::Batch;
use idem::{
    ClaimOrReplay, Detached, Disposition, Fingerprint, Gate, Identity, OnExpiry,
    OnUnavailable, OutcomeCommit, Rejected,
};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub id: u64,
}

#[derive(Debug)]
pub enum ChargeError {
    Rejected(Rejected),
    Declined,
}

impl From<Rejected> for ChargeError {
    fn from(rejected: Rejected) -> Self {
        ChargeError::Rejected(rejected)
    }
}

impl ChargeError {
    fn disposition(&self) -> Disposition {
        match self {
            ChargeError::Declined => Disposition::Keep,
            ChargeError::Rejected(_) => Disposition::Release,
        }
    }
}

#[allow(dead_code)]
async fn exercise(
    gate: &Gate,
    tx: &mut Transaction<'_, Postgres>,
    conn: &mut PgConnection,
    detached: &Detached,
) -> Result<(), ChargeError> {
    let id = Identity::new("charge").part(1);
    let secs = Duration::from_secs;

    let _: Result<Receipt, Rejected> = gate.guard(&id).replay().run(async { Ok(Receipt { id: 1 }) }).await;
    let _: Result<Receipt, Rejected> = gate
        .guard(&id)
        .fingerprint(Fingerprint::new().part(&5_i64).part("EUR"))
        .replay()
        .wait(secs(5))
        .run(async { Ok(Receipt { id: 1 }) })
        .await;
    let _: Result<(), Rejected> = gate
        .guard(&id)
        .lease(secs(90))
        .on_unavailable(OnUnavailable::Run)
        .run(async { Ok(()) })
        .await;
    // An option that keeps the claim on the pool, then a lease.
    let _: Result<(), Rejected> = gate
        .guard(&id)
        .wait(secs(1))
        .lease(secs(90))
        .on_expiry(OnExpiry::InDoubt)
        .run(async { Ok(()) })
        .await;
    let _: Result<(), Rejected> = gate
        .guard(&id)
        .on_unavailable(OnUnavailable::Refuse)
        .run(async { Ok(()) })
        .await;
    let _: Result<Receipt, Rejected> = gate
        .guard(&id)
        .outcome_commit(OutcomeCommit::Async)
        .replay()
        .wait(secs(2))
        .run(async { Ok(Receipt { id: 1 }) })
        .await;
    let _: Result<Receipt, ChargeError> = gate
        .guard(&id)
        .disposition(ChargeError::disposition)
        .lease(secs(30))
        .on_expiry(OnExpiry::InDoubt)
        .replay()
        .run(async { Ok(Receipt { id: 1 }) })
        .await;
    let _: Result<(), Rejected> = gate
        .guard(&id)
        .lease(secs(30))
        .on_expiry(OnExpiry::TakeOver)
        .run(async { Ok(()) })
        .await;
    // The retention windows: on the pool with any other option, and in a
    // transaction.
    let _: Result<Receipt, Rejected> = gate
        .guard(&id)
        .keep_value_for(secs(3_600))
        .lease(secs(30))
        .keep_slot_for(secs(86_400))
        .replay()
        .run(async { Ok(Receipt { id: 1 }) })
        .await;
    let _: Result<(), Rejected> = gate
        .guard(&id)
        .tx(&mut **tx)
        .keep_slot_for(secs(86_400))
        .keep_value_for(secs(3_600))
        .run(async |_: &mut PgConnection| Ok(()))
        .await;

    // Inside a transaction: a `&mut Transaction` and a bare connection.
    let _: Result<Receipt, ChargeError> = gate
        .guard(&id)
        .tx(tx)
        .replay()
        .fingerprint(Fingerprint::new().part(&5_i64))
        .disposition(ChargeError::disposition)
        .run(async |conn: &mut PgConnection| {
            let _ = conn;
            Ok(Receipt { id: 1 })
        })
        .await;
    let _: Result<(), Rejected> = gate.guard(&id).tx(conn).run(async |_: &mut PgConnection| Ok(())).await;

    // Detached: the body outlives a caller that leaves.
    let _: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(secs(30))
        .run_detached(detached, async { Ok(7) })
        .await;

    // The hand ends: a claim, a claim or a replay, a claim in a transaction.
    let claim = gate.guard(&id).lease(secs(30)).claim().await?;
    claim.extend(secs(60)).await?;
    claim.settle().await?;
    match gate.guard(&id).replay().claim_or_replay::<Receipt>().await? {
        ClaimOrReplay::Won(claim) => claim.settle_value(&Receipt { id: 1 }).await?,
        ClaimOrReplay::Replayed(receipt) => drop(receipt),
    }
    let claim = gate.guard(&id).tx(&mut **tx).claim().await?;
    claim.settle(&mut **tx).await?;
    match gate.guard(&id).tx(&mut **tx).replay().claim_or_replay::<Receipt>().await? {
        ClaimOrReplay::Won(claim) => claim.settle_value(&mut **tx, &Receipt { id: 1 }).await?,
        ClaimOrReplay::Replayed(receipt) => drop(receipt),
    }

    // A batch: the same options over many items.
    let batch: Batch<u64> = (1..=3).map(|n| (n, Identity::new("meter").part(n))).collect();
    let _: Vec<Result<Receipt, ChargeError>> = gate
        .guard_batch(batch)
        .lease(secs(30))
        .on_expiry(OnExpiry::InDoubt)
        .replay()
        .disposition(ChargeError::disposition)
        .run(|id| async move { Ok(Receipt { id }) })
        .await;
    let batch: Batch<u64> = (1..=3).map(|n| (n, Identity::new("meter").part(n))).collect();
    let _: Vec<Result<Receipt, ChargeError>> = gate
        .guard_batch(batch)
        .outcome_commit(OutcomeCommit::Async)
        .run(|id| async move { Ok(Receipt { id }) })
        .await;
    Ok(())
}

fn main() {}
