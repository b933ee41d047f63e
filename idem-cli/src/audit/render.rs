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
//! | `lets_through` | string | one sentence: which duplicates this index alone lets in |
//! | `severity` | `"hole"`, `"inert"` or `"covered"` | see below |
//! | `severity_reason` | string or null | why it is inert or covered (null for a hole) |
//! | `changes` | string | what either fix rejects that the table accepts today (empty when covered) |
//! | `conflicts_sql` | string | a query counting the groups of rows that would collide after either fix: 0 means the fix applies (empty when covered) |
//! | `fix.nulls_not_distinct` | array of strings | statements, PostgreSQL 15+ |
//! | `fix.nulls_not_distinct_without_blocking` | array of strings | for a constraint: the same without a long `ACCESS EXCLUSIVE` lock (empty otherwise) |
//! | `fix.nulls_not_distinct_supported` | bool | whether the audited server (15+) can run them |
//! | `fix.partial_indexes` | array of strings | statements, any version (empty when omitted) |
//! | `fix.partial_indexes_omitted` | string or null | why there is no split |
//! | `fix.locks` | object | `nulls_not_distinct`, `nulls_not_distinct_without_blocking`, `partial_indexes`: the lock each form takes, or null when there is no such form |
//! | `notes` | array of strings | what else to know before applying a fix |
//!
//! Severity: `hole`, rows with a NULL key get in however equal they are;
//! `inert`, every row has a NULL key, so the index rejects no row at all;
//! `covered`, other unique indexes reject every duplicate this one lets in
//! (informational: no fix is printed). `idem audit` exits 1 when there is a
//! hole or an inert index, and 0 when every finding is covered.

use serde::Serialize;

use super::Report;
use super::finding::{Finding, Severity};
use crate::error::CliError;
use crate::output;

/// What to know before running any fix: said once, under the findings.
const BEFORE_FIXING: &str = "\
Before you apply a fix:
  - Run each statement on its own, outside a transaction: CONCURRENTLY refuses to run in one.
  - Both fixes make NULL count as a value: rows equal in every key, NULLs included, then collide.
    Building the new index fails while such duplicates exist: each finding's count query finds
    them; resolve them first. A CREATE INDEX CONCURRENTLY that fails leaves an INVALID index
    behind: DROP INDEX CONCURRENTLY it before trying again.
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
    let failing = report
        .findings
        .iter()
        .filter(|f| f.severity.lets_duplicates_in())
        .count();
    let covered = report.findings.len() - failing;
    // "4 more" after the holes; "2 of them" when there is none.
    let which = |n: usize| {
        if failing == 0 {
            format!("{n} of them")
        } else {
            format!("{n} more")
        }
    };
    let covered_sentence = match covered {
        0 => String::new(),
        1 => format!(
            " {} lets NULL rows through, but other unique indexes reject every duplicate \
             (covered: informational, it does not fail the audit).",
            which(1)
        ),
        n => format!(
            " {} let NULL rows through, but other unique indexes reject every duplicate \
             (covered: informational, they do not fail the audit).",
            which(n)
        ),
    };
    if failing == 0 {
        out.push_str(&format!(
            "No NULL holes: none of the {checked} in {schemas} lets duplicates through \
             NULL.{covered_sentence}\n"
        ));
    } else {
        let verb = if failing == 1 { "lets" } else { "let" };
        out.push_str(&format!(
            "{failing} of the {checked} in {schemas} {verb} duplicates through \
             NULL.{covered_sentence}\n\n{BEFORE_FIXING}\n",
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
    let severity = match (&finding.severity, &finding.severity_reason) {
        (Severity::Covered, Some(reason)) => format!("covered (informational): {reason}"),
        (severity, Some(reason)) => format!("{}: {reason}", severity.as_str()),
        (severity, None) => severity.as_str().to_owned(),
    };
    field("severity:", &[severity]);
    if finding.severity == Severity::Covered {
        out.push_str("  no fix needed\n");
        return out;
    }
    field("changes:", std::slice::from_ref(&finding.changes));
    out.push_str(&format!("    {}\n", finding.conflicts_sql));
    let locks = &finding.fix.locks;
    if report.nulls_not_distinct {
        out.push_str("  fix for PostgreSQL 15+, NULLS NOT DISTINCT:\n");
    } else {
        out.push_str(&format!(
            "  fix for PostgreSQL 15+, NULLS NOT DISTINCT (not on this server, PostgreSQL {}):\n",
            report.server_version
        ));
    }
    lock_comment(&mut out, locks.nulls_not_distinct.as_deref());
    for statement in &finding.fix.nulls_not_distinct {
        out.push_str(&format!("    {statement}\n"));
    }
    if !finding.fix.nulls_not_distinct_without_blocking.is_empty() {
        out.push_str("  the same without blocking reads and writes (PostgreSQL 15+):\n");
        lock_comment(
            &mut out,
            locks.nulls_not_distinct_without_blocking.as_deref(),
        );
        for statement in &finding.fix.nulls_not_distinct_without_blocking {
            out.push_str(&format!("    {statement}\n"));
        }
    }
    match &finding.fix.partial_indexes_omitted {
        None => {
            out.push_str("  fix for any version, one partial unique index per NULL pattern:\n");
            lock_comment(&mut out, locks.partial_indexes.as_deref());
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

/// The lock a form of the fix takes, as an SQL comment above its statements.
fn lock_comment(out: &mut String, lock: Option<&str>) {
    if let Some(lock) = lock {
        out.push_str(&format!("    -- lock: {lock}\n"));
    }
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
    severity: &'static str,
    severity_reason: Option<&'a str>,
    changes: &'a str,
    conflicts_sql: &'a str,
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
    nulls_not_distinct_without_blocking: &'a [String],
    nulls_not_distinct_supported: bool,
    partial_indexes: &'a [String],
    partial_indexes_omitted: Option<&'a str>,
    locks: LocksJson<'a>,
}

#[derive(Serialize)]
struct LocksJson<'a> {
    nulls_not_distinct: Option<&'a str>,
    nulls_not_distinct_without_blocking: Option<&'a str>,
    partial_indexes: Option<&'a str>,
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
            severity: f.severity.as_str(),
            severity_reason: f.severity_reason.as_deref(),
            changes: &f.changes,
            conflicts_sql: &f.conflicts_sql,
            fix: FixJson {
                nulls_not_distinct: &f.fix.nulls_not_distinct,
                nulls_not_distinct_without_blocking: &f.fix.nulls_not_distinct_without_blocking,
                nulls_not_distinct_supported: report.nulls_not_distinct,
                partial_indexes: &f.fix.partial_indexes,
                partial_indexes_omitted: f.fix.partial_indexes_omitted.as_deref(),
                locks: LocksJson {
                    nulls_not_distinct: f.fix.locks.nulls_not_distinct.as_deref(),
                    nulls_not_distinct_without_blocking: f
                        .fix
                        .locks
                        .nulls_not_distinct_without_blocking
                        .as_deref(),
                    partial_indexes: f.fix.locks.partial_indexes.as_deref(),
                },
            },
            notes: &f.notes,
        })
        .collect();
    output::json(&findings)
}
