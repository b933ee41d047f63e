//! What the gate did, told to a race harness running in the same task.
//!
//! `idem::testing::race` (the `idem-testing` crate, through
//! [`__internal::observe`](crate::__internal::observe)) needs to know, for each invocation
//! it fired, whether the gate let it run or refused it, whatever the guarded
//! function turned the refusal into. The gate reports to a task-local list
//! when one is in scope; outside a race, reporting is one failed lookup.

use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Rejected;

/// One decision of the gate.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum GateEvent {
    /// The claim was won: the body runs.
    Won,
    /// The claim was refused: the body does not run.
    Refused(Rejected),
    /// The identity was absent, or the store was down and the mode fails
    /// open: the body runs without a claim.
    Ungated,
    /// A duplicate of a settled action got its stored value back: the body
    /// does not run.
    Replayed,
    /// The claim statement was rolled back by a serialization failure or a
    /// deadlock and is being tried again; a decision follows.
    Retried,
    /// The claim was won by taking over one whose lease ran out (a `Won`
    /// follows): the previous holder may still be running.
    TookOver,
    /// The success was recorded: the slot is settled.
    Settled,
    /// The claim was deleted: a retry may run.
    Released,
    /// A definite failure was kept: the slot is `failed`, and duplicates
    /// are refused [`Rejected::AlreadyFailed`].
    Kept,
    /// The outcome is in doubt: the slot is held `in_doubt` (by the body's
    /// disposition, or a lease that ran out under `on_expiry = "in_doubt"`).
    InDoubt,
    /// The outcome could not be recorded as this holder's:
    /// [`Rejected::Unavailable`] or [`Rejected::StoreRefused`] (the row stays
    /// pending), [`Rejected::LeaseLost`] or [`Rejected::ClaimLost`] (the
    /// claim was no longer this holder's; a success is still kept),
    /// [`Rejected::NotRecorded`] (the slot already records an outcome
    /// somebody else wrote, which stands), or [`Rejected::WrongConnection`]
    /// (a claim made inside the caller's transaction recorded through the
    /// pool: nothing was sent).
    Unrecorded(Rejected),
}

pub(crate) type Events = Arc<Mutex<Vec<GateEvent>>>;

tokio::task_local! {
    static EVENTS: Events;
}

/// Reports `event` to the race harness in scope, if any.
pub(crate) fn record(event: GateEvent) {
    let _outside_a_race = EVENTS.try_with(|events| {
        events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    });
}

/// Carries the observer in scope, if any, into `future`, which is to run
/// as a task of its own (a detached guarded call): a task does not inherit
/// its spawner's task-locals, and what the gate decides inside it is still
/// the observed call's.
pub(crate) fn carried<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let events = EVENTS.try_with(Arc::clone).ok();
    async move {
        match events {
            Some(events) => EVENTS.scope(events, future).await,
            None => future.await,
        }
    }
}

/// Runs `future` with `events` collecting what the gate decides inside it.
pub async fn collecting<F: Future>(events: Arc<Mutex<Vec<GateEvent>>>, future: F) -> F::Output {
    EVENTS.scope(events, future).await
}
