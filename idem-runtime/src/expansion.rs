//! The glue `#[idempotent]` expands to: adapters from what the user wrote
//! (a gate expression, a transaction parameter, a return type) to the run
//! loop (the private module `run`), and the names the generated code spells.
//!
//! Glue only: the macro evaluates the key parts and the gate expression,
//! then hands everything to the plain functions here, which forward to the
//! runtime. The facade re-exports this module as `idem::__private`, which is
//! not a stable API.

use std::fmt::Display;
use std::ops::ControlFlow;
use std::sync::Arc;

use sqlx::PgConnection;

use crate::claim::Claim;
use crate::gate::Gate;
pub use crate::identity::Identity;
pub use crate::mode::{
    Disposed, Disposition, Fingerprint, Mode, OnExpiry, OnUnavailable, OutcomeCommit,
};
use crate::run;
pub use crate::run::{
    Outcome, OutcomeOf, ReplayOutcome, finish_in, outcome_of, replayed_outcome_of,
};
pub use std::time::Duration;

/// Runs a guarded function's body on `gate` (see [`Gate::run`]).
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
    run::run(gate.slots(), identity, mode, outcome, body).await
}

/// [`run_with`], detached from its caller: the claim, the body and the
/// record run as a task of `detached`'s, so dropping the returned future
/// does not cancel the body (see [`Gate::run_detached`]). What the tower
/// layer runs each guarded request with.
pub async fn run_detached_with<R, F>(
    gate: &Gate,
    identity: &Identity,
    mode: &Mode,
    detached: &crate::detach::Detached,
    outcome: OutcomeOf<R>,
    body: F,
) -> R
where
    R: Send + 'static,
    F: Future<Output = R> + Send + 'static,
{
    crate::detach::run_detached(
        detached,
        gate.slots().clone(),
        identity.clone(),
        mode.clone(),
        outcome,
        body,
    )
    .await
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
    run::begin_in(gate.slots(), identity, mode, outcome, connection).await
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

/// What a guarded function's `output` means for its slot, by the
/// `disposition = path` of `#[idempotent]`: `classify` of its error, or
/// [`Disposition::Release`] for an `Ok` (which is settled, never disposed).
pub fn disposition_of<T, E>(output: &Result<T, E>, classify: fn(&E) -> Disposition) -> Disposition {
    output.as_ref().err().map_or(Disposition::Release, classify)
}
