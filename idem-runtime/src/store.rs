//! Claim rows in `idem_records`: the statements the gate runs, and nothing else.
//!
//! By default every statement runs on its own pooled connection and commits
//! on its own (autocommit): a claim is visible to every other process the
//! moment it is won, so a losing duplicate is refused at once instead of
//! waiting on the winner's transaction. In-transaction mode passes the
//! caller's connection instead, and the caller's commit decides.

use sqlx::postgres::{PgArguments, PgRow};
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
    /// The fence of the claim this row began as: kept by takeovers, new
    /// when the slot was released and claimed anew. A holder whose lineage
    /// still matches was taken over; one whose lineage is gone was released.
    pub lineage: i64,
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
                 SELECT ",
            existing_columns!(),
            ", CASE WHEN $7 THEN coalesce(output_json, output::text) END AS output \
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
             SELECT true AS won, fence, NULL::bigint AS lineage, NULL::boolean AS settled, \
                    NULL::bytea AS identity, NULL::bytea AS fingerprint, \
                    NULL::boolean AS lease_expired, NULL::text AS output \
             FROM claimed \
             UNION ALL \
             SELECT false, fence, lineage, settled, identity, fingerprint, lease_expired, output \
             FROM existing"
        )
    };
}

/// The columns of an [`Existing`] row, by the names [`Existing::from_row`]
/// reads; `$7` (claim) or `$4` (lookup) says whether to return the stored
/// output. A value settled before schema version 4 is still in `output`.
macro_rules! existing_columns {
    () => {
        "state = 'success' AS settled, identity, fingerprint, fence, \
         coalesce(first_fence, fence) AS lineage, \
         coalesce(lease_expires_at < now(), false) AS lease_expired"
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
    ($statement:expr $(, $and:literal)? $(; $tail:literal)?) => {
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
const LOOKUP: PerRow = per_row!(concat!(
    "SELECT ",
    existing_columns!(),
    ", CASE WHEN $4 THEN coalesce(output_json, output::text) END AS output \
         FROM idem_records"
));

/// `$4`: the holder's fence; `$5`: the output to keep, or NULL. The output
/// is kept as the text serde_json wrote, not as `jsonb`, which refuses some
/// of what JSON can say (`\u0000`): a settle must never fail because of the
/// value it carries.
const SETTLE: PerRow = per_row!(
    "UPDATE idem_records \
     SET state = 'success', settled_at = now(), lease_expires_at = NULL, output_json = $5",
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
     SET state = 'success', settled_at = now(), lease_expires_at = NULL, output_json = $5 \
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

/// `$4`: the holder's fence; `$5`: the new lease in microseconds. Only a
/// claim that has a lease is extended: one made without holds until it is
/// resolved, and must never become expirable.
const EXTEND: PerRow = per_row!(
    "UPDATE idem_records SET lease_expires_at = now() + $5 * interval '1 microsecond'",
    "state = 'pending' AND fence = $4 AND lease_expires_at IS NOT NULL"
);

/// Takes over a pending claim whose lease ran out, if it is still the one
/// that was seen (`$4`, its fence): exactly one of several takers wins, and
/// the fence it gets back (from the sequence) outranks every earlier one.
/// The row keeps its lineage (the fence it began with). `$5`: the new lease
/// in microseconds, or NULL; `$6`: the new fingerprint.
const TAKE_OVER: PerRow = per_row!(
    "UPDATE idem_records \
     SET fence = nextval('idem_records_fence_seq'), created_at = now(), fingerprint = $6, \
         first_fence = coalesce(first_fence, fence), \
         lease_expires_at = now() + $5 * interval '1 microsecond'",
    "state = 'pending' AND fence = $4 AND lease_expires_at < now()";
    "RETURNING fence, first_fence AS lineage"
);

/// Records the success of a holder whose claim is no longer its own (taken
/// over, or released and claimed anew) over the pending row that replaced
/// it, if that is still the one that was seen (`$4`, its fence). A success
/// that happened is a fact the slot must keep: without this, the new
/// holder's release would free the slot and a retry would run the action
/// once more. The row keeps its fence, so the new holder's own settle or
/// release finds it settled. `$5`: the output; `$6`: the fingerprint of the
/// payload the output belongs to.
const SETTLE_OVER: PerRow = per_row!(
    "UPDATE idem_records \
     SET state = 'success', settled_at = now(), lease_expires_at = NULL, output_json = $5, \
         fingerprint = $6",
    "state = 'pending' AND fence = $4"
);

/// Records the success of a holder whose claim was released (by the holder
/// that took it over, or by an operator) while nobody holds the slot: a
/// settled row, as if claimed and settled at once. `$4`: the identity;
/// `$5`: the fingerprint; `$6`: the output.
const SETTLE_VACANT: PerRow = PerRow {
    without_namespace: SETTLE_VACANT_STATEMENT,
    within_namespace: SETTLE_VACANT_STATEMENT,
};

const SETTLE_VACANT_STATEMENT: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, fingerprint, settled_at, output_json) \
     VALUES ($1, 'claim', $2, $3, 'success', $4, $5, now(), $6) \
     ON CONFLICT DO NOTHING";

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

impl Existing {
    /// Reads the columns named by `existing_columns!` and `output`.
    fn from_row(row: &PgRow) -> Result<Existing, sqlx::Error> {
        Ok(Existing {
            settled: row.try_get("settled")?,
            identity: row.try_get("identity")?,
            fingerprint: row.try_get("fingerprint")?,
            fence: row.try_get("fence")?,
            lineage: row.try_get("lineage")?,
            lease_expired: row.try_get("lease_expired")?,
            output: row.try_get("output")?,
        })
    }
}

/// Runs `query` (a statement matched on one row's address and fence, or an
/// insert into one slot); `true` when it changed exactly that row.
async fn changed_one<'e>(
    query: Query<'_, Postgres, PgArguments>,
    executor: impl PgExecutor<'e>,
) -> Result<bool, sqlx::Error> {
    Ok(query.execute(executor).await?.rows_affected() == 1)
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
    if row.try_get::<bool, _>("won")? {
        return Ok(Claimed::Won(row.try_get("fence")?));
    }
    Existing::from_row(&row).map(Claimed::Held)
}

/// The row holding a slot, if any is still there.
pub(crate) async fn lookup<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    with_output: bool,
) -> Result<Option<Existing>, sqlx::Error> {
    LOOKUP
        .query(scope, address)
        .bind(with_output)
        .fetch_optional(executor)
        .await?
        .as_ref()
        .map(Existing::from_row)
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
    changed_one(
        statement.query(scope, address).bind(fence).bind(output),
        executor,
    )
    .await
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
    changed_one(statement.query(scope, address).bind(fence), executor).await
}

/// Renews a pending claim's lease. `false`: the claim was lost.
pub(crate) async fn extend<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    lease_micros: i64,
) -> Result<bool, sqlx::Error> {
    changed_one(
        EXTEND.query(scope, address).bind(fence).bind(lease_micros),
        executor,
    )
    .await
}

/// A claim won by taking an expired one over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TakenOver {
    pub fence: i64,
    pub lineage: i64,
}

/// Takes over an expired claim last seen with fence `seen`. `Some`: this
/// call now holds it, with a fence higher than any before.
pub(crate) async fn take_over<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
    claim: NewClaim<'_>,
) -> Result<Option<TakenOver>, sqlx::Error> {
    TAKE_OVER
        .query(scope, address)
        .bind(seen)
        .bind(claim.lease_micros)
        .bind(claim.fingerprint)
        .fetch_optional(executor)
        .await?
        .map(|row| {
            Ok(TakenOver {
                fence: row.try_get("fence")?,
                lineage: row.try_get("lineage")?,
            })
        })
        .transpose()
}

/// What a late success needs to be recorded in a slot that is no longer its
/// holder's: the payload it belongs to, and the value to keep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LateSuccess<'a> {
    pub identity: &'a [u8],
    pub fingerprint: Option<&'a [u8]>,
    pub output: Option<&'a str>,
}

/// Settles the pending row last seen with fence `seen` with a late success
/// ([`SETTLE_OVER`]). `false`: the row changed since it was seen.
pub(crate) async fn settle_over<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
    late: LateSuccess<'_>,
) -> Result<bool, sqlx::Error> {
    changed_one(
        SETTLE_OVER
            .query(scope, address)
            .bind(seen)
            .bind(late.output)
            .bind(late.fingerprint),
        executor,
    )
    .await
}

/// Records a late success in a vacant slot ([`SETTLE_VACANT`]). `false`:
/// someone claimed the slot meanwhile.
pub(crate) async fn settle_vacant<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    late: LateSuccess<'_>,
) -> Result<bool, sqlx::Error> {
    changed_one(
        SETTLE_VACANT
            .query(scope, address)
            .bind(late.identity)
            .bind(late.fingerprint)
            .bind(late.output),
        executor,
    )
    .await
}

/// Every statement that finds a claim by its address must be served by one
/// of the two partial unique indexes, in both of its forms: a namespace
/// test folded into `IS NOT DISTINCT FROM`, or a predicate the index's does
/// not imply, would turn each call into a scan of the whole table.
#[cfg(all(test, feature = "testing"))]
mod index_use {
    use sqlx::{AssertSqlSafe, Row};

    use super::*;

    /// A parameter after the scope (`$1`-`$3`), typed as the statement binds it.
    enum Param {
        Text(&'static str),
        Bytes,
        Int(i64),
        Bool(bool),
    }

    fn statements() -> [(&'static str, &'static PerRow, Vec<Param>); 9] {
        use Param::{Bool, Bytes, Int, Text};
        [
            ("claim", &CLAIM, vec![Bytes, Bytes, Int(1_000), Bool(true)]),
            ("lookup", &LOOKUP, vec![Bool(true)]),
            ("settle", &SETTLE, vec![Int(1), Text("{}")]),
            ("settle_async", &SETTLE_ASYNC, vec![Int(1), Text("{}")]),
            ("release", &RELEASE, vec![Int(1)]),
            ("release_async", &RELEASE_ASYNC, vec![Int(1)]),
            ("extend", &EXTEND, vec![Int(1), Int(1_000)]),
            ("take_over", &TAKE_OVER, vec![Int(1), Int(1_000), Bytes]),
            ("settle_over", &SETTLE_OVER, vec![Int(1), Text("{}"), Bytes]),
        ]
    }

    /// The indexes a plan in text form scans, and whether it scans a table.
    fn scans(plan: &[String]) -> (Vec<String>, bool) {
        let mut indexes = Vec::new();
        let mut sequential = false;
        for line in plan {
            sequential |= line.contains("Seq Scan");
            for marker in [
                "Index Scan using ",
                "Index Only Scan using ",
                "Bitmap Index Scan on ",
            ] {
                if let Some((_, rest)) = line.split_once(marker) {
                    indexes.extend(rest.split_whitespace().next().map(str::to_owned));
                }
            }
        }
        (indexes, sequential)
    }

    #[tokio::test]
    async fn every_statement_that_finds_a_claim_by_address_uses_a_partial_unique_index() {
        let pool = crate::testing::pool_with(1).await;
        crate::schema::set_up(&pool)
            .await
            .expect("set the schema up");
        let mut conn = pool.acquire().await.expect("a connection");
        // Not to force the index: a scan is still chosen when no index can
        // serve the statement. It keeps a small table from being scanned
        // merely because that is cheaper.
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .expect("set enable_seqscan");
        for (name, statement, params) in statements() {
            for namespace in [None, Some("live")] {
                let scope = Scope {
                    account: "acme",
                    namespace,
                };
                let text = match namespace {
                    None => statement.without_namespace,
                    Some(_) => statement.within_namespace,
                };
                let mut query = sqlx::query(AssertSqlSafe(format!("EXPLAIN {text}")))
                    .bind(scope.account)
                    .bind("claim_0123456789abcdef01234567")
                    .bind(scope.namespace);
                for param in &params {
                    query = match param {
                        Param::Text(text) => query.bind(*text),
                        Param::Bytes => query.bind(&b"\x00"[..]),
                        Param::Int(n) => query.bind(*n),
                        Param::Bool(b) => query.bind(*b),
                    };
                }
                let plan: Vec<String> = query
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap_or_else(|e| panic!("EXPLAIN {name}: {e}"))
                    .iter()
                    .map(|row| row.get(0))
                    .collect();
                let (indexes, sequential) = scans(&plan);
                let plan = plan.join("\n");
                assert!(
                    !sequential && !indexes.is_empty(),
                    "{name} ({namespace:?}) scans the table:\n{plan}"
                );
                for index in indexes {
                    let definition: String =
                        sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = $1")
                            .bind(&index)
                            .fetch_one(&mut *conn)
                            .await
                            .unwrap_or_else(|e| panic!("the definition of {index}: {e}"));
                    let partial_unique = definition.starts_with("CREATE UNIQUE INDEX")
                        && (definition.ends_with("WHERE (namespace IS NULL)")
                            || definition.ends_with("WHERE (namespace IS NOT NULL)"));
                    assert!(
                        partial_unique,
                        "{name} ({namespace:?}) uses {definition}:\n{plan}"
                    );
                }
            }
        }
    }
}
