//! The opt-in distributed form of `idem_records`, on Citus: distributed by
//! `account`, so each account's claims live in one shard on one worker, and
//! every claim, settle or release is one statement the coordinator routes
//! to that worker.
//!
//! Both partial unique indexes lead with `account`, the distribution
//! column, so Citus enforces them shard by shard and uniqueness per account
//! is exactly what it is on one PostgreSQL. What idem asks of the cluster,
//! and checks at start-up: the table distributed by hash on `account`, both
//! indexes valid on every shard placement, and the gate connected to the
//! coordinator, whose sequence hands out every fence (a worker's sequence
//! hands out values from a range of its own, so fences drawn on two nodes
//! would not rise in the order they were drawn).

use sqlx::{PgConnection, PgPool};

use crate::error::{Error, SchemaProblem};
use crate::store::{catalog, citus};

use super::layout::{Distribution, Layout, layout_of};
use super::{REQUIRED_INDEXES, RequiredIndex};

/// Sets the schema up with `idem_records` distributed by Citus on
/// `account`, then brings it to the current version like
/// [`set_up`](super::set_up) does; [`Gate::connect`](crate::Gate::connect)
/// afterwards only verifies it. Run it on the coordinator. The shard count
/// is Citus's `citus.shard_count` (32 unless set), and the table is
/// co-located with your own tables distributed by a text column, so that
/// in-transaction mode's claims and your writes for one account are on one
/// worker.
///
/// Idempotent, and safe when many processes start at once (the set-up lock
/// serialises them; the later ones find the table distributed and only
/// migrate). On a table that exists but is not distributed: an empty one
/// is distributed; one holding rows is left as it is and the error says
/// how to distribute it, because that moves every row under a lock that
/// stops every gate until it is done, a step to plan rather than to take at
/// start-up. A table Citus distributes some other way is never changed.
///
/// # Errors
/// [`Error::Setup`] when the database is not a Citus coordinator, or the
/// table cannot be distributed as asked; nothing was changed then.
pub async fn set_up_distributed(pool: &PgPool) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    require_coordinator(&mut conn).await?;
    if let Some(existing) = layout_of(&mut conn).await?
        && existing.is_distributed_by_account()
    {
        drop(conn);
        return super::set_up(pool).await;
    }
    let mut tx = catalog::begin_set_up(&mut conn).await?;
    // Another process may have set it up while we waited for the lock.
    let existing = layout_of(&mut tx).await?;
    let distribute = match &existing {
        None => true,
        Some(layout) if layout.is_distributed_by_account() => false,
        Some(layout @ Layout::Distributed { .. }) => {
            return Err(Error::Setup(format!(
                "idem_records is already {layout}; idem needs it distributed by hash on account \
                 (its unique indexes lead with account, and every claim is routed by it). \
                 Nothing was changed. Redistribute it in a maintenance window: SELECT \
                 alter_distributed_table('idem_records', distribution_column := 'account')"
            )));
        }
        Some(layout) => {
            if citus::has_rows(&mut tx).await? {
                return Err(Error::Setup(format!(
                    "idem_records exists, {layout}, and holds rows. Nothing was changed: \
                     distributing it moves every row into the shards under a lock that stops \
                     every gate until the copy is done, so idem does not do it at start-up. \
                     In a maintenance window, with the gates stopped, run on the coordinator: \
                     SELECT create_distributed_table('idem_records', 'account'); SELECT \
                     truncate_local_data_after_distributing_table('idem_records'); then set up \
                     again"
                )));
            }
            true
        }
    };
    catalog::migrate(&mut tx).await?;
    if distribute {
        citus::distribute(&mut tx).await?;
        tracing::info!(target: "idem", "idem_records distributed by Citus on account");
    }
    tx.commit().await?;
    Ok(())
}

/// Refuses, saying why, unless `conn` is to a Citus coordinator.
async fn require_coordinator(conn: &mut PgConnection) -> Result<(), Error> {
    if citus::citus_version(conn).await?.is_none() {
        return Err(Error::Setup(
            "this database has no citus extension, so there is nothing to distribute over: \
             install Citus (shared_preload_libraries = 'citus', CREATE EXTENSION citus) and \
             connect to the coordinator, or use set_up (or set_up_partitioned) on a single \
             PostgreSQL"
                .to_owned(),
        ));
    }
    if !citus::is_coordinator(conn).await? {
        return Err(Error::Setup(NOT_THE_COORDINATOR.to_owned()));
    }
    Ok(())
}

const NOT_THE_COORDINATOR: &str = "connected to a Citus worker, not the coordinator: connect idem \
     to the coordinator, whose sequence hands out every fence (fences drawn on two nodes come \
     from ranges of their own and would not rise in the order they were drawn)";

/// What Citus says of `idem_records`, for [`verify`](super::verify).
#[derive(Debug, Default)]
pub(super) struct CitusCheck {
    /// What is wrong with how Citus holds it: nothing when Citus is not
    /// installed or does not manage the table (a plain table on a
    /// coordinator is one PostgreSQL's table).
    pub(super) problems: Vec<SchemaProblem>,
    /// Citus manages the table, so statements take its routed shapes.
    pub(super) distributed: bool,
}

/// Checks how Citus holds `idem_records` ([`CitusCheck`]).
pub(super) async fn check(conn: &mut PgConnection) -> Result<CitusCheck, sqlx::Error> {
    if citus::citus_version(conn).await?.is_none() {
        return Ok(CitusCheck::default());
    }
    let mut problems = Vec::new();
    if !citus::is_coordinator(conn).await? {
        problems.push(distribution_problem(NOT_THE_COORDINATOR.to_owned()));
    }
    let Some(distribution) = citus::distribution(conn).await? else {
        return Ok(CitusCheck {
            problems,
            distributed: false,
        });
    };
    let check = |problems| CitusCheck {
        problems,
        distributed: true,
    };
    let method = Distribution::from_catalog(&distribution.method);
    match (method, distribution.column_name.as_deref()) {
        (Distribution::Hash, Some("account")) => {}
        // A reference table has one copy per node, each enforcing both
        // indexes; a Citus local table is one table on the coordinator.
        (Distribution::ReferenceOrLocal, _) => return Ok(check(problems)),
        (method, column) => {
            problems.push(distribution_problem(format!(
                "Citus distributes it by {} ({method}), so its unique indexes are enforced only \
                 within a shard and a claim can be routed away from the row that holds its slot: \
                 distribute it by hash on account (SELECT alter_distributed_table('idem_records', \
                 distribution_column := 'account'))",
                column.unwrap_or("no column"),
            )));
            return Ok(check(problems));
        }
    }
    for placement in citus::placement_indexes(conn).await? {
        let where_ = format!("shard {} on {}", placement.shard, placement.node);
        let indexes = match placement.indexes {
            Ok(indexes) => indexes,
            Err(answer) => {
                problems.push(distribution_problem(format!(
                    "the indexes of {where_} could not be checked ({answer}): start the worker, \
                     or mend the coordinator's connection to it"
                )));
                continue;
            }
        };
        for required in &REQUIRED_INDEXES {
            if !indexes.iter().any(|index| index.enforces(required)) {
                problems.push(distribution_problem(missing_on_placement(
                    &where_, &indexes, required,
                )));
            }
        }
    }
    Ok(check(problems))
}

fn missing_on_placement(
    where_: &str,
    indexes: &[catalog::Index],
    required: &RequiredIndex,
) -> String {
    let found = indexes
        .iter()
        .find(|index| index.covers(required))
        .map(|index| format!(" (found instead: {})", index.shortfall(required)))
        .unwrap_or_default();
    format!(
        "{where_} lacks the unique index {}{found}: recreate it on the coordinator (DROP INDEX \
         and CREATE UNIQUE INDEX on idem_records propagate to every shard), or repair the \
         placement (citus_copy_shard_placement)",
        required.definition
    )
}

fn distribution_problem(detail: String) -> SchemaProblem {
    SchemaProblem::Distribution { detail }
}
