//! Pruning settled claims: counting them, and deleting them in batches that
//! each hold their locks, and write their WAL, for a bounded moment.
//!
//! A single `DELETE` of every settled claim would lock millions of rows
//! until it commits and write its whole WAL in one burst (which replicas
//! then replay in one burst too). [`Pruning`] walks the table instead, in
//! the order of each partial unique index in turn, by keyset: a batch first
//! reads where the next `batch_size` index entries end
//! ([`Walker::window_end`]), then deletes the prunable claims between the
//! previous end and this one ([`Walker::delete_window`]), in a statement of
//! its own that commits on its own. Each batch therefore reads at most
//! `batch_size` index entries, starting where the last one stopped: never
//! the whole table again, and never the dead entries the batches before it
//! left behind, which a `DELETE ... WHERE ctid IN (SELECT ... LIMIT n)`
//! repeated from the start would wade through until a vacuum. No index is
//! added for it: the walk needs an order, not `settled_at`.
//!
//! On PostgreSQL (partitioned or not) the walk goes across accounts, so
//! that a million small accounts still make full batches; a window's
//! bounds are row comparisons on the index's leading columns, one range
//! scan (a merge of one per partition when partitioned). On a table Citus
//! distributes it goes one account after another, every statement naming
//! its account (`account = $1`), so each is routed to the one worker that
//! holds the account's shard: Citus refuses a `DELETE` whose window is a
//! `LIMIT` across shards, and these have none. The two statements of a
//! batch need not be atomic together: the `DELETE` tests every row it
//! deletes (`state = 'success'`, settled before the cut-off) under its own
//! snapshot and row locks, whatever the window read saw.
//!
//! Only `success` claims are pruned. Pending and in-doubt claims are held
//! slots (a running or unresolved action), and a kept failure is what
//! refuses its retries: none of them is ever deleted here.

use std::num::NonZeroU32;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{PgPool, Row};

use super::citus;
use crate::error::Error;

/// Which settled claims [`prune`] and [`Pruning`] delete.
#[derive(Debug, Clone, Copy)]
pub struct PruneFilter<'a> {
    /// Only claims settled before this instant.
    pub settled_before: SystemTime,
    /// Only this account; `None`: every account.
    pub account: Option<&'a str>,
}

/// The test shared by [`COUNT_PRUNABLE`] and [`PRUNE`]: claims settled
/// before `$1` (microseconds since the Unix epoch), in account `$2` (NULL:
/// every account).
macro_rules! prunable {
    () => {
        "kind = 'claim' AND state = 'success' \
         AND settled_at < timestamptz 'epoch' + $1 * interval '1 microsecond' \
         AND ($2::text IS NULL OR account = $2)"
    };
}

/// Counts what [`prune`] would delete. Index: none; counting reads the
/// table (or, with an account, one partition or shard of it).
pub(super) const COUNT_PRUNABLE: &str = concat!(
    "SELECT count(*) AS claims FROM idem_records WHERE ",
    prunable!()
);

/// The same, per account, largest first (then by account). Index: none.
pub(super) const COUNT_PRUNABLE_BY_ACCOUNT: &str = concat!(
    "SELECT account, count(*) AS claims FROM idem_records WHERE ",
    prunable!(),
    " GROUP BY account ORDER BY claims DESC, account"
);

/// Deletes every settled claim in one statement: what `prune` did before
/// it went in batches, kept for [`prune_in_one_statement`] (the baseline
/// the prune benchmark measures batches against). Index: none; it reads
/// the table.
pub(super) const PRUNE: &str = concat!("DELETE FROM idem_records WHERE ", prunable!());

/// The test a batch's `DELETE` adds to its window: settled successes, before
/// `$7` (microseconds since the Unix epoch).
macro_rules! prunable_in_batch {
    () => {
        "state = 'success' AND settled_at < timestamptz 'epoch' + $7 * interval '1 microsecond'"
    };
}

/// One of the two partial unique indexes a walk goes through, with the
/// statements that walk it.
pub(super) struct Lane {
    /// The namespace of a position before every entry of the lane: NULL in
    /// the lane without one (where it is tested as NULL), the empty string
    /// in the other, below every `(address, namespace)` since no address is
    /// empty.
    start_namespace: Option<&'static str>,
    /// The first account with claims in this lane, by the index's order.
    /// Index: the lane's partial unique index (its leading `account`,
    /// read for a `min`).
    pub(super) first_account: &'static str,
    /// The first account after `$1` with claims in this lane. Index: the
    /// lane's partial unique index.
    pub(super) next_account: &'static str,
    /// The statements of a walk that stays in one account (Citus, or a
    /// prune of one account).
    pub(super) by_account: Walker,
    /// The statements of a walk across accounts, in the index's order.
    pub(super) across: Walker,
}

/// The three statements of a batch. A position in the walk is `($1, $2,
/// $3)`: an account, the last address read there and, in the lane of
/// namespaces, the last namespace (NULL, and tested as NULL, in the lane
/// without one, so that both lanes number their parameters alike).
pub(super) struct Walker {
    /// Where the window of the next `$4 + 1` index entries after the
    /// position ends: the account, address and namespace of its last entry,
    /// or no row when fewer remain (in the account, for a walk by account).
    /// Index: the lane's partial unique index, `$4 + 1` entries of it.
    pub(super) window_end: &'static str,
    /// Deletes the prunable claims after the position up to and including
    /// the entry `($4, $5, $6)` (a walk by account binds `$4` NULL: the end
    /// is in its account), settled before `$7`. Index: the lane's partial
    /// unique index, over that window only.
    pub(super) delete_window: &'static str,
    /// Deletes the prunable claims after the position to the end (of the
    /// account, for a walk by account): fewer than a batch, as
    /// [`Walker::window_end`] found. `$4` to `$6` are bound NULL and tested
    /// as NULL. Index: the lane's partial unique index, from the position
    /// on.
    pub(super) delete_rest: &'static str,
}

/// The lane of claims without a namespace: `(account, kind, address) WHERE
/// namespace IS NULL`. By account, walked by address; across accounts, by
/// `(account, kind, address)`, a row comparison the index serves as one
/// range.
pub(super) const WITHOUT_NAMESPACE: Lane = Lane {
    start_namespace: None,
    first_account: "SELECT min(account) AS account FROM idem_records \
                    WHERE kind = 'claim' AND namespace IS NULL",
    next_account: "SELECT min(account) AS account FROM idem_records \
                   WHERE account > $1 AND kind = 'claim' AND namespace IS NULL",
    by_account: Walker {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE account = $1 AND kind = 'claim' AND namespace IS NULL \
                       AND address > $2 AND $3::text IS NULL \
                     ORDER BY address OFFSET $4 LIMIT 1",
        delete_window: concat!(
            "DELETE FROM idem_records \
             WHERE account = $1 AND kind = 'claim' AND namespace IS NULL \
               AND address > $2 AND $3::text IS NULL \
               AND $4::text IS NULL AND address <= $5 AND $6::text IS NULL AND ",
            prunable_in_batch!()
        ),
        delete_rest: concat!(
            "DELETE FROM idem_records \
             WHERE account = $1 AND kind = 'claim' AND namespace IS NULL \
               AND address > $2 AND $3::text IS NULL \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL AND ",
            prunable_in_batch!()
        ),
    },
    across: Walker {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE kind = 'claim' AND namespace IS NULL \
                       AND (account, kind, address) > ($1, 'claim', $2) AND $3::text IS NULL \
                     ORDER BY account, kind, address OFFSET $4 LIMIT 1",
        delete_window: concat!(
            "DELETE FROM idem_records \
             WHERE kind = 'claim' AND namespace IS NULL \
               AND (account, kind, address) > ($1, 'claim', $2) AND $3::text IS NULL \
               AND (account, kind, address) <= ($4, 'claim', $5) AND $6::text IS NULL AND ",
            prunable_in_batch!()
        ),
        delete_rest: concat!(
            "DELETE FROM idem_records \
             WHERE kind = 'claim' AND namespace IS NULL \
               AND (account, kind, address) > ($1, 'claim', $2) AND $3::text IS NULL \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL AND ",
            prunable_in_batch!()
        ),
    },
};

/// The lane of claims in a namespace: `(account, kind, address, namespace)
/// WHERE namespace IS NOT NULL`. By account, walked by `(address,
/// namespace)`; across accounts, by all four columns: row comparisons the
/// index serves as one range.
pub(super) const WITHIN_NAMESPACE: Lane = Lane {
    start_namespace: Some(""),
    first_account: "SELECT min(account) AS account FROM idem_records \
                    WHERE kind = 'claim' AND namespace IS NOT NULL",
    next_account: "SELECT min(account) AS account FROM idem_records \
                   WHERE account > $1 AND kind = 'claim' AND namespace IS NOT NULL",
    by_account: Walker {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE account = $1 AND kind = 'claim' AND namespace IS NOT NULL \
                       AND (address, namespace) > ($2, $3) \
                     ORDER BY address, namespace OFFSET $4 LIMIT 1",
        delete_window: concat!(
            "DELETE FROM idem_records \
             WHERE account = $1 AND kind = 'claim' AND namespace IS NOT NULL \
               AND (address, namespace) > ($2, $3) \
               AND $4::text IS NULL AND (address, namespace) <= ($5, $6) AND ",
            prunable_in_batch!()
        ),
        delete_rest: concat!(
            "DELETE FROM idem_records \
             WHERE account = $1 AND kind = 'claim' AND namespace IS NOT NULL \
               AND (address, namespace) > ($2, $3) \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL AND ",
            prunable_in_batch!()
        ),
    },
    across: Walker {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE kind = 'claim' AND namespace IS NOT NULL \
                       AND (account, kind, address, namespace) > ($1, 'claim', $2, $3) \
                     ORDER BY account, kind, address, namespace OFFSET $4 LIMIT 1",
        delete_window: concat!(
            "DELETE FROM idem_records \
             WHERE kind = 'claim' AND namespace IS NOT NULL \
               AND (account, kind, address, namespace) > ($1, 'claim', $2, $3) \
               AND (account, kind, address, namespace) <= ($4, 'claim', $5, $6) AND ",
            prunable_in_batch!()
        ),
        delete_rest: concat!(
            "DELETE FROM idem_records \
             WHERE kind = 'claim' AND namespace IS NOT NULL \
               AND (account, kind, address, namespace) > ($1, 'claim', $2, $3) \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL AND ",
            prunable_in_batch!()
        ),
    },
};

/// The lanes, in the order a walk takes them.
const LANES: [&Lane; 2] = [&WITHOUT_NAMESPACE, &WITHIN_NAMESPACE];

/// A batch size of ten thousand: a batch then deletes in tens of
/// milliseconds and writes a few megabytes of WAL (a row lock each, held
/// that long), while the two round trips it costs stay under a percent of
/// its time. BENCHMARKS.md ("prune") has the figures.
pub const DEFAULT_BATCH_SIZE: NonZeroU32 = match NonZeroU32::new(10_000) {
    Some(size) => size,
    None => unreachable!(),
};

/// How many claims [`prune`] would delete now.
pub async fn count_prunable(pool: &PgPool, filter: &PruneFilter<'_>) -> Result<u64, Error> {
    let row = sqlx::query(COUNT_PRUNABLE)
        .bind(micros_rounded_up(filter.settled_before))
        .bind(filter.account)
        .fetch_one(pool)
        .await?;
    let claims: i64 = row.try_get("claims")?;
    Ok(u64::try_from(claims).unwrap_or_default())
}

/// How many claims [`prune`] would delete now, per account: largest first,
/// accounts with none left out.
pub async fn count_prunable_by_account(
    pool: &PgPool,
    filter: &PruneFilter<'_>,
) -> Result<Vec<(String, u64)>, Error> {
    let rows = sqlx::query(COUNT_PRUNABLE_BY_ACCOUNT)
        .bind(micros_rounded_up(filter.settled_before))
        .bind(filter.account)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            let claims: i64 = row.try_get("claims")?;
            Ok((
                row.try_get("account")?,
                u64::try_from(claims).unwrap_or_default(),
            ))
        })
        .collect()
}

/// Deletes the settled claims `filter` selects, in batches of
/// [`DEFAULT_BATCH_SIZE`] (each its own transaction: see [`Pruning`]), and
/// says how many. A retry of a pruned action runs it again: prune only what
/// can no longer be retried.
pub async fn prune(pool: &PgPool, filter: &PruneFilter<'_>) -> Result<u64, Error> {
    let mut pruning = Pruning::new(filter, DEFAULT_BATCH_SIZE);
    let mut deleted = 0;
    while let Some(batch) = pruning.next_batch(pool).await? {
        deleted += batch;
    }
    Ok(deleted)
}

/// Deletes the settled claims `filter` selects in one statement, as
/// [`prune`] did before it went in batches: every row locked until the end,
/// the WAL in one burst. The baseline the prune benchmark measures
/// [`Pruning`] against; not for production tables.
#[doc(hidden)]
pub async fn prune_in_one_statement(pool: &PgPool, filter: &PruneFilter<'_>) -> Result<u64, Error> {
    Ok(sqlx::query(PRUNE)
        .bind(micros_rounded_up(filter.settled_before))
        .bind(filter.account)
        .execute(pool)
        .await?
        .rows_affected())
}

/// A prune under way, one batch at a time: each [`Pruning::next_batch`]
/// deletes the prunable claims among the next `batch_size` claims of the
/// walk (see the module's docs) in a transaction of its own, and moves on
/// only once that has committed.
///
/// So a batch that failed (a lost connection, a restart) can simply be
/// called for again: it reads the same window and deletes what is still
/// there (nothing, if the failure came after its commit). A process killed
/// mid-way leaves every committed batch deleted and nothing half-done, and
/// a new `Pruning` with the same filter finds what is left: the rows a
/// prune deletes are exactly those that still match.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), idem_runtime::Error> {
/// use std::num::NonZeroU32;
/// use std::time::{Duration, SystemTime};
/// use idem_runtime::operations::{PruneFilter, Pruning};
///
/// let ninety_days_ago = SystemTime::now() - Duration::from_secs(90 * 86_400);
/// let filter = PruneFilter { settled_before: ninety_days_ago, account: None };
/// let mut pruning = Pruning::new(&filter, NonZeroU32::new(5_000).unwrap());
/// let mut deleted = 0;
/// while let Some(batch) = pruning.next_batch(&pool).await? {
///     deleted += batch;
///     // Room for the workload (and the replicas) between batches.
///     tokio::time::sleep(Duration::from_millis(20)).await;
/// }
/// println!("pruned {deleted} settled claims");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Pruning {
    /// `settled_before`, in microseconds since the Unix epoch.
    cut_off: i64,
    /// The one account to prune, if the filter names one.
    only_account: Option<String>,
    /// How many index entries a batch reads at most.
    batch_size: NonZeroU32,
    /// How the walk goes, once the first batch has found out.
    walk: Option<Walk>,
    /// Which of [`LANES`] the walk is in; past the last: done.
    lane: usize,
    /// Where the walk is in the current lane.
    at: Position,
}

/// How a walk goes through a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// One account after the other, every statement naming its account:
    /// on Citus, where that routes it to one shard (a window across shards
    /// is a `LIMIT` across shards, which Citus refuses in a `DELETE`), and
    /// for a prune of one account.
    ByAccount,
    /// Across accounts, in the index's order: on PostgreSQL, partitioned
    /// or not, so that many small accounts still make full batches.
    Across,
}

/// Where a walk is within a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Position {
    /// Before the lane's first entry (or, by account, its first account).
    Start,
    /// After the entry `(account, address, namespace)`.
    After {
        account: String,
        address: String,
        namespace: Option<String>,
    },
    /// By account: done with this account; the next one comes after it.
    Past(String),
}

impl Pruning {
    /// A walk over the claims `filter` selects, `batch_size` index entries
    /// a batch.
    pub fn new(filter: &PruneFilter<'_>, batch_size: NonZeroU32) -> Pruning {
        Pruning {
            cut_off: micros_rounded_up(filter.settled_before),
            only_account: filter.account.map(str::to_owned),
            batch_size,
            walk: None,
            lane: 0,
            at: Position::Start,
        }
    }

    /// Whether the walk is over: [`Pruning::next_batch`] would return
    /// `None`.
    pub fn is_done(&self) -> bool {
        self.lane >= LANES.len()
    }

    /// Runs the next batch and returns how many claims it deleted (possibly
    /// none: a window of claims still pending, say), or `None` once the
    /// walk is over. On an error nothing has moved: calling again retries
    /// the same batch.
    pub async fn next_batch(&mut self, pool: &PgPool) -> Result<Option<u64>, Error> {
        let walk = match self.walk {
            Some(walk) => walk,
            None => {
                let walk = self.choose_walk(pool).await?;
                self.walk = Some(walk);
                walk
            }
        };
        while let Some(&lane) = LANES.get(self.lane) {
            let start = || (String::new(), lane.start_namespace.map(str::to_owned));
            let (account, address, namespace) = match (&self.at, walk) {
                (
                    Position::After {
                        account,
                        address,
                        namespace,
                    },
                    _,
                ) => (account.clone(), address.clone(), namespace.clone()),
                (Position::Start, Walk::Across) => {
                    let (address, namespace) = start();
                    (String::new(), address, namespace)
                }
                (Position::Start | Position::Past(_), _) => {
                    match self.next_account(pool, lane).await? {
                        Some(account) => {
                            let (address, namespace) = start();
                            (account, address, namespace)
                        }
                        None => {
                            self.lane += 1;
                            self.at = Position::Start;
                            continue;
                        }
                    }
                }
            };
            let walker = match walk {
                Walk::ByAccount => &lane.by_account,
                Walk::Across => &lane.across,
            };
            let window_end = sqlx::query(walker.window_end)
                .bind(&account)
                .bind(&address)
                .bind(&namespace)
                .bind(i64::from(self.batch_size.get()) - 1)
                .fetch_optional(pool)
                .await?
                .map(
                    |row| -> Result<(String, String, Option<String>), sqlx::Error> {
                        Ok((
                            row.try_get("account")?,
                            row.try_get("address")?,
                            row.try_get("namespace")?,
                        ))
                    },
                )
                .transpose()?;
            let (statement, end) = match &window_end {
                Some((end_account, end_address, end_namespace)) => (
                    walker.delete_window,
                    (
                        (walk == Walk::Across).then_some(end_account),
                        Some(end_address),
                        end_namespace.as_ref(),
                    ),
                ),
                None => (walker.delete_rest, (None, None, None)),
            };
            let deleted = sqlx::query(statement)
                .bind(&account)
                .bind(&address)
                .bind(&namespace)
                .bind(end.0)
                .bind(end.1)
                .bind(end.2)
                .bind(self.cut_off)
                .execute(pool)
                .await?
                .rows_affected();
            // Committed: only now does the walk move on.
            self.at = match (window_end, walk) {
                (Some((account, address, namespace)), _) => Position::After {
                    account,
                    address,
                    namespace,
                },
                (None, Walk::ByAccount) => Position::Past(account),
                (None, Walk::Across) => {
                    self.lane += 1;
                    Position::Start
                }
            };
            return Ok(Some(deleted));
        }
        Ok(None)
    }

    /// By account for one account or a table Citus distributes; across
    /// accounts otherwise.
    async fn choose_walk(&self, pool: &PgPool) -> Result<Walk, Error> {
        if self.only_account.is_some() {
            return Ok(Walk::ByAccount);
        }
        let mut conn = pool.acquire().await?;
        if citus::citus_version(&mut conn).await?.is_none() {
            return Ok(Walk::Across);
        }
        Ok(match citus::distribution(&mut conn).await? {
            Some(distribution) if distribution.column_name.is_some() => Walk::ByAccount,
            _ => Walk::Across,
        })
    }

    /// The account a walk by account goes to next in `lane`: the filter's
    /// own (once per lane), or the next by the lane's index; `None` when
    /// there is no other.
    async fn next_account(&self, pool: &PgPool, lane: &Lane) -> Result<Option<String>, Error> {
        if let Some(only) = &self.only_account {
            return Ok(match self.at {
                Position::Start => Some(only.clone()),
                _ => None,
            });
        }
        let row = match &self.at {
            Position::Past(previous) => {
                sqlx::query(lane.next_account)
                    .bind(previous)
                    .fetch_one(pool)
                    .await?
            }
            _ => sqlx::query(lane.first_account).fetch_one(pool).await?,
        };
        Ok(row.try_get("account")?)
    }
}

/// `time` in microseconds since the Unix epoch, rounded up, so that
/// `settled_at < $1` (a `timestamptz`, whole microseconds) holds exactly when
/// `settled_at < time`. Saturates outside `i64`, where PostgreSQL refuses
/// the instant as out of range.
fn micros_rounded_up(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => {
            let partial = u128::from(after.subsec_nanos() % 1_000 != 0);
            i64::try_from(after.as_micros() + partial).unwrap_or(i64::MAX)
        }
        // The magnitude rounded down is the negative value rounded up.
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |m| -m),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn instants_are_rounded_up_to_whole_microseconds() {
        let at = |nanos: i64| {
            let magnitude = Duration::from_nanos(nanos.unsigned_abs());
            if nanos >= 0 {
                UNIX_EPOCH + magnitude
            } else {
                UNIX_EPOCH - magnitude
            }
        };
        assert_eq!(micros_rounded_up(at(0)), 0);
        assert_eq!(micros_rounded_up(at(1_000)), 1);
        assert_eq!(micros_rounded_up(at(1_001)), 2);
        assert_eq!(micros_rounded_up(at(-1_000)), -1);
        assert_eq!(micros_rounded_up(at(-1_999)), -1);
    }

    #[test]
    fn every_batch_deletes_only_successes_and_a_walk_by_account_names_it() {
        for lane in LANES {
            let walker = &lane.by_account;
            for statement in [walker.window_end, walker.delete_window, walker.delete_rest] {
                assert!(statement.contains("account = $1"), "{statement}");
            }
            for walker in [&lane.by_account, &lane.across] {
                for statement in [walker.delete_window, walker.delete_rest] {
                    assert!(statement.contains("state = 'success'"), "{statement}");
                    assert!(statement.contains("$7"), "{statement}");
                    assert!(!statement.contains("LIMIT"), "{statement}");
                }
            }
        }
    }
}
