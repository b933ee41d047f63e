//! The gate, as users meet it: an `async fn` under `#[idempotent]`, plain
//! and in each opt-in mode, the plain one guarded by hand with the builder,
//! and a batch of messages through `gate.guard_batch`. Every one is the same action, so the duplicates
//! group's settled rows are theirs too.

use std::ops::Range;

use idem::batch::Batch;
use idem::sqlx::{Postgres, Transaction};
use idem::{Gate, Identity, Rejected, idempotent};

use crate::BoxError;
use crate::body::Body;

/// The action of every function here. The duplicates group settles
/// identities of this action up front; if the two ever differ, its refusals
/// turn into wins and the run stops saying so.
pub const ACTION: &str = "loadgen";

/// Claims `n`, runs the body, settles: the whole gate, nothing added.
#[idempotent(key = "n", action = "loadgen")]
pub async fn guarded(gate: &Gate, n: u64, body: Body) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}

/// The same by hand: `gate.guard(&id).run(body)`, the builder the attribute
/// expands to, under the identity `guarded` gives `n`. Measured beside
/// `guarded`, it shows whether the attribute adds anything to the builder.
pub async fn guarded_by_hand(gate: &Gate, n: u64, body: Body) -> Result<(), Rejected> {
    gate.guard(&Identity::new(ACTION).part(n))
        .run(async {
            body.run().await;
            Ok(())
        })
        .await
}

/// The same, its settle committing with `synchronous_commit` off.
#[idempotent(key = "n", action = "loadgen", outcome_commit = "async")]
pub async fn guarded_async(gate: &Gate, n: u64, body: Body) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}

/// The same, keeping the value for duplicates (`replay`): the settle also
/// writes the serialized value.
#[idempotent(key = "n", action = "loadgen", replay)]
pub async fn guarded_replay(gate: &Gate, n: u64, body: Body) -> Result<u64, Rejected> {
    body.run().await;
    Ok(n)
}

/// The same, with a payload fingerprint stored with the claim.
#[idempotent(key = "n", action = "loadgen", fingerprint = "amount_cents, currency")]
pub async fn guarded_fingerprint(
    gate: &Gate,
    n: u64,
    amount_cents: i64,
    currency: &str,
    body: Body,
) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}

/// The same, under a lease.
#[idempotent(key = "n", action = "loadgen", lease = "30s")]
pub async fn guarded_lease(gate: &Gate, n: u64, body: Body) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}

/// How many entities the ordered events of [`guarded_ordered`] fall
/// into: operation `n` is an event of entity `n % ORDERED_ENTITIES`, so
/// each entity gets a newer event every that many operations, never two
/// at once (fewer operations than that are ever in flight).
pub const ORDERED_ENTITIES: u64 = 1_024;

/// The same, as an ordered event of entity `entity` at order `n`: the
/// claim also takes the entity's row, and finds its previous event
/// settled.
#[idempotent(key = "n", action = "loadgen", entity = "entity", order = "n")]
pub async fn guarded_ordered(gate: &Gate, n: u64, entity: u64, body: Body) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}

/// The same inside the caller's transaction: claim and settle on its
/// connection, committed with it.
#[idempotent(key = "n", action = "loadgen", tx = tx)]
pub async fn guarded_in_transaction(
    gate: &Gate,
    tx: &mut Transaction<'_, Postgres>,
    n: u64,
    body: Body,
) -> Result<(), Rejected> {
    body.run().await;
    Ok(())
}

/// How many entities the events of [`batch_ordered`] fall into: message
/// `n` is an event of entity `n % ORDERED_BATCH_ENTITIES`, at order `n`.
/// Far more than the messages ever in flight (16 batches of 100), so that
/// no event meets another of its entity in flight, nor one newer applied.
pub const ORDERED_BATCH_ENTITIES: u64 = 65_536;

/// Messages `numbers` as one batch of ordered events
/// (`Batch::push_ordered`), each of entity `n % ORDERED_BATCH_ENTITIES` at
/// order `n`, under the identity [`guarded_ordered`] gives `n`: an error
/// unless every message ran and settled.
pub async fn batch_ordered(gate: &Gate, numbers: Range<u64>, body: Body) -> Result<(), BoxError> {
    let mut batch: Batch<u64> = Batch::new();
    for n in numbers {
        let entity = Identity::new(ACTION).part(n % ORDERED_BATCH_ENTITIES);
        batch.push_ordered(n, Identity::new(ACTION).part(n), &entity, n);
    }
    all_ran(gate, batch, body).await
}

/// Messages `numbers` as one batch through `gate.guard_batch`, each under
/// the identity the functions above give its number (one claim statement
/// for the batch, `body` for each won message, one settle statement): an
/// error unless every message ran and settled.
pub async fn batch(gate: &Gate, numbers: Range<u64>, body: Body) -> Result<(), BoxError> {
    let batch: Batch<u64> = numbers
        .map(|n| (n, Identity::new(ACTION).part(n)))
        .collect();
    all_ran(gate, batch, body).await
}

/// Guards `batch`, no-op bodies: an error unless every message ran.
async fn all_ran(gate: &Gate, batch: Batch<u64>, body: Body) -> Result<(), BoxError> {
    let size = batch.len();
    let results = gate
        .guard_batch(batch)
        .run(|_| async move {
            body.run().await;
            Ok::<(), Rejected>(())
        })
        .await;
    let refused: Vec<&Rejected> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if results.len() != size || !refused.is_empty() {
        let first = refused
            .first()
            .map_or(String::new(), |r| format!(", the first: {r}"));
        return Err(format!(
            "gate.guard_batch of {size} new identities answered {} items, {} refused{first}",
            results.len(),
            refused.len()
        )
        .into());
    }
    Ok(())
}
