//! What `#[idempotent]` expands to calls.
//!
//! The macro holds no runtime logic: it evaluates the key parts and the gate
//! expression, then hands everything to the plain functions here. The facade
//! re-exports them as `idem::__private`, which is not a stable API.

use std::fmt::Display;
use std::ops::ControlFlow;
use std::sync::Arc;

use sqlx::PgConnection;

use crate::claim::{Acquired, Claim, Via};
use crate::error::Rejected;
use crate::gate::Gate;
pub use crate::identity::Identity;
pub use crate::mode::{Fingerprint, Mode, OnUnavailable, OutcomeCommit};
pub use std::time::Duration;

/// The return type of a guarded function: a `Result` whose error can carry a
/// [`Rejected`].
#[diagnostic::on_unimplemented(
    message = "an #[idempotent] function must return `Result<T, E>` where `E: From<idem::Rejected>`; `{Self}` is not such a type",
    label = "a refused duplicate must be able to return `Err(E::from(Rejected))` here",
    note = "return a `Result` whose error type implements `From<idem::Rejected>`: with thiserror, add a variant `#[error(transparent)] Rejected(#[from] idem::Rejected)`; by hand, `impl From<idem::Rejected> for MyError`"
)]
pub trait Outcome: Sized {
    /// The value a refused invocation returns.
    fn rejected(rejected: Rejected) -> Self;
    /// `true` when the claim should be settled, `false` when released.
    fn is_success(&self) -> bool;
}

// Not recommended in diagnostics: a `Result` whose error lacks
// `From<Rejected>` is then reported through `Outcome`'s own message above,
// which says how to fix it, rather than as a bare unmet `From` bound.
#[diagnostic::do_not_recommend]
impl<T, E: From<Rejected>> Outcome for Result<T, E> {
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
pub trait ReplayOutcome: Outcome {
    /// The `Ok` value as JSON; `Ok(None)` for an `Err`.
    fn encode(&self) -> Result<Option<String>, serde_json::Error>;
    /// A stored `Ok` value, read back.
    fn decode(json: &str) -> Result<Self, serde_json::Error>;
}

#[diagnostic::do_not_recommend]
impl<T, E> ReplayOutcome for Result<T, E>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    E: From<Rejected>,
{
    fn encode(&self) -> Result<Option<String>, serde_json::Error> {
        self.as_ref().ok().map(serde_json::to_string).transpose()
    }

    fn decode(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json).map(Ok)
    }
}

/// How to treat a guarded function's return type `R`: the [`Outcome`]
/// methods (and, in `replay` mode, the [`ReplayOutcome`] ones) as plain
/// function pointers.
///
/// The expansion obtains it with [`outcome_of`] or [`replayed_outcome_of`],
/// whose single trait bound is the only place a wrong return type can fail,
/// so the user sees one error, at the return type, rather than one per use.
pub struct OutcomeOf<R> {
    rejected: fn(Rejected) -> R,
    is_success: fn(&R) -> bool,
    replay: Option<Replay<R>>,
}

struct Replay<R> {
    encode: fn(&R) -> Result<Option<String>, serde_json::Error>,
    decode: fn(&str) -> Result<R, serde_json::Error>,
}

/// The [`OutcomeOf`] a return type that implements [`Outcome`].
pub fn outcome_of<R: Outcome>() -> OutcomeOf<R> {
    OutcomeOf {
        rejected: R::rejected,
        is_success: R::is_success,
        replay: None,
    }
}

/// The [`OutcomeOf`] a return type whose `Ok` value is replayed.
pub fn replayed_outcome_of<R: ReplayOutcome>() -> OutcomeOf<R> {
    OutcomeOf {
        rejected: R::rejected,
        is_success: R::is_success,
        replay: Some(Replay {
            encode: R::encode,
            decode: R::decode,
        }),
    }
}

impl<R> OutcomeOf<R> {
    /// What a duplicate of a settled action returns: its stored value, or
    /// `AlreadyDone` when there is none to give (or it no longer reads back).
    fn settled(&self, identity: &Identity, stored: Option<String>) -> R {
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
    /// too) is returned as that refusal, so the holder learns it was fenced
    /// off. Its success is still kept in the slot, so a retry is refused
    /// (or, with `replay`, handed the value). A success the store failed to
    /// record keeps the body's value: the slot stays pending (fail closed)
    /// and a tracing error says so.
    async fn record(&self, claim: Claim, output: R, via: &mut Via<'_>) -> R {
        if !(self.is_success)(&output) {
            // The body's error is what its caller needs; a failed release is
            // reported by tracing and leaves the slot pending.
            let _released = claim.release_via(via).await;
            return output;
        }
        let json = match self.replay.as_ref().map(|replay| (replay.encode)(&output)) {
            Some(Ok(json)) => json,
            Some(Err(error)) => {
                tracing::error!(
                    target: "idem",
                    address = claim.address(),
                    error = %error,
                    "the Ok value could not be serialized for replay; settling without it, \
                     so duplicates are refused as already done"
                );
                None
            }
            None => None,
        };
        match claim.settle_with(json.as_deref(), via).await {
            Err(lost @ (Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. })) => {
                (self.rejected)(lost)
            }
            _ => output,
        }
    }
}

/// Claims `identity` on `gate`, runs `body` only if the claim was won, then
/// settles (success) or releases (failure). See [`Gate::run`].
pub async fn run<R, F>(gate: &Gate, identity: &Identity, body: F) -> R
where
    R: Outcome,
    F: Future<Output = R>,
{
    run_with(gate, identity, &Mode::new(), outcome_of(), body).await
}

/// [`run`] with the opt-in modes, and the outcome's treatment passed in
/// (what the expansion calls).
pub async fn run_with<R, F>(
    gate: &Gate,
    identity: &Identity,
    mode: &Mode,
    outcome: OutcomeOf<R>,
    body: F,
) -> R
where
    F: Future<Output = R>,
{
    let mut via = Via::Pool(gate.pool());
    let claim = match gate
        .acquire(identity, mode, outcome.replay.is_some(), &mut via)
        .await
    {
        Ok(Acquired::Won(claim)) => claim,
        Ok(Acquired::Settled(stored)) => return outcome.settled(identity, stored),
        Err(rejected) => return (outcome.rejected)(rejected),
    };
    let output = body.await;
    outcome.record(claim, output, &mut via).await
}

/// In-transaction mode, before the body: claims inside the caller's
/// transaction. `Break` carries what the function returns instead of running
/// its body (a refusal, or a replayed value).
pub async fn begin_in<R>(
    gate: &Gate,
    identity: &Identity,
    mode: &Mode,
    outcome: &OutcomeOf<R>,
    connection: &mut PgConnection,
) -> ControlFlow<R, Claim> {
    let mut via = Via::Transaction(connection);
    match gate
        .acquire(identity, mode, outcome.replay.is_some(), &mut via)
        .await
    {
        Ok(Acquired::Won(claim)) => ControlFlow::Continue(claim),
        Ok(Acquired::Settled(stored)) => ControlFlow::Break(outcome.settled(identity, stored)),
        Err(rejected) => ControlFlow::Break((outcome.rejected)(rejected)),
    }
}

/// In-transaction mode, after the body: settles or releases inside the
/// caller's transaction, so the claim commits or rolls back with the body's
/// own writes.
pub async fn finish_in<R>(
    claim: Claim,
    outcome: &OutcomeOf<R>,
    output: R,
    connection: &mut PgConnection,
) -> R {
    outcome
        .record(claim, output, &mut Via::Transaction(connection))
        .await
}

/// A connection a transaction-mode claim can run on: the `tx = ...`
/// parameter of `#[idempotent]`.
#[diagnostic::on_unimplemented(
    message = "`tx = ...` must name a `&mut Transaction<'_, Postgres>` or `&mut PgConnection` parameter, not one of `{Self}`",
    label = "the claim and its settle run on this connection, inside your transaction",
    note = "take the transaction the body writes with, e.g. `tx: &mut sqlx::Transaction<'_, sqlx::Postgres>`, and name it: #[idempotent(..., tx = tx)]"
)]
pub trait AsConnection {
    /// The connection itself.
    fn as_connection(&mut self) -> &mut PgConnection;
}

impl AsConnection for PgConnection {
    fn as_connection(&mut self) -> &mut PgConnection {
        self
    }
}

impl AsConnection for sqlx::Transaction<'_, sqlx::Postgres> {
    fn as_connection(&mut self) -> &mut PgConnection {
        self
    }
}

impl AsConnection for sqlx::pool::PoolConnection<sqlx::Postgres> {
    fn as_connection(&mut self) -> &mut PgConnection {
        self
    }
}

/// The connection behind a `tx = ...` parameter.
pub fn connection_of<C: AsConnection + ?Sized>(connection: &mut C) -> &mut PgConnection {
    connection.as_connection()
}

/// Something that is, or points to, a [`Gate`]: the `gate` option of
/// `#[idempotent]` (by default, the parameter named `gate`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idem Gate",
    label = "#[idempotent] uses this as its gate",
    note = "the gate is the parameter named `gate`, or the expression given as `gate = ...`; it must be a `Gate`, `&Gate`, `Arc<Gate>` or `Box<Gate>`"
)]
pub trait AsGate {
    /// The gate itself.
    fn as_gate(&self) -> &Gate;
}

impl AsGate for Gate {
    fn as_gate(&self) -> &Gate {
        self
    }
}

impl<T: AsGate + ?Sized> AsGate for &T {
    fn as_gate(&self) -> &Gate {
        (**self).as_gate()
    }
}

impl<T: AsGate + ?Sized> AsGate for &mut T {
    fn as_gate(&self) -> &Gate {
        (**self).as_gate()
    }
}

impl<T: AsGate + ?Sized> AsGate for Arc<T> {
    fn as_gate(&self) -> &Gate {
        (**self).as_gate()
    }
}

impl<T: AsGate + ?Sized> AsGate for Box<T> {
    fn as_gate(&self) -> &Gate {
        (**self).as_gate()
    }
}

/// An owned copy of the gate, so the body may still move the original.
pub fn gate_of<G: AsGate + ?Sized>(gate: &G) -> Gate {
    gate.as_gate().clone()
}

/// `gate` scoped to the account named by `account`'s `Display` form, so
/// `account = tenant.id` works for strings, integers and UUIDs alike.
pub fn in_account<A: Display + ?Sized>(gate: Gate, account: &A) -> Gate {
    gate.account(account.to_string())
}

/// `gate` scoped to the namespace named by `namespace`'s `Display` form.
pub fn in_namespace<N: Display + ?Sized>(gate: Gate, namespace: &N) -> Gate {
    gate.namespace(namespace.to_string())
}
