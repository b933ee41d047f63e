//! One operation of a scenario, with everything it needs to run.

use std::sync::Arc;

use idem::sqlx::PgPool;

use crate::accounts::{Accounts, Gates};
use crate::body::Body;
use crate::drive::Operation;
use crate::duplicates::Settled;
use crate::floor::Floor;
use crate::fused::Fused;
use crate::http::{Routers, Way};
use crate::stepped::{self, Commit, Steps};
use crate::{BoxError, advisory, brandur, gated, keys, recovery_points, steps_in_row};

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Hand-written claim and settle.
    Floor(Floor),
    /// The `#[idempotent]` function.
    Gate,
    /// The same guard by hand: `gate.guard(&id).run(body)`.
    GuardByHand,
    /// The `#[idempotent]` function in an opt-in mode.
    GateMode(GateMode),
    /// `gate.guard_batch` of `--batch-size` new identities.
    GateBatch,
    /// The same, each message an ordered event (`Batch::push_ordered`).
    GateBatchOrdered,
    /// The Stripe-style `idempotency_keys` table.
    Brandur,
    /// A guard whose body runs three no-op steps, its outcome (the settle
    /// and each step's record) committing as said ([`stepped`]).
    ThreeSteps(Steps, Commit),
    /// The same three phases by hand, as recovery points
    /// ([`recovery_points`]).
    RecoveryPoints,
    /// A sketch of three steps kept in the claim's own row, by hand
    /// ([`steps_in_row`]).
    StepsInRow,
    /// A session advisory lock held across the body.
    Advisory,
    /// Refuses a settled identity with one `SELECT`.
    RefuseByLookup,
    /// Refuses a settled identity through the gate.
    RefuseThroughGate,
    /// Refuses a settled identity through a gate with the local outcome
    /// cache, warmed ([`cached`](crate::cached)).
    RefuseThroughCachedGate,
    /// Refuses a settled identity with a one-statement claim.
    RefuseByFusedClaim(Fused),
    /// A `POST` guarded by `#[idempotent]` on its axum handler, or by
    /// `IdempotencyLayer` ([`http`](crate::http)).
    Http(Way),
}

/// The opt-in modes, each an `#[idempotent]` fn of [`gated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateMode {
    AsyncOutcome,
    Replay,
    Fingerprint,
    Lease,
    Ordered,
    InTransaction,
}

/// A scenario's work, bound to one run's pool and gate.
pub struct Workload {
    pub work: Work,
    pub body: Body,
    pub pool: PgPool,
    /// Which account operation `n` claims in.
    pub accounts: Arc<Accounts>,
    /// The gate over `pool`, scoped to each of `accounts`.
    pub gates: Gates,
    /// Messages per batch, for [`Work::GateBatch`] and
    /// [`Work::GateBatchOrdered`].
    pub batch_size: u64,
    /// The rows the duplicates group refuses.
    pub settled: Option<Arc<Settled>>,
    /// The axum routers of [`Work::Http`], on the default account's gate.
    pub routers: Routers,
}

impl Workload {
    /// Runs operation number `n`; an error means the run measured something
    /// other than what it claims to, and stops it.
    pub async fn run(&self, n: u64) -> Result<(), BoxError> {
        match self.work {
            Work::Floor(floor) => {
                floor
                    .run(&self.pool, self.accounts.of(n), n, self.body)
                    .await
            }
            Work::Gate => Ok(gated::guarded(self.gates.of(n), n, self.body).await?),
            Work::GuardByHand => Ok(gated::guarded_by_hand(self.gates.of(n), n, self.body).await?),
            Work::GateMode(mode) => self.run_mode(mode, n).await,
            // `n` picks the account; the batch's identities are fresh ones
            // of their own.
            Work::GateBatch => {
                let identities = keys::next_many(self.batch_size);
                gated::batch(self.gates.of(n), identities, self.body).await
            }
            Work::GateBatchOrdered => {
                let identities = keys::next_many(self.batch_size);
                gated::batch_ordered(self.gates.of(n), identities, self.body).await
            }
            Work::Brandur => brandur::run(&self.pool, n, self.body).await,
            Work::ThreeSteps(steps, commit) => {
                stepped::three_steps(self.gates.of(n), n, steps, commit).await
            }
            Work::RecoveryPoints => recovery_points::run(&self.pool, n).await,
            Work::StepsInRow => steps_in_row::run(&self.pool, self.accounts.of(n), n).await,
            Work::Advisory => advisory::run(&self.pool, n, self.body).await,
            Work::RefuseByLookup => self.settled()?.refuse_by_lookup(&self.pool, n).await,
            // The gates of a cached run carry the cache (`cached::gate_for`).
            Work::RefuseThroughGate | Work::RefuseThroughCachedGate => {
                self.settled()?.refuse_through_gate(&self.gates, n).await
            }
            Work::Http(way) => crate::http::charge_once(&self.routers, way, n).await,
            Work::RefuseByFusedClaim(fused) => {
                self.settled()?
                    .refuse_by_fused_claim(&self.pool, fused, n)
                    .await
            }
        }
    }

    async fn run_mode(&self, mode: GateMode, n: u64) -> Result<(), BoxError> {
        let (gate, body) = (self.gates.of(n), self.body);
        match mode {
            GateMode::AsyncOutcome => gated::guarded_async(gate, n, body).await?,
            GateMode::Replay => {
                let value = gated::guarded_replay(gate, n, body).await?;
                if value != n {
                    return Err(format!("replay returned {value} for {n}").into());
                }
            }
            GateMode::Fingerprint => {
                let amount = i64::try_from(n % 100_000)?;
                gated::guarded_fingerprint(gate, n, amount, "EUR", body).await?
            }
            GateMode::Lease => gated::guarded_lease(gate, n, body).await?,
            GateMode::Ordered => {
                gated::guarded_ordered(gate, n, n % gated::ORDERED_ENTITIES, body).await?
            }
            GateMode::InTransaction => {
                let mut tx = self.pool.begin().await?;
                gated::guarded_in_transaction(gate, &mut tx, n, body).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    fn settled(&self) -> Result<&Settled, BoxError> {
        self.settled
            .as_deref()
            .ok_or_else(|| "a refusal scenario ran without settled rows".into())
    }
}

impl Operation for Workload {
    fn run(&self, n: u64) -> impl Future<Output = Result<(), BoxError>> + Send {
        Workload::run(self, n)
    }
}
