//! The claim gauges' one statement (feature `metrics`): how many claims
//! are pending past an age or in doubt, and how old the oldest of each is.
//! What the gauges mean, and when to sample them, is
//! [`crate::metrics`]'s business.

use sqlx::{PgExecutor, Row};

/// The columns both forms of the statement return. Conditional aggregates
/// (`CASE` inside `count` and `min`), not `FILTER`, so that Citus combines
/// them across shards like any `count` and `min`. `$1` the age, in seconds,
/// past which a pending claim counts. A claim in doubt is as old as its
/// doubt (`in_doubt_since`; `created_at` for a row from before that column).
macro_rules! gauges_over {
    ($scope:literal) => {
        concat!(
            "SELECT \
                 count(CASE WHEN state = 'pending' \
                             AND created_at < now() - make_interval(secs => $1::float8) \
                            THEN 1 END) AS pending_older, \
                 count(CASE WHEN state = 'in_doubt' THEN 1 END) AS in_doubt, \
                 extract(epoch FROM now() - min(CASE WHEN state = 'pending' THEN created_at END)) \
                     ::float8 AS oldest_pending_seconds, \
                 extract(epoch FROM now() - min(CASE WHEN state = 'in_doubt' \
                     THEN coalesce(in_doubt_since, created_at) END)) \
                     ::float8 AS oldest_in_doubt_seconds \
             FROM idem_records WHERE ",
            $crate::store::open_claims!(""),
            " AND state IN ('pending', 'in_doubt')",
            $scope
        )
    };
}

/// The gauges over every account. `$1` the pending age in seconds. Index:
/// the index of open claims (`open_claims!`), read whole: only the claims
/// not settled, never the successes. It is still a pass over every open
/// claim, which is why the gauges are sampled on an interval the
/// application picks, never per call.
pub const GAUGES_EVERY_ACCOUNT: &str = gauges_over!("");

/// The gauges of one account. `$1` the pending age in seconds, `$2` the
/// account. Index: the index of open claims, from its leading column, the
/// account; on the partitioned layout in the account's one partition, on
/// Citus in the one shard holding it.
pub const GAUGES_ONE_ACCOUNT: &str = gauges_over!(" AND account = $2");

/// What [`GAUGES_EVERY_ACCOUNT`] or [`GAUGES_ONE_ACCOUNT`] read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClaimGauges {
    /// Pending claims created longer ago than the age asked about.
    pub pending_older: i64,
    /// Claims in doubt.
    pub in_doubt: i64,
    /// The age of the oldest pending claim, in seconds; `None`: none.
    pub oldest_pending_seconds: Option<f64>,
    /// The age of the oldest claim in doubt, in seconds; `None`: none.
    pub oldest_in_doubt_seconds: Option<f64>,
}

/// Reads the gauges of `account` (`None`: every account), counting pending
/// claims older than `pending_older_than_seconds`.
pub(crate) async fn claim_gauges(
    executor: impl PgExecutor<'_>,
    account: Option<&str>,
    pending_older_than_seconds: f64,
) -> Result<ClaimGauges, sqlx::Error> {
    let query = match account {
        None => sqlx::query(GAUGES_EVERY_ACCOUNT).bind(pending_older_than_seconds),
        Some(account) => sqlx::query(GAUGES_ONE_ACCOUNT)
            .bind(pending_older_than_seconds)
            .bind(account),
    };
    let row = query.fetch_one(executor).await?;
    Ok(ClaimGauges {
        pending_older: row.try_get("pending_older")?,
        in_doubt: row.try_get("in_doubt")?,
        oldest_pending_seconds: row.try_get("oldest_pending_seconds")?,
        oldest_in_doubt_seconds: row.try_get("oldest_in_doubt_seconds")?,
    })
}
