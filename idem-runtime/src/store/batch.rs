//! The batch statements: claim many slots in one statement, look up the
//! holders of those it lost in one more, and record the outcomes of the won
//! ones with one statement per kind (settle, release, keep, hold in doubt).
//!
//! # Every address an index probe, whatever the statistics say
//!
//! A batch statement joins the list of addresses (`unnest` of an array
//! parameter) with `idem_records`. Written the obvious way (`UPDATE ...
//! FROM unnest(...) WHERE account = $1 AND address = item.address`), the
//! planner may scan the whole account and match the list in a hash or
//! merge join; it does so whenever its statistics say the account holds a
//! few rows (a new tenant, statistics taken before a load, or none taken
//! yet): measured at 230–390 ms for 100 addresses over 300,000 rows,
//! against 2–4 ms for 100 probes. `address = ANY($2)` is planned the same
//! way. No arrangement of the join's constants survives a table whose
//! statistics were never taken (its indexes, built empty, say they hold
//! nothing, so any plan looks free).
//!
//! So on PostgreSQL each address is found by a subquery of its own, joined
//! `LATERAL` and cut with `LIMIT 1`, which the planner can neither flatten
//! into a join nor run other than once per address: the same one-row
//! lookup, on the full key of the partial unique index, as every statement
//! of the one-claim path. A lookup returns what that subquery found; an
//! update or delete takes the row it found by its `ctid` (and `tableoid`,
//! for a partitioned table), a direct fetch that needs no statistics
//! either. Should the row change between the two (a concurrent writer),
//! PostgreSQL re-checks the newest version against `ctid` and the fence,
//! finds it no longer matches, and leaves it: the item is then recorded
//! alone, as one claim is. The `batch_plans` test
//! (`tests/testsuite/store/batch_plans.rs`) pins the plans with
//! `EXPLAIN`, under statistics that are stale and under none at all.
//!
//! On Citus the account stays a constant of the join (`account = $1`):
//! that is how Citus routes the statement to the one worker holding the
//! account's shard (a `ctid` means nothing across shards); the worker plans
//! the join against its shard's statistics.
//!
//! # Address order
//!
//! Every batch statement visits its rows in address order: the claim
//! inserts them sorted, and the others probe them in the order of a sorted
//! list. Two batches that overlap take their row locks (and wait on each
//! other's uncommitted inserts) in the same order, so they cannot deadlock.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{FromRow, PgExecutor, Postgres, Row};

use super::claims::{Existing, existing_columns};
use super::{Commit, Engine, PerCommit, SplitOnNamespace, per_commit};
use crate::outcome::{Disposition, Outcome};

/// A batch statement in its four forms: per engine (see the module's
/// docs), and per namespace ([`SplitOnNamespace`]).
pub struct PerEngine {
    postgres: SplitOnNamespace,
    citus: SplitOnNamespace,
}

impl PerEngine {
    /// The form for `engine` and `namespace`, with the parameters every
    /// batch statement shares bound: `$1` the account, `$2` the addresses,
    /// `$3` the namespace.
    fn for_batch<'q>(
        &self,
        engine: Engine,
        scope: super::Scope<'q>,
        addresses: &'q [&'q str],
    ) -> Query<'q, Postgres, PgArguments> {
        let forms = match engine {
            Engine::PostgreSQL => &self.postgres,
            Engine::Citus => &self.citus,
        };
        sqlx::query(forms.for_namespace(scope.namespace))
            .bind(scope.account)
            .bind(addresses)
            .bind(scope.namespace)
    }

    /// The text for `engine` and `namespace`, for the plan tests.
    pub fn text(&self, engine: Engine, namespace: Option<&str>) -> &'static str {
        match engine {
            Engine::PostgreSQL => self.postgres.for_namespace(namespace),
            Engine::Citus => self.citus.for_namespace(namespace),
        }
    }
}

/// A statement over the rows of a batch: `$head` (the statement up to its
/// `FROM` or `USING` list, whose last item is the batch), `$items` (an
/// `unnest(...) AS item(address, ...)` over the array parameters), then
/// `WHERE` the row is the item's (see the module docs for how it is found)
/// `AND $and`, and `$tail` (its `RETURNING` list). In all four forms, `$1`
/// is the account, `$2` the addresses, `$3` the namespace.
macro_rules! per_batch {
    ($head:expr, $items:expr, $and:literal, $tail:literal) => {
        PerEngine {
            postgres: SplitOnNamespace {
                without_namespace: per_batch!(@postgres $head, $items,
                    "namespace IS NULL AND $3::text IS NULL", $and, $tail),
                within_namespace: per_batch!(@postgres $head, $items,
                    "namespace = $3", $and, $tail),
            },
            citus: SplitOnNamespace {
                without_namespace: per_batch!(@citus $head, $items,
                    "r.namespace IS NULL AND $3::text IS NULL", $and, $tail),
                within_namespace: per_batch!(@citus $head, $items,
                    "r.namespace = $3", $and, $tail),
            },
        }
    };
    // `$tail!` writes the tail with the namespace test of another row of
    // the batch's form (an entity's, `e.`), so that it too is found
    // through the partial unique index of that form.
    ($head:expr, $items:expr, $and:literal, $tail:ident!) => {
        PerEngine {
            postgres: SplitOnNamespace {
                without_namespace: per_batch!(@postgres $head, $items,
                    "namespace IS NULL AND $3::text IS NULL", $and,
                    $tail!("e.namespace IS NULL AND $3::text IS NULL")),
                within_namespace: per_batch!(@postgres $head, $items,
                    "namespace = $3", $and, $tail!("e.namespace = $3")),
            },
            citus: SplitOnNamespace {
                without_namespace: per_batch!(@citus $head, $items,
                    "r.namespace IS NULL AND $3::text IS NULL", $and,
                    $tail!("e.namespace IS NULL AND $3::text IS NULL")),
                within_namespace: per_batch!(@citus $head, $items,
                    "r.namespace = $3", $and, $tail!("e.namespace = $3")),
            },
        }
    };
    (@postgres $head:expr, $items:expr, $namespace_test:literal, $and:literal,
     $tail:expr) => {
        concat!(
            $head,
            " (SELECT item.*, found.ctid AS row_ctid, found.tableoid AS row_table \
               FROM ", $items, " \
               CROSS JOIN LATERAL ( \
                   SELECT ctid, tableoid FROM idem_records \
                   WHERE account = $1 AND kind = 'claim' AND address = item.address AND ",
            $namespace_test,
            "      LIMIT 1) AS found \
               ORDER BY item.address) AS item \
             WHERE r.ctid = item.row_ctid AND r.tableoid = item.row_table AND ",
            $and, " ", $tail
        )
    };
    (@citus $head:expr, $items:expr, $namespace_test:literal, $and:literal,
     $tail:expr) => {
        concat!(
            $head,
            " (SELECT item.* FROM ", $items, " ORDER BY item.address) AS item \
             WHERE r.account = $1 AND r.kind = 'claim' AND r.address = item.address AND ",
            $namespace_test, " AND ", $and, " ", $tail
        )
    };
}

/// Claims every slot of a batch that is free, in one statement: a pending
/// row per address, inserted in address order; a conflict with either
/// partial unique index skips that address. Returns the won addresses and
/// their fences; an address missing from the answer is held by somebody
/// (the caller looks it up with [`LOOKUP_BATCH`]).
///
/// `$1` account, `$2` addresses (no repeats), `$3` namespace, `$4`
/// identities, `$5` fingerprints (NULL elements: none), `$6` lease in
/// microseconds (NULL: none), `$7` and `$8` the value's and the slot's
/// windows in microseconds (NULL: for ever), `$9` `expires_in_doubt`
/// (`true`, or NULL: take over). The same text serves every form: the insert
/// is arbitrated by the index the new row's namespace falls under, and
/// Citus routes it by the one account.
pub const CLAIM_BATCH: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, fingerprint, lease_expires_at, \
        value_kept_for, slot_kept_for, expires_in_doubt) \
     SELECT $1, 'claim', item.address, $3, 'pending', item.identity, item.fingerprint, \
            now() + $6 * interval '1 microsecond', $7 * interval '1 microsecond', \
            $8 * interval '1 microsecond', $9 \
     FROM unnest($2::text[], $4::bytea[], $5::bytea[]) AS item(address, identity, fingerprint) \
     ORDER BY item.address \
     ON CONFLICT DO NOTHING \
     RETURNING address, fence";

/// [`LOOKUP_BATCH`] on PostgreSQL: a `LATERAL` lookup per address.
macro_rules! lookup_batch_statement {
    ($namespace_test:literal) => {
        concat!(
            "SELECT item.address, found.* \
             FROM unnest($2::text[]) AS item(address) \
             CROSS JOIN LATERAL ( \
                 SELECT ",
            existing_columns!(),
            ", \
                        CASE WHEN $4 THEN coalesce(output_json, output::text) END AS output \
                 FROM idem_records \
                 WHERE account = $1 AND kind = 'claim' AND address = item.address AND ",
            $namespace_test,
            "    LIMIT 1) AS found"
        )
    };
}

/// [`LOOKUP_BATCH`] on Citus: the join, routed by the constant account.
macro_rules! lookup_batch_routed {
    ($namespace_test:literal) => {
        concat!(
            "SELECT r.address, ",
            existing_columns!(),
            ", \
                    CASE WHEN $4 THEN coalesce(output_json, output::text) END AS output \
             FROM idem_records r, unnest($2::text[]) AS item(address) \
             WHERE r.account = $1 AND r.kind = 'claim' AND r.address = item.address AND ",
            $namespace_test
        )
    };
}

/// The rows holding the slots of a batch, as [`Existing`] reads them, with
/// their addresses; `$4`: whether to return the stored outputs. On
/// PostgreSQL, one lookup per address through the partial unique index of
/// its form; on Citus, the routed join (see the module docs).
pub const LOOKUP_BATCH: PerEngine = PerEngine {
    postgres: SplitOnNamespace {
        without_namespace: lookup_batch_statement!("namespace IS NULL AND $3::text IS NULL"),
        within_namespace: lookup_batch_statement!("namespace = $3"),
    },
    citus: SplitOnNamespace {
        without_namespace: lookup_batch_routed!("r.namespace IS NULL AND $3::text IS NULL"),
        within_namespace: lookup_batch_routed!("r.namespace = $3"),
    },
};

/// A batch statement over the holder's pending claims, each matched on
/// its fence (`$4`), returning the addresses it changed: `$head` up to its
/// `FROM` or `USING` list, and the array parameters' `unnest` (the
/// addresses and the fences, unless given).
macro_rules! on_held {
    ($head:expr) => {
        on_held!(
            $head,
            "unnest($2::text[], $4::bigint[]) AS item(address, fence)"
        )
    };
    ($head:expr, $items:expr) => {
        per_batch!(
            $head,
            $items,
            "r.state = 'pending' AND r.fence = item.fence",
            "RETURNING r.address, coalesce(r.awaited, false) AS awaited"
        )
    };
}

/// What a settle sets: `success`, and the output to keep (from the item).
macro_rules! settle_set {
    () => {
        "UPDATE idem_records r \
         SET state = 'success', settled_at = statement_timestamp(), lease_expires_at = NULL, \
             output_json = item.output \
         FROM"
    };
}

/// The items of a settle: each address, its fence and the output to keep.
macro_rules! settle_items {
    () => {
        "unnest($2::text[], $4::bigint[], $5::text[]) AS item(address, fence, output)"
    };
}

/// What keeping a failure sets: `failed`, and why (`$5`).
macro_rules! keep_set {
    () => {
        "UPDATE idem_records r \
         SET state = 'failed', settled_at = statement_timestamp(), lease_expires_at = NULL, state_reason = $5 \
         FROM"
    };
}

/// Settles the holder's pending claims, each matched on its fence. `$4`
/// fences, `$5` outputs to keep (NULL elements: none). Returns the settled
/// addresses. Index: one probe per address into the partial unique index
/// of its form.
pub const SETTLE_BATCH: PerCommit<PerEngine> =
    per_commit!(leading, on_held!(settle_set!(), settle_items!()));

/// What [`RELEASE_BATCH`] does with the claims it deleted: stamps their
/// steps released, and frees the entity each ordered event among them held
/// (as a single release does, `stamping_released_steps!`: a deleted row
/// cannot be told from one not yet visible, so only its release frees the
/// entity), its row found with `$entity_namespace_test`.
macro_rules! releasing_batch {
    ($entity_namespace_test:literal) => {
        concat!(
            "RETURNING r.address, r.entity, r.awaited), \
             stamped AS (UPDATE idem_records s SET released_at = now() FROM released \
                         WHERE s.account = $1 AND s.kind = 'step' \
                           AND s.claim_address = released.address \
                           AND s.namespace IS NOT DISTINCT FROM $3), \
             freed AS (UPDATE idem_records e SET held_by = NULL, event_order = NULL \
                       FROM released \
                       WHERE e.account = $1 AND e.kind = 'entity' \
                         AND e.address = released.entity AND ",
            $entity_namespace_test,
            "            AND e.held_by = released.address) \
             SELECT address, coalesce(awaited, false) AS awaited FROM released"
        )
    };
}

/// Deletes the holder's pending claims, each matched on its fence, freeing
/// their slots, stamps the steps of each claim it deleted released, and
/// frees the entity of each ordered event it deleted, as a single release
/// does (`stamping_released_steps!`). `$4` fences. Returns the released
/// addresses. Index: one probe per address into the partial unique index
/// of its form, one per address released into the steps', and one per
/// ordered event released into its form's, for its entity.
pub const RELEASE_BATCH: PerCommit<PerEngine> = per_commit!(
    leading,
    per_batch!(
        "WITH released AS (DELETE FROM idem_records r USING",
        "unnest($2::text[], $4::bigint[]) AS item(address, fence)",
        "r.state = 'pending' AND r.fence = item.fence",
        releasing_batch!
    )
);

/// Keeps the holder's pending claims as definite failures, each matched on
/// its fence. `$4` fences, `$5` how they got there (`state_reason`).
/// Returns the kept addresses. Index: as [`SETTLE_BATCH`].
pub const KEEP_BATCH: PerCommit<PerEngine> = per_commit!(leading, on_held!(keep_set!()));

/// Holds the holder's pending claims in doubt, each matched on its fence;
/// the lease is cleared, so none can be taken over. `$4` fences, `$5` how
/// they got there (`state_reason`). Returns the held addresses. Index: as
/// [`SETTLE_BATCH`].
pub const HOLD_IN_DOUBT_BATCH: PerEngine = on_held!(
    "UPDATE idem_records r \
     SET state = 'in_doubt', lease_expires_at = NULL, state_reason = $5, \
         in_doubt_since = now() \
     FROM"
);

/// What a new claim of a batch carries besides its address: as
/// [`NewClaim`](super::NewClaim), per item.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewBatchItem<'a> {
    pub address: &'a str,
    pub identity: &'a [u8],
    pub fingerprint: Option<&'a [u8]>,
}

/// The lease every claim of a batch is made with: its length in
/// microseconds (`None`: none), and whether, run out, it holds the slot in
/// doubt (as [`NewClaim`](super::NewClaim)'s).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLease {
    pub micros: Option<i64>,
    pub expires_in_doubt: bool,
}

/// Claims every free slot among `items` (addresses without repeats) in one
/// statement ([`CLAIM_BATCH`]): the won addresses with their fences, in
/// address order.
pub(crate) async fn claim_batch<'e>(
    executor: impl PgExecutor<'e>,
    scope: super::Scope<'_>,
    items: &[NewBatchItem<'_>],
    lease: BatchLease,
    windows: super::Windows,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let query = claims_bound(CLAIM_BATCH, scope, items.iter(), lease, windows);
    won(query.fetch_all(executor).await?)
}

/// `text`, a claim of many new rows, with what [`CLAIM_BATCH`] binds:
/// `$1` the account, `$2` the addresses, `$3` the namespace, `$4` the
/// identities, `$5` the fingerprints (pairwise with the addresses), `$6`
/// the lease, `$7` and `$8` the windows, in microseconds, `$9`
/// `expires_in_doubt`. The batch claim of ordered events binds the same,
/// then its own.
pub(super) fn claims_bound<'q, 'a: 'q>(
    text: &'static str,
    scope: super::Scope<'q>,
    items: impl Iterator<Item = &'q NewBatchItem<'a>> + Clone,
    lease: BatchLease,
    windows: super::Windows,
) -> Query<'q, Postgres, PgArguments> {
    let addresses: Vec<&str> = items.clone().map(|item| item.address).collect();
    let identities: Vec<&[u8]> = items.clone().map(|item| item.identity).collect();
    let fingerprints: Vec<Option<&[u8]>> = items.map(|item| item.fingerprint).collect();
    sqlx::query(text)
        .bind(scope.account)
        .bind(addresses)
        .bind(scope.namespace)
        .bind(identities)
        .bind(fingerprints)
        .bind(lease.micros)
        .bind(windows.value_micros)
        .bind(windows.slot_micros)
        .bind(super::claims::expires_in_doubt(lease.expires_in_doubt))
}

/// The won addresses and their fences, as a batch claim returns them.
pub(super) fn won(rows: Vec<PgRow>) -> Result<Vec<(String, i64)>, sqlx::Error> {
    rows.iter()
        .map(|row| Ok((row.try_get("address")?, row.try_get("fence")?)))
        .collect()
}

/// The rows holding the slots of `addresses` ([`LOOKUP_BATCH`]), with their
/// addresses; an address with no row is missing from the answer.
pub(crate) async fn lookup_batch<'e>(
    executor: impl PgExecutor<'e>,
    engine: Engine,
    scope: super::Scope<'_>,
    addresses: &[&str],
    kept_value: super::KeptValue,
) -> Result<Vec<(String, Existing)>, sqlx::Error> {
    LOOKUP_BATCH
        .for_batch(engine, scope, addresses)
        .bind(kept_value.is_read())
        .fetch_all(executor)
        .await?
        .iter()
        .map(|row| Ok((row.try_get("address")?, Existing::from_row(row)?)))
        .collect()
}

/// Records `outcome` for the pending claims at `addresses` held under
/// `fences` (pairwise), in one statement; the addresses it changed, each
/// with whether a duplicate in another process waits on it
/// (`claims::MARK_AWAITED`). An address missing from the answer is no
/// longer pending under its fence.
/// A settle keeps, per claim, its value of `outputs` (pairwise too; unread
/// for a failure); a kept failure and a hold in doubt say why in
/// `state_reason`, as the same outcome of one claim does.
#[allow(
    clippy::too_many_arguments,
    reason = "one statement's binds, each named"
)]
pub(crate) async fn record_batch<'e>(
    executor: impl PgExecutor<'e>,
    engine: Engine,
    scope: super::Scope<'_>,
    addresses: &[&str],
    fences: &[i64],
    outcome: Outcome,
    outputs: &[Option<&str>],
    commit: Commit,
) -> Result<Vec<(String, bool)>, sqlx::Error> {
    let query = match outcome {
        Outcome::Succeeded(_) => SETTLE_BATCH
            .committing(commit)
            .for_batch(engine, scope, addresses)
            .bind(fences)
            .bind(outputs),
        Outcome::Failed(Disposition::Release) => RELEASE_BATCH
            .committing(commit)
            .for_batch(engine, scope, addresses)
            .bind(fences),
        Outcome::Failed(Disposition::Keep) => KEEP_BATCH
            .committing(commit)
            .for_batch(engine, scope, addresses)
            .bind(fences)
            .bind(super::KEPT_FAILURE),
        Outcome::Failed(Disposition::InDoubt) => HOLD_IN_DOUBT_BATCH
            .for_batch(engine, scope, addresses)
            .bind(fences)
            .bind(super::BODY_IN_DOUBT),
    };
    query
        .fetch_all(executor)
        .await?
        .iter()
        .map(|row| Ok((row.try_get("address")?, row.try_get("awaited")?)))
        .collect()
}
