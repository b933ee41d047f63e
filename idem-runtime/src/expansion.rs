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
    message = "an #[idempotent] function must return `Result<T, E>` where `E: From<idem::Rejected>`, not `{Self}`",
    label = "this return type cannot say that a duplicate was refused",
    note = "a refused call returns `Err(E::from(Rejected))`; return e.g. `Result<{Self}, MyError>` and give MyError a `From<idem::Rejected>` impl (thiserror: `#[error(transparent)] Rejected(#[from] idem::Rejected)`)"
)]
pub trait Outcome: Sized {
    /// The value a refused invocation returns.
    fn rejected(rejected: Rejected) -> Self;
    /// `true` when the claim should be settled, `false` when released.
    fn is_success(&self) -> bool;
}

impl<T, E: From<Rejected>> Outcome for Result<T, E> {
    fn rejected(rejected: Rejected) -> Self {
        Err(E::from(rejected))
    }

    fn is_success(&self) -> bool {
        self.is_ok()
    }
}

/// Claims `identity` on `gate`, runs `body` only if the claim was won, then
/// settles (success) or releases (failure). See [`Gate::run`].
pub async fn run<R, F>(gate: &Gate, identity: &Identity, body: F) -> R
where
    R: Outcome,
    F: Future<Output = R>,
{
    let claim = match gate.claim(identity).await {
        Ok(claim) => claim,
        Err(rejected) => return R::rejected(rejected),
    };
    let outcome = body.await;
    // Failures to record are reported by tracing inside settle and release,
    // and leave the slot pending (fail closed). The body's own outcome is
    // what the caller needs either way.
    let _recorded = if outcome.is_success() {
        claim.settle().await
    } else {
        claim.release().await
    };
    outcome
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
