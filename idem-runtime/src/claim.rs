//! The handle of a won slot, and recording what became of it.
//!
//! A [`Claim`] settles (success, kept forever) or releases (failure, the
//! slot freed for a retry). Either is matched on the claim's fence; when it
//! matches nothing, the claim is no longer this holder's, and a success is
//! still written into the slot (a success that happened is never forgotten)
//! while the holder is told what became of its claim.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::attach::{Held, Landing};
use crate::decision::Decision;
use crate::error::Rejected;
use crate::fault::{self, Fault};
use crate::identity::Identity;
use crate::measure::Stopwatch;
use crate::mode::{self, Disposition};
use crate::outcome::Outcome;
use crate::retry;
use crate::scoped_pool::ScopedPool;
use crate::settled::Final;
use crate::store::{self, Commit, LateSuccess};
use crate::via::Via;

/// How often a holder whose claim is no longer its own tries to record its
/// success in the slot, when the slot changes under it between the look and
/// the write. Each miss means another claim or release of this very slot
/// landed within one round trip, so a few are plenty; should every one miss,
/// the error says the success could not be kept.
const LATE_SUCCESS_ATTEMPTS: usize = 8;

/// A won slot (or, for an absent identity or a fail-open run, no slot at
/// all). Record the outcome with [`settle`](Claim::settle) or
/// [`release`](Claim::release); dropping it unresolved leaves the row
/// pending, which refuses every retry until its lease (if any) runs out or an
/// operator resolves it.
#[must_use = "a claim must be settled or released; dropped, it keeps its slot pending"]
pub struct Claim {
    held: Option<WonSlot>,
}

/// A slot this caller won: what [`acquire`](crate::acquire) hands over, and what
/// the claim needs to record its outcome.
pub(crate) struct WonSlot {
    pub(crate) slots: ScopedPool,
    pub(crate) identity: Identity,
    /// The payload's fingerprint, kept with a late success.
    pub(crate) fingerprint: Option<[u8; 20]>,
    pub(crate) address: String,
    pub(crate) fence: i64,
    /// The fence the claim began with: ours, or the one of the claim we took
    /// over. A row that still carries it was taken over, not released.
    pub(crate) lineage: i64,
    pub(crate) lease: Arc<Lease>,
    /// Since the claim was won (or its body's turn came, in a batch): how
    /// long the body ran.
    pub(crate) won: Stopwatch,
    /// Inside the caller's transaction, the transaction decides: a dropped
    /// claim is rolled back with it, so there is nothing to warn about.
    pub(crate) in_transaction: bool,
    /// The claim's retention windows: with either, its outcome is never
    /// remembered by this process (the window could end while it is), and
    /// a late success written into its vacant slot keeps them.
    pub(crate) windows: store::Windows,
    /// How the outcome commits.
    pub(crate) commit: Commit,
    /// An ordered event's entity address and order: a late success written
    /// into its vacant slot counts as applied for the entity.
    pub(crate) ordered: Option<(String, i64)>,
    /// Registered in the gate's claims in flight, for a duplicate of this
    /// process to await the outcome instead of polling; never a claim made
    /// inside the caller's transaction, undecided until it commits.
    pub(crate) attached: Option<Held>,
}

/// The claim's lease, if it has one, by this process's clock: only to
/// tell, when the claim is gone, a lease that ran out (and was taken over,
/// then released) from a claim removed under a live lease.
pub(crate) struct Lease {
    leased: bool,
    /// `None`: no lease, or one too long for the clock to hold.
    ends: Mutex<Option<Instant>>,
}

impl Lease {
    /// A lease of `lease` (`None`: none) starting now.
    pub(crate) fn from_now(lease: Option<Duration>) -> Lease {
        Lease {
            leased: lease.is_some(),
            ends: Mutex::new(lease.and_then(|lease| Instant::now().checked_add(lease))),
        }
    }

    fn renewed(&self, lease: Duration) {
        *self.ends.lock().unwrap_or_else(PoisonError::into_inner) =
            Instant::now().checked_add(lease);
    }

    /// What is left of it now; `None`: no lease, or one too long for the
    /// clock to hold.
    fn left(&self) -> Option<Duration> {
        self.ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|ends| ends.saturating_duration_since(Instant::now()))
    }

    /// How long a step's record may wait for the run's next statement to
    /// carry it, at most `wait`: that long without a lease (nobody takes
    /// such a claim over), and with one only while a good margin of it is
    /// left, so that the record lands long before anyone may take the
    /// claim over and record the step otherwise. `None`: record it now
    /// (always, for a `wait` of zero).
    pub(crate) fn carry_for(&self, wait: Duration) -> Option<Duration> {
        if wait.is_zero() {
            return None;
        }
        if !self.leased {
            return Some(wait);
        }
        match self.left() {
            // Too long for the clock to hold.
            None => Some(wait),
            Some(left) => (left >= wait.saturating_mul(4)).then_some(wait),
        }
    }

    /// Why the claim at `address` is no longer its holder's, when it was
    /// found gone: `LeaseLost` once its lease ran out by this clock (it was
    /// taken over, then perhaps released), `ClaimLost` before (someone
    /// released or removed it under a live lease, or one it never had).
    pub(crate) fn lost(&self, address: &str) -> Rejected {
        let address = address.to_owned();
        if self.ran_out() {
            Rejected::LeaseLost { address }
        } else {
            Rejected::ClaimLost { address }
        }
    }

    fn ran_out(&self) -> bool {
        self.ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|ends| Instant::now() >= ends)
    }
}

impl Claim {
    /// The claim of a slot just won.
    pub(crate) fn won(held: WonSlot) -> Claim {
        Claim { held: Some(held) }
    }

    /// No slot at all: an absent identity, or a store down under a mode that
    /// fails open. Settling or releasing it does nothing.
    pub(crate) fn ungated() -> Claim {
        Claim { held: None }
    }

    /// `false` when nothing was claimed (an absent identity, or the store was
    /// down and the mode fails open).
    pub fn is_gated(&self) -> bool {
        self.held.is_some()
    }

    /// The claimed address, if anything was claimed.
    pub fn address(&self) -> Option<&str> {
        self.held.as_ref().map(|held| held.address.as_str())
    }

    /// The fencing token: higher for every later claim or takeover of any
    /// slot. Pass it to external systems that can reject stale writers.
    pub fn fence(&self) -> Option<i64> {
        self.held.as_ref().map(|held| held.fence)
    }

    /// Records success: the row becomes `success` and keeps the slot forever.
    ///
    /// If the store fails, the row stays `pending` (fail closed): retries
    /// are refused rather than risk running the action twice; the error is
    /// [`Rejected::Unavailable`] (an outage) or [`Rejected::StoreRefused`].
    /// If the claim is no longer this holder's, the success is still
    /// recorded in the slot unless it is already settled (a success that
    /// happened is never forgotten), and the error says what happened:
    /// [`Rejected::LeaseLost`] (its lease ran out and another invocation
    /// took it over) or [`Rejected::ClaimLost`] (someone released or removed
    /// it). If somebody else recorded a success or a failure over this
    /// claim's row meanwhile (a reconciler or an operator resolved it, an
    /// earlier holder's late success settled it), that outcome stands and
    /// the error is [`Rejected::NotRecorded`]: every duplicate is told the
    /// recorded outcome, never this one. A claim its lease turned in doubt
    /// (`on_expiry = "in_doubt"`, nobody took it over) is settled with this
    /// success, the outcome nobody knew, and `Ok` is returned. A settle
    /// repeated after its reply was lost finds the row as it wrote it, and
    /// is `Ok` too.
    ///
    /// A claim made inside the caller's transaction is a
    /// [`TxClaim`](crate::TxClaim) ([`Guard::tx`](crate::Guard::tx)), which
    /// records on that transaction.
    pub async fn settle(self) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(Outcome::Succeeded(None), &mut Via::Pool(&pool))
            .await
    }

    /// Records failure: the row is deleted, so a retry can run the action.
    ///
    /// If the store fails, the row stays `pending` (fail closed). If the
    /// claim was taken over, nothing changes and the error is
    /// [`Rejected::LeaseLost`]: the new holder decides. A claim that is gone
    /// already (released by someone else, or by an earlier attempt of this
    /// release whose reply was lost) counts as released. A claim somebody
    /// else recorded meanwhile is left as it is, with
    /// [`Rejected::NotRecorded`] (see [`dispose`](Claim::dispose)).
    pub async fn release(self) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(Outcome::Failed(Disposition::Release), &mut Via::Pool(&pool))
            .await
    }

    /// Records a failure as `disposition` says: [`Release`] deletes the row
    /// (as [`release`](Claim::release) does), [`Keep`] keeps the slot as
    /// `failed` (duplicates are refused [`Rejected::AlreadyFailed`]),
    /// [`InDoubt`] holds it `in_doubt` (duplicates are refused
    /// [`Rejected::InDoubt`] until a reconciler or an operator resolves it).
    ///
    /// As with a release, a store failure leaves the row `pending` (fail
    /// closed), and a claim taken over meanwhile is left to its new holder
    /// ([`Rejected::LeaseLost`]). A [`Keep`] or an [`InDoubt`] of a claim
    /// that somebody released or removed meanwhile (an operator's `idem
    /// claims release`) holds nothing: the slot is free and a retry runs,
    /// so the error is [`Rejected::ClaimLost`] (or `LeaseLost`, once the
    /// lease ran out).
    ///
    /// A claim under the claim's fence that somebody else recorded
    /// meanwhile (a reconciler or an operator resolved it, its lease ran
    /// out under `on_expiry = "in_doubt"`, an earlier holder's late success
    /// settled it) is left as it is: the error is
    /// [`Rejected::NotRecorded`], saying what the slot records.
    ///
    /// [`Release`]: Disposition::Release
    /// [`Keep`]: Disposition::Keep
    /// [`InDoubt`]: Disposition::InDoubt
    pub async fn dispose(self, disposition: Disposition) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(Outcome::Failed(disposition), &mut Via::Pool(&pool))
            .await
    }

    /// Renews the lease to `lease` from now, for bodies that run long.
    ///
    /// A claim made without a lease holds until it is resolved: there is
    /// nothing to renew, and it stays unexpirable; so does a claim made
    /// inside the caller's transaction, which never has a lease (a guard
    /// with [`tx`](crate::Guard::tx) has no `lease`). `lease` is checked as
    /// [`Guard::lease`](crate::Guard::lease) checks it ([`Rejected::InvalidOption`]).
    /// [`Rejected::LeaseLost`] if the claim is no longer held under its
    /// lease: taken over meanwhile, or, under `on_expiry = "in_doubt"`,
    /// turned in doubt by a duplicate that found the lease run out (nobody
    /// else ran it then, and its late [`settle`](Claim::settle) is still
    /// recorded as the outcome nobody knew).
    pub async fn extend(&self, lease: Duration) -> Result<(), Rejected> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        let micros = mode::lease_micros(lease)?;
        if !held.lease.leased {
            return Ok(());
        }
        let (scope, address, fence) = (held.slots.scope(), &*held.address, held.fence);
        let via = &mut Via::Pool(held.slots.pool());
        let extended = retry::repeat_recording!(via, |conn| {
            store::extend(&mut *conn, scope, address, fence, micros).await
        });
        match extended {
            Ok(true) => {
                held.lease.renewed(lease);
                Ok(())
            }
            Ok(false) => {
                let lost = Rejected::LeaseLost {
                    address: held.address.clone(),
                };
                held.event(
                    tracing::Level::ERROR,
                    "lease extension found the claim taken over",
                    Some(&lost),
                );
                Err(lost)
            }
            Err(error) => Err(Rejected::from_store(error)),
        }
    }

    /// The pool of the gate that made this claim, if anything was claimed,
    /// to record its outcome through. (A claim made inside the caller's
    /// transaction is a [`TxClaim`](crate::TxClaim), which records on
    /// that transaction instead.)
    fn pool(&self) -> Option<PgPool> {
        self.held.as_ref().map(|held| held.slots.pool().clone())
    }

    /// Records success keeping `value` (as JSON) for replay: a later
    /// duplicate guarded with [`replay`](crate::Guard::replay) is handed it
    /// ([`ClaimOrReplay::Replayed`](crate::ClaimOrReplay::Replayed)) instead
    /// of [`Rejected::AlreadyDone`].
    ///
    /// A duplicate gets exactly this value (as its type's serde
    /// implementation writes and reads it: a field serde skips comes back
    /// as its default) or nothing: one that would not read back as itself (it fails to serialize, or JSON writes it as
    /// something else: `Some(())`, `Some(None)` and a NaN are all `null`,
    /// which reads back as `None`) is not kept. The success is never lost
    /// to its value: the claim is settled without one, a tracing error
    /// says so, and duplicates are refused `AlreadyDone`. Otherwise as
    /// [`settle`](Claim::settle).
    pub async fn settle_value<T: serde::Serialize + serde::de::DeserializeOwned>(
        self,
        value: &T,
    ) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        let json = crate::stored_value::for_replay(self.address(), value);
        self.settle_on(json.as_deref(), &mut Via::Pool(&pool)).await
    }

    /// Settles the claim, keeping `output` (the `Ok` value for replay).
    pub(crate) async fn settle_on(
        self,
        output: Option<&str>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        self.finish(Outcome::Succeeded(output), via).await
    }

    /// Settles the claim, keeping `output` (the `Ok` value for replay).
    pub(crate) async fn settle_with(
        self,
        output: Option<&str>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        self.finish(Outcome::Succeeded(output), via).await
    }

    /// Settles a success as [`settle_with`](Claim::settle_with) does, with
    /// the record of the step its body finished last riding in the same
    /// statement ([`store::SETTLE_CARRYING_STEP`]). The second value says
    /// whether that record went in: `false` is for the step to look into
    /// (an earlier attempt's, whose reply was lost, or somebody else's).
    pub(crate) async fn settle_carrying(
        mut self,
        output: Option<&str>,
        carried: store::CarriedRecord<'_>,
        via: &mut Via<'_>,
    ) -> (Result<(), Rejected>, bool) {
        let Some(held) = self.held.take() else {
            return (Ok(()), false);
        };
        let outcome = Outcome::Succeeded(output);
        let mut recorded = false;
        let recording = Stopwatch::start();
        let settled = held
            .record(outcome, Some((carried, &mut recorded)), via)
            .await;
        held.report(outcome, &settled, &recording);
        (settled, recorded)
    }

    /// Records a failure as `disposition` says.
    pub(crate) async fn dispose_via(
        self,
        disposition: Disposition,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        self.finish(Outcome::Failed(disposition), via).await
    }

    /// The slot this claim holds, if any.
    pub(crate) fn held(&self) -> Option<&WonSlot> {
        self.held.as_ref()
    }

    /// What is left of the claim's lease by this process's clock; `None`:
    /// no lease (or one too long for the clock to hold), or no slot.
    pub(crate) fn lease_left(&self) -> Option<Duration> {
        self.held.as_ref()?.lease.left()
    }

    /// Lets go of a claim found lost before its body started (a batch's
    /// queued item): nothing of this holder's ran, so there is nothing to
    /// record and nothing to warn about as it goes.
    pub(crate) fn forget(mut self) {
        self.held = None;
    }

    /// Lets go of a claim whose body succeeded after one of its steps found
    /// the claim no longer this holder's (`lost`), without recording the
    /// success: the body went on without the steps that were refused, so
    /// its success is not the action's, and writing it over whoever holds
    /// the slot now would end that holder's run for it.
    pub(crate) fn let_go_lost(mut self, lost: &Rejected) {
        if let Some(held) = self.held.take() {
            Decision::Unrecorded(lost).recorded(
                &held.slots,
                &held.identity,
                &held.won,
                &Stopwatch::start(),
            );
            held.event(
                tracing::Level::WARN,
                "the body returned Ok after one of its steps found the claim no longer this \
                 holder's: its success is not recorded, since it went on without the steps \
                 that were refused",
                Some(lost),
            );
        }
    }

    /// The body of this claim starts now: a batch's body may wait for its
    /// turn after the claim was won.
    pub(crate) fn body_starts(&mut self) {
        if let Some(held) = &mut self.held {
            held.won = Stopwatch::start();
        }
    }

    /// `outcome` was written over this holder's own row by a batch
    /// statement begun at `recording`: remembers and reports it, as
    /// [`finish`](Claim::finish) does after its own statement.
    pub(crate) fn recorded_in_batch(
        mut self,
        outcome: Outcome<Option<&str>>,
        via: &Via<'_>,
        recording: &Stopwatch,
    ) {
        if let Some(held) = self.held.take() {
            held.tell_this_process(outcome, via);
            held.report(outcome, &Ok(()), recording);
        }
    }

    /// Records `outcome` through `via`, and reports it.
    pub(crate) async fn finish(
        mut self,
        outcome: Outcome<Option<&str>>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let recording = Stopwatch::start();
        let recorded = held.record(outcome, None, via).await;
        held.report(outcome, &recorded, &recording);
        recorded
    }

    /// Holds the claim in doubt because of something other than its body's
    /// own verdict, saying so in `reason` (the row's `state_reason`): a
    /// detached body stopped past its bound, at shutdown, or panicked
    /// ([`detach`](crate::detach)). Reported as any hold in doubt.
    pub(crate) async fn hold_in_doubt(
        mut self,
        reason: &'static str,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let outcome = Outcome::Failed(Disposition::InDoubt);
        let recording = Stopwatch::start();
        let (scope, address, fence) = (held.slots.scope(), &*held.address, held.fence);
        let recorded = match retry::repeat_recording!(via, |conn| {
            store::hold_in_doubt(&mut *conn, scope, address, fence, reason).await
        }) {
            Ok(wrote @ store::Wrote::Row { .. }) => {
                held.recorded(outcome, wrote, via).await;
                Ok(())
            }
            Ok(store::Wrote::Nothing) => {
                let found = held.no_longer_ours(outcome, via).await;
                if found.is_ok() {
                    held.recorded(outcome, store::Wrote::UNSAID, via).await;
                }
                found
            }
            Err(error) => Err(Rejected::from_store(error)),
        };
        held.report(outcome, &recorded, &recording);
        recorded
    }
}

impl WonSlot {
    /// Says what became of `outcome`, whose recording began at
    /// `recording`: to tracing, to a race harness and to the metrics.
    fn report(
        &self,
        outcome: Outcome<Option<&str>>,
        recorded: &Result<(), Rejected>,
        recording: &Stopwatch,
    ) {
        let decision = match recorded {
            Ok(()) => Decision::Recorded(outcome.kind()),
            Err(rejected) => Decision::Unrecorded(rejected),
        };
        decision.recorded(&self.slots, &self.identity, &self.won, recording);
        match decision {
            Decision::Recorded(Outcome::Succeeded(_)) => {
                self.event(tracing::Level::DEBUG, "settled", None);
            }
            Decision::Recorded(Outcome::Failed(Disposition::Keep)) => {
                self.event(
                    tracing::Level::INFO,
                    "failure kept: the slot is failed",
                    None,
                );
            }
            Decision::Recorded(Outcome::Failed(Disposition::InDoubt)) => {
                self.event(
                    tracing::Level::WARN,
                    "outcome in doubt: the slot is held until a reconciler or an operator \
                     resolves it",
                    None,
                );
            }
            Decision::Recorded(Outcome::Failed(Disposition::Release)) => {
                self.event(tracing::Level::DEBUG, "released", None);
            }
            // Only the two above come out of a recording.
            Decision::Won { .. }
            | Decision::Replayed
            | Decision::Ungated
            | Decision::FailedOpen
            | Decision::Refused(_)
            | Decision::ExpiredIntoDoubt => {}
            Decision::Unrecorded(rejected) => {
                let message = match rejected {
                    Rejected::NotRecorded { .. } => {
                        "this holder's outcome was not recorded: the slot already records one \
                         somebody else wrote, which every duplicate is told"
                    }
                    Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. } => match outcome {
                        Outcome::Succeeded(_) => {
                            "the claim was no longer this holder's when its success was recorded; \
                             the success is kept in the slot unless it was settled already"
                        }
                        Outcome::Failed(_) => {
                            "the claim was taken over before its failure was recorded: the new \
                             holder decides"
                        }
                    },
                    _ => match outcome {
                        Outcome::Succeeded(_) => {
                            "settle failed; the slot stays pending (fail closed) until resolved"
                        }
                        Outcome::Failed(_) => {
                            "recording the failure failed; the slot stays pending (fail closed) \
                             until resolved"
                        }
                    },
                };
                self.event(tracing::Level::ERROR, message, Some(rejected));
            }
        }
    }

    /// Records `outcome`: the statement, retried after a transient failure;
    /// a success whose value the store refuses, again without the value;
    /// and, when it matched no row of ours, what became of the claim.
    /// `carried`: a step's record to write in the settle's statement, and
    /// where to say whether it went in.
    async fn record(
        &self,
        outcome: Outcome<Option<&str>>,
        mut carried: Option<(store::CarriedRecord<'_>, &mut bool)>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        let mut written = outcome;
        let mut attempt = self.record_once(outcome, carried.as_mut(), via).await;
        // Inside the caller's transaction the failure has aborted it: the
        // claim rolls back with the body's writes, and nothing is lost.
        let carries_a_value = matches!(outcome, Outcome::Succeeded(Some(_)));
        if carries_a_value && !via.in_transaction() {
            attempt = match attempt {
                Err(error) if fault::classify(&error) != Fault::Outage => {
                    self.event(
                        tracing::Level::ERROR,
                        "the settle carrying the Ok value for replay was refused (not an \
                         outage); settling without the value, so that the success is kept and \
                         duplicates are refused as already done",
                        Some(&Rejected::from_store(error)),
                    );
                    written = Outcome::Succeeded(None);
                    self.record_once(written, carried.as_mut(), via).await
                }
                other => other,
            };
        }
        match attempt {
            Ok(wrote @ store::Wrote::Row { .. }) => {
                self.recorded(written, wrote, via).await;
                Ok(())
            }
            // A claim made inside the caller's transaction is that
            // transaction's uncommitted row: nobody else can see it, take it
            // over or release it, so no row under our fence means this is
            // another connection. Looking further would write a late
            // success into what looks like a vacant slot, and wait forever
            // on the row the claim's own open transaction holds.
            Ok(store::Wrote::Nothing) if self.in_transaction => {
                let misused = Rejected::WrongConnection {
                    called: match outcome {
                        Outcome::Succeeded(_) => {
                            "TxClaim::settle on another connection than its transaction's"
                        }
                        Outcome::Failed(Disposition::Release) => {
                            "TxClaim::release on another connection than its transaction's"
                        }
                        Outcome::Failed(_) => {
                            "TxClaim::dispose on another connection than its transaction's"
                        }
                    },
                    instead: "a claim made inside a transaction is recorded on that \
                              transaction's connection, where its row is: call it with the \
                              transaction the claim was made in",
                };
                self.event(
                    tracing::Level::ERROR,
                    "the outcome of a claim made inside a transaction was recorded on another \
                     connection; nothing was recorded",
                    Some(&misused),
                );
                Decision::Unrecorded(&misused).observed_only();
                Err(misused)
            }
            Ok(store::Wrote::Nothing) => {
                let found = self.no_longer_ours(outcome, via).await;
                // `Ok` here is this holder's own outcome after all (an
                // earlier attempt whose reply was lost, a late success over
                // a claim turned in doubt): a final fact the cache may hold,
                // as after a first attempt that matched.
                if found.is_ok() {
                    self.recorded(written, store::Wrote::UNSAID, via).await;
                }
                found
            }
            Err(error) => Err(Rejected::from_store(error)),
        }
    }

    /// `written` was just recorded over this holder's own row by a
    /// statement of its own that `wrote`: tells this process (the cache,
    /// and the duplicates attached here) and wakes those waiting in others.
    async fn recorded(
        &self,
        written: Outcome<Option<&str>>,
        wrote: store::Wrote,
        via: &mut Via<'_>,
    ) {
        self.tell_this_process(written, via);
        self.wake(wrote, via).await;
    }

    /// Tells this process what was just written over this holder's own
    /// row: its outcome cache ([`remember`](Self::remember)) and the
    /// duplicates attached to the claim ([`land`](Self::land)).
    fn tell_this_process(&self, written: Outcome<Option<&str>>, via: &Via<'_>) {
        self.remember(written, via);
        self.land(written, via);
    }

    /// Tells the outcome cache, if the gate has one, what was just written
    /// over this holder's own row: a success (with the value it kept) or a
    /// failure kept for good. Never from inside the caller's transaction,
    /// which may still roll back.
    fn remember(&self, written: Outcome<Option<&str>>, via: &Via<'_>) {
        if via.in_transaction() || self.windows.any() {
            return;
        }
        let (identity, fingerprint) = (
            self.identity.canonical(),
            self.fingerprint.as_ref().map(|f| f.as_slice()),
        );
        self.slots.remember(&self.address, || match written {
            Outcome::Succeeded(output) => Some(Final::settled(identity, fingerprint, output)),
            Outcome::Failed(Disposition::Keep) => Some(Final::failed(identity, fingerprint)),
            Outcome::Failed(_) => None,
        });
    }

    /// Tells this process's duplicates waiting on the claim (attached to
    /// it) what was just written over this holder's own row, as a lookup
    /// would read it: a final fact, a hold in doubt, a release; an outcome
    /// with a window is only said to have landed (they read it, as the
    /// cache never answers one). Never from inside the caller's
    /// transaction, whose claims are not attached to.
    fn land(&self, written: Outcome<Option<&str>>, via: &Via<'_>) {
        let Some(attached) = &self.attached else {
            return;
        };
        if via.in_transaction() {
            return;
        }
        let (identity, fingerprint) = (
            self.identity.canonical(),
            self.fingerprint.as_ref().map(|f| f.as_slice()),
        );
        let windowed = self.windows.any();
        attached.landed(|| match written {
            Outcome::Failed(Disposition::Release) => Landing::Freed,
            _ if windowed => Landing::Look,
            Outcome::Succeeded(output) => {
                Landing::Final(Final::settled(identity, fingerprint, output))
            }
            Outcome::Failed(Disposition::Keep) => {
                Landing::Final(Final::failed(identity, fingerprint))
            }
            Outcome::Failed(Disposition::InDoubt) => Landing::InDoubt {
                identity: identity.into(),
                fingerprint: fingerprint.map(Box::from),
            },
        });
    }

    /// Wakes the duplicates waiting on this claim in other processes, when
    /// the outcome statement that `wrote` found one marked it
    /// (`store::MARK_AWAITED`): one more statement, sent only then. Not
    /// from inside the caller's transaction, which a failed notification
    /// would abort (its waiters look once a second). A wake-up that fails
    /// is only lost time: the waiters look for themselves.
    async fn wake(&self, wrote: store::Wrote, via: &mut Via<'_>) {
        if !wrote.awaited() || via.in_transaction() {
            return;
        }
        let woken = async {
            let mut conn = via.connection().await?;
            store::wake(&mut *conn, &self.address).await
        }
        .await;
        if let Err(error) = woken {
            self.event(
                tracing::Level::DEBUG,
                "the wake-up of duplicates waiting in other processes was not sent; they look \
                 for themselves",
                Some(&Rejected::from_store(error)),
            );
        }
    }

    /// One settle or release statement, retried after a transient failure
    /// (it is matched on the fence, so a repeat changes nothing).
    /// [`store::Wrote::Nothing`]: no pending row under this fence.
    async fn record_once(
        &self,
        outcome: Outcome<Option<&str>>,
        carried: Option<&mut (store::CarriedRecord<'_>, &mut bool)>,
        via: &mut Via<'_>,
    ) -> Result<store::Wrote, sqlx::Error> {
        let (scope, address, fence) = (self.slots.scope(), &*self.address, self.fence);
        // Inside the caller's transaction `synchronous_commit = off` would
        // hold for the caller's whole commit (the guard refuses the two
        // together at compile time; this keeps the store honest), so it
        // commits durably.
        let commit = if via.in_transaction() {
            Commit::Durable
        } else {
            self.commit
        };
        if let (Outcome::Succeeded(output), Some((step, recorded))) = (outcome, carried) {
            let written: store::SettledCarrying = retry::repeat_recording!(via, |conn| {
                store::settle_carrying_step(
                    &mut *conn, scope, address, fence, output, *step, commit,
                )
                .await
            })?;
            // An attempt that wrote it, whose reply was lost, leaves the
            // next one `false`: said once written, it stays said.
            **recorded |= written.recorded;
            return Ok(written.settled);
        }
        retry::repeat_recording!(via, |conn| match outcome {
            Outcome::Succeeded(output) => {
                store::settle(&mut *conn, scope, address, fence, output, commit).await
            }
            Outcome::Failed(Disposition::Keep) => {
                store::keep(
                    &mut *conn,
                    scope,
                    address,
                    fence,
                    commit,
                    store::KEPT_FAILURE,
                )
                .await
            }
            Outcome::Failed(Disposition::InDoubt) => {
                store::hold_in_doubt(&mut *conn, scope, address, fence, store::BODY_IN_DOUBT).await
            }
            Outcome::Failed(_) => store::release(&mut *conn, scope, address, fence, commit).await,
        })
    }

    /// The settle or release matched no pending row under this fence: find
    /// out what became of the claim, and make sure a success is kept.
    async fn no_longer_ours(
        &self,
        outcome: Outcome<Option<&str>>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        match outcome {
            Outcome::Failed(disposition) => {
                let row = self.look(via).await?;
                self.failure_matched_nothing(disposition, row.as_ref())
            }
            Outcome::Succeeded(output) => self.keep_success(output, via).await,
        }
    }

    /// A failure's statement matched no pending row of ours. Still under
    /// our fence, the row records what this holder wrote (an earlier
    /// attempt whose reply was lost) or what somebody else wrote over it
    /// (a resolution, an expiry into doubt, an earlier holder's late
    /// success): then this failure was not recorded, and the holder is told
    /// what is. Gone, or claimed anew, a release happened (by an earlier
    /// attempt, or by someone else); a failure kept or held in doubt did
    /// not (an earlier attempt of it would have left its row): somebody
    /// removed the claim, the slot is free to a retry, and the holder must
    /// not hear that its failure holds the slot. Taken over: the new holder
    /// decides.
    fn failure_matched_nothing(
        &self,
        disposition: Disposition,
        row: Option<&store::Existing>,
    ) -> Result<(), Rejected> {
        let releasing = !matches!(disposition, Disposition::Keep | Disposition::InDoubt);
        let removed = || {
            if releasing {
                Ok(())
            } else {
                Err(self.lease.lost(&self.address))
            }
        };
        let Some(row) = row.filter(|row| self.identity.is_stored_as(&row.identity)) else {
            return removed();
        };
        if row.fence == self.fence {
            let own = row.written_by_its_holder()
                && match disposition {
                    Disposition::Keep => row.state == store::ClaimState::Failed,
                    Disposition::InDoubt => row.state == store::ClaimState::InDoubt,
                    _ => false,
                };
            return if own {
                Ok(())
            } else {
                Err(self.not_recorded(row))
            };
        }
        if row.lineage == self.lineage {
            return Err(self.lease_lost());
        }
        removed()
    }

    /// The holder's outcome was not recorded, because `row`, still under
    /// its fence, records one somebody else wrote: says which.
    fn not_recorded(&self, row: &store::Existing) -> Rejected {
        Rejected::NotRecorded {
            address: self.address.clone(),
            recorded: recorded_by_another(row),
        }
    }

    /// A settle matched no pending row of ours: unless an earlier attempt of
    /// it committed, write the success into the slot anyway (over the pending
    /// row that replaced ours, or into the vacant slot), and say what became
    /// of the claim.
    async fn keep_success(&self, output: Option<&str>, via: &mut Via<'_>) -> Result<(), Rejected> {
        for _ in 0..LATE_SUCCESS_ATTEMPTS {
            let (seen, lost) = match self.look(via).await? {
                // Released under us while the body ran, by the holder that
                // took it over or by someone else.
                None => (None, self.lease.lost(&self.address)),
                // A colliding identity claimed the vacant slot: the success
                // cannot be written there. Said loudly by `finish`.
                Some(row) if !self.identity.is_stored_as(&row.identity) => {
                    return Err(self.claim_lost());
                }
                // Still under our fence and settled: by an earlier attempt
                // of this very settle, whose reply was lost, or by somebody
                // else over our row (a reconciler, an operator, an earlier
                // holder's late success), whose success every duplicate is
                // told instead of ours.
                Some(row) if row.settled && row.fence == self.fence => {
                    return if row.written_by_its_holder() {
                        Ok(())
                    } else {
                        Err(self.not_recorded(&row))
                    };
                }
                // Resolved as a definite failure by a reconciler or an
                // operator meanwhile: a resolution stands, and is theirs to
                // correct (`idem claims show` says who resolved it).
                Some(row) if row.state == store::ClaimState::Failed && row.fence == self.fence => {
                    return Err(self.not_recorded(&row));
                }
                // Kept as a definite failure by a later holder: final, and
                // never written over. Taken over (our lineage) or claimed
                // anew after a release, as below.
                Some(row) if row.state == store::ClaimState::Failed => {
                    return Err(if row.lineage == self.lineage {
                        self.lease_lost()
                    } else {
                        self.claim_lost()
                    });
                }
                // Turned in doubt under our fence (its lease ran out under
                // `on_expiry = "in_doubt"`, and nobody took it over): our
                // success is the outcome nobody knew, and once written it is
                // ours, the one every duplicate is told.
                Some(row) if row.fence == self.fence && row.state == store::ClaimState::InDoubt => {
                    if self.settle_own_hold(via, output).await? {
                        return Ok(());
                    }
                    continue;
                }
                Some(row) => {
                    let lost = if row.lineage == self.lineage {
                        self.lease_lost()
                    } else {
                        self.claim_lost()
                    };
                    // Settled already (by a holder after us, or by a late
                    // success of one before us): nothing to add.
                    if row.settled {
                        return Err(lost);
                    }
                    (Some(row.fence), lost)
                }
            };
            if self.keep_late_success(via, seen, output).await? {
                return Err(lost);
            }
        }
        self.event(
            tracing::Level::ERROR,
            "the slot changed under every attempt to keep this success after the claim was \
             lost: it is not recorded, and a retry may run the action again",
            None,
        );
        Err(self.claim_lost())
    }

    /// Writes this holder's success over its own claim, held in doubt
    /// under its fence since its lease ran out. `false`: the row changed
    /// between the look and the write.
    async fn settle_own_hold(
        &self,
        via: &mut Via<'_>,
        output: Option<&str>,
    ) -> Result<bool, Rejected> {
        let (scope, address, fence) = (self.slots.scope(), &*self.address, self.fence);
        let late = self.late_success(output);
        // Matched on the fence: a repeat changes nothing.
        let written: Result<bool, sqlx::Error> = retry::repeat_recording!(via, |conn| {
            store::settle_own_hold(&mut *conn, scope, address, fence, late).await
        });
        let written = written.map_err(Rejected::from_store)?;
        if written {
            self.event(
                tracing::Level::WARN,
                "the lease ran out while the body ran and the claim was held in doubt, but \
                 nobody took it over: the success is recorded over the hold",
                None,
            );
            self.recorded(Outcome::Succeeded(output), store::Wrote::UNSAID, via)
                .await;
        }
        Ok(written)
    }

    /// What a success of this holder recorded after its claim was lost
    /// carries: its identity, payload and `output`, and, for a vacant
    /// slot, its windows and its entity.
    fn late_success<'s>(&'s self, output: Option<&'s str>) -> LateSuccess<'s> {
        LateSuccess {
            identity: self.identity.canonical(),
            fingerprint: self.fingerprint.as_ref().map(|f| f.as_slice()),
            output,
            windows: self.windows,
            ordered: self
                .ordered
                .as_ref()
                .map(|(entity, order)| (entity.as_str(), *order)),
        }
    }

    /// Writes this holder's success into the slot it no longer holds: over
    /// the pending row last seen with fence `seen`, or into the vacant slot.
    /// `false`: the slot changed between the look and the write.
    async fn keep_late_success(
        &self,
        via: &mut Via<'_>,
        seen: Option<i64>,
        output: Option<&str>,
    ) -> Result<bool, Rejected> {
        let scope = self.slots.scope();
        let late = self.late_success(output);
        let address = &*self.address;
        // Both are safe to repeat: the first is matched on the fence seen,
        // the second inserts only into a vacant slot.
        let written: Result<bool, sqlx::Error> = retry::repeat_recording!(via, |conn| match seen {
            Some(seen) => store::settle_over(&mut *conn, scope, address, seen, late).await,
            None => store::settle_vacant(&mut *conn, scope, address, late).await,
        });
        let written = written.map_err(Rejected::from_store)?;
        if written {
            self.event(
                tracing::Level::WARN,
                "a success recorded after the claim was lost: the slot is settled with it, so \
                 no retry runs the action again",
                None,
            );
        }
        Ok(written)
    }

    /// The row in the slot now, if any.
    async fn look(&self, via: &mut Via<'_>) -> Result<Option<store::Existing>, Rejected> {
        let (scope, address) = (self.slots.scope(), &*self.address);
        let row: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
            store::lookup(&mut *conn, scope, address, store::KeptValue::Skip).await
        });
        row.map_err(Rejected::from_store)
    }

    fn lease_lost(&self) -> Rejected {
        Rejected::LeaseLost {
            address: self.address.clone(),
        }
    }

    fn claim_lost(&self) -> Rejected {
        Rejected::ClaimLost {
            address: self.address.clone(),
        }
    }

    fn event(&self, level: tracing::Level, message: &str, rejected: Option<&Rejected>) {
        let account = self.slots.account();
        let namespace = self.slots.namespace();
        let action = self.identity.action();
        let address = &*self.address;
        let fence = self.fence;
        let error = rejected.map(tracing::field::display);
        match level {
            tracing::Level::ERROR => tracing::error!(
                target: "idem", account, namespace, action, address, fence, error, "{message}"
            ),
            tracing::Level::WARN => tracing::warn!(
                target: "idem", account, namespace, action, address, fence, error, "{message}"
            ),
            _ => tracing::debug!(
                target: "idem", account, namespace, action, address, fence, error, "{message}"
            ),
        }
    }
}

/// What `row` records, written by somebody other than the holder of its
/// fence, as [`Rejected::NotRecorded`] says it.
pub(crate) fn recorded_by_another(row: &store::Existing) -> &'static str {
    use store::ClaimState::{Failed, InDoubt, Pending, Success};
    match (row.state, row.resolved, row.reason.as_deref()) {
        (Success, true, _) => "was resolved as succeeded by a reconciler or an operator",
        (Failed, true, _) => "was resolved as failed by a reconciler or an operator",
        (Success, false, Some(store::LATE_SUCCESS)) => {
            "was settled by the late success of an earlier holder of the slot, whose claim was \
             taken over or released while its body ran"
        }
        (InDoubt, _, _) => {
            "is held in doubt: its lease ran out (on_expiry = \"in_doubt\") before this outcome \
             came, and a reconciler or an operator resolves it"
        }
        (Success, _, _) => "is settled as succeeded",
        (Failed, _, _) => "is kept as a definite failure",
        (Pending, _, _) => "records another outcome",
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(held) = self.held.as_ref().filter(|held| !held.in_transaction) {
            held.event(
                tracing::Level::WARN,
                "claim dropped before its outcome was recorded (panic, cancellation or \
                 a forgotten settle); the slot stays pending and refuses retries",
                None,
            );
        }
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("address", &self.address())
            .field("fence", &self.fence())
            .finish()
    }
}
