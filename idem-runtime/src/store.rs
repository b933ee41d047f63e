//! Claim rows in `idem_records`: the statements the gate runs, and nothing else.
//!
//! Every statement runs on its own pooled connection and commits on its own
//! (autocommit): a claim is visible to every other process the moment it is
//! won, so a losing duplicate is refused at once instead of waiting on the
//! winner's transaction.

use sqlx::PgPool;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

/// Where a claim lives, besides its address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub account: &'a str,
    pub namespace: Option<&'a str>,
}

/// A claim row found on conflict.
#[derive(Debug)]
pub(crate) struct Existing {
    pub settled: bool,
    pub identity: Vec<u8>,
}

/// The happy path, and the whole gate: one statement. A conflict with either
/// partial unique index means somebody else holds the slot; no row comes
/// back and nothing is written.
const INSERT_PENDING: &str = "INSERT INTO idem_records (account, kind, address, namespace, state, identity) \
     VALUES ($1, 'claim', $2, $3, 'pending', $4) \
     ON CONFLICT DO NOTHING \
     RETURNING true";

/// A statement over one claim row, in its two forms: the row is found through
/// the partial index whose predicate its namespace satisfies, so the
/// namespace test is spelled out (`IS NULL` or `= $3`) rather than folded
/// into `IS NOT DISTINCT FROM`, which no index can serve.
struct PerRow {
    without_namespace: &'static str,
    within_namespace: &'static str,
}

macro_rules! per_row {
    ($statement:literal $(, $and:literal)?) => {
        PerRow {
            without_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL"
                $(, " AND ", $and)?
            ),
            within_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace = $3"
                $(, " AND ", $and)?
            ),
        }
    };
}

const LOOKUP: PerRow = per_row!("SELECT state = 'success', identity FROM idem_records");

const SETTLE: PerRow = per_row!(
    "UPDATE idem_records SET state = 'success', settled_at = now()",
    "state = 'pending'"
);

const RELEASE: PerRow = per_row!("DELETE FROM idem_records", "state = 'pending'");

impl PerRow {
    fn query<'q>(&self, scope: Scope<'q>, address: &'q str) -> Query<'q, Postgres, PgArguments> {
        match scope.namespace {
            None => sqlx::query(self.without_namespace)
                .bind(scope.account)
                .bind(address),
            Some(namespace) => sqlx::query(self.within_namespace)
                .bind(scope.account)
                .bind(address)
                .bind(namespace),
        }
    }
}

/// Inserts a pending claim. `true`: this call won the slot.
pub(crate) async fn insert_pending(
    pool: &PgPool,
    scope: Scope<'_>,
    address: &str,
    identity: &[u8],
) -> Result<bool, sqlx::Error> {
    let won = sqlx::query(INSERT_PENDING)
        .bind(scope.account)
        .bind(address)
        .bind(scope.namespace)
        .bind(identity)
        .fetch_optional(pool)
        .await?;
    Ok(won.is_some())
}

/// The row holding a slot, if any is still there.
pub(crate) async fn lookup(
    pool: &PgPool,
    scope: Scope<'_>,
    address: &str,
) -> Result<Option<Existing>, sqlx::Error> {
    use sqlx::Row;
    let row = LOOKUP.query(scope, address).fetch_optional(pool).await?;
    row.map(|row| {
        Ok(Existing {
            settled: row.try_get(0)?,
            identity: row.try_get(1)?,
        })
    })
    .transpose()
}

/// Marks a pending claim settled. `false`: it was no longer pending.
pub(crate) async fn settle(
    pool: &PgPool,
    scope: Scope<'_>,
    address: &str,
) -> Result<bool, sqlx::Error> {
    let done = SETTLE.query(scope, address).execute(pool).await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes a pending claim. `false`: it was no longer pending.
pub(crate) async fn release(
    pool: &PgPool,
    scope: Scope<'_>,
    address: &str,
) -> Result<bool, sqlx::Error> {
    let done = RELEASE.query(scope, address).execute(pool).await?;
    Ok(done.rows_affected() == 1)
}
