//! Claim rows in `idem_records`: the statements the gate runs, and nothing else.
//!
//! By default every statement runs on its own pooled connection and commits
//! on its own (autocommit): a claim is visible to every other process the
//! moment it is won, so a losing duplicate is refused at once instead of
//! waiting on the winner's transaction. In-transaction mode passes the
//! caller's connection instead, and the caller's commit decides.

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgExecutor, Postgres, Row};

/// Where a claim lives, besides its address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub account: &'a str,
    pub namespace: Option<&'a str>,
}

/// What a new claim row carries besides its scope and address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewClaim<'a> {
    pub identity: &'a [u8],
    pub fingerprint: Option<&'a [u8]>,
    /// `None`: the claim holds until resolved.
    pub lease_micros: Option<i64>,
}

/// A claim row found on conflict.
#[derive(Debug)]
pub(crate) struct Existing {
    pub settled: bool,
    pub identity: Vec<u8>,
    pub fingerprint: Option<Vec<u8>>,
    pub fence: i64,
    /// A lease was set and has run out (by the database's clock).
    pub lease_expired: bool,
    /// The stored `Ok` value, when asked for and present.
    pub output: Option<String>,
}

/// The claim, and the whole gate: one statement, whose insert decides.
///
/// It looks first, in the same statement, so that a duplicate of a visible
/// claim (the common duplicate: a retry of something settled or long in
/// flight) is answered by this one round trip instead of an insert that
/// conflicts and then a lookup: a refusal costs what a hand-written `SELECT`
/// does. When the lookup finds nothing the `INSERT ... ON CONFLICT DO
/// NOTHING` runs, and a conflict with either partial unique index means
/// somebody else holds the slot. The lookup is an early-out only: a row it
/// cannot see (committed after the statement's snapshot, or not committed
/// yet) still stops the insert, and then no row comes back at all, which
/// [`claim`] answers with a plain [`lookup`] under a new snapshot.
///
/// `$1` account, `$2` address, `$3` namespace, `$4` identity, `$5`
/// fingerprint, `$6` lease in microseconds (NULL: none), `$7` whether to
/// return the stored output.
macro_rules! claim_statement {
    ($namespace_test:literal) => {
        concat!(
            "WITH existing AS ( \
                 SELECT state = 'success' AS settled, identity, fingerprint, fence, \
                        coalesce(lease_expires_at < now(), false) AS lease_expired, \
                        CASE WHEN $7 THEN output::text END AS output \
                 FROM idem_records \
                 WHERE account = $1 AND kind = 'claim' AND address = $2 AND ",
            $namespace_test,
            " ), claimed AS ( \
                 INSERT INTO idem_records \
                   (account, kind, address, namespace, state, identity, fingerprint, \
                    lease_expires_at) \
                 SELECT $1, 'claim', $2, $3, 'pending', $4, $5, \
                        now() + $6 * interval '1 microsecond' \
                 WHERE NOT EXISTS (SELECT FROM existing) \
                 ON CONFLICT DO NOTHING \
                 RETURNING fence \
             ) \
             SELECT true, fence, NULL::boolean, NULL::bytea, NULL::bytea, NULL::boolean, \
                    NULL::text \
             FROM claimed \
             UNION ALL \
             SELECT false, fence, settled, identity, fingerprint, lease_expired, output \
             FROM existing"
        )
    };
}

const CLAIM: PerRow = PerRow {
    without_namespace: claim_statement!("namespace IS NULL AND $3::text IS NULL"),
    within_namespace: claim_statement!("namespace = $3"),
};

/// What the claim statement found.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// This statement inserted the claim, with this fence.
    Won(i64),
    /// The slot is held by a row the statement could see.
    Held(Existing),
    /// The insert met a row the statement's snapshot cannot see: look again.
    Hidden,
}

/// A statement over one claim row, in its two forms. The row is found
/// through the partial index whose predicate its namespace satisfies, so the
/// namespace test is spelled out (`IS NULL` or `= $3`) rather than folded
/// into `IS NOT DISTINCT FROM`, which no index can serve. `$1` is the
/// account, `$2` the address and `$3` the namespace in both forms (NULL and
/// unused in the first), so further parameters are numbered alike.
struct PerRow {
    without_namespace: &'static str,
    within_namespace: &'static str,
}

macro_rules! per_row {
    ($statement:literal $(, $and:literal)? $(; $tail:literal)?) => {
        PerRow {
            without_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = 'claim' AND address = $2 \
                  AND namespace IS NULL AND $3::text IS NULL"
                $(, " AND ", $and)? $(, " ", $tail)?
            ),
            within_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace = $3"
                $(, " AND ", $and)? $(, " ", $tail)?
            ),
        }
    };
}

/// `$4`: whether to return the stored output (it may be large).
const LOOKUP: PerRow = per_row!(
    "SELECT state = 'success', identity, fingerprint, fence, \
            coalesce(lease_expires_at < now(), false), \
            CASE WHEN $4 THEN output::text END \
     FROM idem_records"
);

/// `$4`: the holder's fence; `$5`: the output to keep, or NULL.
const SETTLE: PerRow = per_row!(
    "UPDATE idem_records \
     SET state = 'success', settled_at = now(), lease_expires_at = NULL, output = $5::jsonb",
    "state = 'pending' AND fence = $4"
);

/// `$4`: the holder's fence.
const RELEASE: PerRow = per_row!(
    "DELETE FROM idem_records",
    "state = 'pending' AND fence = $4"
);

/// [`SETTLE`] committing without waiting for its WAL to reach the disk:
/// `synchronous_commit` is set for its own transaction only, inside the
/// statement (no extra round trip, nothing left on the pooled connection).
const SETTLE_ASYNC: PerRow = per_row!(
    "UPDATE idem_records \
     SET state = 'success', settled_at = now(), lease_expires_at = NULL, output = $5::jsonb \
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit",
    "state = 'pending' AND fence = $4"
);

/// [`RELEASE`], committing as [`SETTLE_ASYNC`] does.
const RELEASE_ASYNC: PerRow = per_row!(
    "DELETE FROM idem_records \
     USING (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit",
    "state = 'pending' AND fence = $4"
);

/// How a settle or release commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// Waits for the WAL flush, as every commit does by default.
    Durable,
    /// Returns before the WAL flush (`synchronous_commit = off`).
    Async,
}

/// `$4`: the holder's fence; `$5`: the new lease in microseconds.
const EXTEND: PerRow = per_row!(
    "UPDATE idem_records SET lease_expires_at = now() + $5 * interval '1 microsecond'",
    "state = 'pending' AND fence = $4"
);

/// Takes over a pending claim whose lease ran out, if it is still the one
/// that was seen (`$4`, its fence): exactly one of several takers wins, and
/// the fence it gets back (from the sequence) outranks every earlier one.
/// `$5`: the new lease in microseconds, or NULL; `$6`: the new fingerprint.
const TAKE_OVER: PerRow = per_row!(
    "UPDATE idem_records \
     SET fence = nextval('idem_records_fence_seq'), created_at = now(), fingerprint = $6, \
         lease_expires_at = now() + $5 * interval '1 microsecond'",
    "state = 'pending' AND fence = $4 AND lease_expires_at < now()";
    "RETURNING fence"
);

impl PerRow {
    fn query<'q>(&self, scope: Scope<'q>, address: &'q str) -> Query<'q, Postgres, PgArguments> {
        let statement = match scope.namespace {
            None => self.without_namespace,
            Some(_) => self.within_namespace,
        };
        sqlx::query(statement)
            .bind(scope.account)
            .bind(address)
            .bind(scope.namespace)
    }
}

/// Claims the slot, or finds who holds it, in one statement ([`CLAIM`]).
pub(crate) async fn claim<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    claim: NewClaim<'_>,
    with_output: bool,
) -> Result<Claimed, sqlx::Error> {
    let row = CLAIM
        .query(scope, address)
        .bind(claim.identity)
        .bind(claim.fingerprint)
        .bind(claim.lease_micros)
        .bind(with_output)
        .fetch_optional(executor)
        .await?;
    let Some(row) = row else {
        return Ok(Claimed::Hidden);
    };
    if row.try_get::<bool, _>(0)? {
        return Ok(Claimed::Won(row.try_get(1)?));
    }
    Ok(Claimed::Held(Existing {
        fence: row.try_get(1)?,
        settled: row.try_get(2)?,
        identity: row.try_get(3)?,
        fingerprint: row.try_get(4)?,
        lease_expired: row.try_get(5)?,
        output: row.try_get(6)?,
    }))
}

/// The row holding a slot, if any is still there.
pub(crate) async fn lookup<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    with_output: bool,
) -> Result<Option<Existing>, sqlx::Error> {
    let row = LOOKUP
        .query(scope, address)
        .bind(with_output)
        .fetch_optional(executor)
        .await?;
    row.map(|row| {
        Ok(Existing {
            settled: row.try_get(0)?,
            identity: row.try_get(1)?,
            fingerprint: row.try_get(2)?,
            fence: row.try_get(3)?,
            lease_expired: row.try_get(4)?,
            output: row.try_get(5)?,
        })
    })
    .transpose()
}

/// Marks a pending claim settled, keeping `output`. `false`: the row is no
/// longer pending under this fence.
pub(crate) async fn settle<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    output: Option<&str>,
    commit: Commit,
) -> Result<bool, sqlx::Error> {
    let statement = match commit {
        Commit::Durable => &SETTLE,
        Commit::Async => &SETTLE_ASYNC,
    };
    let done = statement
        .query(scope, address)
        .bind(fence)
        .bind(output)
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes a pending claim. `false`: the row is no longer pending under
/// this fence.
pub(crate) async fn release<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    commit: Commit,
) -> Result<bool, sqlx::Error> {
    let statement = match commit {
        Commit::Durable => &RELEASE,
        Commit::Async => &RELEASE_ASYNC,
    };
    let done = statement
        .query(scope, address)
        .bind(fence)
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Renews a pending claim's lease. `false`: the claim was lost.
pub(crate) async fn extend<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    lease_micros: i64,
) -> Result<bool, sqlx::Error> {
    let done = EXTEND
        .query(scope, address)
        .bind(fence)
        .bind(lease_micros)
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Takes over an expired claim last seen with fence `seen`. `Some(fence)`:
/// this call now holds it, with a fence higher than any before.
pub(crate) async fn take_over<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
    claim: NewClaim<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    TAKE_OVER
        .query(scope, address)
        .bind(seen)
        .bind(claim.lease_micros)
        .bind(claim.fingerprint)
        .fetch_optional(executor)
        .await?
        .map(|row| row.try_get(0))
        .transpose()
}
