//! idem's schema as SQL: the migrations and their set-up, the schema
//! version, and the catalog queries that verification and the partitioned
//! layout read. What the answers mean (is this index good enough? is this
//! layout the one asked for?) is [`crate::schema`]'s business.
//!
//! The catalog queries look `idem_records` up with `to_regclass`, so they
//! find the table the connection's `search_path` finds, as every other
//! statement does.

use sqlx::FromRow;
use sqlx::{Acquire, AssertSqlSafe, PgConnection, Postgres, Row, Transaction};

/// The whole schema as one idempotent script, for users who run their own
/// migrations (refinery, sqlx-cli, Flyway, ...): every [`MIGRATIONS`] entry
/// in order. It records its versions in `idem_schema_version`, so
/// [`Gate::connect`](crate::Gate::connect) then only verifies it.
pub const SCHEMA_SQL: &str = concat!(
    include_str!("../../sql/v1.sql"),
    "\n",
    include_str!("../../sql/v2.sql"),
    "\n",
    include_str!("../../sql/v3.sql"),
    "\n",
    include_str!("../../sql/v4.sql"),
    "\n",
    include_str!("../../sql/v5.sql"),
    "\n",
    include_str!("../../sql/v6.sql"),
    "\n",
    include_str!("../../sql/v7.sql"),
    "\n",
    include_str!("../../sql/v8.sql"),
    "\n",
    include_str!("../../sql/v9.sql"),
    "\n",
    include_str!("../../sql/v10.sql"),
    "\n",
    include_str!("../../sql/v11.sql"),
    "\n",
    include_str!("../../sql/v12.sql"),
    "\n",
    include_str!("../../sql/v13.sql"),
    "\n",
    include_str!("../../sql/v14.sql")
);

/// The schema version this build writes and expects.
pub const SCHEMA_VERSION: i32 = 14;

/// One step of the schema's history.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its version: applied in order, each once.
    pub version: i32,
    /// Idempotent SQL; it records its own version in `idem_schema_version`.
    pub sql: &'static str,
}

impl Migration {
    const fn new(version: i32, sql: &'static str) -> Migration {
        Migration { version, sql }
    }
}

/// Every schema version, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration::new(1, include_str!("../../sql/v1.sql")),
    Migration::new(2, include_str!("../../sql/v2.sql")),
    Migration::new(3, include_str!("../../sql/v3.sql")),
    Migration::new(4, include_str!("../../sql/v4.sql")),
    Migration::new(5, include_str!("../../sql/v5.sql")),
    Migration::new(6, include_str!("../../sql/v6.sql")),
    Migration::new(7, include_str!("../../sql/v7.sql")),
    Migration::new(8, include_str!("../../sql/v8.sql")),
    Migration::new(9, include_str!("../../sql/v9.sql")),
    Migration::new(10, include_str!("../../sql/v10.sql")),
    Migration::new(11, include_str!("../../sql/v11.sql")),
    Migration::new(12, include_str!("../../sql/v12.sql")),
    Migration::new(13, include_str!("../../sql/v13.sql")),
    Migration::new(14, include_str!("../../sql/v14.sql")),
];

/// The index of open claims (schema version 9, `sql/v9.sql`).
pub const OPEN_CLAIMS_INDEX: &str = "idem_records_open_claims";

/// How `pg_get_indexdef` ends the definition of the index of open claims:
/// an index of that name on `idem_records` is the index when it is valid,
/// not unique and its definition ends so. `sql/v9.sql` holds the same text
/// (a test compares them), and rebuilds whatever fails the same rule.
pub(crate) const OPEN_CLAIMS_DEFINED: &str = "USING btree (account, state, created_at, address) \
     WHERE ((kind = 'claim'::text) AND (state IS DISTINCT FROM 'success'::text))";

/// The index of open claims as `idem migrate` and the console show it.
pub(crate) const OPEN_CLAIMS_DEFINITION: &str = "INDEX idem_records_open_claims \
     (account, state, created_at, address) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'";

/// Whether the index of open claims is on `idem_records`, by the rule of
/// [`OPEN_CLAIMS_DEFINED`]. `$1` its name, `$2` that definition's end.
const OPEN_CLAIMS_INDEX_PRESENT: &str = "SELECT EXISTS ( \
         SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = to_regclass('idem_records') AND c.relname = $1 \
           AND i.indisvalid AND NOT i.indisunique \
           AND right(pg_get_indexdef(i.indexrelid), length($2)) = $2) AS present";

/// Serialises concurrent set-ups across processes ("idemschm" in ASCII).
const SETUP_LOCK: i64 = 0x6964_656d_7363_686d;

/// Takes the set-up lock for the rest of the transaction. `$1`: the lock.
const LOCK_SET_UP: &str = "SELECT pg_advisory_xact_lock($1)";

/// Whether the version table exists where the `search_path` looks.
const VERSION_TABLE_EXISTS: &str =
    "SELECT to_regclass('idem_schema_version') IS NOT NULL AS version_table_exists";

/// The highest version applied. Index: the version table's primary key.
const MAX_VERSION: &str = "SELECT coalesce(max(version), 0) AS version FROM idem_schema_version";

/// Where the `search_path` finds `idem_records`: as it resolves the name
/// (unqualified when the path finds it first), qualified with its schema,
/// and the `search_path` itself. The names are NULL when there is no table.
const LOCATE_TABLE: &str = "SELECT to_regclass('idem_records')::text AS table_name, \
            (SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass('idem_records')) AS qualified_name, \
            current_setting('search_path') AS search_path";

/// The columns of `idem_records`, and whether each is `NOT NULL`.
const COLUMNS: &str = "SELECT attname::text AS name, attnotnull AS not_null FROM pg_attribute \
     WHERE attrelid = to_regclass('idem_records') AND attnum > 0 AND NOT attisdropped";

/// The query of the indexes on a relation, as [`Index`] reads them: their
/// key columns in order, and their predicate as PostgreSQL prints it. The
/// relation is named by a `to_regclass` argument: `'idem_records'` here,
/// `'%s'` (each shard's name) when Citus runs it on every placement.
macro_rules! indexes_of {
    ($relation:literal) => {
        concat!(
            "SELECT ic.relname::text AS name, \
                    i.indisunique AS is_unique, \
                    i.indisvalid AS is_valid, \
                    i.indimmediate AS is_immediate, \
                    i.indexprs IS NOT NULL AS has_expressions, \
                    ARRAY(SELECT a.attname::text \
                          FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                          WHERE k.ord <= i.indnkeyatts \
                          ORDER BY k.ord) AS columns, \
                    pg_get_expr(i.indpred, i.indrelid) AS predicate \
             FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid \
             WHERE i.indrelid = to_regclass(",
            $relation,
            ") \
             ORDER BY ic.relname"
        )
    };
}

pub(super) use indexes_of;

/// The indexes on `idem_records` (`indexes_of!`).
const INDEXES: &str = indexes_of!("'idem_records'");

/// Whether `idem_records` is partitioned, its partition key, and how many
/// partitions are attached to it directly; no row when there is no table.
const LAYOUT: &str = "SELECT c.relkind = 'p' AS partitioned, \
            CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END AS partition_key, \
            (SELECT count(*) FROM pg_inherits h WHERE h.inhparent = c.oid) AS partitions \
     FROM pg_class c WHERE c.oid = to_regclass('idem_records')";

/// The bounds of the partitions of `idem_records` when it is partitioned by
/// hash, as PostgreSQL prints them: `FOR VALUES WITH (modulus 16, remainder
/// 3)`.
const HASH_PARTITION_BOUNDS: &str = "SELECT pg_get_expr(c.relpartbound, c.oid) AS bound \
     FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid \
     JOIN pg_partitioned_table p ON p.partrelid = h.inhparent \
     WHERE h.inhparent = to_regclass('idem_records') AND p.partstrat = 'h'";

/// The script that creates `idem_records` hash-partitioned on `account`
/// into `partitions` partitions, to run before [`MIGRATIONS`] (which then
/// find the table there and add what it lacks). Built from
/// `sql/partitioned.sql`, whose one placeholder is the count.
pub(crate) fn partitioned_prelude(partitions: u16) -> String {
    include_str!("../../sql/partitioned.sql").replace("{partitions}", &partitions.to_string())
}

/// Brings the schema up to [`SCHEMA_VERSION`]: the migrations run in one
/// transaction under the set-up lock; when the schema is already current,
/// no DDL runs and no lock is taken.
pub async fn set_up(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let mut attempt = 1;
    loop {
        if current_version(&mut *conn).await? >= SCHEMA_VERSION {
            return Ok(());
        }
        let migrated = match begin_set_up(&mut *conn).await {
            Ok(tx) => migrate_and_commit(tx).await,
            Err(error) => Err(error),
        };
        match migrated {
            // The set-up rolled back whole: another transaction's locks
            // crossed its DDL's (seen once on a fresh database, with test
            // binaries starting at once). Read where the schema stands,
            // and go again.
            Err(error) if attempt < SET_UP_ATTEMPTS && is_transient(&error) => attempt += 1,
            done => return done,
        }
    }
}

/// How many times a set-up that deadlocked or failed to serialize is tried.
const SET_UP_ATTEMPTS: u32 = 3;

/// A deadlock (`40P01`) or a serialization failure (`40001`): the
/// transaction was rolled back whole, and trying it again is safe.
fn is_transient(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|code| code == "40P01" || code == "40001")
}

/// The set-up transaction, holding the advisory lock every set-up takes
/// first, so that concurrent set-ups run one at a time.
pub(crate) async fn begin_set_up(
    conn: &mut PgConnection,
) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    let mut tx = conn.begin().await?;
    sqlx::query(LOCK_SET_UP)
        .bind(SETUP_LOCK)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Creates `idem_records` partitioned ([`partitioned_prelude`]) inside the
/// set-up transaction.
pub(crate) async fn create_partitioned(
    tx: &mut Transaction<'_, Postgres>,
    partitions: u16,
) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(partitioned_prelude(partitions)))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Applies the migrations the schema lacks, as read under the lock (another
/// process may have applied some while we waited for it), and commits.
pub(crate) async fn migrate_and_commit(
    mut tx: Transaction<'_, Postgres>,
) -> Result<(), sqlx::Error> {
    migrate(&mut tx).await?;
    tx.commit().await
}

/// Applies the migrations the schema lacks, as read under the lock, inside
/// the set-up transaction.
pub(crate) async fn migrate(tx: &mut Transaction<'_, Postgres>) -> Result<(), sqlx::Error> {
    let current = current_version(tx).await?;
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        sqlx::raw_sql(migration.sql).execute(&mut **tx).await?;
        tracing::info!(target: "idem", version = migration.version, "idem schema migrated");
    }
    Ok(())
}

/// The highest schema version applied, 0 when idem was never set up here.
pub(crate) async fn current_version(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    let row = sqlx::query(VERSION_TABLE_EXISTS)
        .fetch_one(&mut *conn)
        .await?;
    if !row.try_get::<bool, _>("version_table_exists")? {
        return Ok(0);
    }
    sqlx::query(MAX_VERSION)
        .fetch_one(&mut *conn)
        .await?
        .try_get("version")
}

/// Where the `search_path` finds `idem_records`.
#[derive(Debug)]
pub(crate) struct TableLocation {
    /// The table as the `search_path` resolves it; `None` when it finds none.
    pub table: Option<String>,
    /// The table qualified with its schema; `None` when there is none.
    pub qualified: Option<String>,
    /// The `search_path` in force.
    pub search_path: String,
}

/// Whether the index of open claims is on `idem_records`
/// ([`OPEN_CLAIMS_INDEX_PRESENT`]).
pub(crate) async fn open_claims_index_present(
    conn: &mut PgConnection,
) -> Result<bool, sqlx::Error> {
    sqlx::query(OPEN_CLAIMS_INDEX_PRESENT)
        .bind(OPEN_CLAIMS_INDEX)
        .bind(OPEN_CLAIMS_DEFINED)
        .fetch_one(&mut *conn)
        .await?
        .try_get("present")
}

/// Where the `search_path` finds `idem_records` ([`LOCATE_TABLE`]).
pub(crate) async fn locate_table(conn: &mut PgConnection) -> Result<TableLocation, sqlx::Error> {
    let row = sqlx::query(LOCATE_TABLE).fetch_one(&mut *conn).await?;
    Ok(TableLocation {
        table: row.try_get("table_name")?,
        qualified: row.try_get("qualified_name")?,
        search_path: row.try_get("search_path")?,
    })
}

/// A column of `idem_records`.
#[derive(Debug)]
pub(crate) struct Column {
    pub name: String,
    pub not_null: bool,
}

/// The columns of `idem_records` ([`COLUMNS`]).
pub(crate) async fn columns(conn: &mut PgConnection) -> Result<Vec<Column>, sqlx::Error> {
    sqlx::query(COLUMNS)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| {
            Ok(Column {
                name: row.try_get("name")?,
                not_null: row.try_get("not_null")?,
            })
        })
        .collect()
}

/// An index on `idem_records` as the catalog describes it ([`INDEXES`]),
/// decoded by column name.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Index {
    pub name: String,
    pub is_unique: bool,
    pub is_valid: bool,
    /// Not deferrable: only such an index can arbitrate `ON CONFLICT`.
    pub is_immediate: bool,
    pub has_expressions: bool,
    /// Its key columns, in order.
    pub columns: Vec<String>,
    /// Its predicate as PostgreSQL prints it: `(namespace IS NULL)`.
    pub predicate: Option<String>,
}

/// The indexes on `idem_records` ([`INDEXES`]), by name.
pub(crate) async fn indexes(conn: &mut PgConnection) -> Result<Vec<Index>, sqlx::Error> {
    sqlx::query(INDEXES)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(Index::from_row)
        .collect()
}

/// How `idem_records` is laid out, as the catalog says.
#[derive(Debug)]
pub(crate) struct TableLayout {
    pub partitioned: bool,
    /// The partition key as PostgreSQL prints it, when partitioned.
    pub partition_key: Option<String>,
    /// How many partitions are attached to it directly.
    pub partitions: i64,
}

/// How `idem_records` is laid out ([`LAYOUT`]); `None` when the
/// `search_path` finds no such table.
pub(crate) async fn layout(conn: &mut PgConnection) -> Result<Option<TableLayout>, sqlx::Error> {
    sqlx::query(LAYOUT)
        .fetch_optional(&mut *conn)
        .await?
        .map(|row| {
            Ok(TableLayout {
                partitioned: row.try_get("partitioned")?,
                partition_key: row.try_get("partition_key")?,
                partitions: row.try_get("partitions")?,
            })
        })
        .transpose()
}

/// The bounds of `idem_records`' hash partitions
/// ([`HASH_PARTITION_BOUNDS`]); none when it is not partitioned by hash.
pub(crate) async fn hash_partition_bounds(
    conn: &mut PgConnection,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query(HASH_PARTITION_BOUNDS)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| row.try_get("bound"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sql/v9.sql` decides whether an index is the index of open claims
    /// by the text `status` reports it present by.
    #[test]
    fn the_migration_and_the_status_know_the_index_of_open_claims_by_one_definition() {
        let v9 = include_str!("../../sql/v9.sql").replace("''", "'");
        let defined = OPEN_CLAIMS_DEFINED.replace("address) WHERE", "address) '\n        'WHERE");
        assert!(
            v9.contains(&defined),
            "sql/v9.sql no longer defines {OPEN_CLAIMS_DEFINED}"
        );
        assert!(v9.contains(OPEN_CLAIMS_INDEX));
    }
}
