//! idem's schema: the SQL, its idempotent set-up, and the start-up check.
//!
//! The schema is idem's own. Its version lives in `idem_schema_version`, never
//! in sqlx's `_sqlx_migrations`, which belongs to your application.

use sqlx::PgPool;

use crate::error::{SchemaProblem, SchemaProblems};
use crate::store::Engine;
use crate::store::catalog::{self, Index};

mod distributed;
mod layout;
mod partitioned;

pub use crate::store::catalog::{SCHEMA_SQL, SCHEMA_VERSION};
pub use distributed::set_up_distributed;
pub use layout::{Distribution, Layout, layout};
pub use partitioned::{MAX_PARTITIONS, partitioned_sql, set_up_partitioned};

use crate::__internal;
use crate::error::Error;

/// Brings the schema up to [`SCHEMA_VERSION`].
///
/// Idempotent, and safe when many processes start at once: the migrations run
/// in one transaction under a transaction-scoped advisory lock. When the
/// schema is already current it runs no DDL and takes no lock, so a run-time
/// role without DDL rights can call it.
pub async fn set_up(pool: &PgPool) -> Result<(), Error> {
    Ok(catalog::set_up(&mut *pool.acquire().await?).await?)
}

/// Where idem's schema stands, as `idem migrate --check` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// `idem_records` qualified with its schema (`app.idem_records`), as the
    /// connection's `search_path` finds it; `None` when it finds none.
    pub table: Option<String>,
    /// The `search_path` in force, for saying where it looked.
    pub search_path: String,
    /// The highest schema version applied; 0 when idem was never set up.
    pub version: i32,
    /// The version this build of idem expects: [`SCHEMA_VERSION`].
    pub expected_version: i32,
    /// How the table is laid out; `None` when there is no table.
    pub layout: Option<Layout>,
    /// The two partial unique indexes the gate needs, as they must be
    /// defined.
    pub unique_indexes: [&'static str; 2],
    /// What [`verify`] found wrong; `None` when a gate would start.
    pub problems: Option<SchemaProblems>,
    /// The index of open claims (schema version 9), as it must be defined.
    pub open_claims_index: &'static str,
    /// That index is on the table, valid and as defined. The reconciler's
    /// listing, `idem claims list --state`, the claim gauges and the
    /// console's lists read it; without it they read the whole table. The
    /// gate does not need it, so its absence is not one of the `problems`.
    pub open_claims_index_present: bool,
}

impl Status {
    /// A gate would start on this schema, and no migration is pending.
    pub fn is_current(&self) -> bool {
        self.problems.is_none() && self.version >= self.expected_version
    }
}

/// Where idem's schema stands: the table, its version, its layout and what
/// is wrong with it. Reads the catalog only; changes nothing.
pub async fn status(pool: &PgPool) -> Result<Status, Error> {
    let location = catalog::locate_table(&mut *pool.acquire().await?).await?;
    let version = catalog::current_version(&mut *pool.acquire().await?).await?;
    let layout = layout(pool).await?;
    let problems = verify(pool).await?;
    let open_claims_index_present =
        catalog::open_claims_index_present(&mut *pool.acquire().await?).await?;
    Ok(Status {
        table: location.qualified,
        search_path: location.search_path,
        version,
        expected_version: SCHEMA_VERSION,
        layout,
        unique_indexes: [
            __internal::INDEX_WITHOUT_NAMESPACE,
            __internal::INDEX_WITHIN_NAMESPACE,
        ],
        problems,
        open_claims_index: catalog::OPEN_CLAIMS_DEFINITION,
        open_claims_index_present,
    })
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
    ("state_reason", false),
    ("resolved_at", false),
    ("in_doubt_since", false),
    ("claim_address", false),
    ("released_at", false),
    ("value_kept_for", false),
    ("slot_kept_for", false),
    // Version 12: every release frees the entity of an ordered event.
    ("entity", false),
    ("event_order", false),
    ("applied_order", false),
    ("held_by", false),
    // Version 13: every outcome statement returns whether anybody waits.
    ("awaited", false),
    // Version 14: every claim says what its lease turns into.
    ("expires_in_doubt", false),
];

/// An index the gate relies on: its key columns (as a set) and predicate.
pub(super) struct RequiredIndex {
    columns: &'static [&'static str],
    predicate: &'static str,
    pub(super) definition: &'static str,
}

pub(super) const REQUIRED_INDEXES: [RequiredIndex; 2] = [
    RequiredIndex {
        columns: &["account", "kind", "address"],
        predicate: "namespace IS NULL",
        definition: __internal::INDEX_WITHOUT_NAMESPACE,
    },
    RequiredIndex {
        columns: &["account", "kind", "address", "namespace"],
        predicate: "namespace IS NOT NULL",
        definition: __internal::INDEX_WITHIN_NAMESPACE,
    },
];

/// What an index the catalog describes does for the gate.
impl Index {
    pub(super) fn covers(&self, required: &RequiredIndex) -> bool {
        self.columns.len() == required.columns.len()
            && required
                .columns
                .iter()
                .all(|c| self.columns.iter().any(|own| own == c))
    }

    pub(super) fn enforces(&self, required: &RequiredIndex) -> bool {
        self.is_unique
            && self.is_valid
            && self.is_immediate
            && !self.has_expressions
            && self.covers(required)
            && self.predicate.as_deref().map(normalize_predicate)
                == Some(normalize_predicate(required.predicate))
    }

    /// Why this index, which looks like `required`, does not do its job.
    pub(super) fn shortfall(&self, required: &RequiredIndex) -> String {
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
/// both partial unique indexes with the right predicates; on a Citus
/// coordinator also that the table is distributed by `account` and both
/// indexes hold on every shard placement.
///
/// Returns `Ok(None)` when the schema can enforce one claim per identity.
pub async fn verify(pool: &PgPool) -> Result<Option<SchemaProblems>, Error> {
    Ok(verify_for_gate(pool).await?.0)
}

/// [`verify`], and what the table is on, as a starting gate needs both:
/// the store's statement shapes depend on whether Citus distributes it.
pub(crate) async fn verify_for_gate(
    pool: &PgPool,
) -> Result<(Option<SchemaProblems>, Engine), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let location = catalog::locate_table(&mut conn).await?;
    let Some(table) = location.table else {
        let missing = SchemaProblems {
            table: "idem_records".to_owned(),
            problems: vec![SchemaProblem::MissingTable {
                search_path: location.search_path,
            }],
        };
        return Ok((Some(missing), Engine::PostgreSQL));
    };

    let mut problems = Vec::new();
    let columns = catalog::columns(&mut conn).await?;
    for &(column, must_be_not_null) in REQUIRED_COLUMNS {
        match columns.iter().find(|found| found.name == column) {
            None => problems.push(SchemaProblem::Column {
                column,
                wrong: "is missing",
            }),
            Some(found) if must_be_not_null && !found.not_null => {
                problems.push(SchemaProblem::Column {
                    column,
                    wrong: "is nullable; it must be NOT NULL",
                })
            }
            Some(_) => {}
        }
    }

    let indexes = catalog::indexes(&mut conn).await?;
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

    // Citus: on the coordinator a distributed table is a shell whose
    // indexes say nothing of the shards that hold the rows.
    let citus = distributed::check(&mut conn).await?;
    problems.extend(citus.problems);
    let engine = if citus.distributed {
        Engine::Citus
    } else {
        Engine::PostgreSQL
    };

    let problems = (!problems.is_empty()).then_some(SchemaProblems { table, problems });
    Ok((problems, engine))
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
        assert_eq!(
            __internal::MIGRATIONS.last().map(|m| m.version),
            Some(SCHEMA_VERSION)
        );
    }
}
