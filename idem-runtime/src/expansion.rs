//! The glue `#[idempotent]` expands to: adapters from what the user wrote
//! (a gate expression, a transaction parameter, a return type) to the run
//! loop (the private module `run`), and the names the generated code spells.
//!
//! Glue only: the macro evaluates the key parts and the gate expression,
//! then hands everything to the plain functions here, which forward to the
//! runtime. The facade re-exports this module as `idem::__private`, which is
//! not a stable API.

use std::fmt::Display;
use std::sync::Arc;

use sqlx::PgConnection;

use crate::gate::Gate;
pub use crate::guard::Entered;
use crate::guard::{Checked, Classify, Guard, NoReplay, Replay};
pub use crate::identity::Identity;
pub use crate::mode::{Disposition, Fingerprint, OnExpiry, OnUnavailable, OutcomeCommit};
pub use crate::run::{GuardedResult, ReplayableResult};
pub use std::time::Duration;

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

/// A guarded function's return type, naming its error: what the classifier
/// of `disposition = path` takes.
#[diagnostic::on_unimplemented(
    message = "`disposition` classifies the error of a `Result`, and `{Self}` is not a `Result`",
    label = "the return type of a function with `disposition = ...`"
)]
pub trait ErrorOf {
    /// The `E` of `Result<T, E>`.
    type Error;
}

impl<T, E> ErrorOf for Result<T, E> {
    type Error = E;
}

/// The classifier of `disposition = path`, as a `fn(&E) -> Disposition`
/// with `E` the error of the function's return type `Ret`: a path of
/// another shape fails where it is written, as a mismatched fn pointer.
pub fn classifier_of<Ret: ErrorOf>(
    classify: fn(&Ret::Error) -> Disposition,
) -> fn(&Ret::Error) -> Disposition {
    classify
}

/// [`classifier_of`] for a function whose return type is not written out
/// (an `impl Trait`): its error is inferred from the body.
pub fn classifier<E>(classify: fn(&E) -> Disposition) -> fn(&E) -> Disposition {
    classify
}

/// The guard of a function without `replay`, its body's output checked:
/// the one bound a return type `Ret` can miss is `GuardedResult`, whose message
/// says how to fix it, and the expansion spans this call at the return
/// type, so a wrong one fails there, once.
pub fn checked<'a, 'd, Ret, D, P>(guard: Guard<'a, NoReplay, D, P>) -> Checked<'a, 'd, P, Ret>
where
    Ret: GuardedResult,
    D: Classify<Ret> + Send + Sync + 'd,
{
    guard.__check()
}

/// [`checked`] for a function with `replay`: the bound is `ReplayableResult`.
pub fn checked_replayed<'a, 'd, Ret, D, P>(
    guard: Guard<'a, Replay, D, P>,
) -> Checked<'a, 'd, P, Ret>
where
    Ret: ReplayableResult,
    D: Classify<Ret> + Send + Sync + 'd,
{
    guard.__check()
}
