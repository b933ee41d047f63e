//! The run loop: claim, run the body only if the claim was won, then record
//! what the body returned (settle a success, release a failure).
//!
//! [`Guard::run`](crate::Guard::run) and its variants call it, and so does
//! every `#[idempotent]` function, through the glue in
//! [`expansion`](crate::expansion). What a body's output means (a success or
//! not; for `replay`, the value to keep) is told by an [`OutcomeOf`], built
//! from the traits [`GuardedResult`] and [`ReplayableResult`].

use crate::acquire::{Acquired, KeptValue, acquire};
use crate::claim::Claim;
use crate::error::Rejected;
use crate::identity::Identity;
use crate::mode::{Disposition, Mode};
use crate::outcome::Outcome;
use crate::scoped_pool::ScopedPool;
use crate::step::Ambient;
use crate::via::Via;

/// The return type of a guarded function: a `Result` whose error can carry a
/// [`Rejected`].
#[diagnostic::on_unimplemented(
    message = "a guarded call (an #[idempotent] function, a guard's body) must return `Result<T, E>` where `E: From<idem::Rejected>`; `{Self}` is not such a type",
    label = "a refused duplicate must be able to return `Err(E::from(Rejected))` here",
    note = "return a `Result` whose error type implements `From<idem::Rejected>`: with thiserror, add a variant `#[error(transparent)] Rejected(#[from] idem::Rejected)`; by hand, `impl From<idem::Rejected> for MyError`"
)]
pub trait GuardedResult: Sized {
    /// The value a refused invocation returns.
    fn rejected(rejected: Rejected) -> Self;
    /// `true` when the claim should be settled, `false` when released.
    fn is_success(&self) -> bool;
}

// Not recommended in diagnostics: a `Result` whose error lacks
// `From<Rejected>` is then reported through `GuardedResult`'s own message above,
// which says how to fix it, rather than as a bare unmet `From` bound.
#[diagnostic::do_not_recommend]
impl<T, E: From<Rejected>> GuardedResult for Result<T, E> {
    fn rejected(rejected: Rejected) -> Self {
        Err(E::from(rejected))
    }

    fn is_success(&self) -> bool {
        self.is_ok()
    }
}

/// The return type of a guarded function in `replay` mode: a `Result` whose
/// `Ok` value can be stored as JSON and read back.
#[diagnostic::on_unimplemented(
    message = "`replay` keeps the `Ok` value for later duplicates, so it must be `serde::Serialize + serde::de::DeserializeOwned`; `{Self}` is not such a `Result`",
    label = "the `Ok` type here must be Serialize + DeserializeOwned",
    note = "derive `serde::Serialize` and `serde::Deserialize` for the `Ok` type, or drop `replay` (duplicates then get `Rejected::AlreadyDone`)"
)]
pub trait ReplayableResult: GuardedResult {
    /// The `Ok` value as the JSON kept for replay; `None` for an `Err`,
    /// and for a value that would not read back as itself (see
    /// `stored_value`), which is settled without one.
    fn encode(&self, address: Option<&str>) -> Option<String>;
    /// A stored `Ok` value, read back.
    fn decode(json: &str) -> Result<Self, serde_json::Error>;
}

#[diagnostic::do_not_recommend]
impl<T, E> ReplayableResult for Result<T, E>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    E: From<Rejected>,
{
    fn encode(&self, address: Option<&str>) -> Option<String> {
        let value = self.as_ref().ok()?;
        crate::stored_value::for_replay(address, value)
    }

    fn decode(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json).map(Ok)
    }
}

/// How to treat a guarded function's return type `R`: the [`GuardedResult`]
/// methods (and, in `replay` mode, the [`ReplayableResult`] ones) as plain
/// function pointers.
///
/// The expansion obtains it with [`outcome_of`] or [`replayed_outcome_of`],
/// whose single trait bound is the only place a wrong return type can fail,
/// so the user sees one error, at the return type, rather than one per use.
pub struct OutcomeOf<'a, R> {
    rejected: fn(Rejected) -> R,
    is_success: fn(&R) -> bool,
    replay: Option<ReplayCodec<R>>,
    /// What a failure means for the slot; `None`: every failure releases it.
    /// Boxed so that one run loop serves every classifier; the classifiers
    /// the guard and the attribute pass capture nothing, and a box of
    /// nothing does not allocate.
    dispose: Option<Dispose<'a, R>>,
}

/// A classifier of failures: what a body's failed output means for its slot.
type Dispose<'a, R> = Box<dyn Fn(&R) -> Disposition + Send + Sync + 'a>;

struct ReplayCodec<R> {
    encode: fn(&R, Option<&str>) -> Option<String>,
    decode: fn(&str) -> Result<R, serde_json::Error>,
}

/// The [`OutcomeOf`] a return type that implements [`GuardedResult`].
pub fn outcome_of<R: GuardedResult>() -> OutcomeOf<'static, R> {
    OutcomeOf {
        rejected: R::rejected,
        is_success: R::is_success,
        replay: None,
        dispose: None,
    }
}

/// The [`OutcomeOf`] a return type whose `Ok` value is replayed.
pub fn replayed_outcome_of<R: ReplayableResult>() -> OutcomeOf<'static, R> {
    OutcomeOf {
        rejected: R::rejected,
        is_success: R::is_success,
        replay: Some(ReplayCodec {
            encode: R::encode,
            decode: R::decode,
        }),
        dispose: None,
    }
}

impl<'a, R> OutcomeOf<'a, R> {
    /// Failures are recorded as `dispose` says of each (see
    /// [`Disposition`]); without it, every failure releases the slot.
    #[must_use]
    pub fn disposed_by<'b>(
        self,
        dispose: impl Fn(&R) -> Disposition + Send + Sync + 'b,
    ) -> OutcomeOf<'b, R> {
        OutcomeOf {
            rejected: self.rejected,
            is_success: self.is_success,
            replay: self.replay,
            dispose: Some(Box::new(dispose)),
        }
    }

    /// What a duplicate of a settled action returns: its stored value, or
    /// `AlreadyDone` when there is none to give (or it no longer reads back).
    pub(crate) fn settled(&self, identity: &Identity, stored: Option<String>) -> R {
        if let (Some(replay), Some(json)) = (&self.replay, stored) {
            match (replay.decode)(&json) {
                Ok(output) => return output,
                Err(error) => tracing::warn!(
                    target: "idem",
                    action = identity.action(),
                    error = %error,
                    "the stored value no longer reads back as this function's Ok type; \
                     refusing the duplicate as already done"
                ),
            }
        }
        (self.rejected)(Rejected::AlreadyDone)
    }

    /// Settles or releases `claim` by what the body returned, and returns
    /// what the caller gets.
    ///
    /// The body's own output, with one exception: a success whose claim was
    /// no longer this holder's ([`Rejected::LeaseLost`],
    /// [`Rejected::ClaimLost`]: another invocation may have run the action
    /// too), or whose slot already recorded an outcome somebody else wrote
    /// ([`Rejected::NotRecorded`]: every duplicate is told that one), is
    /// returned as that refusal, so the holder learns it was fenced off. Its success is still kept in the slot, so a retry is refused
    /// (or, with `replay`, handed the value). A success the store failed to
    /// record keeps the body's value: the slot stays pending (fail closed)
    /// and a tracing error says so; inside the caller's transaction it is
    /// returned as the refusal instead, since that transaction can no longer
    /// commit.
    ///
    /// `steps`: what the body's steps saw, when it could run any: a step
    /// whose outcome nobody knows turns any failure into a hold in doubt,
    /// and a success of a body one of whose steps refused to run for a
    /// lost claim is not recorded (it is returned as that refusal).
    pub(crate) async fn record(
        &self,
        claim: Claim,
        output: R,
        steps: Option<&Ambient>,
        via: &mut Via<'_>,
    ) -> R {
        let wanted = self.wanted(claim.address(), &output);
        // The record of the step the body finished last rides with the
        // settle; any other ending writes it first, on its own, so that
        // what the steps saw is known before the outcome is chosen.
        let carried = match (steps, &wanted) {
            (Some(steps), Outcome::Succeeded(_)) if steps.refused().is_none() => steps.ride().await,
            (Some(steps), _) => {
                steps.land_carried().await;
                None
            }
            (None, _) => None,
        };
        let json = match wanted {
            Outcome::Failed(disposition) => {
                let disposition = steps.map_or(disposition, |steps| steps.overrides(disposition));
                // The body's error is what its caller needs; a failure that
                // could not be recorded is reported by tracing and leaves the
                // slot pending. But a failure meant to hold the slot (kept,
                // or in doubt) over an outcome somebody else recorded would
                // tell this caller one story and every duplicate another:
                // the caller hears what the slot records. A release there
                // claimed nothing happened, which the recorded outcome does
                // not contradict: the body's error stands.
                let recorded = claim.dispose_via(disposition, via).await;
                return match recorded {
                    Err(not_recorded @ Rejected::NotRecorded { .. })
                        if matches!(disposition, Disposition::Keep | Disposition::InDoubt) =>
                    {
                        (self.rejected)(not_recorded)
                    }
                    _ => output,
                };
            }
            Outcome::Succeeded(json) => json,
        };
        if let Some(lost) = steps.and_then(Ambient::refused) {
            claim.let_go_lost(&lost);
            return (self.rejected)(lost);
        }
        let in_transaction = via.in_transaction();
        let settled = match (steps, carried) {
            (Some(steps), Some(carried)) => {
                let (settled, recorded) = claim
                    .settle_carrying(json.as_deref(), carried.record(), via)
                    .await;
                steps.carried_landed(&carried, recorded).await;
                settled
            }
            _ => claim.settle_with(json.as_deref(), via).await,
        };
        match settled {
            Err(
                lost @ (Rejected::LeaseLost { .. }
                | Rejected::ClaimLost { .. }
                | Rejected::NotRecorded { .. }),
            ) => (self.rejected)(lost),
            // Inside the caller's transaction, a success that could not be
            // recorded is no success: the failure aborted the transaction
            // (or its connection is gone), so the claim and the body's own
            // writes cannot commit. The caller hears it before it commits,
            // which an aborted transaction's COMMIT would not tell it.
            Err(unrecorded) if in_transaction => (self.rejected)(unrecorded),
            _ => output,
        }
    }

    /// What `output`, the body's return of the claim at `address`, asks
    /// its slot to record: a success (with, for `replay`, the `Ok` value as
    /// JSON), or a failure and what it means for the slot.
    pub(crate) fn wanted(&self, address: Option<&str>, output: &R) -> Outcome<Option<String>> {
        if !(self.is_success)(output) {
            return Outcome::Failed(
                self.dispose
                    .as_ref()
                    .map_or(Disposition::Release, |dispose| dispose(output)),
            );
        }
        Outcome::Succeeded(
            self.replay
                .as_ref()
                .and_then(|replay| (replay.encode)(output, address)),
        )
    }

    /// What a refused invocation returns.
    pub(crate) fn refused(&self, rejected: Rejected) -> R {
        (self.rejected)(rejected)
    }

    /// How a refusal becomes what the caller gets, on its own: for a
    /// caller whose `OutcomeOf` went to a detached run.
    pub(crate) fn refuser(&self) -> fn(Rejected) -> R {
        self.rejected
    }

    /// Whether duplicates of a settled action are handed its stored value.
    pub(crate) fn replays(&self) -> bool {
        self.replay.is_some()
    }
}

/// Claims `identity` in `slots`, runs `body` only if the claim was won, then
/// settles (success) or releases (failure), as `outcome` says of what the
/// body returned. See [`Guard::run`](crate::Guard::run).
pub(crate) async fn run<R, F>(
    slots: &ScopedPool,
    identity: &Identity,
    mode: &Mode,
    outcome: OutcomeOf<'_, R>,
    body: F,
) -> R
where
    F: Future<Output = R>,
{
    let mut via = Via::Pool(slots.pool());
    let claim = match acquire(
        slots,
        identity,
        mode,
        KeptValue::read_if(outcome.replay.is_some()),
        &mut via,
    )
    .await
    {
        Ok(Acquired::Won(claim)) => claim,
        Ok(Acquired::Settled(stored)) => return outcome.settled(identity, stored),
        Err(rejected) => return (outcome.rejected)(rejected),
    };
    let steps = Ambient::of_claim(claim.held(), identity, slots);
    let output = steps.around(body).await;
    outcome.record(claim, output, Some(&steps), &mut via).await
}
