//! What `#[idempotent]` expands to calls.
//!
//! The macro holds no runtime logic: it evaluates the key parts and the gate
//! expression, then hands everything to the plain functions here. The facade
//! re-exports them as `idem::__private`, which is not a stable API.

use std::fmt::Display;
use std::sync::Arc;

use crate::error::Rejected;
use crate::gate::Gate;
use crate::identity::Identity;

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

/// How to treat a guarded function's return type `R`: the [`Outcome`]
/// methods as plain function pointers.
///
/// The expansion obtains it with [`outcome_of`], whose single `R: Outcome`
/// bound is the only place a wrong return type can fail, so the user sees
/// one error, at the return type, rather than one per use.
pub struct OutcomeOf<R> {
    rejected: fn(Rejected) -> R,
    is_success: fn(&R) -> bool,
}

/// The [`OutcomeOf`] a return type that implements [`Outcome`].
pub fn outcome_of<R: Outcome>() -> OutcomeOf<R> {
    OutcomeOf {
        rejected: R::rejected,
        is_success: R::is_success,
    }
}

/// Claims `identity` on `gate`, runs `body` only if the claim was won, then
/// settles (success) or releases (failure). See [`Gate::run`].
pub async fn run<R, F>(gate: &Gate, identity: &Identity, body: F) -> R
where
    R: Outcome,
    F: Future<Output = R>,
{
    run_with(gate, identity, outcome_of(), body).await
}

/// [`run`], with the outcome's treatment passed in (what the expansion calls).
pub async fn run_with<R, F>(gate: &Gate, identity: &Identity, outcome: OutcomeOf<R>, body: F) -> R
where
    F: Future<Output = R>,
{
    let claim = match gate.claim(identity).await {
        Ok(claim) => claim,
        Err(rejected) => return (outcome.rejected)(rejected),
    };
    let output = body.await;
    // Failures to record are reported by tracing inside settle and release,
    // and leave the slot pending (fail closed). The body's own output is
    // what the caller needs either way.
    let _recorded = if (outcome.is_success)(&output) {
        claim.settle().await
    } else {
        claim.release().await
    };
    output
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
