//! What the audit reads from PostgreSQL's catalog: every unique index and
//! unique constraint in the audited schemas, the functions their expressions
//! call, and the server's keywords.
//!
//! Existing names come back quoted by the server (`quote_ident`), so they are
//! exactly as PostgreSQL would spell them in SQL. Expressions come back twice:
//! as SQL for people (`pg_get_indexdef`, `pg_get_expr`) and as the stored node
//! tree for the proofs (see [`node_tree`](super::node_tree)).

use std::collections::HashMap;

use serde::Deserialize;
use sqlx::{PgPool, Row};

use super::nullability::{Function, Known, NEVER_NULL_FUNCTIONS};

/// One unique index, or the index behind one unique constraint.
#[derive(Debug, Clone)]
pub struct UniqueIndex {
    /// The schema, exactly as in the catalog (unquoted).
    pub schema_name: String,
    /// The table, exactly as in the catalog (unquoted).
    pub table_name: String,
    /// The schema, quoted for SQL.
    pub schema_sql: String,
    /// `schema.table`, quoted for SQL.
    pub table_sql: String,
    /// The table's OID: other unique indexes of the same table may cover
    /// this one's NULL rows.
    pub table_oid: i64,
    /// The table is partitioned: its indexes cannot be built `CONCURRENTLY`.
    pub table_is_partitioned: bool,
    /// The primary key: never a finding, but it rejects duplicates that
    /// other indexes let through.
    pub primary_key: bool,
    /// `pg_index.indisvalid`: an index left invalid by a failed
    /// `CREATE INDEX CONCURRENTLY` is not trusted to reject anything.
    pub valid: bool,
    /// The index, exactly as in the catalog (unquoted).
    pub index_name: String,
    /// The index, quoted for SQL (unqualified).
    pub index_sql: String,
    /// The unique constraint the index backs, if any.
    pub constraint: Option<Constraint>,
    /// `pg_get_indexdef`, or `pg_get_constraintdef` for a constraint.
    pub definition: String,
    /// The access method, quoted (`btree` for every core unique index).
    pub method_sql: String,
    /// Declared `NULLS NOT DISTINCT` (PostgreSQL 15+; always `false` before).
    pub nulls_not_distinct: bool,
    /// The key columns and expressions, in order; `INCLUDE` columns excluded.
    pub keys: Vec<Key>,
    /// The `INCLUDE` columns, quoted.
    pub include_sql: Vec<String>,
    /// Every column of the table.
    pub columns: Vec<TableColumn>,
    /// `pg_index.indexprs` as text: one tree per expression key, in order.
    pub expressions_tree: Option<String>,
    /// `pg_index.indpred` as text.
    pub predicate_tree: Option<String>,
    /// The predicate as SQL.
    pub predicate_sql: Option<String>,
    /// The table's validated `CHECK` constraints (`conbin` as text).
    pub checks_tree: Vec<String>,
    /// A foreign key uses this index.
    pub referenced_by_foreign_keys: bool,
}

/// A unique constraint, by name.
#[derive(Debug, Clone)]
pub struct Constraint {
    /// Exactly as in the catalog (unquoted).
    pub name: String,
    /// Quoted for SQL.
    pub sql: String,
    /// `DEFERRABLE`.
    pub deferrable: bool,
    /// `INITIALLY DEFERRED`.
    pub initially_deferred: bool,
}

/// One key column or expression of an index.
#[derive(Debug, Clone, Deserialize)]
pub struct Key {
    /// The table column's number, 0 for an expression.
    pub attnum: i16,
    /// The column (quoted) or the expression, as `pg_get_indexdef` prints it
    /// for one index column: bare for a column or function call, in
    /// parentheses otherwise, so it can stand in an index definition.
    pub sql: String,
    /// The index's collation for this key, 0 if none.
    pub collation: i64,
    /// The operator class's OID: two indexes compare a key the same way
    /// when they share it and the collation.
    pub opclass: i64,
    /// That collation, qualified and quoted.
    pub collation_sql: Option<String>,
    /// The operator class, qualified and quoted, when it is not the default
    /// PostgreSQL would pick again.
    pub opclass_sql: Option<String>,
    /// `DESC`.
    pub descending: bool,
    /// `NULLS FIRST` (the default with `DESC`).
    pub nulls_first: bool,
}

/// A column of the indexed table.
#[derive(Debug, Clone, Deserialize)]
pub struct TableColumn {
    /// Its attribute number.
    pub attnum: i16,
    /// Its name, quoted.
    pub sql: String,
    /// Declared `NOT NULL`.
    pub not_null: bool,
    /// Its collation, 0 if none.
    pub collation: i64,
}

/// Facts about the server that shape the queries and the quoting.
#[derive(Debug, Clone)]
pub struct Server {
    /// `pg_index.indnullsnotdistinct` exists (PostgreSQL 15+).
    pub has_nulls_not_distinct: bool,
    /// `server_version`, e.g. `15.19 (Debian 15.19-0+deb12u1)`: for messages.
    pub version: String,
    /// Keywords the server does not list as unreserved.
    pub keywords: Vec<String>,
}

/// Reads the [`Server`] facts.
pub async fn server(pool: &PgPool) -> Result<Server, sqlx::Error> {
    let row = sqlx::query(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute \
                        WHERE attrelid = 'pg_catalog.pg_index'::regclass \
                          AND attname = 'indnullsnotdistinct') AS has_nnd, \
                current_setting('server_version') AS version, \
                ARRAY(SELECT word::text FROM pg_get_keywords() WHERE catcode <> 'U') AS keywords",
    )
    .fetch_one(pool)
    .await?;
    Ok(Server {
        has_nulls_not_distinct: row.try_get("has_nnd")?,
        version: row.try_get("version")?,
        keywords: row.try_get("keywords")?,
    })
}

/// The schemas among `wanted` that do not exist.
pub async fn missing_schemas(pool: &PgPool, wanted: &[String]) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT s FROM unnest($1::text[]) WITH ORDINALITY AS w(s, n) \
         WHERE NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = s) ORDER BY n",
    )
    .bind(wanted)
    .fetch_all(pool)
    .await
}

/// The schemas an audit without `--schema` covers, in order.
pub async fn default_schemas(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace \
         WHERE nspname NOT IN ('pg_catalog', 'information_schema') \
           AND nspname NOT LIKE 'pg\\_toast%' AND nspname NOT LIKE 'pg\\_temp\\_%' \
         ORDER BY nspname",
    )
    .fetch_all(pool)
    .await
}

/// The catalog query, with `$nnd` standing for the `NULLS NOT DISTINCT` flag:
/// the column exists only from PostgreSQL 15, so older servers get `false`.
macro_rules! unique_indexes_query {
    ($nnd:literal) => {
        concat!(
            "SELECT n.nspname::text AS schema_name,
                    t.relname::text AS table_name,
                    quote_ident(n.nspname) AS schema_sql,
                    quote_ident(n.nspname) || '.' || quote_ident(t.relname) AS table_sql,
                    t.oid::int8 AS table_oid,
                    t.relkind = 'p' AS table_is_partitioned,
                    i.indisprimary AS primary_key,
                    i.indisvalid AS valid,
                    ic.relname::text AS index_name,
                    quote_ident(ic.relname) AS index_sql,
                    con.conname::text AS constraint_name,
                    quote_ident(con.conname) AS constraint_sql,
                    coalesce(con.condeferrable, false) AS deferrable,
                    coalesce(con.condeferred, false) AS initially_deferred,
                    coalesce(pg_get_constraintdef(con.oid, true),
                             pg_get_indexdef(i.indexrelid)) AS definition,
                    quote_ident(am.amname) AS method_sql,
                    ",
            $nnd,
            " AS nulls_not_distinct,
                    (SELECT json_agg(json_build_object(
                                'attnum', i.indkey[k - 1],
                                'sql', pg_get_indexdef(i.indexrelid, k, true),
                                'collation', i.indcollation[k - 1]::int8,
                                'opclass', i.indclass[k - 1]::int8,
                                'collation_sql',
                                    (SELECT quote_ident(cn.nspname) || '.' || quote_ident(c.collname)
                                     FROM pg_collation c
                                     JOIN pg_namespace cn ON cn.oid = c.collnamespace
                                     WHERE c.oid = i.indcollation[k - 1]),
                                -- Omitted when PostgreSQL would choose it again:
                                -- the default class for exactly the key's type,
                                -- or the default it reaches when the type has
                                -- none of its own (varchar -> text_ops).
                                'opclass_sql',
                                    (SELECT CASE
                                         WHEN opc.opcdefault
                                              AND (opc.opcintype = ia.atttypid
                                                   OR NOT EXISTS (
                                                       SELECT 1 FROM pg_opclass d
                                                       WHERE d.opcmethod = opc.opcmethod
                                                         AND d.opcdefault
                                                         AND d.opcintype = ia.atttypid))
                                         THEN NULL
                                         ELSE quote_ident(ocn.nspname) || '.' || quote_ident(opc.opcname)
                                     END
                                     FROM pg_opclass opc
                                     JOIN pg_namespace ocn ON ocn.oid = opc.opcnamespace
                                     WHERE opc.oid = i.indclass[k - 1]),
                                'descending', (i.indoption[k - 1] & 1) <> 0,
                                'nulls_first', (i.indoption[k - 1] & 2) <> 0)
                            ORDER BY k)
                     FROM generate_series(1, i.indnkeyatts) AS k
                     JOIN pg_attribute ia ON ia.attrelid = i.indexrelid AND ia.attnum = k
                    )::text AS keys,
                    ARRAY(SELECT quote_ident(a.attname)
                          FROM generate_series(i.indnkeyatts + 1, i.indnatts) AS k
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k - 1]
                          ORDER BY k) AS include_sql,
                    (SELECT json_agg(json_build_object(
                                'attnum', a.attnum,
                                'sql', quote_ident(a.attname),
                                'not_null', a.attnotnull,
                                'collation', a.attcollation::int8))
                     FROM pg_attribute a
                     WHERE a.attrelid = i.indrelid AND a.attnum > 0 AND NOT a.attisdropped
                    )::text AS columns,
                    i.indexprs::text AS expressions_tree,
                    i.indpred::text AS predicate_tree,
                    pg_get_expr(i.indpred, i.indrelid, true) AS predicate_sql,
                    ARRAY(SELECT ck.conbin::text FROM pg_constraint ck
                          WHERE ck.conrelid = i.indrelid AND ck.contype = 'c'
                            AND ck.convalidated
                          ORDER BY ck.conname) AS checks_tree,
                    EXISTS (SELECT 1 FROM pg_constraint f
                            WHERE f.contype = 'f' AND f.conindid = i.indexrelid)
                        AS referenced_by_foreign_keys
             FROM pg_index i
             JOIN pg_class ic ON ic.oid = i.indexrelid
             JOIN pg_class t ON t.oid = i.indrelid
             JOIN pg_namespace n ON n.oid = t.relnamespace
             JOIN pg_am am ON am.oid = ic.relam
             LEFT JOIN pg_constraint con
                    ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
                   AND con.contype = 'u'
             -- Primary keys come too: never findings, but they reject
             -- duplicates the other indexes let through.
             WHERE i.indisunique
               -- A partition's copy of a partitioned index is reported once,
               -- through its parent.
               AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
               AND n.nspname = ANY ($1::text[])
             ORDER BY n.nspname, t.relname, coalesce(con.conname, ic.relname)"
        )
    };
}

const UNIQUE_INDEXES_SINCE_15: &str = unique_indexes_query!("i.indnullsnotdistinct");
const UNIQUE_INDEXES_BEFORE_15: &str = unique_indexes_query!("false");

/// Every unique index, unique constraint and primary key on tables in
/// `schemas`.
pub async fn unique_indexes(
    pool: &PgPool,
    server: &Server,
    schemas: &[String],
) -> Result<Vec<UniqueIndex>, sqlx::Error> {
    let query = if server.has_nulls_not_distinct {
        UNIQUE_INDEXES_SINCE_15
    } else {
        UNIQUE_INDEXES_BEFORE_15
    };
    let rows = sqlx::query(query).bind(schemas).fetch_all(pool).await?;
    rows.iter().map(unique_index).collect()
}

fn unique_index(row: &sqlx::postgres::PgRow) -> Result<UniqueIndex, sqlx::Error> {
    let constraint = match (
        row.try_get::<Option<String>, _>("constraint_name")?,
        row.try_get::<Option<String>, _>("constraint_sql")?,
    ) {
        (Some(name), Some(sql)) => Some(Constraint {
            name,
            sql,
            deferrable: row.try_get("deferrable")?,
            initially_deferred: row.try_get("initially_deferred")?,
        }),
        _ => None,
    };
    Ok(UniqueIndex {
        schema_name: row.try_get("schema_name")?,
        table_name: row.try_get("table_name")?,
        schema_sql: row.try_get("schema_sql")?,
        table_sql: row.try_get("table_sql")?,
        table_oid: row.try_get("table_oid")?,
        table_is_partitioned: row.try_get("table_is_partitioned")?,
        primary_key: row.try_get("primary_key")?,
        valid: row.try_get("valid")?,
        index_name: row.try_get("index_name")?,
        index_sql: row.try_get("index_sql")?,
        constraint,
        definition: row.try_get("definition")?,
        method_sql: row.try_get("method_sql")?,
        nulls_not_distinct: row.try_get("nulls_not_distinct")?,
        keys: json_column(row, "keys")?,
        include_sql: row.try_get("include_sql")?,
        columns: json_column(row, "columns")?,
        expressions_tree: row.try_get("expressions_tree")?,
        predicate_tree: row.try_get("predicate_tree")?,
        predicate_sql: row.try_get("predicate_sql")?,
        checks_tree: row.try_get("checks_tree")?,
        referenced_by_foreign_keys: row.try_get("referenced_by_foreign_keys")?,
    })
}

/// A `json_agg(...)::text` column; NULL (no rows) is an empty list.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &sqlx::postgres::PgRow,
    column: &str,
) -> Result<Vec<T>, sqlx::Error> {
    match row.try_get::<Option<String>, _>(column)? {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text).map_err(|source| sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: Box::new(source),
        }),
    }
}

/// What [`nullability`](super::nullability) needs to know about `oids`.
pub async fn functions(pool: &PgPool, oids: &[u32]) -> Result<HashMap<u32, Function>, sqlx::Error> {
    let oids: Vec<i64> = oids.iter().map(|&oid| i64::from(oid)).collect();
    let rows = sqlx::query(
        "SELECT p.oid::int8 AS oid, p.proisstrict AS strict, \
                n.nspname = 'pg_catalog' AS builtin, \
                p.proname::text || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')' AS signature \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE p.oid::int8 = ANY ($1::int8[])",
    )
    .bind(&oids)
    .fetch_all(pool)
    .await?;
    let mut functions = HashMap::new();
    for row in rows {
        let oid: i64 = row.try_get("oid")?;
        let Ok(oid) = u32::try_from(oid) else {
            continue;
        };
        let signature: String = row.try_get("signature")?;
        let builtin: bool = row.try_get("builtin")?;
        functions.insert(
            oid,
            Function {
                known: builtin.then(|| Known::of(&signature)).flatten(),
                never_null: builtin && NEVER_NULL_FUNCTIONS.contains(&signature.as_str()),
                strict: row.try_get("strict")?,
                signature,
            },
        );
    }
    Ok(functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_query_variants_differ_only_in_the_nulls_not_distinct_column() {
        assert_eq!(
            UNIQUE_INDEXES_SINCE_15.replace("i.indnullsnotdistinct", "false"),
            UNIQUE_INDEXES_BEFORE_15
        );
    }
}
