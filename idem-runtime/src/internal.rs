//! **Not a stable API.** What idem's own `idem` command, benchmarks and
//! tests reach into: the migrations one by one, the index definitions as
//! text, the batch claim statement, a baseline prune, the gate's decisions
//! as the test helpers (`idem-testing`) observe them. They change with
//! idem's schema and its statements, in any release, without notice; an
//! application uses [`schema`](crate::schema) (`set_up`, `verify`,
//! `status`, `SCHEMA_SQL`) and [`operations`](crate::operations) instead.

use sqlx::{PgConnection, PgPool};

use crate::store::catalog;

pub use crate::store::catalog::{MIGRATIONS, Migration};
pub use crate::store::prune::prune_in_one_statement;

/// What the gate decided, told to a race harness in the same task: for
/// `idem::testing` (the `idem-testing` crate), its `race`, `observe` and
/// `GateEvent`.
pub mod observe {
    pub use crate::observe::{GateEvent, collecting};
}

/// The store: its named statements (their SQL text in every form), and the
/// calls that send them, for idem's own tests that `EXPLAIN` each statement
/// and drive a claim through its transitions against a real PostgreSQL
/// (`tests/testsuite/store/`). Not a stable API: the statements change with
/// the schema, in any release.
pub mod store {
    #[cfg(feature = "metrics")]
    pub use crate::store::gauges;
    pub use crate::store::{
        Commit, Engine, PerCommit, Scope, SplitOnNamespace, batch, browse, catalog, claims,
        metering, ordered, prune, steps,
    };

    /// The operators' API ([`crate::operations`]) and the statements behind
    /// it, which stay out of that public module.
    pub mod operations {
        pub use crate::operations::*;
        use crate::store::SplitOnNamespace;
        use crate::store::operations as statements;

        /// A claim's steps, by its address.
        pub const STEPS_OF_CLAIM: SplitOnNamespace = statements::STEPS_OF_CLAIM;
        /// An operator's release of a pending claim.
        pub const RELEASE_PENDING: SplitOnNamespace = statements::RELEASE_PENDING;
        /// The lock a resolution takes on its claim.
        pub const LOCK_FOR_RESOLVE: SplitOnNamespace = statements::LOCK_FOR_RESOLVE;
        /// A claim resolved as succeeded.
        pub const RESOLVE_SUCCEEDED: SplitOnNamespace = statements::RESOLVE_SUCCEEDED;
        /// A claim resolved as failed.
        pub const RESOLVE_FAILED: SplitOnNamespace = statements::RESOLVE_FAILED;
        /// A claim resolved by releasing it.
        pub const RESOLVE_RELEASE: SplitOnNamespace = statements::RESOLVE_RELEASE;

        /// The listing of a scope's claims, in `state` if given.
        pub fn list_statement(scope: &ScopeFilter<'_>, state: Option<ClaimState>) -> String {
            statements::list_statement(scope, state)
        }

        /// The count of a scope's claims, in `state` if given.
        pub fn count_statement(scope: &ScopeFilter<'_>, state: Option<ClaimState>) -> String {
            statements::count_statement(scope, state)
        }

        /// The reconciler's listing of a scope's claims in doubt.
        pub fn reconcile_statement(scope: &ScopeFilter<'_>) -> String {
            statements::reconcile_statement(scope)
        }

        /// The lookup of one claim of a scope.
        pub fn find_statement(scope: &ScopeFilter<'_>) -> String {
            statements::find_statement(scope)
        }
    }
}

/// The definitions of the two unique indexes the gate relies on.
pub const INDEX_WITHOUT_NAMESPACE: &str = "UNIQUE (account, kind, address) WHERE namespace IS NULL";
/// See [`INDEX_WITHOUT_NAMESPACE`].
pub const INDEX_WITHIN_NAMESPACE: &str =
    "UNIQUE (account, kind, address, namespace) WHERE namespace IS NOT NULL";

/// The statement a batch guard (`Gate::guard_batch`) claims a batch with, for benchmarks that
/// send it by hand to measure the claim alone: `$1` account, `$2` addresses
/// (no repeats), `$3` namespace, `$4` identities, `$5` fingerprints, `$6`
/// lease in microseconds (or NULL), `$7` and `$8` the value's and the
/// slot's windows in microseconds (or NULL), `$9` whether the lease, run
/// out, holds the claim in doubt (`true`, or NULL); it returns the won
/// addresses and their fences.
pub const BATCH_CLAIM_SQL: &str = crate::store::CLAIM_BATCH;

/// The highest schema version applied, 0 when idem was never set up here.
pub async fn current_version(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    catalog::current_version(conn).await
}

/// Where the connection's `search_path` finds `idem_records`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Location {
    /// The table qualified with its schema (`app.idem_records`), however the
    /// `search_path` finds it; `None` when it finds none.
    pub table: Option<String>,
    /// The `search_path` in force, for saying where it looked.
    pub search_path: String,
}

/// Where the connection's `search_path` finds `idem_records`, if anywhere.
pub async fn locate(pool: &PgPool) -> Result<Location, sqlx::Error> {
    let found = catalog::locate_table(&mut *pool.acquire().await?).await?;
    Ok(Location {
        table: found.qualified,
        search_path: found.search_path,
    })
}
