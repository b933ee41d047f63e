//! Steps inside one claim (issue 27), as users write them: a guarded call
//! whose body runs three no-op steps, `a`, `b` and `c`, each recorded with
//! the claim. Measured against the same three phases written by hand as
//! recovery points ([`crate::recovery_points`]) and against the plain guard
//! with no steps ([`crate::gated`]).
//!
//! What a step costs, counted from the store's statements
//! (`idem-runtime/src/store/steps.rs`): a step that is not repeatable sends
//! one, its marker (`INSERT ... SELECT ... WHERE` the claim is still the
//! holder's `ON CONFLICT DO NOTHING`, durable, since it is the step's lock),
//! which carries the record of the step before it (`UPDATE ... SET state =
//! 'success', output_json = ...`, in the same statement); the settle
//! carries the last step's record, committing as the claim's outcome does
//! (durable, or with `outcome_commit(OutcomeCommit::Async)`
//! asynchronously). So three such steps inside one guarded call are 2 + 3
//! = 5 statements, each on a pooled connection of its own, autocommitted:
//! 5 durable commits, or 4 (the claim and the three markers) with the
//! outcome asynchronous.
//!
//! A repeatable step has no marker: the run reads its claim's steps once,
//! at its first repeatable step (a `SELECT`), and each step sends its
//! record alone (`INSERT ... SELECT ... WHERE` the claim is still the
//! holder's `ON CONFLICT ... DO UPDATE` over a cut-off holder's marker),
//! committing as the outcome does: 2 + 1 + 3 = 6 statements, 5 durable
//! commits (the read commits nothing), or 1 with the outcome asynchronous.

use idem::{Gate, Identity, OutcomeCommit, Rejected};

use crate::BoxError;
use crate::gated::ACTION;

/// How the claim's outcome (the settle, and each step's record) commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Waiting for the WAL flush: the guard's default.
    Durable,
    /// `outcome_commit(OutcomeCommit::Async)`.
    Async,
}

/// Whether the steps are declared repeatable: with no marker, each is its
/// record alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steps {
    /// `idem::step(..)`: a marker, then a record.
    Marked,
    /// `idem::step(..).repeatable()`: the record alone.
    Repeatable,
}

/// What each step returns, and what the run checks it got back.
const STEP_VALUE: u64 = 1;

/// One no-op step, `name`, as `steps` says.
async fn no_op(name: &'static str, steps: Steps) -> Result<u64, Rejected> {
    let step = idem::step(name, async { Ok::<u64, Rejected>(STEP_VALUE) });
    match steps {
        Steps::Marked => step.await,
        Steps::Repeatable => step.repeatable().await,
    }
}

/// Claims `n`, runs three no-op steps inside the claim, settles. An error
/// unless each step handed back its value (a new identity runs each).
pub async fn three_steps(
    gate: &Gate,
    n: u64,
    steps: Steps,
    commit: Commit,
) -> Result<(), BoxError> {
    let id = Identity::new(ACTION).part(n);
    let body = async {
        let a = no_op("a", steps).await?;
        let b = no_op("b", steps).await?;
        let c = no_op("c", steps).await?;
        Ok::<_, Rejected>([a, b, c])
    };
    let values = match commit {
        Commit::Durable => gate.guard(&id).run(body).await?,
        Commit::Async => {
            gate.guard(&id)
                .outcome_commit(OutcomeCommit::Async)
                .run(body)
                .await?
        }
    };
    if values != [STEP_VALUE; 3] {
        return Err(format!("the steps of {n} returned {values:?}").into());
    }
    Ok(())
}
