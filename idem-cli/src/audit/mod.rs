//! `idem audit`: every unique index and unique constraint that enforces
//! nothing for rows where a key is NULL.
//!
//! A unique index compares keys with `=`, and `NULL = NULL` is not true, so
//! two rows that differ only by having NULL in the same key both insert. The
//! audit reports an index (or the constraint it backs) when:
//!
//! - it is unique, not a primary key, and not `NULLS NOT DISTINCT`;
//! - and at least one of its key columns or expressions can be NULL in a row
//!   the index covers, by the rules in [`nullability`]. `INCLUDE` columns
//!   are not keys and never count.
//!
//! Each finding has a severity (see [`finding`]): a **hole** lets rows with
//! a NULL key in however equal they are; an **inert** index has a NULL key in
//! every row (the table's `CHECK` constraints say so), so it rejects nothing
//! at all; a **covered** one lets NULL rows through but other unique indexes
//! of the table reject every such duplicate (informational: no fix). Holes
//! and inert indexes make `idem audit` exit 1.
//!
//! The audit only reads the catalog; it writes nothing and needs no
//! privilege beyond connecting. Each hole and inert index comes with both
//! fixes from [`fix`], the lock each takes, and a query that counts the rows
//! the fixes would reject today.

pub mod catalog;
mod finding;
mod fix;
mod node_tree;
mod nullability;
mod quote;
pub mod render;

use sqlx::PgPool;

use crate::error::CliError;
use std::collections::HashMap;

use finding::{Finding, Neighbour, Parsed, judge};
use quote::Quoter;

/// What one audit found.
#[derive(Debug)]
pub struct Report {
    /// The schemas audited, in order, quoted for SQL.
    pub schemas_sql: Vec<String>,
    /// How many unique indexes and constraints were checked.
    pub checked: usize,
    /// The ones that let NULL rows through: holes and inert indexes, and
    /// covered ones (informational).
    pub findings: Vec<Finding>,
    /// The server's version, as it reports it.
    pub server_version: String,
    /// The server knows `NULLS NOT DISTINCT` (PostgreSQL 15+); when it does
    /// not, the report says the split is the fix to use.
    pub nulls_not_distinct: bool,
}

impl Report {
    /// Some finding lets duplicates in (a hole or an inert index): the audit
    /// exits 1. Covered findings alone do not.
    pub fn lets_duplicates_in(&self) -> bool {
        self.findings
            .iter()
            .any(|f| f.severity.lets_duplicates_in())
    }
}

/// Audits `schemas`, or every schema but PostgreSQL's own when it is empty.
pub async fn audit(pool: &PgPool, schemas: &[String]) -> Result<Report, CliError> {
    let server = catalog::server(pool)
        .await
        .map_err(CliError::database("read the server's catalog"))?;
    let schemas = if schemas.is_empty() {
        catalog::default_schemas(pool)
            .await
            .map_err(CliError::database("list the schemas"))?
    } else {
        let missing = catalog::missing_schemas(pool, schemas)
            .await
            .map_err(CliError::database("look up the schemas"))?;
        if !missing.is_empty() {
            return Err(CliError::Usage(format!(
                "no schema named {} in this database; check --schema (names are case-sensitive)",
                missing.join(", ")
            )));
        }
        let mut unique = Vec::new();
        for schema in schemas {
            if !unique.contains(schema) {
                unique.push(schema.clone());
            }
        }
        unique
    };
    let indexes = catalog::unique_indexes(pool, &server, &schemas)
        .await
        .map_err(CliError::database("read the unique indexes"))?;
    let parsed: Vec<Parsed> = indexes.iter().map(Parsed::of).collect();
    let mut oids = Vec::new();
    for p in &parsed {
        p.functions_called(&mut oids);
    }
    oids.sort_unstable();
    oids.dedup();
    let functions = catalog::functions(pool, &oids)
        .await
        .map_err(CliError::database("read the functions the indexes use"))?;
    let quoter = Quoter::new(server.keywords);
    let schemas_sql = schemas.iter().map(|s| quoter.quote(s)).collect();
    let mut by_table: HashMap<i64, Vec<Neighbour<'_>>> = HashMap::new();
    for (index, parsed) in indexes.iter().zip(&parsed) {
        by_table
            .entry(index.table_oid)
            .or_default()
            .push(Neighbour { index, parsed });
    }
    let findings = indexes
        .iter()
        .zip(&parsed)
        .filter_map(|(index, parsed)| {
            let neighbours: Vec<Neighbour<'_>> = by_table
                .get(&index.table_oid)
                .into_iter()
                .flatten()
                .filter(|n| !std::ptr::eq(n.index, index))
                .copied()
                .collect();
            judge(index, parsed, &neighbours, &functions, &quoter)
        })
        .collect();
    Ok(Report {
        schemas_sql,
        checked: indexes.iter().filter(|i| !i.primary_key).count(),
        findings,
        server_version: server.version,
        nulls_not_distinct: server.has_nulls_not_distinct,
    })
}
