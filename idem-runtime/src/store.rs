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

/// The happy path, and the whole gate: one statement. A conflict with either
/// partial unique index means somebody else holds the slot; no row comes
/// back and nothing is written.
const INSERT_PENDING: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, fingerprint, lease_expires_at) \
     VALUES ($1, 'claim', $2, $3, 'pending', $4, $5, now() + $6 * interval '1 microsecond') \
     ON CONFLICT DO NOTHING \
     RETURNING fence";

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

/// Inserts a pending claim. `Some(fence)`: this call won the slot.
pub(crate) async fn insert_pending<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    claim: NewClaim<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query(INSERT_PENDING)
        .bind(scope.account)
        .bind(address)
        .bind(scope.namespace)
        .bind(claim.identity)
        .bind(claim.fingerprint)
        .bind(claim.lease_micros)
        .fetch_optional(executor)
        .await?
        .map(|row| row.try_get(0))
        .transpose()
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
) -> Result<bool, sqlx::Error> {
    let done = SETTLE
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
) -> Result<bool, sqlx::Error> {
    let done = RELEASE
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
