//! **Not a stable API.** What idem's own `idem` command, benchmarks and
//! tests reach into: the migrations one by one, the index definitions as
//! text, the batch claim statement, a baseline prune. They change with
//! idem's schema and its statements, in any release, without notice; an
//! application uses [`schema`](crate::schema) (`set_up`, `verify`,
//! `status`, `SCHEMA_SQL`) and [`operations`](crate::operations) instead.

use sqlx::{PgConnection, PgPool};

use crate::store::catalog;

pub use crate::store::catalog::{MIGRATIONS, Migration};
pub use crate::store::prune::prune_in_one_statement;

/// The definitions of the two unique indexes the gate relies on.
pub const INDEX_WITHOUT_NAMESPACE: &str = "UNIQUE (account, kind, address) WHERE namespace IS NULL";
/// See [`INDEX_WITHOUT_NAMESPACE`].
pub const INDEX_WITHIN_NAMESPACE: &str =
    "UNIQUE (account, kind, address, namespace) WHERE namespace IS NOT NULL";

/// The statement a batch guard (`Gate::guard_batch`) claims a batch with, for benchmarks that
/// send it by hand to measure the claim alone: `$1` account, `$2` addresses
/// (no repeats), `$3` namespace, `$4` identities, `$5` fingerprints, `$6`
/// lease in microseconds (or NULL); it returns the won addresses and their
/// fences.
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
