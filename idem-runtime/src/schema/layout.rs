//! How `idem_records` is laid out: one table, partitioned by PostgreSQL, or
//! distributed by Citus. Read from the catalog, never assumed.

use std::fmt;

use sqlx::{PgConnection, PgPool};

use crate::error::Error;
use crate::store::{catalog, citus};

/// How `idem_records` is laid out, as the catalog says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// One table: what [`set_up`](super::set_up) and
    /// [`SCHEMA_SQL`](super::SCHEMA_SQL) create.
    Plain,
    /// A partitioned table.
    Partitioned {
        /// The partition key as PostgreSQL prints it: `HASH (account)` for
        /// what [`set_up_partitioned`](super::set_up_partitioned) creates.
        key: String,
        /// How many partitions are attached directly to it.
        partitions: usize,
    },
    /// A table Citus manages, read on its coordinator.
    Distributed {
        /// How Citus spreads it: [`Distribution::Hash`] for what
        /// [`set_up_distributed`](super::set_up_distributed) creates.
        method: Distribution,
        /// The distribution column: `account` for what
        /// [`set_up_distributed`](super::set_up_distributed) creates; `None`
        /// for a reference or local table.
        column: Option<String>,
        /// How many shards it has.
        shards: usize,
    },
}

/// How Citus spreads a table over its workers
/// (`pg_dist_partition.partmethod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Distribution {
    /// By the hash of its distribution column: each value in one shard.
    Hash,
    /// Not spread: a reference table (a copy on every node) or a Citus
    /// local table (on the coordinator).
    ReferenceOrLocal,
    /// Appended shards (no uniqueness across them).
    Append,
    /// By ranges of its distribution column.
    Range,
    /// A method this build of idem does not know.
    Unknown,
}

impl Distribution {
    /// `pg_dist_partition.partmethod`'s letter, read.
    pub(super) fn from_catalog(method: &str) -> Distribution {
        match method {
            "h" => Distribution::Hash,
            "n" => Distribution::ReferenceOrLocal,
            "a" => Distribution::Append,
            "r" => Distribution::Range,
            _ => Distribution::Unknown,
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Distribution::Hash => "hash",
            Distribution::ReferenceOrLocal => "reference or local",
            Distribution::Append => "append",
            Distribution::Range => "range",
            Distribution::Unknown => "unknown",
        })
    }
}

impl Layout {
    /// What [`set_up_distributed`](super::set_up_distributed) creates, with
    /// however many shards it has.
    pub fn is_distributed_by_account(&self) -> bool {
        matches!(
            self,
            Layout::Distributed { method: Distribution::Hash, column: Some(column), .. }
                if column == "account"
        )
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Plain => f.write_str("plain (not partitioned)"),
            Layout::Partitioned { key, partitions } => {
                write!(f, "partitioned by {key} into {partitions} partitions")
            }
            Layout::Distributed {
                method,
                column: Some(column),
                shards,
            } => write!(
                f,
                "distributed by Citus on {column} ({method}) into {shards} shards"
            ),
            Layout::Distributed { method, shards, .. } => {
                write!(f, "a Citus {method} table ({shards} shards)")
            }
        }
    }
}

/// How `idem_records` is laid out, or `None` when it does not exist where
/// the connection's `search_path` looks.
pub async fn layout(pool: &PgPool) -> Result<Option<Layout>, Error> {
    Ok(layout_of(&mut *pool.acquire().await?).await?)
}

pub(super) async fn layout_of(conn: &mut PgConnection) -> Result<Option<Layout>, sqlx::Error> {
    let Some(found) = catalog::layout(conn).await? else {
        return Ok(None);
    };
    // On a Citus coordinator a distributed table is a shell of the plain
    // kind: Citus's own catalog says how it is spread.
    if citus::citus_version(conn).await?.is_some()
        && let Some(distribution) = citus::distribution(conn).await?
    {
        return Ok(Some(Layout::Distributed {
            method: Distribution::from_catalog(&distribution.method),
            column: distribution.column_name,
            shards: usize::try_from(distribution.shards).unwrap_or(usize::MAX),
        }));
    }
    Ok(Some(if found.partitioned {
        Layout::Partitioned {
            key: found.partition_key.unwrap_or_default(),
            partitions: usize::try_from(found.partitions).unwrap_or(usize::MAX),
        }
    } else {
        Layout::Plain
    }))
}
