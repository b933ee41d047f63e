//! The statements of steps inside one claim (`kind = 'step'`): begin one
//! (its marker), look one up, record its result, abandon it after its
//! failure, and retake one whose holder was cut off inside it.
//!
//! A step's row lives at an address of its own (`step_` and a digest of
//! its identity and name), in the claim's account and namespace, arbitrated
//! by the same two partial unique indexes as every row; `claim_address`
//! names its claim. Its `fence` is the fence of the claim holder that runs
//! it: every statement that changes a step's row is a compare-and-swap on
//! `state = 'pending' AND fence = $4`, so a holder changes only its own
//! marker, and nobody writes over a recorded step.
//!
//! Only a holder begins or retakes a step: both statements insert or move
//! the marker only while the claim is still pending under the holder's
//! fence, so a holder whose claim was taken over (or released) cannot start
//! a step under it. Recording needs no such test: the marker is the
//! holder's own, and its step ran; a success that happened is never lost.

use sqlx::{FromRow, PgExecutor, Row};

use super::claims::changed_one;
use super::operations::StepState;
use super::{Commit, PerCommit, Scope, SplitOnNamespace, per_commit, per_row};

/// A step's row, decoded by column name.
#[derive(Debug)]
pub(crate) struct StepRow {
    pub state: StepState,
    /// The fence of the claim holder that began (or retook) it.
    pub fence: i64,
    /// The step's canonical encoding: a hit is re-checked against it.
    pub identity: Vec<u8>,
    /// The recorded value, as JSON.
    pub output: Option<String>,
}

impl FromRow<'_, sqlx::postgres::PgRow> for StepRow {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(StepRow {
            state: StepState::of_row(row)?,
            fence: row.try_get("fence")?,
            identity: row.try_get("identity")?,
            output: row.try_get("output")?,
        })
    }
}

/// A statement over one step's row found by its address: [`per_row!`] for
/// `kind = 'step'`, in a form [`per_commit!`] can take.
macro_rules! per_step_row {
    ($statement:expr $(, $and:expr)? $(; $tail:expr)?) => {
        per_row!(kind "step", $statement $(, $and)? $(; $tail)?)
    };
}

/// The test that the claim at `$6` is still pending under the fence `$5`,
/// in the namespace test of its form: the claim's own row, found through
/// the same partial unique index.
macro_rules! claim_held {
    ($namespace_test:literal) => {
        concat!(
            "EXISTS (SELECT FROM idem_records c \
                     WHERE c.account = $1 AND c.kind = 'claim' AND c.address = $6 AND ",
            $namespace_test,
            " AND c.state = 'pending' AND c.fence = $5)"
        )
    };
}

/// The text of [`BEGIN_STEP`] with its namespace test.
///
/// The new row is selected from the claim's own row (`FROM idem_records c`,
/// its `account` the claim's), not from constants under `WHERE EXISTS`:
/// both say the same on PostgreSQL, but Citus pushes only this form down
/// to the shard holding the account, as one statement there. The form
/// with no table in its `FROM` it plans "pull to coordinator": the look
/// and the insert as two steps, and a row count that says 1 when
/// `ON CONFLICT` inserted nothing, so a recorded step would run again.
/// `RETURNING` says what was inserted on either plan.
///
/// A step is begun at `statement_timestamp()`, not `now()`: in the
/// caller's transaction `now()` is the transaction's start, the same for
/// every step begun in it, and `claims show` lists steps in the order they
/// were begun.
macro_rules! begin_step {
    ($claim_namespace_test:literal) => {
        concat!(
            "INSERT INTO idem_records \
               (account, kind, address, namespace, state, identity, fence, first_fence, \
                claim_address, created_at) \
             SELECT c.account, 'step', $2, $3, 'pending', $4, $5, $5, $6, statement_timestamp() \
             FROM idem_records c \
             WHERE c.account = $1 AND c.kind = 'claim' AND c.address = $6 AND ",
            $claim_namespace_test,
            " AND c.state = 'pending' AND c.fence = $5 \
             ON CONFLICT DO NOTHING \
             RETURNING fence"
        )
    };
}

/// Begins a step: inserts its `pending` marker, while the claim is still
/// the holder's. `$1` account, `$2` the step's address, `$3` namespace, `$4`
/// the step's identity, `$5` the holder's fence, `$6` the claim's address.
/// Inserts nothing when the step has a row already (the insert is
/// arbitrated by both partial unique indexes) or the claim is no longer
/// pending under `$5`. Index: the claim's test is served by the partial
/// unique index of its form.
pub(super) const BEGIN_STEP: SplitOnNamespace = SplitOnNamespace {
    without_namespace: begin_step!("c.namespace IS NULL AND $3::text IS NULL"),
    within_namespace: begin_step!("c.namespace = $3"),
};

/// A step's row by its address; `$4` its claim's address. Index: the
/// partial unique index of its form (or the index of a claim's steps,
/// which the claim's address makes as narrow: a planner without
/// statistics may take either).
pub(super) const LOOKUP_STEP: SplitOnNamespace = per_step_row!(
    "SELECT state, fence, identity, output_json AS output FROM idem_records",
    "claim_address = $4"
);

/// Records the holder's step as finished, keeping `$5`, its value as JSON
/// text (never `jsonb`, which refuses some of what JSON can say), at
/// `statement_timestamp()` (after it was begun, in a transaction too).
/// `$4`: the holder's fence. Index: the partial unique index of its form.
pub(super) const RECORD_STEP: PerCommit<SplitOnNamespace> = per_commit!(
    opening "FROM",
    per_step_row!(
        "UPDATE idem_records \
         SET state = 'success', settled_at = statement_timestamp(), output_json = $5",
        "state = 'pending' AND fence = $4 AND claim_address = $6"
    )
);

/// Deletes the holder's marker of a step that failed: it did not finish,
/// so a later run runs it again. `$4`: the holder's fence. Index: the
/// partial unique index of its form.
pub(super) const ABANDON_STEP: PerCommit<SplitOnNamespace> = per_commit!(
    opening "USING",
    per_step_row!(
        "DELETE FROM idem_records",
        "state = 'pending' AND fence = $4 AND claim_address = $5"
    )
);

/// The text of [`RETAKE_STEP`] with its namespace tests.
macro_rules! retake_step {
    ($namespace_test:literal, $claim_namespace_test:literal) => {
        concat!(
            "UPDATE idem_records SET fence = $5 \
             WHERE account = $1 AND kind = 'step' AND address = $2 AND ",
            $namespace_test,
            " AND state = 'pending' AND fence = $4 AND claim_address = $6 AND ",
            claim_held!($claim_namespace_test)
        )
    };
}

/// Moves the marker of a step begun under the fence `$4` (by a holder cut
/// off inside it) to the holder's fence `$5`, while the claim at `$6` is
/// still pending under `$5`: for a step declared safe to repeat. Index:
/// the partial unique index of its form, for the step and for the claim.
pub(super) const RETAKE_STEP: SplitOnNamespace = SplitOnNamespace {
    without_namespace: retake_step!(
        "namespace IS NULL AND $3::text IS NULL",
        "c.namespace IS NULL"
    ),
    within_namespace: retake_step!("namespace = $3", "c.namespace = $3"),
};

/// What a step's new row carries besides its scope and address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewStep<'a> {
    /// The step's canonical encoding.
    pub identity: &'a [u8],
    /// The fence of the holder that begins it.
    pub fence: i64,
    /// The address of its claim.
    pub claim_address: &'a str,
}

/// Begins a step ([`BEGIN_STEP`]). `true`: its marker is in; `false`: the
/// step has a row already, or the claim is no longer the holder's.
pub(crate) async fn begin_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    step: NewStep<'_>,
) -> Result<bool, sqlx::Error> {
    let inserted = BEGIN_STEP
        .for_row(scope, address)
        .bind(step.identity)
        .bind(step.fence)
        .bind(step.claim_address)
        .fetch_optional(executor)
        .await?;
    Ok(inserted.is_some())
}

/// A step's row, if it has one ([`LOOKUP_STEP`]).
pub(crate) async fn lookup_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    claim_address: &str,
) -> Result<Option<StepRow>, sqlx::Error> {
    LOOKUP_STEP
        .for_row(scope, address)
        .bind(claim_address)
        .fetch_optional(executor)
        .await?
        .as_ref()
        .map(StepRow::from_row)
        .transpose()
}

/// Records the holder's step ([`RECORD_STEP`]). `false`: the marker is no
/// longer pending under this fence.
pub(crate) async fn record_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    claim_address: &str,
    output: &str,
    commit: Commit,
) -> Result<bool, sqlx::Error> {
    let statement = RECORD_STEP.committing(commit).for_row(scope, address);
    changed_one(
        statement.bind(fence).bind(output).bind(claim_address),
        executor,
    )
    .await
}

/// Deletes the holder's marker of a failed step ([`ABANDON_STEP`]).
/// `false`: the marker is no longer pending under this fence.
pub(crate) async fn abandon_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    claim_address: &str,
    commit: Commit,
) -> Result<bool, sqlx::Error> {
    let statement = ABANDON_STEP.committing(commit).for_row(scope, address);
    changed_one(statement.bind(fence).bind(claim_address), executor).await
}

/// Moves a cut-off holder's marker (fence `theirs`) to this holder's
/// ([`RETAKE_STEP`]). `false`: the marker moved or went, or the claim is
/// no longer this holder's.
pub(crate) async fn retake_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    theirs: i64,
    step: NewStep<'_>,
) -> Result<bool, sqlx::Error> {
    let statement = RETAKE_STEP.for_row(scope, address);
    changed_one(
        statement
            .bind(theirs)
            .bind(step.fence)
            .bind(step.claim_address),
        executor,
    )
    .await
}

/// A step begun and never recorded, as the reconciler reads it.
#[derive(Debug)]
pub(crate) struct PendingStep {
    pub address: String,
    pub fence: i64,
    /// The step's canonical encoding: its name is its last field.
    pub identity: Vec<u8>,
}

/// The text of [`PENDING_STEPS`] with its namespace test.
macro_rules! pending_steps {
    ($namespace_test:literal) => {
        concat!(
            "SELECT address, fence, identity FROM idem_records \
             WHERE account = $1 AND kind = 'step' AND claim_address = $2 AND ",
            $namespace_test,
            " AND state = 'pending' ORDER BY created_at, address"
        )
    };
}

/// The steps of the claim at `$2` begun and never recorded. Index:
/// `idem_records_steps_of_claim` (account, claim_address) over step rows.
pub(super) const PENDING_STEPS: SplitOnNamespace = SplitOnNamespace {
    without_namespace: pending_steps!("namespace IS NULL AND $3::text IS NULL"),
    within_namespace: pending_steps!("namespace = $3"),
};

/// Records a step begun under the fence `$4` and never recorded as
/// finished with the value `$5`, for somebody other than its holder (a
/// reconciler's probe said it happened): `resolved_at` says so. Index: the
/// partial unique index of its form.
pub(super) const RESOLVE_STEP: SplitOnNamespace = per_step_row!(
    "UPDATE idem_records SET state = 'success', settled_at = now(), resolved_at = now(), \
     output_json = $5",
    "state = 'pending' AND fence = $4 AND claim_address = $6"
);

/// The steps of the claim at `$2` begun and never recorded ([`PENDING_STEPS`]).
pub(crate) async fn pending_steps<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    claim_address: &str,
) -> Result<Vec<PendingStep>, sqlx::Error> {
    let rows = PENDING_STEPS
        .for_row(scope, claim_address)
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(PendingStep {
                address: row.try_get("address")?,
                fence: row.try_get("fence")?,
                identity: row.try_get("identity")?,
            })
        })
        .collect()
}

/// Records a pending step as finished for somebody other than its holder
/// ([`RESOLVE_STEP`]). `false`: it is no longer pending under `fence`.
pub(crate) async fn resolve_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    claim_address: &str,
    output: &str,
) -> Result<bool, sqlx::Error> {
    let statement = RESOLVE_STEP.for_row(scope, address);
    changed_one(
        statement.bind(fence).bind(output).bind(claim_address),
        executor,
    )
    .await
}
