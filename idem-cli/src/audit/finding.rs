//! Deciding whether one unique index lets duplicates through NULL, and
//! describing it when it does.

use std::collections::HashMap;

use super::catalog::{Key, UniqueIndex};
use super::fix::{ConstraintInput, Fix, FixInput, fixes};
use super::node_tree::{Expr, IndexExpression, parse_expr, parse_expr_list};
use super::nullability::{Facts, Function, why_nullable};
use super::quote::Quoter;

/// A unique index or constraint that enforces nothing for some NULL rows.
#[derive(Debug, Clone)]
pub struct Finding {
    /// The index as the catalog describes it.
    pub index: UniqueIndex,
    /// Every key, as SQL.
    pub key_sql: Vec<String>,
    /// The keys that can be NULL, with why.
    pub nullable: Vec<NullableKey>,
    /// One sentence: which duplicates get in.
    pub lets_through: String,
    /// The SQL that closes the hole.
    pub fix: Fix,
    /// What else to know before applying the fix.
    pub notes: Vec<String>,
}

impl Finding {
    /// `"constraint"` or `"index"`.
    pub fn kind(&self) -> &'static str {
        if self.index.constraint.is_some() {
            "constraint"
        } else {
            "index"
        }
    }

    /// The constraint's name, or the index's: exactly as in the catalog.
    pub fn name(&self) -> &str {
        self.index
            .constraint
            .as_ref()
            .map_or(&self.index.index_name, |c| &c.name)
    }

    /// The constraint's name, or the index's: quoted for SQL.
    pub fn name_sql(&self) -> &str {
        self.index
            .constraint
            .as_ref()
            .map_or(&self.index.index_sql, |c| &c.sql)
    }
}

/// A key that can be NULL in a row the index covers.
#[derive(Debug, Clone)]
pub struct NullableKey {
    /// The column or expression, as SQL.
    pub sql: String,
    /// Where the NULL can come from.
    pub why: Vec<String>,
}

/// The stored trees of one index and its table, read once, so the functions
/// of every index can be looked up in one query before any is judged.
#[derive(Debug)]
pub struct Parsed {
    /// One entry per key: the key as an expression, and for an expression key
    /// its own collation (`None`: unknown).
    keys: Vec<(Expr, Option<u32>)>,
    predicate: Option<Expr>,
    checks: Vec<Expr>,
}

impl Parsed {
    /// Reads the trees of `index`. An expression key whose tree cannot be
    /// read is opaque, so it is reported rather than trusted.
    pub fn of(index: &UniqueIndex) -> Parsed {
        let mut expressions = index
            .expressions_tree
            .as_deref()
            .and_then(parse_expr_list)
            .unwrap_or_default()
            .into_iter();
        let keys = index
            .keys
            .iter()
            .map(|key| {
                if key.attnum != 0 {
                    (Expr::Column(key.attnum), None)
                } else {
                    expressions.next().map_or_else(
                        || (Expr::Opaque("unreadable expression".to_owned()), None),
                        |IndexExpression { expr, collation }| (expr, collation),
                    )
                }
            })
            .collect();
        Parsed {
            keys,
            predicate: index.predicate_tree.as_deref().map(parse_expr),
            checks: index
                .checks_tree
                .iter()
                .map(String::as_str)
                .map(parse_expr)
                .collect(),
        }
    }

    /// The OIDs of every function the keys, the predicate and the checks call.
    pub fn functions_called(&self, out: &mut Vec<u32>) {
        for (expr, _) in &self.keys {
            super::node_tree::functions_called(expr, out);
        }
        for expr in self.predicate.iter().chain(&self.checks) {
            super::node_tree::functions_called(expr, out);
        }
    }
}

/// The finding for `index`, or `None` when every key is proven non-NULL in
/// the rows it covers (or it is `NULLS NOT DISTINCT`).
pub fn judge(
    index: &UniqueIndex,
    parsed: &Parsed,
    functions: &HashMap<u32, Function>,
    quoter: &Quoter,
) -> Option<Finding> {
    if index.nulls_not_distinct {
        return None;
    }
    let columns: HashMap<i16, (String, bool)> = index
        .columns
        .iter()
        .map(|c| (c.attnum, (c.sql.clone(), c.not_null)))
        .collect();
    let facts = Facts {
        columns: &columns,
        functions,
        predicate: parsed.predicate.as_ref(),
        checks: &parsed.checks,
    };
    let mut nullable_positions = Vec::new();
    let mut nullable = Vec::new();
    for (position, (key, (expr, _))) in index.keys.iter().zip(&parsed.keys).enumerate() {
        let why = why_nullable(expr, &facts);
        if !why.is_empty() {
            nullable_positions.push(position);
            nullable.push(NullableKey {
                sql: key.sql.clone(),
                why,
            });
        }
    }
    if nullable.is_empty() {
        return None;
    }

    let natural_collations: Vec<Option<i64>> = index
        .keys
        .iter()
        .zip(&parsed.keys)
        .map(|(key, (_, expression_collation))| {
            if key.attnum != 0 {
                index
                    .columns
                    .iter()
                    .find(|c| c.attnum == key.attnum)
                    .map(|c| c.collation)
            } else {
                expression_collation.map(i64::from)
            }
        })
        .collect();
    let key_definitions: Vec<String> = index
        .keys
        .iter()
        .zip(natural_collations)
        .map(|(key, natural)| key_definition(key, natural))
        .collect();
    let key_sql: Vec<String> = index.keys.iter().map(|k| k.sql.clone()).collect();
    let fix = fixes(
        &FixInput {
            schema_sql: &index.schema_sql,
            table_sql: &index.table_sql,
            table_is_partitioned: index.table_is_partitioned,
            name: index
                .constraint
                .as_ref()
                .map_or(&index.index_name, |c| &c.name),
            index_sql: &index.index_sql,
            constraint: index.constraint.as_ref().map(|c| ConstraintInput {
                sql: &c.sql,
                deferrable: c.deferrable,
                initially_deferred: c.initially_deferred,
            }),
            method_sql: &index.method_sql,
            key_definitions: &key_definitions,
            key_sql: &key_sql,
            nullable: &nullable_positions,
            include_sql: &index.include_sql,
            predicate_sql: index.predicate_sql.as_deref(),
            referenced_by_foreign_keys: index.referenced_by_foreign_keys,
        },
        quoter,
    );
    Some(Finding {
        lets_through: lets_through(&key_sql, &nullable_positions),
        notes: notes(index, &fix),
        index: index.clone(),
        key_sql,
        nullable,
        fix,
    })
}

/// One key as it stands in an index definition: the column or expression,
/// then any collation, operator class and ordering that differ from what
/// PostgreSQL would pick by itself.
fn key_definition(key: &Key, natural_collation: Option<i64>) -> String {
    let mut definition = key.sql.clone();
    if key.collation != 0
        && natural_collation != Some(key.collation)
        && let Some(collation) = &key.collation_sql
    {
        definition.push_str(" COLLATE ");
        definition.push_str(collation);
    }
    if let Some(opclass) = &key.opclass_sql {
        definition.push(' ');
        definition.push_str(opclass);
    }
    match (key.descending, key.nulls_first) {
        (true, true) => definition.push_str(" DESC"),
        (true, false) => definition.push_str(" DESC NULLS LAST"),
        (false, true) => definition.push_str(" NULLS FIRST"),
        (false, false) => {}
    }
    definition
}

/// One sentence saying which duplicates the index accepts.
fn lets_through(key_sql: &[String], nullable: &[usize]) -> String {
    let nulls: Vec<&str> = nullable.iter().map(|&p| key_sql[p].as_str()).collect();
    let others: Vec<&str> = key_sql
        .iter()
        .enumerate()
        .filter(|(p, _)| !nullable.contains(p))
        .map(|(_, sql)| sql.as_str())
        .collect();
    let where_null = match nulls.as_slice() {
        [one] => format!("{one} is NULL"),
        [init @ .., last] => format!("{} or {last} is NULL", init.join(", ")),
        [] => String::new(),
    };
    let even = match (nulls.len(), others.as_slice()) {
        (1, []) => String::new(),
        (1, [one]) => format!(", even with the same {one}"),
        (1, many) => format!(", even with the same ({})", many.join(", ")),
        (_, _) => ", even when all their other keys are equal".to_owned(),
    };
    format!(
        "Any number of rows where {where_null} are accepted{even}, because NULLs never equal \
         each other."
    )
}

fn notes(index: &UniqueIndex, fix: &Fix) -> Vec<String> {
    let mut notes = Vec::new();
    if index.referenced_by_foreign_keys {
        notes.push(
            "Foreign keys use this index, so dropping it fails: drop them first and re-create \
             them once the new index exists."
                .to_owned(),
        );
    }
    if let Some(constraint) = &index.constraint
        && fix.partial_indexes_omitted.is_none()
    {
        notes.push(format!(
            "Partial indexes cannot back a constraint: after the split, \
             ON CONFLICT ON CONSTRAINT {} must name the columns and predicate instead.",
            constraint.sql
        ));
        if constraint.deferrable {
            notes.push(
                "The partial indexes are checked at once: they cannot be DEFERRABLE like the \
                 constraint."
                    .to_owned(),
            );
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(sql: &[&str]) -> Vec<String> {
        sql.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_sentence_names_the_null_keys_and_the_keys_that_may_repeat() {
        assert_eq!(
            lets_through(&keys(&["email"]), &[0]),
            "Any number of rows where email is NULL are accepted, because NULLs never equal each \
             other."
        );
        assert_eq!(
            lets_through(&keys(&["account_id", "external_ref"]), &[1]),
            "Any number of rows where external_ref is NULL are accepted, even with the same \
             account_id, because NULLs never equal each other."
        );
        assert_eq!(
            lets_through(&keys(&["a", "b", "c"]), &[2]),
            "Any number of rows where c is NULL are accepted, even with the same (a, b), because \
             NULLs never equal each other."
        );
        assert_eq!(
            lets_through(&keys(&["a", "b", "c"]), &[0, 1, 2]),
            "Any number of rows where a, b or c is NULL are accepted, even when all their other \
             keys are equal, because NULLs never equal each other."
        );
    }

    fn key(sql: &str) -> Key {
        Key {
            attnum: 1,
            sql: sql.to_owned(),
            collation: 0,
            collation_sql: None,
            opclass_sql: None,
            descending: false,
            nulls_first: false,
        }
    }

    #[test]
    fn key_definitions_keep_what_differs_from_the_defaults() {
        assert_eq!(key_definition(&key("email"), Some(100)), "email");
        let mut k = key("code");
        k.collation = 950;
        k.collation_sql = Some("pg_catalog.\"C\"".to_owned());
        k.opclass_sql = Some("pg_catalog.text_pattern_ops".to_owned());
        k.descending = true;
        assert_eq!(
            key_definition(&k, Some(100)),
            "code COLLATE pg_catalog.\"C\" pg_catalog.text_pattern_ops DESC NULLS LAST"
        );
        assert_eq!(
            key_definition(&k, Some(950)),
            "code pg_catalog.text_pattern_ops DESC NULLS LAST"
        );
        assert_eq!(
            key_definition(&k, None),
            "code COLLATE pg_catalog.\"C\" pg_catalog.text_pattern_ops DESC NULLS LAST",
            "unknown natural collation: spelled out"
        );
        let mut first = key("x");
        first.nulls_first = true;
        assert_eq!(key_definition(&first, None), "x NULLS FIRST");
        first.descending = true;
        assert_eq!(key_definition(&first, None), "x DESC");
    }
}
