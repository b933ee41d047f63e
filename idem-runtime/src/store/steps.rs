//! The statements of steps inside one claim (`kind = 'step'`): begin one
//! (its marker), look one up, record its result, abandon it after its
//! failure; for a step that runs without a marker (a repeatable one), read
//! the claim's steps once and record its result in one statement, over
//! the marker of a holder cut off inside it if there is one.
//!
//! A step's row lives at an address of its own (`step_` and a digest of
//! its identity and name), in the claim's account and namespace, arbitrated
//! by the same two partial unique indexes as every row; `claim_address`
//! names its claim. Its `fence` is the fence of the claim holder that runs
//! it: every statement that changes a step's row is a compare-and-swap on
//! `state = 'pending'` and the fence, so a holder changes only its own
//! marker (or, recording a step without one, a marker of an older fence),
//! and nobody writes over a recorded step.
//!
//! Only a holder begins a step, or records one without a marker: both
//! statements insert only while the claim is still pending under the
//! holder's fence, so a holder whose claim was taken over (or released)
//! cannot add a step under it. Outcome over a marker needs no such test:
//! the marker is the holder's own, and its step ran; a success that
//! happened is never lost.

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

impl StepRow {
    /// The recorded value, as JSON (`null` for a row that has none).
    pub fn value(self) -> String {
        self.output.unwrap_or_else(|| "null".into())
    }
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
pub const BEGIN_STEP: SplitOnNamespace = SplitOnNamespace {
    without_namespace: begin_step!("c.namespace IS NULL AND $3::text IS NULL"),
    within_namespace: begin_step!("c.namespace = $3"),
};

/// A step's row by its address; `$4` its claim's address. Index: the
/// partial unique index of its form (or the index of a claim's steps,
/// which the claim's address makes as narrow: a planner without
/// statistics may take either).
pub const LOOKUP_STEP: SplitOnNamespace = per_step_row!(
    "SELECT state, fence, identity, output_json AS output FROM idem_records",
    "claim_address = $4"
);

/// Records the holder's step as finished, keeping `$5`, its value as JSON
/// text (never `jsonb`, which refuses some of what JSON can say), at
/// `statement_timestamp()` (after it was begun, in a transaction too).
/// `$4`: the holder's fence. Index: the partial unique index of its form.
pub const RECORD_STEP: PerCommit<SplitOnNamespace> = per_commit!(
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
pub const ABANDON_STEP: PerCommit<SplitOnNamespace> = per_commit!(
    opening "USING",
    per_step_row!(
        "DELETE FROM idem_records",
        "state = 'pending' AND fence = $4 AND claim_address = $5"
    )
);

/// The `recorded` item of a `WITH` that writes a carried record over the
/// holder's own marker, as [`RECORD_STEP`] does, given its parameters by
/// name (`$address`, `$output`, `$fence`, `$claim`, each a literal such as
/// `"$7"`) and its namespace test: what [`RECORD_AND_BEGIN_STEP`] and
/// [`SETTLE_CARRYING_STEP`](super::claims::SETTLE_CARRYING_STEP) share.
macro_rules! recording_carried {
    ($address:literal, $output:literal, $fence:literal, $claim:literal, $namespace_test:literal) => {
        concat!(
            "recorded AS (UPDATE idem_records \
               SET state = 'success', settled_at = statement_timestamp(), output_json = ",
            $output,
            " WHERE account = $1 AND kind = 'step' AND address = ",
            $address,
            " AND ",
            $namespace_test,
            " AND state = 'pending' AND fence = ",
            $fence,
            " AND claim_address = ",
            $claim,
            " RETURNING 1)"
        )
    };
}
pub(super) use recording_carried;

/// The text of [`RECORD_AND_BEGIN_STEP`] with the namespace test of the
/// step recorded and of the claim.
macro_rules! record_and_begin_step {
    ($namespace_test:literal, $claim_namespace_test:literal) => {
        concat!(
            "WITH ",
            recording_carried!("$7", "$8", "$5", "$6", $namespace_test),
            ", begun AS (",
            begin_step!($claim_namespace_test),
            ") SELECT EXISTS (SELECT FROM recorded) AS recorded, \
                      EXISTS (SELECT FROM begun) AS begun"
        )
    };
}

/// Records the step the holder finished last (its address `$7`) and
/// begins the next one, in one statement and one durable commit: the
/// record of step k rides with the marker of step k + 1, so N steps cost
/// N + 2 statements with the claim and its settle (which carries the
/// last record, [`SETTLE_CARRYING_STEP`](super::claims::SETTLE_CARRYING_STEP)),
/// not 2N + 2. The record is
/// [`RECORD_STEP`]'s compare-and-swap on the holder's own marker, the
/// begin [`BEGIN_STEP`]'s insert while the claim is the holder's; each
/// says in its own column whether it wrote. Parameters as `BEGIN_STEP`'s,
/// then `$7` the recorded step's address and `$8` its value as JSON.
/// Durable only: the marker must be. Not for Citus, which plans an
/// `INSERT` inside a `WITH` apart from the rest (each step records on its
/// own there). Index: the partial unique index of its form, for both
/// rows and the claim's test.
pub const RECORD_AND_BEGIN_STEP: SplitOnNamespace = SplitOnNamespace {
    without_namespace: record_and_begin_step!(
        "namespace IS NULL AND $3::text IS NULL",
        "c.namespace IS NULL AND $3::text IS NULL"
    ),
    within_namespace: record_and_begin_step!("namespace = $3", "c.namespace = $3"),
};

/// The text of [`RECORD_UNMARKED_STEP`] from `$head`, the statement up to
/// its `FROM` list (which [`per_commit!`] may open with the async item).
///
/// Selected from the claim's own row, as [`BEGIN_STEP`] is (Citus pushes
/// this form down to the account's shard). The conflict target names the
/// partial unique index of each form, with its predicate, so that a
/// marker left by a holder cut off inside the step is updated in place.
macro_rules! record_unmarked_step {
    ($head:expr) => {
        $crate::store::SplitOnNamespace {
            without_namespace: concat!(
                $head,
                " idem_records c \
                 WHERE c.account = $1 AND c.kind = 'claim' AND c.address = $6 \
                   AND c.namespace IS NULL AND $3::text IS NULL \
                   AND c.state = 'pending' AND c.fence = $5 \
                 ON CONFLICT (account, kind, address) WHERE namespace IS NULL ",
                record_unmarked_step!(@update)
            ),
            within_namespace: concat!(
                $head,
                " idem_records c \
                 WHERE c.account = $1 AND c.kind = 'claim' AND c.address = $6 \
                   AND c.namespace = $3 \
                   AND c.state = 'pending' AND c.fence = $5 \
                 ON CONFLICT (account, kind, address, namespace) WHERE namespace IS NOT NULL ",
                record_unmarked_step!(@update)
            ),
        }
    };
    (@update) => {
        "DO UPDATE SET state = 'success', fence = excluded.fence, \
             settled_at = excluded.settled_at, output_json = excluded.output_json \
         WHERE idem_records.state = 'pending' \
           AND idem_records.claim_address = excluded.claim_address \
           AND idem_records.fence <= excluded.fence \
         RETURNING fence"
    };
}

/// Records a step that ran without a marker (a [repeatable] one), in one
/// statement: its row goes in `success` with its value `$7`, while the
/// claim at `$6` is still pending under the holder's fence `$5`; `$4` its
/// identity. A marker at its address (a holder cut off inside it) is
/// recorded over, if it is still pending and no newer holder's: fences
/// come from one sequence, so a stale holder's (lower) fence can never
/// write over what a newer holder began or recorded, and nothing is ever
/// written over a recorded step. Returns a row only when it wrote.
/// Index: the claim's test and the conflict, the partial unique index of
/// their form.
///
/// [repeatable]: crate::Step::repeatable
pub const RECORD_UNMARKED_STEP: PerCommit<SplitOnNamespace> = per_commit!(
    leading,
    record_unmarked_step!(
        "INSERT INTO idem_records \
           (account, kind, address, namespace, state, identity, fence, first_fence, \
            claim_address, created_at, settled_at, output_json) \
         SELECT c.account, 'step', $2, $3, 'success', $4, $5, $5, $6, \
                statement_timestamp(), statement_timestamp(), $7 \
         FROM"
    )
);

/// The text of [`STEPS_FOR_REPLAY`] with its namespace test.
macro_rules! steps_for_replay {
    ($namespace_test:literal) => {
        concat!(
            "SELECT NULL::text AS address, NULL::text AS state, NULL::int8 AS fence, \
                    NULL::bytea AS identity, NULL::text AS output, \
                    (state = 'pending' AND fence = $4) AS held \
             FROM idem_records \
             WHERE account = $1 AND kind = 'claim' AND address = $2 AND ",
            $namespace_test,
            " UNION ALL \
             SELECT address, state, fence, identity, output_json, NULL::boolean \
             FROM idem_records \
             WHERE account = $1 AND kind = 'step' AND claim_address = $2 AND ",
            $namespace_test
        )
    };
}

/// Every step of the claim at `$2`, with its value, and whether the claim
/// is still pending under the holder's fence `$4` (a row with `held` set,
/// absent when the claim is gone): what a run reads once, at its first step
/// without a marker, to replay what is recorded without a statement per
/// step, and to know before running one that its claim is still its own.
/// Index: the claim's row, the partial unique index of its form; its
/// steps, `idem_records_steps_of_claim` (account, claim_address) over step
/// rows.
pub const STEPS_FOR_REPLAY: SplitOnNamespace = SplitOnNamespace {
    without_namespace: steps_for_replay!("namespace IS NULL AND $3::text IS NULL"),
    within_namespace: steps_for_replay!("namespace = $3"),
};

/// What a run read of its claim ([`STEPS_FOR_REPLAY`]).
#[derive(Debug)]
pub(crate) struct StepsRead {
    /// The claim is still pending under the holder's fence.
    pub held: bool,
    /// Its steps, by address.
    pub steps: Vec<(String, StepRow)>,
}

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

/// The record of a step its holder finished, carried by the run's next
/// statement instead of a statement of its own: the next step's begin
/// ([`RECORD_AND_BEGIN_STEP`]) or the claim's settle
/// ([`SETTLE_CARRYING_STEP`](super::claims::SETTLE_CARRYING_STEP)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CarriedRecord<'a> {
    /// The step's address.
    pub address: &'a str,
    /// Its value, as JSON.
    pub output: &'a str,
}

/// What [`RECORD_AND_BEGIN_STEP`] wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordedAndBegun {
    /// The carried record went over the holder's marker.
    pub recorded: bool,
    /// The next step's marker went in.
    pub begun: bool,
}

/// Records `carried` and begins the step at `address`
/// ([`RECORD_AND_BEGIN_STEP`]).
pub(crate) async fn record_and_begin_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    step: NewStep<'_>,
    carried: CarriedRecord<'_>,
) -> Result<RecordedAndBegun, sqlx::Error> {
    let row = RECORD_AND_BEGIN_STEP
        .for_row(scope, address)
        .bind(step.identity)
        .bind(step.fence)
        .bind(step.claim_address)
        .bind(carried.address)
        .bind(carried.output)
        .fetch_one(executor)
        .await?;
    Ok(RecordedAndBegun {
        recorded: row.try_get("recorded")?,
        begun: row.try_get("begun")?,
    })
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

/// Records a step that ran without a marker ([`RECORD_UNMARKED_STEP`]).
/// `false`: nothing was written (the step is recorded already, or a newer
/// holder's marker is there, or the claim is no longer this holder's).
pub(crate) async fn record_unmarked_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    step: NewStep<'_>,
    output: &str,
    commit: Commit,
) -> Result<bool, sqlx::Error> {
    let written = RECORD_UNMARKED_STEP
        .committing(commit)
        .for_row(scope, address)
        .bind(step.identity)
        .bind(step.fence)
        .bind(step.claim_address)
        .bind(output)
        .fetch_optional(executor)
        .await?;
    Ok(written.is_some())
}

/// Every step of the claim at `claim_address`, by address, and whether
/// the claim is still pending under `fence` ([`STEPS_FOR_REPLAY`]).
pub(crate) async fn steps_for_replay<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    claim_address: &str,
    fence: i64,
) -> Result<StepsRead, sqlx::Error> {
    let rows = STEPS_FOR_REPLAY
        .for_row(scope, claim_address)
        .bind(fence)
        .fetch_all(executor)
        .await?;
    let mut read = StepsRead {
        held: false,
        steps: Vec::with_capacity(rows.len()),
    };
    for row in &rows {
        match row.try_get::<Option<bool>, _>("held")? {
            Some(held) => read.held = held,
            None => read
                .steps
                .push((row.try_get("address")?, StepRow::from_row(row)?)),
        }
    }
    Ok(read)
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
pub const PENDING_STEPS: SplitOnNamespace = SplitOnNamespace {
    without_namespace: pending_steps!("namespace IS NULL AND $3::text IS NULL"),
    within_namespace: pending_steps!("namespace = $3"),
};

/// Records a step begun under the fence `$4` and never recorded as
/// finished with the value `$5`, for somebody other than its holder (a
/// reconciler's probe said it happened): `resolved_at` says so. Index: the
/// partial unique index of its form.
pub const RESOLVE_STEP: SplitOnNamespace = per_step_row!(
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
