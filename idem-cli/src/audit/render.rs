//! The audit's report, for people (text) and for scripts (JSON).
//!
//! # JSON
//!
//! An array with one object per finding (empty when there is none). Fields,
//! stable:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `schema`, `table` | string | where it is, exactly as in the catalog (unquoted) |
//! | `kind` | `"index"` or `"constraint"` | a unique index, or a unique constraint (reported once, not also as its index) |
//! | `name` | string | the index or constraint, exactly as in the catalog |
//! | `definition` | string | `pg_get_indexdef`, or `pg_get_constraintdef` for a constraint |
//! | `key_columns` | array of strings | every key column or expression, as SQL (`INCLUDE` columns are not keys) |
//! | `nullable_columns` | array of {`column`, `why`} | the keys that can be NULL (`column` as SQL) and, in `why`, each source of NULL |
//! | `predicate` | string or null | the partial index's predicate, as SQL |
//! | `lets_through` | string | one sentence: which duplicates get in |
//! | `fix.nulls_not_distinct` | array of strings | statements, PostgreSQL 15+ |
//! | `fix.nulls_not_distinct_supported` | bool | whether the audited server (15+) can run them |
//! | `fix.partial_indexes` | array of strings | statements, any version (empty when omitted) |
//! | `fix.partial_indexes_omitted` | string or null | why there is no split |
//! | `notes` | array of strings | what else to know before applying a fix |

use serde::Serialize;

use super::Report;
use super::finding::Finding;
use crate::error::CliError;
use crate::output;

/// What to know before running any fix: said once, under the findings.
const BEFORE_FIXING: &str = "\
Before you apply a fix:
  - Run each statement on its own, outside a transaction: CONCURRENTLY refuses to run in one.
  - Both fixes make NULL count as a value: rows equal in every key, NULLs included, then collide.
    Building the new index fails while such duplicates exist: find and resolve them first.
  - Storage parameters (WITH ...) and tablespaces of the old index are not carried over.
  - If rows with NULL are meant to be exempt, say so instead: add WHERE <column> IS NOT NULL to
    the index; the audit accepts that.";

/// The summary names the audited schemas up to this many.
const MAX_SCHEMAS_NAMED: usize = 5;

/// The report as text: one block per finding, then a summary.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    for finding in &report.findings {
        out.push_str(&finding_block(finding, report));
        out.push('\n');
    }
    let checked = plural(
        report.checked,
        "unique index or constraint",
        "unique indexes and constraints",
    );
    // Named when few; a whole database can have hundreds.
    let schemas = match report.schemas_sql.as_slice() {
        [one] => format!("schema {one}"),
        few if few.len() <= MAX_SCHEMAS_NAMED => format!("schemas {}", few.join(", ")),
        many => format!("{} schemas", many.len()),
    };
    if report.findings.is_empty() {
        out.push_str(&format!(
            "No NULL holes: none of the {checked} in {schemas} lets duplicates through NULL.\n"
        ));
    } else {
        out.push_str(&format!(
            "{} of the {checked} in {schemas} let duplicates through NULL.\n\n{BEFORE_FIXING}\n",
            report.findings.len()
        ));
        if !report.nulls_not_distinct {
            out.push_str(&format!(
                "  - This server is PostgreSQL {}: NULLS NOT DISTINCT exists only from PostgreSQL \
                 15 on, so use the fix for any version\n    (the split into partial indexes), or \
                 make the columns NOT NULL; the NULLS NOT DISTINCT fix is for after an upgrade.\n",
                report.server_version
            ));
        }
    }
    out
}

fn finding_block(finding: &Finding, report: &Report) -> String {
    const LABEL: usize = 14;
    let index = &finding.index;
    let mut out = format!(
        "{}: unique {} {}\n",
        index.table_sql,
        finding.kind(),
        finding.name_sql()
    );
    let mut field = |label: &str, lines: &[String]| {
        for (i, line) in lines.iter().enumerate() {
            let label = if i == 0 { label } else { "" };
            out.push_str(&format!("  {label:<LABEL$}{line}\n"));
        }
    };
    field("definition:", std::slice::from_ref(&index.definition));
    let nullable: Vec<String> = finding
        .nullable
        .iter()
        .map(|key| match key.why.as_slice() {
            [only] if *only == format!("{} allows NULL", key.sql) => only.clone(),
            why => format!("{}, because {}", key.sql, why.join("; ")),
        })
        .collect();
    field("nullable:", &nullable);
    field("duplicates:", std::slice::from_ref(&finding.lets_through));
    if report.nulls_not_distinct {
        out.push_str("  fix for PostgreSQL 15+, NULLS NOT DISTINCT:\n");
    } else {
        out.push_str(&format!(
            "  fix for PostgreSQL 15+, NULLS NOT DISTINCT (not on this server, PostgreSQL {}):\n",
            report.server_version
        ));
    }
    for statement in &finding.fix.nulls_not_distinct {
        out.push_str(&format!("    {statement}\n"));
    }
    match &finding.fix.partial_indexes_omitted {
        None => {
            out.push_str("  fix for any version, one partial unique index per NULL pattern:\n");
            for statement in &finding.fix.partial_indexes {
                out.push_str(&format!("    {statement}\n"));
            }
        }
        Some(why) => out.push_str(&format!("  no split into partial indexes: {why}\n")),
    }
    for note in &finding.notes {
        out.push_str(&format!("  note: {note}\n"));
    }
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

#[derive(Serialize)]
struct FindingJson<'a> {
    schema: &'a str,
    table: &'a str,
    kind: &'static str,
    name: &'a str,
    definition: &'a str,
    key_columns: &'a [String],
    nullable_columns: Vec<NullableJson<'a>>,
    predicate: Option<&'a str>,
    lets_through: &'a str,
    fix: FixJson<'a>,
    notes: &'a [String],
}

#[derive(Serialize)]
struct NullableJson<'a> {
    column: &'a str,
    why: &'a [String],
}

#[derive(Serialize)]
struct FixJson<'a> {
    nulls_not_distinct: &'a [String],
    nulls_not_distinct_supported: bool,
    partial_indexes: &'a [String],
    partial_indexes_omitted: Option<&'a str>,
}

/// The findings as a JSON array (see the module docs for the fields).
pub fn json(report: &Report) -> Result<String, CliError> {
    let findings: Vec<FindingJson<'_>> = report
        .findings
        .iter()
        .map(|f| FindingJson {
            schema: &f.index.schema_name,
            table: &f.index.table_name,
            kind: f.kind(),
            name: f.name(),
            definition: &f.index.definition,
            key_columns: &f.key_sql,
            nullable_columns: f
                .nullable
                .iter()
                .map(|k| NullableJson {
                    column: &k.sql,
                    why: &k.why,
                })
                .collect(),
            predicate: f.index.predicate_sql.as_deref(),
            lets_through: &f.lets_through,
            fix: FixJson {
                nulls_not_distinct: &f.fix.nulls_not_distinct,
                nulls_not_distinct_supported: report.nulls_not_distinct,
                partial_indexes: &f.fix.partial_indexes,
                partial_indexes_omitted: f.fix.partial_indexes_omitted.as_deref(),
            },
            notes: &f.notes,
        })
        .collect();
    output::json(&findings)
}
