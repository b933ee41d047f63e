//! `idem migrate`: set idem's schema up with the runtime's own function, then
//! verify it the way a starting gate does.

use idem_runtime::schema;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::CliError;
use crate::output::{self, Format};

/// What the schema looks like after `migrate`.
#[derive(Debug, Serialize)]
pub struct SchemaReport {
    /// `idem_records` as PostgreSQL resolves it, if it exists.
    pub table: Option<String>,
    /// The highest version applied (0: none).
    pub version: i32,
    /// The version this build of idem expects.
    pub expected_version: i32,
    /// How the table is laid out: `plain`, `partitioned by HASH (account)
    /// into 16 partitions`, or `distributed by Citus on account (hash) into
    /// 32 shards`; null when there is no table.
    pub layout: Option<String>,
    /// The two unique indexes the gate needs, as they must be defined.
    pub unique_indexes: [&'static str; 2],
    /// What is wrong; empty when a gate would start.
    pub problems: Vec<String>,
    /// The index of open claims (schema version 9), as it must be defined.
    pub open_claims_index: &'static str,
    /// That index is there, valid and as defined; without it, the lists of
    /// open claims read the whole table (not a problem: the gate starts).
    pub open_claims_index_present: bool,
}

impl SchemaReport {
    /// A gate would start on this schema.
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.version >= self.expected_version
    }
}

/// What `migrate` does before it verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing (`--check`).
    Check,
    /// Set up or bring up to date, as a plain table where there is none.
    SetUp,
    /// Set up, hash-partitioned into this many partitions where there is no
    /// table (`--partitions N`).
    SetUpPartitioned(u16),
    /// Set up distributed by Citus on account (`--distributed`).
    SetUpDistributed,
}

/// Sets the schema up as `action` says, and verifies it.
pub async fn migrate(
    pool: &PgPool,
    schema_name: Option<&str>,
    action: Action,
) -> Result<SchemaReport, CliError> {
    if let Some(name) = schema_name {
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(name)
                .fetch_one(pool)
                .await
                .map_err(CliError::database("look up the schema"))?;
        if !exists {
            return Err(CliError::Usage(format!(
                "schema {name:?} does not exist: create it first (CREATE SCHEMA ...), \
                 or pass the --schema that holds idem_records"
            )));
        }
    }
    match action {
        Action::Check => {}
        Action::SetUp => schema::set_up(pool)
            .await
            .map_err(CliError::store("set up idem's schema"))?,
        Action::SetUpPartitioned(partitions) => schema::set_up_partitioned(pool, partitions)
            .await
            .map_err(CliError::store("set up idem's partitioned schema"))?,
        Action::SetUpDistributed => schema::set_up_distributed(pool)
            .await
            .map_err(CliError::store("set up idem's distributed schema"))?,
    }
    // The table comes qualified even when its schema is on the search_path,
    // so the report says where it is.
    let status = schema::status(pool)
        .await
        .map_err(CliError::store("read idem's schema"))?;
    let mut problems: Vec<String> = status
        .problems
        .map(|p| p.problems.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    let version = status.version;
    if status.table.is_some() && version < status.expected_version {
        problems.push(format!(
            "the schema is at version {version}, this idem expects {}: run `idem migrate` \
             without --check (with a role that may run DDL)",
            status.expected_version
        ));
    }
    Ok(SchemaReport {
        table: status.table,
        version,
        expected_version: status.expected_version,
        layout: status.layout.map(|layout| layout.to_string()),
        unique_indexes: status.unique_indexes,
        problems,
        open_claims_index: status.open_claims_index,
        open_claims_index_present: status.open_claims_index_present,
    })
}

/// The report in `format`.
pub fn render(report: &SchemaReport, format: Format) -> Result<String, CliError> {
    match format {
        Format::Json => output::json(report),
        Format::Text => Ok(text(report)),
    }
}

fn text(report: &SchemaReport) -> String {
    let table = report.table.as_deref().unwrap_or("idem_records");
    if report.ok() {
        let mut out = format!(
            "idem schema version {} is in place: {table}\n",
            report.version
        );
        if let Some(layout) = &report.layout {
            out.push_str(&format!("  layout: {layout}\n"));
        }
        for index in report.unique_indexes {
            out.push_str(&format!("  present: {index}\n"));
        }
        if report.open_claims_index_present {
            out.push_str(&format!("  present: {}\n", report.open_claims_index));
        } else {
            out.push_str(&format!(
                "  absent: {}\n    the reconciler, `idem claims list --state`, the gauges and the \
                 console read the whole table instead; docs/operations.md (\"Version 9 builds an \
                 index\") shows how to build it without blocking writers\n",
                report.open_claims_index
            ));
        }
        out
    } else {
        let mut out = format!(
            "idem's schema cannot enforce one claim per identity: {table} (version {})\n",
            report.version
        );
        for problem in &report.problems {
            out.push_str(&format!("  - {problem}\n"));
        }
        out.push_str(
            "Fix: run `idem migrate` with a role that may run DDL, or apply \
             idem::schema::SCHEMA_SQL with your migration tool.\n",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(problems: Vec<String>) -> SchemaReport {
        SchemaReport {
            table: Some("app.idem_records".to_owned()),
            version: 3,
            expected_version: 3,
            layout: Some("plain (not partitioned)".to_owned()),
            unique_indexes: [
                "UNIQUE (a) WHERE x IS NULL",
                "UNIQUE (a, x) WHERE x IS NOT NULL",
            ],
            problems,
            open_claims_index: "INDEX (o)",
            open_claims_index_present: true,
        }
    }

    #[test]
    fn a_sound_schema_lists_its_indexes() {
        assert_eq!(
            text(&report(vec![])),
            "idem schema version 3 is in place: app.idem_records\n  \
             layout: plain (not partitioned)\n  \
             present: UNIQUE (a) WHERE x IS NULL\n  \
             present: UNIQUE (a, x) WHERE x IS NOT NULL\n  \
             present: INDEX (o)\n"
        );
    }

    #[test]
    fn a_missing_index_of_open_claims_is_shown_with_what_it_costs_and_the_schema_still_passes() {
        let report = SchemaReport {
            open_claims_index_present: false,
            ..report(vec![])
        };
        assert!(report.ok());
        let shown = text(&report);
        assert!(shown.contains("  absent: INDEX (o)\n"), "{shown}");
        assert!(shown.contains("read the whole table"), "{shown}");
        assert!(shown.contains("without blocking writers"), "{shown}");
    }

    #[test]
    fn problems_are_listed_with_the_fix() {
        let shown = text(&report(vec!["missing unique index: UNIQUE (a)".to_owned()]));
        assert!(shown.starts_with("idem's schema cannot enforce one claim per identity"));
        assert!(shown.contains("  - missing unique index: UNIQUE (a)\n"));
        assert!(shown.contains("Fix: run `idem migrate`"));
    }
}
