//! The Citus catalog: whether the database is a Citus coordinator, how
//! `idem_records` is distributed, the two partial unique indexes on every
//! shard placement, and the one call that distributes the table. What the
//! answers mean is [`crate::schema`]'s business.
//!
//! Every query here but [`CITUS_VERSION`] reads Citus's own catalog or calls
//! its functions, so it runs only once [`citus_version`] said the extension
//! is installed.

use sqlx::{FromRow, PgConnection, Row};

use super::catalog::{Index, indexes_of};

/// The version of the `citus` extension installed in this database; no row
/// when it is not installed.
const CITUS_VERSION: &str =
    "SELECT extversion AS version FROM pg_extension WHERE extname = 'citus'";

/// Whether this node is the coordinator: the node whose metadata routes each
/// statement to the worker holding the account's shard, and whose sequence
/// hands out every fence.
const IS_COORDINATOR: &str = "SELECT citus_is_coordinator() AS is_coordinator";

/// How Citus distributes `idem_records`: its method (`h` hash, `n` none:
/// a reference or local table, `a` append, `r` range), its distribution
/// column, and its shard count; no row when Citus does not manage it.
const DISTRIBUTION: &str = "SELECT p.partmethod::text AS method, \
            CASE WHEN p.partkey IS NOT NULL \
                 THEN column_to_column_name(p.logicalrelid, p.partkey) END AS column_name, \
            (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) \
                AS shards \
     FROM pg_dist_partition p WHERE p.logicalrelid = to_regclass('idem_records')";

/// Whether `idem_records` holds any row. A scan that stops at the first
/// row, on any layout.
const HAS_ROWS: &str = "SELECT EXISTS (SELECT FROM idem_records) AS has_rows";

/// Distributes the (empty) `idem_records` by `account` into Citus's default
/// shard count (`citus.shard_count`), co-located with the other tables
/// distributed by a text column, so that an application table distributed
/// by the same account lives on the same worker as its claims.
const DISTRIBUTE: &str = "SELECT create_distributed_table('idem_records', 'account')";

/// The indexes on every shard placement of `idem_records`, one row per
/// placement: the node, whether the query ran there, and what it returned
/// (the indexes as a JSON array of [`Index`] objects, or the error).
const PLACEMENT_INDEXES: &str = concat!(
    "SELECT shardid, nodename, nodeport, success, result \
     FROM run_command_on_placements('idem_records', \
          $command$SELECT coalesce(json_agg(i), '[]')::text FROM (",
    indexes_of!("'%s'"),
    ") i$command$) \
     ORDER BY shardid, nodename, nodeport"
);

/// The version of Citus installed in this database, if it is.
pub(crate) async fn citus_version(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
    sqlx::query(CITUS_VERSION)
        .fetch_optional(&mut *conn)
        .await?
        .map(|row| row.try_get("version"))
        .transpose()
}

/// Whether this node is the Citus coordinator ([`IS_COORDINATOR`]).
pub(crate) async fn is_coordinator(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query(IS_COORDINATOR)
        .fetch_one(&mut *conn)
        .await?
        .try_get("is_coordinator")
}

/// How Citus distributes `idem_records` ([`DISTRIBUTION`]).
#[derive(Debug, Clone, FromRow)]
pub(crate) struct Distribution {
    /// `h` (hash), `n` (reference or local), `a` (append), `r` (range).
    pub method: String,
    /// The distribution column, when there is one.
    pub column_name: Option<String>,
    /// How many shards it has.
    pub shards: i64,
}

/// How Citus distributes `idem_records`; `None` when Citus does not manage
/// it (a plain table on the coordinator).
pub(crate) async fn distribution(
    conn: &mut PgConnection,
) -> Result<Option<Distribution>, sqlx::Error> {
    sqlx::query_as(DISTRIBUTION)
        .fetch_optional(&mut *conn)
        .await
}

/// Whether `idem_records` holds any row ([`HAS_ROWS`]).
pub(crate) async fn has_rows(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query(HAS_ROWS)
        .fetch_one(&mut *conn)
        .await?
        .try_get("has_rows")
}

/// Distributes the empty `idem_records` by `account` ([`DISTRIBUTE`]).
pub(crate) async fn distribute(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(DISTRIBUTE).execute(&mut *conn).await?;
    Ok(())
}

/// The indexes of one shard placement, or why they could not be read.
#[derive(Debug)]
pub(crate) struct Placement {
    pub shard: i64,
    /// `host:port` of the worker holding it.
    pub node: String,
    /// Its indexes; `Err` with the node's answer when the query failed
    /// there (the worker is down, say).
    pub indexes: Result<Vec<Index>, String>,
}

/// The indexes on every shard placement of `idem_records`
/// ([`PLACEMENT_INDEXES`]).
pub(crate) async fn placement_indexes(
    conn: &mut PgConnection,
) -> Result<Vec<Placement>, sqlx::Error> {
    let rows = sqlx::query(PLACEMENT_INDEXES).fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|row| {
            let node_name: String = row.try_get("nodename")?;
            let node_port: i32 = row.try_get("nodeport")?;
            let success: bool = row.try_get("success")?;
            let result: String = row.try_get("result")?;
            let indexes = if success {
                indexes_from_json(&result)
                    .ok_or_else(|| format!("an answer idem cannot read: {result}"))
            } else {
                Err(result)
            };
            Ok(Placement {
                shard: row.try_get("shardid")?,
                node: format!("{node_name}:{node_port}"),
                indexes,
            })
        })
        .collect()
}

/// `[{"name": ..., "is_unique": ..., ...}]`, as `json_agg` writes the rows
/// of `indexes_of!`.
fn indexes_from_json(text: &str) -> Option<Vec<Index>> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value.as_array()?.iter().map(index_from_json).collect()
}

fn index_from_json(value: &serde_json::Value) -> Option<Index> {
    let flag = |name: &str| value.get(name)?.as_bool();
    Some(Index {
        name: value.get("name")?.as_str()?.to_owned(),
        is_unique: flag("is_unique")?,
        is_valid: flag("is_valid")?,
        is_immediate: flag("is_immediate")?,
        has_expressions: flag("has_expressions")?,
        columns: value
            .get("columns")?
            .as_array()?
            .iter()
            .map(|column| column.as_str().map(str::to_owned))
            .collect::<Option<_>>()?,
        predicate: match value.get("predicate")? {
            serde_json::Value::Null => None,
            predicate => Some(predicate.as_str()?.to_owned()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_s_indexes_are_read_from_json_agg_s_text() {
        let text = r#"[{"name":"idem_records_unique_without_namespace_102040","is_unique":true,
            "is_valid":true,"is_immediate":true,"has_expressions":false,
            "columns":["account","kind","address"],"predicate":"(namespace IS NULL)"},
            {"name":"other","is_unique":false,"is_valid":true,"is_immediate":true,
            "has_expressions":false,"columns":["account"],"predicate":null}]"#;
        let indexes = indexes_from_json(text).expect("two indexes");
        assert_eq!(indexes.len(), 2);
        assert_eq!(indexes[0].columns, ["account", "kind", "address"]);
        assert_eq!(indexes[0].predicate.as_deref(), Some("(namespace IS NULL)"));
        assert!(indexes[0].is_unique && !indexes[1].is_unique);
        assert_eq!(indexes[1].predicate, None);
        assert!(indexes_from_json("[]").is_some_and(|found| found.is_empty()));
        assert!(indexes_from_json(r#"[{"name":"x"}]"#).is_none());
        assert!(indexes_from_json("ERROR: no").is_none());
    }
}
