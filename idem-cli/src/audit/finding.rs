//! Deciding whether one unique index lets duplicates through NULL, how
//! badly, and describing it when it does.
//!
//! # Severity
//!
//! The rows an index covers fall into NULL patterns: which of its nullable
//! keys are NULL. A pattern is impossible when the index predicate or a
//! validated `CHECK` of the table rules it out (the same proofs as in
//! [`nullability`](super::nullability), under the assumption that those keys
//! are NULL and the others are not). Then:
//!
//! - **inert**: no row can have every key present (say
//!   `CHECK ((a IS NULL) <> (b IS NULL))` or `CHECK (num_nonnulls(a, b) = 1)`
//!   over keys `a, b`), so the index compares nothing and rejects no row at
//!   all;
//! - **covered**: for every possible pattern with a NULL, some other valid
//!   unique index of the table (a primary key too) rejects two rows of that
//!   pattern that are equal in this index's non-NULL keys (and, when it has
//!   keys of its own, equal in those: each must be nullable in general yet
//!   proven present in such rows, tied to the NULL keys by a `CHECK`; a
//!   `NOT NULL` key would cover anything). Its keys compare the same way
//!   (operator class and collation), and its predicate must hold in every
//!   such row. So no two rows equal in every key, NULLs included, both get
//!   in: this index alone lets them, the others do not. Anything not proven
//!   this way is not covered. An inert index covered only through keys it
//!   does not have stays inert: it most likely meant something else;
//! - **hole** otherwise: duplicates with a NULL get in.

use std::collections::HashMap;

use super::catalog::{Key, UniqueIndex};
use super::fix::{ConstraintInput, Fix, FixInput, fixes};
use super::node_tree::{Expr, IndexExpression, parse_expr, parse_expr_list};
use super::nullability::{
    Facts, Function, Given, holds_given, not_null_given, row_possible, same, why_nullable,
};
use super::quote::Quoter;

/// Past this many nullable keys the patterns (2^n) are not enumerated: the
/// index is taken as a hole, unproven.
const MAX_PATTERN_KEYS: usize = 8;
const _: () = assert!(super::fix::MAX_SPLIT_KEYS <= MAX_PATTERN_KEYS);

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Rows with a NULL key get in however equal they are.
    Hole,
    /// Every row has a NULL key: the index rejects no row at all.
    Inert,
    /// This index lets NULL rows through, but other unique indexes reject
    /// every duplicate among them: informational.
    Covered,
}

impl Severity {
    /// `hole`, `inert` or `covered`, as in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Hole => "hole",
            Severity::Inert => "inert",
            Severity::Covered => "covered",
        }
    }

    /// Duplicates get in: `idem audit` exits 1.
    pub fn lets_duplicates_in(self) -> bool {
        self != Severity::Covered
    }
}

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
    /// How bad it is.
    pub severity: Severity,
    /// Why it is inert or covered, in a sentence; `None` for a hole.
    pub severity_reason: Option<String>,
    /// What either fix changes: the rows it rejects that the index accepts
    /// today. Empty when there is no fix (covered).
    pub changes: String,
    /// A query counting the groups of rows that would collide after either
    /// fix, so that no fix fails half-way: it must print 0 before one runs.
    /// Empty when there is no fix (covered).
    pub conflicts_sql: String,
    /// The SQL that closes the hole (nothing when covered).
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
#[derive(Debug, Clone)]
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

/// Another unique index of the same table, as a possible cover.
#[derive(Debug, Clone, Copy)]
pub struct Neighbour<'a> {
    /// The index.
    pub index: &'a UniqueIndex,
    /// Its trees.
    pub parsed: &'a Parsed,
}

/// The finding for `index`, or `None` when every key is proven non-NULL in
/// the rows it covers (or it is `NULLS NOT DISTINCT`, or a primary key). `neighbours` are the
/// other unique indexes of its table.
pub fn judge(
    index: &UniqueIndex,
    parsed: &Parsed,
    neighbours: &[Neighbour<'_>],
    functions: &HashMap<u32, Function>,
    quoter: &Quoter,
) -> Option<Finding> {
    if index.nulls_not_distinct || index.primary_key {
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

    let key_sql: Vec<String> = index.keys.iter().map(|k| k.sql.clone()).collect();
    let patterns = possible_patterns(parsed, &nullable_positions, &facts);
    let cover = cover(
        index,
        parsed,
        &nullable_positions,
        &patterns,
        neighbours,
        &facts,
    );
    let every_key_possible = patterns.first() == Some(&0);
    let (severity, severity_reason) = match cover {
        // An index that compares nothing, "covered" only through keys it
        // does not have, most likely meant something else: inert.
        Some((reason, extra)) if every_key_possible || !extra => {
            let mut reason = reason;
            if !every_key_possible {
                reason.push_str(" This index itself rejects no row: every row has a NULL key.");
            }
            (Severity::Covered, Some(reason))
        }
        _ if every_key_possible => (Severity::Hole, None),
        _ => (
            Severity::Inert,
            Some(inert_reason(&key_sql, &nullable_positions)),
        ),
    };

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
    let compared: Vec<String> = index
        .keys
        .iter()
        .zip(&natural_collations)
        .map(|(key, natural)| key_compared(key, *natural))
        .collect();
    let key_definitions: Vec<String> = index
        .keys
        .iter()
        .zip(natural_collations)
        .map(|(key, natural)| key_definition(key, natural))
        .collect();
    let fix = if severity == Severity::Covered {
        Fix {
            partial_indexes_omitted: Some(
                "covered by other unique indexes: no fix needed".to_owned(),
            ),
            ..Fix::default()
        }
    } else {
        fixes(
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
                patterns: &patterns,
                include_sql: &index.include_sql,
                predicate_sql: index.predicate_sql.as_deref(),
                referenced_by_foreign_keys: index.referenced_by_foreign_keys,
            },
            quoter,
        )
    };
    let changes = if severity == Severity::Covered {
        String::new()
    } else {
        changes(&key_sql)
    };
    Some(Finding {
        lets_through: lets_through(&key_sql, &nullable_positions),
        notes: notes(
            index,
            &fix,
            &key_sql,
            &nullable_positions,
            every_key_possible,
        ),
        conflicts_sql: if severity == Severity::Covered {
            String::new()
        } else {
            conflicts_sql(index, &compared)
        },
        severity,
        severity_reason,
        changes,
        index: index.clone(),
        key_sql,
        nullable,
        fix,
    })
}

/// The NULL patterns (bit `j`: the `j`-th nullable key is NULL) a row of the
/// index can have, ascending. Past [`MAX_PATTERN_KEYS`] nullable keys, just
/// pattern 0: unproven, so a hole (no split is written out for that many).
fn possible_patterns(parsed: &Parsed, nullable: &[usize], facts: &Facts<'_>) -> Vec<u32> {
    if nullable.len() > MAX_PATTERN_KEYS {
        // Unproven: a hole. The split is not written out for this many.
        return vec![0];
    }
    (0u32..1 << nullable.len())
        .filter(|&pattern| {
            let (null, not_null) = pattern_keys(parsed, nullable, pattern);
            row_possible(
                &Given {
                    null: &null,
                    not_null: &not_null,
                },
                facts,
            )
        })
        .collect()
}

/// The nullable keys NULL in `pattern`, and those present.
fn pattern_keys<'p>(
    parsed: &'p Parsed,
    nullable: &[usize],
    pattern: u32,
) -> (Vec<&'p Expr>, Vec<&'p Expr>) {
    let mut null = Vec::new();
    let mut not_null = Vec::new();
    for (j, &position) in nullable.iter().enumerate() {
        let expr = &parsed.keys[position].0;
        if pattern & (1 << j) != 0 {
            null.push(expr);
        } else {
            not_null.push(expr);
        }
    }
    (null, not_null)
}

/// Why the index is covered, or `None` when some possible pattern with a
/// NULL has no other index that rejects its duplicates (see the module docs).
/// The flag: the cover needs keys the index does not have.
fn cover(
    index: &UniqueIndex,
    parsed: &Parsed,
    nullable: &[usize],
    patterns: &[u32],
    neighbours: &[Neighbour<'_>],
    facts: &Facts<'_>,
) -> Option<(String, bool)> {
    if nullable.len() > MAX_PATTERN_KEYS {
        return None;
    }
    let mut coverers: Vec<&str> = Vec::new();
    let mut extra_keys: Vec<&str> = Vec::new();
    let with_null: Vec<u32> = patterns.iter().copied().filter(|&p| p != 0).collect();
    if with_null.is_empty() {
        return None;
    }
    for pattern in with_null {
        let (null, not_null) = pattern_keys(parsed, nullable, pattern);
        let given = Given {
            null: &null,
            not_null: &not_null,
        };
        let key_is_null = |position: usize| {
            nullable
                .iter()
                .position(|&p| p == position)
                .is_some_and(|j| pattern & (1 << j) != 0)
        };
        let found = neighbours.iter().find_map(|n| {
            let other = n.index;
            if !other.valid
                || n.parsed
                    .predicate
                    .as_ref()
                    .is_some_and(|p| !holds_given(p, &given, facts))
            {
                return None;
            }
            let mut extras = Vec::new();
            for (key, (expr, _)) in other.keys.iter().zip(&n.parsed.keys) {
                let in_key = index
                    .keys
                    .iter()
                    .zip(&parsed.keys)
                    .position(|(_, (my_expr, _))| same(my_expr, expr));
                match in_key {
                    // Compared another way (a case-insensitive collation, an
                    // operator class of its own): proves nothing.
                    Some(position)
                        if index.keys[position].opclass != key.opclass
                            || index.keys[position].collation != key.collation =>
                    {
                        return None;
                    }
                    Some(position) if !key_is_null(position) || other.nulls_not_distinct => {}
                    Some(_) => return None,
                    // A key of its own counts only when it may be NULL in
                    // general yet is proven present in rows of this pattern:
                    // tied to the NULL keys by a CHECK. A NOT NULL key (a
                    // primary key's id) would "cover" every index trivially.
                    None if !why_nullable(expr, facts).is_empty()
                        && not_null_given(expr, &given, facts) =>
                    {
                        extras.push(key.sql.as_str());
                    }
                    None => return None,
                }
            }
            Some((
                other
                    .constraint
                    .as_ref()
                    .map_or(&other.index_sql, |c| &c.sql),
                extras,
            ))
        })?;
        let (name, extras) = found;
        if !coverers.contains(&name.as_str()) {
            coverers.push(name);
        }
        for extra in extras {
            if !extra_keys.contains(&extra) {
                extra_keys.push(extra);
            }
        }
    }
    let by = match coverers.as_slice() {
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
        [] => return None,
    };
    let extra = !extra_keys.is_empty();
    let reason = if extra_keys.is_empty() {
        format!(
            "Every duplicate it lets through is rejected by {by}: no two rows equal in ({}), \
             NULLs included, both get in.",
            index
                .keys
                .iter()
                .map(|k| k.sql.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        let all: Vec<&str> = index
            .keys
            .iter()
            .map(|k| k.sql.as_str())
            .chain(extra_keys.iter().copied())
            .collect();
        format!(
            "Together with {by}, no two rows equal in ({}), NULLs included, both get in: where a \
             key of this index is NULL, the table's CHECK constraints keep {} present, and {by} \
             rejects the duplicates. Rows equal in this index's keys alone but not in {} still \
             get in.",
            all.join(", "),
            extra_keys.join(", "),
            extra_keys.join(", "),
        )
    };
    Some((reason, extra))
}

/// Why an index whose rows all have a NULL key is inert.
fn inert_reason(key_sql: &[String], nullable: &[usize]) -> String {
    let keys: Vec<&str> = nullable.iter().map(|&p| key_sql[p].as_str()).collect();
    let all = match keys.as_slice() {
        [one] => format!("{one} present"),
        [a, b] => format!("{a} and {b} both present"),
        [init @ .., last] => format!("{} and {last} all present", init.join(", ")),
        [] => "every key present".to_owned(),
    };
    format!(
        "No row can have {all} (the table's CHECK constraints or the index predicate rule it \
         out), so this index never compares two rows: it rejects no row at all."
    )
}

/// The rows either fix rejects that the index accepts today.
fn changes(key_sql: &[String]) -> String {
    format!(
        "Either fix rejects rows the table accepts today: rows equal in ({}) with NULL in the \
         same keys. Building the new index fails while such rows exist; count their groups \
         first (0 means the fix applies):",
        key_sql.join(", ")
    )
}

/// The query counting the groups of rows (in the index's predicate) that
/// are equal in every key, NULLs included: `GROUP BY` treats NULLs as equal,
/// as both fixes do. Each key is compared under the index's collation.
fn conflicts_sql(index: &UniqueIndex, compared: &[String]) -> String {
    let predicate = index
        .predicate_sql
        .as_deref()
        .map(|p| format!(" WHERE {p}"))
        .unwrap_or_default();
    format!(
        "SELECT count(*) AS conflicting_groups FROM (SELECT 1 FROM {table}{predicate} \
         GROUP BY {keys} HAVING count(*) > 1) AS conflicts;",
        table = index.table_sql,
        keys = compared.join(", "),
    )
}

/// One key as `GROUP BY` should compare it: with the index's collation when
/// it differs from the key's own.
fn key_compared(key: &Key, natural_collation: Option<i64>) -> String {
    match &key.collation_sql {
        Some(collation) if key.collation != 0 && natural_collation != Some(key.collation) => {
            format!("{} COLLATE {collation}", key.sql)
        }
        _ => key.sql.clone(),
    }
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

/// What else to know before a fix. `every_key_possible`: some row can have
/// every key present, so the split has an index for such rows.
fn notes(
    index: &UniqueIndex,
    fix: &Fix,
    key_sql: &[String],
    nullable: &[usize],
    every_key_possible: bool,
) -> Vec<String> {
    let mut notes = Vec::new();
    if index.referenced_by_foreign_keys {
        notes.push(
            "Foreign keys use this index, so dropping it fails: drop them first and re-create \
             them once the new index exists."
                .to_owned(),
        );
    }
    if !fix.partial_indexes.is_empty() {
        let mut present: Vec<String> = nullable
            .iter()
            .map(|&p| format!("{} IS NOT NULL", key_sql[p]))
            .collect();
        if let Some(predicate) = &index.predicate_sql {
            present.push(format!("({predicate})"));
        }
        let by_constraint = index
            .constraint
            .as_ref()
            .map(|c| format!(" and ON CONFLICT ON CONSTRAINT {}", c.sql))
            .unwrap_or_default();
        let target = match &index.predicate_sql {
            None => format!("({})", key_sql.join(", ")),
            Some(predicate) => format!("({}) WHERE {predicate}", key_sql.join(", ")),
        };
        let instead = if every_key_possible {
            format!(
                "Name the index for rows without NULL instead, ON CONFLICT ({}) WHERE {}, or use \
                 the NULLS NOT DISTINCT fix",
                key_sql.join(", "),
                present.join(" AND ")
            )
        } else {
            "Use the NULLS NOT DISTINCT fix".to_owned()
        };
        notes.push(format!(
            "Upserts: after the split, INSERT ... ON CONFLICT {target}{by_constraint} fail \
             (\"there is no unique or exclusion constraint matching the ON CONFLICT \
             specification\"): no index matches {matches} any more. {instead}, which keeps \
             ON CONFLICT {target} working.",
            matches = if index.predicate_sql.is_some() {
                "those keys with exactly that predicate"
            } else {
                "those keys without a predicate"
            },
        ));
        if index.constraint.as_ref().is_some_and(|c| c.deferrable) {
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
            opclass: 0,
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
