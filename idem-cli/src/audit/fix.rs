//! The SQL that closes a NULL hole, two ways.
//!
//! Both make NULL count as a value: rows whose keys are equal, NULLs
//! included, collide.
//!
//! 1. `NULLS NOT DISTINCT` (PostgreSQL 15+): build the new index beside the
//!    old one, drop the old one, give the new one the old name. A constraint
//!    is dropped and re-added in one `ALTER TABLE`, which holds an
//!    `ACCESS EXCLUSIVE` lock while it builds; so for a constraint the
//!    non-blocking form comes too: `CREATE UNIQUE INDEX CONCURRENTLY`, then
//!    one `ALTER TABLE` that swaps the constraint onto it
//!    (`ADD CONSTRAINT ... UNIQUE USING INDEX`) and builds nothing.
//! 2. The split, for any version: one partial unique index per pattern of
//!    NULLs among the nullable keys, each over the keys that are not NULL in
//!    that pattern (a constant `(true)` when none is), the existing predicate
//!    AND-ed to each. A pattern no row can have (the table's `CHECK`
//!    constraints rule it out) gets no index: it could never match a row.
//!    With `n` nullable keys that is up to `2^n` indexes, so the split is
//!    offered up to [`MAX_SPLIT_KEYS`] of them.
//!
//! Each form says which lock it takes ([`Locks`]).
//!
//! Kept from the old index: access method, key order, collations, operator
//! classes, `DESC`/`NULLS FIRST|LAST`, `INCLUDE` columns, the predicate,
//! `DEFERRABLE`. Not kept: storage parameters (`WITH (...)`) and tablespace.

use super::quote::{Quoter, name_with_suffix};

/// The most nullable keys the split is written out for (8 indexes).
pub const MAX_SPLIT_KEYS: usize = 3;

/// What the fixes need to know about the index.
#[derive(Debug, Clone)]
pub struct FixInput<'a> {
    /// `schema`, quoted.
    pub schema_sql: &'a str,
    /// `schema.table`, quoted.
    pub table_sql: &'a str,
    /// Partitioned tables refuse `CONCURRENTLY`.
    pub table_is_partitioned: bool,
    /// The index (or constraint) name as in the catalog: new names derive
    /// from it.
    pub name: &'a str,
    /// The index name, quoted.
    pub index_sql: &'a str,
    /// The constraint, if the index backs one.
    pub constraint: Option<ConstraintInput<'a>>,
    /// The access method, quoted.
    pub method_sql: &'a str,
    /// Each key's full definition (collation, operator class, order).
    pub key_definitions: &'a [String],
    /// Each key as an expression (for `IS NULL` tests).
    pub key_sql: &'a [String],
    /// Positions (into the keys) of the nullable keys, in key order.
    pub nullable: &'a [usize],
    /// The NULL patterns a row can have, ascending (bit `j` set: the `j`-th
    /// nullable key is NULL): the split writes one index for each.
    pub patterns: &'a [u32],
    /// `INCLUDE` columns, quoted.
    pub include_sql: &'a [String],
    /// The existing predicate, as SQL.
    pub predicate_sql: Option<&'a str>,
    /// A foreign key uses the index.
    pub referenced_by_foreign_keys: bool,
}

/// The constraint an index backs.
#[derive(Debug, Clone, Copy)]
pub struct ConstraintInput<'a> {
    /// Quoted.
    pub sql: &'a str,
    /// `DEFERRABLE`.
    pub deferrable: bool,
    /// `INITIALLY DEFERRED`.
    pub initially_deferred: bool,
}

/// Both fixes, each a list of statements to run one at a time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fix {
    /// PostgreSQL 15+.
    pub nulls_not_distinct: Vec<String>,
    /// PostgreSQL 15+, for a constraint on a table that is not partitioned:
    /// the same change without an `ACCESS EXCLUSIVE` lock during the build.
    /// Empty otherwise (an index's fix is already built `CONCURRENTLY`).
    pub nulls_not_distinct_without_blocking: Vec<String>,
    /// Any version; empty when [`Fix::partial_indexes_omitted`] says why.
    pub partial_indexes: Vec<String>,
    /// Why there is no split.
    pub partial_indexes_omitted: Option<String>,
    /// The lock each form takes.
    pub locks: Locks,
}

/// The lock each form of the fix takes on the table, in one sentence each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Locks {
    /// For [`Fix::nulls_not_distinct`] (`None` when there is no fix).
    pub nulls_not_distinct: Option<String>,
    /// For [`Fix::nulls_not_distinct_without_blocking`], when there is one.
    pub nulls_not_distinct_without_blocking: Option<String>,
    /// For [`Fix::partial_indexes`], when there is a split.
    pub partial_indexes: Option<String>,
}

/// `CREATE`/`DROP INDEX CONCURRENTLY`'s lock.
const CONCURRENT_BUILD: &str = "SHARE UPDATE EXCLUSIVE: reads and writes go on while \
    the index builds (CONCURRENTLY cannot run inside a transaction block: run each statement \
    on its own)";
/// A partitioned table's `CREATE INDEX`.
const PARTITIONED_BUILD: &str = "SHARE on the table and every partition while the index \
    builds: writes wait, reads go on (a partitioned table refuses CONCURRENTLY)";

/// Both fixes for `input`.
pub fn fixes(input: &FixInput<'_>, quoter: &Quoter) -> Fix {
    let (partial_indexes, partial_indexes_omitted) = match split_refusal(input) {
        Some(why) => (Vec::new(), Some(why)),
        None => (split(input, quoter), None),
    };
    let nulls_not_distinct_without_blocking = match input.constraint {
        Some(constraint) if !input.table_is_partitioned => {
            swap_onto_concurrent_index(input, constraint, quoter)
        }
        _ => Vec::new(),
    };
    Fix {
        locks: locks(
            input,
            !nulls_not_distinct_without_blocking.is_empty(),
            !partial_indexes.is_empty(),
        ),
        nulls_not_distinct: nulls_not_distinct(input, quoter),
        nulls_not_distinct_without_blocking,
        partial_indexes,
        partial_indexes_omitted,
    }
}

fn locks(input: &FixInput<'_>, without_blocking: bool, split: bool) -> Locks {
    let build = if input.table_is_partitioned {
        PARTITIONED_BUILD
    } else {
        CONCURRENT_BUILD
    };
    let nulls_not_distinct = if input.constraint.is_some() {
        "ACCESS EXCLUSIVE for the whole ALTER TABLE, which builds the new index: reads and \
         writes of the table wait until it is done"
            .to_owned()
    } else if input.table_is_partitioned {
        format!("{build}; DROP INDEX takes ACCESS EXCLUSIVE, briefly")
    } else {
        format!("{build}; DROP INDEX CONCURRENTLY and the RENAME take the same lock")
    };
    let last = if input.constraint.is_some() {
        "the closing ALTER TABLE takes ACCESS EXCLUSIVE only for a moment, as it builds nothing"
    } else if input.table_is_partitioned {
        "DROP INDEX takes ACCESS EXCLUSIVE, briefly"
    } else {
        "DROP INDEX CONCURRENTLY takes the same lock"
    };
    Locks {
        nulls_not_distinct: Some(nulls_not_distinct),
        nulls_not_distinct_without_blocking: without_blocking.then(|| {
            format!(
                "{CONCURRENT_BUILD}; the closing ALTER TABLE takes ACCESS EXCLUSIVE only for a \
                 moment, as it builds nothing"
            )
        }),
        partial_indexes: split.then(|| format!("{build}; {last}")),
    }
}

/// The constraint's `NULLS NOT DISTINCT` fix without the long lock: build
/// the index `CONCURRENTLY`, then swap the constraint onto it. The new index
/// takes the constraint's name as it becomes the constraint's.
fn swap_onto_concurrent_index(
    input: &FixInput<'_>,
    constraint: ConstraintInput<'_>,
    quoter: &Quoter,
) -> Vec<String> {
    let new = quoter.quote(&name_with_suffix(input.name, "_nnd"));
    vec![
        format!(
            "CREATE UNIQUE INDEX CONCURRENTLY {new} ON {table} USING {method} ({columns}){include} \
             NULLS NOT DISTINCT;",
            table = input.table_sql,
            method = input.method_sql,
            columns = input.key_definitions.join(", "),
            include = include(input),
        ),
        format!(
            "ALTER TABLE {table} DROP CONSTRAINT {c}, ADD CONSTRAINT {c} UNIQUE USING INDEX \
             {new}{deferrable};",
            table = input.table_sql,
            c = constraint.sql,
            deferrable = deferrable(constraint),
        ),
    ]
}

fn deferrable(constraint: ConstraintInput<'_>) -> &'static str {
    match (constraint.deferrable, constraint.initially_deferred) {
        (false, _) => "",
        (true, false) => " DEFERRABLE",
        (true, true) => " DEFERRABLE INITIALLY DEFERRED",
    }
}

fn concurrently(input: &FixInput<'_>) -> &'static str {
    if input.table_is_partitioned {
        ""
    } else {
        "CONCURRENTLY "
    }
}

fn include(input: &FixInput<'_>) -> String {
    if input.include_sql.is_empty() {
        String::new()
    } else {
        format!(" INCLUDE ({})", input.include_sql.join(", "))
    }
}

fn nulls_not_distinct(input: &FixInput<'_>, quoter: &Quoter) -> Vec<String> {
    let columns = input.key_definitions.join(", ");
    let include = include(input);
    if let Some(constraint) = input.constraint {
        let deferrable = deferrable(constraint);
        return vec![format!(
            "ALTER TABLE {table} DROP CONSTRAINT {c}, ADD CONSTRAINT {c} \
             UNIQUE NULLS NOT DISTINCT ({columns}){include}{deferrable};",
            table = input.table_sql,
            c = constraint.sql,
        )];
    }
    let new = quoter.quote(&name_with_suffix(input.name, "_nnd"));
    let predicate = input
        .predicate_sql
        .map(|p| format!(" WHERE {p}"))
        .unwrap_or_default();
    let concurrently = concurrently(input);
    vec![
        format!(
            "CREATE UNIQUE INDEX {concurrently}{new} ON {table} USING {method} ({columns}){include} \
             NULLS NOT DISTINCT{predicate};",
            table = input.table_sql,
            method = input.method_sql,
        ),
        format!(
            "DROP INDEX {concurrently}{schema}.{old};",
            schema = input.schema_sql,
            old = input.index_sql,
        ),
        format!(
            "ALTER INDEX {schema}.{new} RENAME TO {old};",
            schema = input.schema_sql,
            old = input.index_sql,
        ),
    ]
}

fn split_refusal(input: &FixInput<'_>) -> Option<String> {
    if input.referenced_by_foreign_keys {
        return Some(
            "a foreign key references it, and a foreign key needs a unique index without a \
             predicate: use NULLS NOT DISTINCT, or make the columns NOT NULL"
                .to_owned(),
        );
    }
    let n = input.nullable.len();
    (n > MAX_SPLIT_KEYS).then(|| {
        format!(
            "{n} nullable keys would need 2^{n} = {} partial indexes: use NULLS NOT DISTINCT, \
             or make some of the columns NOT NULL",
            1u64 << n.min(63)
        )
    })
}

fn split(input: &FixInput<'_>, quoter: &Quoter) -> Vec<String> {
    let include = include(input);
    let concurrently = concurrently(input);
    let nullable = input.nullable;
    let mut statements = Vec::with_capacity(input.patterns.len() + 1);
    // Pattern bit j set: the j-th nullable key IS NULL. Pattern 0, every key
    // present, comes first: it is the index most rows live in.
    for &pattern in input.patterns {
        let is_null = |j: usize| pattern & (1 << j) != 0;
        let columns: Vec<&str> = input
            .key_definitions
            .iter()
            .enumerate()
            .filter(|(position, _)| {
                nullable
                    .iter()
                    .position(|p| p == position)
                    .is_none_or(|j| !is_null(j))
            })
            .map(|(_, definition)| definition.as_str())
            .collect();
        let columns = if columns.is_empty() {
            // Every key is NULL in this pattern: at most one such row.
            "(true)".to_owned()
        } else {
            columns.join(", ")
        };
        let mut conditions: Vec<String> = nullable
            .iter()
            .enumerate()
            .map(|(j, &position)| {
                let test = if is_null(j) { "IS NULL" } else { "IS NOT NULL" };
                format!("{} {test}", input.key_sql[position])
            })
            .collect();
        if let Some(predicate) = input.predicate_sql {
            conditions.push(format!("({predicate})"));
        }
        let bits: String = (0..nullable.len())
            .map(|j| if is_null(j) { '1' } else { '0' })
            .collect();
        let name = quoter.quote(&name_with_suffix(input.name, &format!("_n{bits}")));
        statements.push(format!(
            "CREATE UNIQUE INDEX {concurrently}{name} ON {table} USING {method} ({columns}){include} \
             WHERE {conditions};",
            table = input.table_sql,
            method = input.method_sql,
            conditions = conditions.join(" AND "),
        ));
    }
    statements.push(match input.constraint {
        Some(constraint) => format!(
            "ALTER TABLE {} DROP CONSTRAINT {};",
            input.table_sql, constraint.sql
        ),
        None => format!(
            "DROP INDEX {concurrently}{}.{};",
            input.schema_sql, input.index_sql
        ),
    });
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(keys: &'a [String], nullable: &'a [usize]) -> FixInput<'a> {
        FixInput {
            schema_sql: "public",
            table_sql: "public.users",
            table_is_partitioned: false,
            name: "users_email_key",
            index_sql: "users_email_key",
            constraint: None,
            method_sql: "btree",
            key_definitions: keys,
            key_sql: keys,
            nullable,
            patterns: &ALL_PATTERNS[..1 << nullable.len()],
            include_sql: &[],
            predicate_sql: None,
            referenced_by_foreign_keys: false,
        }
    }

    const ALL_PATTERNS: [u32; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn one_nullable_column_alone_splits_into_a_constant_index_for_its_null() {
        let keys = strings(&["email"]);
        let fix = fixes(&input(&keys, &[0]), &Quoter::default());
        assert_eq!(
            fix.nulls_not_distinct,
            strings(&[
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_nnd ON public.users USING btree (email) NULLS NOT DISTINCT;",
                "DROP INDEX CONCURRENTLY public.users_email_key;",
                "ALTER INDEX public.users_email_key_nnd RENAME TO users_email_key;",
            ])
        );
        assert_eq!(
            fix.partial_indexes,
            strings(&[
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n0 ON public.users USING btree (email) WHERE email IS NOT NULL;",
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n1 ON public.users USING btree ((true)) WHERE email IS NULL;",
                "DROP INDEX CONCURRENTLY public.users_email_key;",
            ])
        );
        assert_eq!(fix.partial_indexes_omitted, None);
    }

    #[test]
    fn several_nullable_keys_give_one_index_per_null_pattern_and_keep_the_predicate() {
        let keys = strings(&["account", "a", "lower(b)"]);
        let mut fix_input = input(&keys, &[1, 2]);
        fix_input.predicate_sql = Some("deleted_at IS NULL OR archived");
        fix_input.include_sql = &[];
        let fix = fixes(&fix_input, &Quoter::default());
        let creates: Vec<&String> = fix.partial_indexes.iter().take(4).collect();
        assert_eq!(
            creates,
            [
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n00 ON public.users USING btree (account, a, lower(b)) WHERE a IS NOT NULL AND lower(b) IS NOT NULL AND (deleted_at IS NULL OR archived);",
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n10 ON public.users USING btree (account, lower(b)) WHERE a IS NULL AND lower(b) IS NOT NULL AND (deleted_at IS NULL OR archived);",
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n01 ON public.users USING btree (account, a) WHERE a IS NOT NULL AND lower(b) IS NULL AND (deleted_at IS NULL OR archived);",
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n11 ON public.users USING btree (account) WHERE a IS NULL AND lower(b) IS NULL AND (deleted_at IS NULL OR archived);",
            ]
        );
        assert_eq!(fix.partial_indexes.len(), 5);
        assert!(
            fix.nulls_not_distinct[0]
                .ends_with("NULLS NOT DISTINCT WHERE deleted_at IS NULL OR archived;")
        );
    }

    #[test]
    fn constraints_are_swapped_in_one_alter_table_keeping_deferrability() {
        let keys = strings(&["code"]);
        let mut fix_input = input(&keys, &[0]);
        fix_input.constraint = Some(ConstraintInput {
            sql: "\"Codes Key\"",
            deferrable: true,
            initially_deferred: true,
        });
        fix_input.include_sql = &[];
        let fix = fixes(&fix_input, &Quoter::default());
        assert_eq!(
            fix.nulls_not_distinct,
            strings(&[
                "ALTER TABLE public.users DROP CONSTRAINT \"Codes Key\", ADD CONSTRAINT \"Codes Key\" UNIQUE NULLS NOT DISTINCT (code) DEFERRABLE INITIALLY DEFERRED;"
            ])
        );
        assert_eq!(
            fix.partial_indexes.last().map(String::as_str),
            Some("ALTER TABLE public.users DROP CONSTRAINT \"Codes Key\";")
        );
    }

    #[test]
    fn partitioned_tables_get_no_concurrently_and_new_names_are_quoted() {
        let keys = strings(&["tenant", "\"Ext Id\""]);
        let mut fix_input = input(&keys, &[1]);
        fix_input.table_is_partitioned = true;
        fix_input.name = "Events \"Ext\"";
        fix_input.index_sql = "\"Events \"\"Ext\"\"\"";
        let fix = fixes(&fix_input, &Quoter::default());
        assert_eq!(
            fix.nulls_not_distinct[0],
            "CREATE UNIQUE INDEX \"Events \"\"Ext\"\"_nnd\" ON public.users USING btree (tenant, \"Ext Id\") NULLS NOT DISTINCT;"
        );
        assert_eq!(
            fix.partial_indexes[1],
            "CREATE UNIQUE INDEX \"Events \"\"Ext\"\"_n1\" ON public.users USING btree (tenant) WHERE \"Ext Id\" IS NULL;"
        );
    }

    #[test]
    fn the_split_is_refused_past_three_nullable_keys_or_under_a_foreign_key() {
        let keys = strings(&["a", "b", "c", "d"]);
        let fix = fixes(&input(&keys, &[0, 1, 2, 3]), &Quoter::default());
        assert!(fix.partial_indexes.is_empty());
        assert!(
            fix.partial_indexes_omitted
                .as_deref()
                .is_some_and(|why| why.contains("16 partial indexes"))
        );
        let three = fixes(&input(&keys, &[0, 1, 2]), &Quoter::default());
        assert_eq!(three.partial_indexes.len(), 9);

        let mut referenced = input(&keys, &[0]);
        referenced.referenced_by_foreign_keys = true;
        let fix = fixes(&referenced, &Quoter::default());
        assert!(fix.partial_indexes.is_empty());
        assert!(
            fix.partial_indexes_omitted
                .as_deref()
                .is_some_and(|why| why.contains("foreign key"))
        );
    }

    #[test]
    fn include_columns_are_kept() {
        let keys = strings(&["a"]);
        let include = strings(&["payload"]);
        let mut fix_input = input(&keys, &[0]);
        fix_input.include_sql = &include;
        let fix = fixes(&fix_input, &Quoter::default());
        assert!(fix.nulls_not_distinct[0].contains("(a) INCLUDE (payload) NULLS NOT DISTINCT;"));
        assert!(fix.partial_indexes[0].contains("(a) INCLUDE (payload) WHERE a IS NOT NULL;"));
    }

    #[test]
    fn the_split_writes_an_index_only_for_the_patterns_a_row_can_have() {
        let keys = strings(&["a", "b"]);
        let mut fix_input = input(&keys, &[0, 1]);
        fix_input.patterns = &[1, 2];
        let fix = fixes(&fix_input, &Quoter::default());
        assert_eq!(
            fix.partial_indexes,
            strings(&[
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n10 ON public.users USING btree (b) WHERE a IS NULL AND b IS NOT NULL;",
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_n01 ON public.users USING btree (a) WHERE a IS NOT NULL AND b IS NULL;",
                "DROP INDEX CONCURRENTLY public.users_email_key;",
            ])
        );
    }

    #[test]
    fn a_constraint_also_gets_the_form_built_concurrently_except_on_a_partitioned_table() {
        let keys = strings(&["code"]);
        let mut fix_input = input(&keys, &[0]);
        fix_input.constraint = Some(ConstraintInput {
            sql: "codes_code_key",
            deferrable: true,
            initially_deferred: false,
        });
        let fix = fixes(&fix_input, &Quoter::default());
        assert_eq!(
            fix.nulls_not_distinct_without_blocking,
            strings(&[
                "CREATE UNIQUE INDEX CONCURRENTLY users_email_key_nnd ON public.users USING btree (code) NULLS NOT DISTINCT;",
                "ALTER TABLE public.users DROP CONSTRAINT codes_code_key, ADD CONSTRAINT codes_code_key UNIQUE USING INDEX users_email_key_nnd DEFERRABLE;",
            ])
        );
        assert!(
            fix.locks
                .nulls_not_distinct
                .as_deref()
                .is_some_and(|l| l.starts_with("ACCESS EXCLUSIVE"))
        );
        assert!(fix.locks.nulls_not_distinct_without_blocking.is_some());

        fix_input.table_is_partitioned = true;
        let fix = fixes(&fix_input, &Quoter::default());
        assert!(fix.nulls_not_distinct_without_blocking.is_empty());
        assert_eq!(fix.locks.nulls_not_distinct_without_blocking, None);
        assert!(
            fix.locks
                .partial_indexes
                .as_deref()
                .is_some_and(|l| l.contains("writes wait"))
        );
        let index = fixes(&input(&keys, &[0]), &Quoter::default());
        assert!(index.nulls_not_distinct_without_blocking.is_empty());
    }
}
