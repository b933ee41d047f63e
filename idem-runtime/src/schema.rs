//! idem's schema: the SQL, its idempotent set-up, and the start-up check.
//!
//! The schema is idem's own. Its version lives in `idem_schema_version`, never
//! in sqlx's `_sqlx_migrations`, which belongs to your application.

use sqlx::{Acquire, PgConnection, PgPool, Postgres, Transaction};

use crate::error::{SchemaProblem, SchemaProblems};

mod partitioned;

pub use partitioned::{Layout, MAX_PARTITIONS, layout, partitioned_sql, set_up_partitioned};

/// The whole schema as one idempotent script, for users who run their own
/// migrations (refinery, sqlx-cli, Flyway, ...): every [`MIGRATIONS`] entry
/// in order. It records its versions in `idem_schema_version`, so
/// [`Gate::connect`](crate::Gate::connect) then only verifies it.
pub const SCHEMA_SQL: &str = concat!(
    include_str!("../sql/v1.sql"),
    "\n",
    include_str!("../sql/v2.sql"),
    "\n",
    include_str!("../sql/v3.sql"),
    "\n",
    include_str!("../sql/v4.sql")
);

/// The schema version this build writes and expects.
pub const SCHEMA_VERSION: i32 = 4;

/// One step of the schema's history.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its version: applied in order, each once.
    pub version: i32,
    /// Idempotent SQL; it records its own version in `idem_schema_version`.
    pub sql: &'static str,
}

/// Every schema version, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("../sql/v1.sql"),
    },
    Migration {
        version: 2,
        sql: include_str!("../sql/v2.sql"),
    },
    Migration {
        version: 3,
        sql: include_str!("../sql/v3.sql"),
    },
    Migration {
        version: 4,
        sql: include_str!("../sql/v4.sql"),
    },
];

/// The definitions of the two unique indexes the gate relies on.
pub const INDEX_WITHOUT_NAMESPACE: &str = "UNIQUE (account, kind, address) WHERE namespace IS NULL";
/// See [`INDEX_WITHOUT_NAMESPACE`].
pub const INDEX_WITHIN_NAMESPACE: &str =
    "UNIQUE (account, kind, address, namespace) WHERE namespace IS NOT NULL";

/// Serialises concurrent set-ups across processes ("idemschm" in ASCII).
const SETUP_LOCK: i64 = 0x6964_656d_7363_686d;

/// Brings the schema up to [`SCHEMA_VERSION`].
///
/// Idempotent, and safe when many processes start at once: the migrations run
/// in one transaction under a transaction-scoped advisory lock. When the
/// schema is already current it runs no DDL and takes no lock, so a run-time
/// role without DDL rights can call it.
pub async fn set_up(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    if current_version(&mut conn).await? >= SCHEMA_VERSION {
        return Ok(());
    }
    let tx = begin_set_up(&mut conn).await?;
    migrate_and_commit(tx).await
}

/// The set-up transaction, holding the advisory lock every set-up takes
/// first, so that concurrent set-ups run one at a time.
async fn begin_set_up(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SETUP_LOCK)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Applies the migrations the schema lacks, as read under the lock (another
/// process may have applied some while we waited for it), and commits.
async fn migrate_and_commit(mut tx: Transaction<'_, Postgres>) -> Result<(), sqlx::Error> {
    let current = current_version(&mut tx).await?;
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        sqlx::raw_sql(migration.sql).execute(&mut *tx).await?;
        tracing::info!(target: "idem", version = migration.version, "idem schema migrated");
    }
    tx.commit().await
}

/// The highest schema version applied, 0 when idem was never set up here.
pub async fn current_version(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('idem_schema_version') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(0);
    }
    sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM idem_schema_version")
        .fetch_one(&mut *conn)
        .await
}

/// A column the gate reads or writes, and whether it must be `NOT NULL`.
const REQUIRED_COLUMNS: &[(&str, bool)] = &[
    ("account", true),
    ("kind", true),
    ("address", true),
    ("namespace", false),
    ("state", true),
    ("identity", true),
    ("meter", false),
    ("quantity", false),
    ("occurred_at", false),
    ("output", false),
    ("fingerprint", false),
    ("fence", true),
    ("output_json", false),
    ("first_fence", false),
    ("lease_expires_at", false),
];

/// An index the gate relies on: its key columns (as a set) and predicate.
struct RequiredIndex {
    columns: &'static [&'static str],
    predicate: &'static str,
    definition: &'static str,
}

const REQUIRED_INDEXES: [RequiredIndex; 2] = [
    RequiredIndex {
        columns: &["account", "kind", "address"],
        predicate: "namespace IS NULL",
        definition: INDEX_WITHOUT_NAMESPACE,
    },
    RequiredIndex {
        columns: &["account", "kind", "address", "namespace"],
        predicate: "namespace IS NOT NULL",
        definition: INDEX_WITHIN_NAMESPACE,
    },
];

/// An index on `idem_records` as the catalog describes it.
#[derive(Debug)]
struct IndexRow {
    name: String,
    is_unique: bool,
    is_valid: bool,
    is_immediate: bool,
    has_expressions: bool,
    columns: Vec<String>,
    predicate: Option<String>,
}

impl IndexRow {
    fn covers(&self, required: &RequiredIndex) -> bool {
        self.columns.len() == required.columns.len()
            && required
                .columns
                .iter()
                .all(|c| self.columns.iter().any(|own| own == c))
    }

    fn enforces(&self, required: &RequiredIndex) -> bool {
        self.is_unique
            && self.is_valid
            && self.is_immediate
            && !self.has_expressions
            && self.covers(required)
            && self.predicate.as_deref().map(normalize_predicate)
                == Some(normalize_predicate(required.predicate))
    }

    /// Why this index, which looks like `required`, does not do its job.
    fn shortfall(&self, required: &RequiredIndex) -> String {
        let mut why = Vec::new();
        if !self.is_unique {
            why.push("it is not unique".to_owned());
        }
        if !self.is_valid {
            why.push(
                "it is invalid (a failed CREATE INDEX CONCURRENTLY, or on a partitioned table, \
                 a partition without it)"
                    .to_owned(),
            );
        }
        if !self.is_immediate {
            why.push("it is deferrable, so it cannot arbitrate ON CONFLICT".to_owned());
        }
        match &self.predicate {
            None if self.columns.iter().any(|c| c == "namespace") => why.push(
                "it has no predicate, and a unique index over the nullable namespace column \
                 enforces nothing for rows whose namespace is NULL"
                    .to_owned(),
            ),
            None => why.push(format!(
                "it lacks the predicate WHERE {}",
                required.predicate
            )),
            Some(p) if normalize_predicate(p) != normalize_predicate(required.predicate) => {
                why.push(format!("its predicate is {p}"));
            }
            Some(_) => {}
        }
        format!(
            "{} on ({}), but {}",
            self.name,
            self.columns.join(", "),
            why.join("; ")
        )
    }
}

/// `(namespace IS NULL)` and `namespace is null` compare equal.
fn normalize_predicate(predicate: &str) -> String {
    predicate
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Checks that `idem_records` exists, has the columns the gate uses, and
/// both partial unique indexes with the right predicates.
///
/// Returns `Ok(None)` when the schema can enforce one claim per identity.
pub async fn verify(pool: &PgPool) -> Result<Option<SchemaProblems>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let (table, search_path): (Option<String>, String) =
        sqlx::query_as("SELECT to_regclass('idem_records')::text, current_setting('search_path')")
            .fetch_one(&mut *conn)
            .await?;
    let Some(table) = table else {
        return Ok(Some(SchemaProblems {
            table: "idem_records".to_owned(),
            problems: vec![SchemaProblem::MissingTable { search_path }],
        }));
    };

    let mut problems = Vec::new();
    let columns: Vec<(String, bool)> = sqlx::query_as(
        "SELECT attname::text, attnotnull FROM pg_attribute \
         WHERE attrelid = to_regclass('idem_records') AND attnum > 0 AND NOT attisdropped",
    )
    .fetch_all(&mut *conn)
    .await?;
    for &(column, must_be_not_null) in REQUIRED_COLUMNS {
        match columns.iter().find(|(name, _)| name == column) {
            None => problems.push(SchemaProblem::Column {
                column,
                wrong: "is missing",
            }),
            Some((_, not_null)) if must_be_not_null && !not_null => {
                problems.push(SchemaProblem::Column {
                    column,
                    wrong: "is nullable; it must be NOT NULL",
                })
            }
            Some(_) => {}
        }
    }

    type Row = (String, bool, bool, bool, bool, Vec<String>, Option<String>);
    let rows: Vec<Row> = sqlx::query_as(
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
         WHERE i.indrelid = to_regclass('idem_records') \
         ORDER BY ic.relname",
    )
    .fetch_all(&mut *conn)
    .await?;
    let indexes: Vec<IndexRow> = rows
        .into_iter()
        .map(
            |(name, is_unique, is_valid, is_immediate, has_expressions, columns, predicate)| {
                IndexRow {
                    name,
                    is_unique,
                    is_valid,
                    is_immediate,
                    has_expressions,
                    columns,
                    predicate,
                }
            },
        )
        .collect();
    for required in &REQUIRED_INDEXES {
        if indexes.iter().any(|index| index.enforces(required)) {
            continue;
        }
        let found = indexes
            .iter()
            .find(|index| index.covers(required))
            .map(|index| index.shortfall(required));
        problems.push(SchemaProblem::MissingIndex {
            definition: required.definition,
            found,
        });
    }

    // A partitioned table: its unique indexes are valid only once every
    // partition has them, so the checks above hold for every partition. What
    // is left is whether every account has a partition to go to.
    if let Some((modulus, missing)) = partitioned::uncovered_hash_remainders(&mut conn).await?
        && !missing.is_empty()
    {
        problems.push(SchemaProblem::Partitions {
            detail: format!(
                "no partition takes hash remainders {missing:?} of modulus {modulus}, so every \
                 claim of an account that hashes there fails; create the missing partitions \
                 (CREATE TABLE ... PARTITION OF idem_records FOR VALUES WITH (MODULUS {modulus}, \
                 REMAINDER r))"
            ),
        });
    }

    Ok((!problems.is_empty()).then_some(SchemaProblems { table, problems }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicates_compare_without_parentheses_case_or_spacing() {
        assert_eq!(
            normalize_predicate("(namespace IS NULL)"),
            normalize_predicate("namespace is  null")
        );
        assert_ne!(
            normalize_predicate("(namespace IS NULL)"),
            normalize_predicate("(namespace IS NOT NULL)")
        );
    }

    #[test]
    fn the_exported_sql_creates_both_partial_indexes() {
        assert!(SCHEMA_SQL.contains("(account, kind, address) WHERE namespace IS NULL"));
        assert!(
            SCHEMA_SQL.contains("(account, kind, address, namespace) WHERE namespace IS NOT NULL")
        );
        assert!(!SCHEMA_SQL.contains("_sqlx_migrations"));
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }
}
