//! The one SQL layer: every statement idem runs against its own tables
//! (`idem_records`, `idem_schema_version`) and the catalog queries about
//! them, and nothing else. The modules above it (the gate, the meter, the
//! schema set-up, the CLI through [`operations`]) decide what to do; this
//! layer says it to PostgreSQL and reads the answer back.
//!
//! | module | its statements |
//! |---|---|
//! | `claims` | the claim path: claim, lookup, take over, settle, release, extend, late successes, keep a failure, hold in doubt |
//! | `batch` | the claim path for many slots at once: claim, look up, and one statement per kind of outcome |
//! | `metering` | usage events: record a batch, total a meter |
//! | [`operations`] | what operators do (the `idem` command): list, show, release, resolve, prune |
//! | `gauges` | the claim gauges of feature `metrics`: pending past an age, in doubt, the oldest of each |
//! | `prune` | pruning settled claims: counted, and deleted in batches (heap page ranges on PostgreSQL 14+, a keyset walk of the partial unique indexes before that and on Citus; re-exported by [`operations`]) |
//! | `catalog` | schema set-up, its version, the verification and partition queries |
//! | `citus` | the Citus catalog: coordinator, distribution, indexes on every shard placement, and distributing the table |
//!
//! # Rules every statement follows
//!
//! - **Named.** Each statement is a `const` (or, where it must vary, a named
//!   function that joins fixed pieces) whose doc comment says what it does,
//!   what its parameters are, and which index serves it.
//! - **Found through a partial unique index.** A row is found by its address
//!   through one of the two partial unique indexes, `(account, kind,
//!   address) WHERE namespace IS NULL` and `(account, kind, address,
//!   namespace) WHERE namespace IS NOT NULL`. PostgreSQL uses a partial
//!   index only when the statement's own `WHERE` implies the index's
//!   predicate, so the namespace test is spelled out: every such statement
//!   comes in two forms ([`SplitOnNamespace`]), one with `namespace IS NULL`
//!   and one with `namespace = $n`, chosen by the caller's namespace. Never
//!   `namespace IS NOT DISTINCT FROM $n` or `($n IS NULL AND namespace IS
//!   NULL) OR namespace = $n`: neither implies either predicate, and each
//!   turns a lookup into a scan of the whole table. The `index_use` test
//!   runs `EXPLAIN` on each of them and fails on a plan that does not use
//!   one of the two indexes.
//! - **Decoded by column name.** Rows are read with `row.try_get("fence")`,
//!   never by position, so a select list can be reordered, or a row shared
//!   by two statements, without shifting one field into another.
//! - **One statement, one round trip.** Nothing here opens a transaction of
//!   its own except the schema set-up: a claim commits the moment it is won.
//! - **The bottom layer.** Nothing here imports the gate, the claim, the
//!   expansion, the meter, the schema module or the test helpers; they
//!   import this.

mod batch;
pub(crate) mod catalog;
pub(crate) mod citus;
mod claims;
#[cfg(feature = "metrics")]
pub(crate) mod gauges;
pub(crate) mod metering;
pub mod operations;
mod prune;
#[cfg(feature = "cache")]
pub(crate) mod store_id;

#[cfg(test)]
mod batch_plans;
#[cfg(test)]
mod index_use;
#[cfg(test)]
mod scratch;
#[cfg(test)]
mod transitions;

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

pub(crate) use batch::{BatchOutcome, NewBatchItem, claim_batch, lookup_batch, record_batch};
// The batch claim's text, for the load generator (`idem::testing`).
#[cfg(feature = "testing")]
pub(crate) use batch::CLAIM_BATCH;
pub(crate) use claims::{
    BODY_IN_DOUBT, Claimed, Existing, KEPT_FAILURE, LATE_SUCCESS, LateSuccess, NewClaim, claim,
    expire_in_doubt, extend, hold_in_doubt, keep, lookup, release, settle, settle_over,
    settle_own_hold, settle_vacant, take_over,
};

/// Where a claim (or a usage event) lives, besides its address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub account: &'a str,
    pub namespace: Option<&'a str>,
}

/// What the table is on, as far as the shape of a statement matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// One PostgreSQL, partitioned or not (or a table Citus does not
    /// distribute).
    PostgreSQL,
    /// A table Citus distributes: a statement whose CTE modifies the table
    /// is not routed to the one worker holding the account's shard, but
    /// planned in steps whose intermediate results go to every worker, so
    /// the claim takes the routed two-statement form there.
    Citus,
}

/// How a settle or release commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// Waits for the WAL flush, as every commit does by default.
    Durable,
    /// Returns before the WAL flush (`synchronous_commit = off`).
    Async,
}

impl Commit {
    /// Of a statement's two forms, the one that commits this way.
    fn pick<'s>(
        self,
        durable: &'s SplitOnNamespace,
        asynchronous: &'s SplitOnNamespace,
    ) -> &'s SplitOnNamespace {
        match self {
            Commit::Durable => durable,
            Commit::Async => asynchronous,
        }
    }
}

/// A statement in the two forms that the two partial unique indexes call
/// for: one for rows without a namespace (`namespace IS NULL`), one for rows
/// in a namespace (`namespace = $n`). Each form's `WHERE` implies its
/// index's predicate, so each can be served by that index.
struct SplitOnNamespace {
    without_namespace: &'static str,
    within_namespace: &'static str,
}

impl SplitOnNamespace {
    /// The form for rows in `namespace` (`None`: without one).
    fn for_namespace(&self, namespace: Option<&str>) -> &'static str {
        match namespace {
            None => self.without_namespace,
            Some(_) => self.within_namespace,
        }
    }

    /// The form for `scope`, with the parameters every statement over one
    /// row shares bound: `$1` the account, `$2` the address, `$3` the
    /// namespace (NULL, and tested as NULL, in the form without one, so that
    /// later parameters are numbered alike in both forms).
    fn for_row<'q>(&self, scope: Scope<'q>, address: &'q str) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(self.for_namespace(scope.namespace))
            .bind(scope.account)
            .bind(address)
            .bind(scope.namespace)
    }
}

/// A statement over one row found by its address, in both forms: `$1`
/// account, `$2` address, `$3` namespace ([`SplitOnNamespace::for_row`]),
/// then `AND $and` and a `$tail` (a `RETURNING` list) if given.
macro_rules! per_row {
    ($statement:expr $(, $and:literal)? $(; $tail:expr)?) => {
        $crate::store::SplitOnNamespace {
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
use per_row;
