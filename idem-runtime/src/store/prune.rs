//! Pruning settled claims: counting them, and deleting them in batches that
//! each hold their locks, and write their WAL, for a bounded moment.
//!
//! A single `DELETE` of every settled claim would lock millions of rows
//! until it commits and write its whole WAL in one burst (which replicas
//! then replay in one burst too). [`Pruning`] walks the table instead, by
//! keyset, each batch a statement of its own that commits on its own and
//! starts where the last one stopped: never the whole table again, and
//! never the dead rows the batches before it left behind, which a `DELETE
//! ... WHERE ctid IN (SELECT ... LIMIT n)` repeated from the start would
//! wade through until a vacuum. No index is added for it. Which order it
//! walks in depends on the server:
//!
//! - **PostgreSQL 14 and later: the heap, in page ranges**
//!   ([`DELETE_HEAP_PAGES`], a TID range scan of about `batch_size` claims'
//!   worth of pages; of each partition's heap when partitioned). A table
//!   fills its heap in the order claims are made, so neighbouring pages
//!   hold claims settled about the same time, and each page is dirtied
//!   (and written to the WAL) by one batch. A window of an index, by
//!   contrast, holds claims from all over the heap: on five million claims
//!   over a thousand accounts, every batch dirtied as many pages as it
//!   deleted claims, which later batches dirtied again, and the walk took
//!   minutes where one `DELETE` took seconds (BENCHMARKS.md, "Prune in
//!   batches").
//! - **PostgreSQL 12 and 13: each partial unique index**, across accounts,
//!   which cannot scan a range of pages: a batch reads where the next
//!   `batch_size` index entries end ([`Walker::window_end`]), a row
//!   comparison on the index's leading columns, then deletes the prunable
//!   claims up to there ([`Walker::delete_window`]).
//! - **Citus, and a prune of one account: each index, one account after
//!   another**, every statement naming its account (`account = $1`), so
//!   that each is routed to the one worker holding the account's shard:
//!   Citus refuses a `DELETE` whose window is a `LIMIT` across shards, and
//!   these have none.
//!
//! The two statements of an index batch need not be atomic together: the
//! `DELETE` tests every row it deletes (`state = 'success'`, settled before
//! the cut-off) under its own snapshot and row locks, whatever the window
//! read saw.
//!
//! Which claims go ([`PruneFilter`]): successes that hold their slot for
//! ever, settled before the cut-off (the operator's horizon: their slots
//! open again), and any recorded outcome (a success, a kept failure) whose
//! slot's window ([`keep_slot_for`](crate::Guard::keep_slot_for)) is over
//! by the database's clock, whenever it was recorded. Never a claim inside
//! its window, whatever the cut-off. Pending and in-doubt claims are held
//! slots (a running or unresolved action), and a kept failure without a
//! window is what refuses its retries: none of them is ever deleted here.
//!
//! Each batch also compacts, in its transaction and over the same window,
//! the successes past the window in which their value is kept
//! (`compactable!`, `compacted!`): their value, fingerprint and steps go,
//! and their identity becomes an 8-byte check of it. Their slots stay.

use std::num::NonZeroU32;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row};

use super::{SplitOnNamespace, citus};
use crate::error::Error;

/// Which settled claims [`prune`] and [`Pruning`] delete: built with
/// [`PruneFilter::new`] and its methods, so that a later filter is not a
/// breaking change.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct PruneFilter<'a> {
    /// Only claims settled before this instant.
    pub settled_before: SystemTime,
    /// Only this account; `None`: every account.
    pub account: Option<&'a str>,
}

impl<'a> PruneFilter<'a> {
    /// The claims of every account settled before `settled_before`.
    pub fn new(settled_before: SystemTime) -> Self {
        PruneFilter {
            settled_before,
            account: None,
        }
    }

    /// Only the claims whose slot's window is over
    /// ([`keep_slot_for`](crate::Guard::keep_slot_for)), of every account:
    /// their slots are open already, so deleting them changes nothing a
    /// caller sees. Every filter deletes them; this one nothing else.
    pub fn expired() -> Self {
        PruneFilter::new(UNIX_EPOCH)
    }

    /// Only this account's (`Some`), or every account's (`None`).
    pub fn account(mut self, account: impl Into<Option<&'a str>>) -> Self {
        self.account = account.into();
        self
    }
}

/// Which claims a prune deletes, before the cut-off `$cut` (microseconds
/// since the Unix epoch): a success that holds its slot for ever, settled
/// before the cut-off (the operator's horizon, which re-opens it); and a
/// recorded outcome whose slot's window is over
/// ([`slot_expired!`](super::claims::slot_expired), by the database's
/// clock), whenever it was recorded. Never a claim inside its window,
/// whatever the cut-off: that slot was promised for the window.
///
/// Never an ordered event's claim that still holds its entity
/// (`not_holding_an_entity!`): the entity reads whether that event applied
/// from its claim row at its next event, and a row gone would hold the
/// entity for good.
macro_rules! claim_prunable {
    ($cut:literal) => {
        claim_prunable!($cut, "idem_records")
    };
    ($cut:literal, $row:literal) => {
        concat!(
            "((state = 'success' AND slot_kept_for IS NULL \
               AND settled_at < timestamptz 'epoch' + ",
            $cut,
            " * interval '1 microsecond') OR (",
            super::claims::slot_expired!(),
            ")) AND ",
            not_holding_an_entity!($row)
        )
    };
}

/// The test that the claim `$row` (the deleting statement's name for its
/// row) is not an ordered event that holds its entity (`held_by`, schema
/// v12; `store::ordered`). A claim of no entity passes at once; an
/// event's entity is found through the partial unique index of its
/// namespace form, one `EXISTS` each, as `claim_gone!` does for steps.
macro_rules! not_holding_an_entity {
    ($row:literal) => {
        concat!(
            "NOT (",
            $row,
            ".entity IS NOT NULL AND ( \
               EXISTS (SELECT FROM idem_records e \
                       WHERE e.account = ",
            $row,
            ".account AND e.kind = 'entity' \
                         AND e.address = ",
            $row,
            ".entity AND e.held_by = ",
            $row,
            ".address \
                         AND e.namespace IS NULL AND ",
            $row,
            ".namespace IS NULL) \
               OR EXISTS (SELECT FROM idem_records e \
                          WHERE e.account = ",
            $row,
            ".account AND e.kind = 'entity' \
                            AND e.address = ",
            $row,
            ".entity AND e.held_by = ",
            $row,
            ".address \
                            AND e.namespace = ",
            $row,
            ".namespace \
                            AND ",
            $row,
            ".namespace IS NOT NULL)))"
        )
    };
}

/// The test shared by [`COUNT_PRUNABLE`] and [`PRUNE`]: claims prunable
/// before `$1` (`claim_prunable!`), in account `$2` (NULL: every account).
macro_rules! prunable {
    () => {
        concat!(
            "kind = 'claim' AND ",
            claim_prunable!("$1"),
            " AND ($2::text IS NULL OR account = $2)"
        )
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

/// Counts what a prune would compact now (`compactable!`), in account
/// `$1` (NULL: every account). Index: none; counting reads the table (or,
/// with an account, one partition or shard of it).
pub(super) const COUNT_COMPACTABLE: &str = concat!(
    "SELECT count(*) AS claims FROM idem_records WHERE ",
    super::claims::compactable!(),
    " AND ($1::text IS NULL OR account = $1)"
);

/// Deletes every settled claim in one statement: what `prune` did before
/// it went in batches, kept for [`prune_in_one_statement`] (the baseline
/// the prune benchmark measures batches against). Index: none; it reads
/// the table.
pub(super) const PRUNE: &str = concat!("DELETE FROM idem_records WHERE ", prunable!());

/// The test a batch's `DELETE` adds to its window: settled successes, before
/// `$7` (microseconds since the Unix epoch), and the rows it returns, from
/// which the batch deletes the pruned claims' steps ([`STEPS_OF_PRUNED`]).
macro_rules! prunable_in_batch {
    () => {
        concat!(
            claim_prunable!("$7"),
            " RETURNING kind, account, address, namespace"
        )
    };
}

/// The test a batch's compaction adds to its window: a success past its
/// value's window not compacted yet (`compactable!`), and the rows it
/// returns, whose steps the batch deletes with them. `$7`, the cut-off,
/// is bound to every statement of a batch alike and not needed here.
macro_rules! compactable_in_batch {
    () => {
        concat!(
            super::claims::compactable!(),
            " AND $7::int8 IS NOT NULL RETURNING kind, account, address, namespace"
        )
    };
}

/// The test that the step `s` has no claim any more (released, or resolved
/// by releasing it, and never claimed again): no claim row at its
/// `claim_address` in its account and namespace. One `NOT EXISTS` per
/// namespace form, each found through the partial unique index its
/// predicate implies (the one for a namespace is empty for a step without
/// one, and the other way round). Each also tests the step's own
/// namespace (`s.namespace IS NOT NULL` is implied by the equality): a
/// test of the outer row alone keeps PostgreSQL 18 from turning the
/// `NOT EXISTS` into a hashed subplan, which reads every claim of the
/// table once per batch, and keeps it a probe of the index per step.
macro_rules! claim_gone {
    () => {
        "NOT EXISTS (SELECT FROM idem_records c \
                     WHERE c.account = s.account AND c.kind = 'claim' \
                       AND c.address = s.claim_address \
                       AND c.namespace IS NULL AND s.namespace IS NULL) \
         AND NOT EXISTS (SELECT FROM idem_records c \
                         WHERE c.account = s.account AND c.kind = 'claim' \
                           AND c.address = s.claim_address \
                           AND c.namespace = s.namespace AND s.namespace IS NOT NULL)"
    };
}

/// The test a batch adds for steps whose claim is gone: the same age rule
/// as a claim's (recorded successes, settled before `$cut`, microseconds
/// since the Unix epoch), measured from the later of the step's record and
/// its claim's last release (`released_at`, which every release stamps),
/// and [`claim_gone!`]. A released claim's finished steps are what its
/// retry replays, so they go no earlier than a claim settled when it was
/// released would: a claim held in doubt past the horizon and then
/// released keeps them for its retry. A pending step (begun, and cut off)
/// is never pruned, as a pending claim is not: it is what refuses to run
/// the step again.
macro_rules! prunable_orphan_step {
    ($cut:literal) => {
        concat!(
            "s.state = 'success' \
             AND s.settled_at < timestamptz 'epoch' + ",
            $cut,
            " * interval '1 microsecond' \
             AND (s.released_at IS NULL OR s.released_at < timestamptz 'epoch' + ",
            $cut,
            " * interval '1 microsecond') AND ",
            claim_gone!()
        )
    };
}

/// One of the two partial unique indexes a walk goes through, with the
/// statements that walk it.
pub struct Lane {
    /// The namespace of a position before every entry of the lane: NULL in
    /// the lane without one (where it is tested as NULL), the empty string
    /// in the other, below every `(address, namespace)` since no address is
    /// empty.
    start_namespace: Option<&'static str>,
    /// The first account with claims in this lane, by the index's order.
    /// Index: the lane's partial unique index (its leading `account`,
    /// read for a `min`).
    pub first_account: &'static str,
    /// The first account after `$1` with claims in this lane. Index: the
    /// lane's partial unique index.
    pub next_account: &'static str,
    /// The statements of a walk that stays in one account (Citus, or a
    /// prune of one account).
    pub by_account: Walker,
    /// The statements of a walk across accounts, in the index's order.
    pub across: Walker,
}

/// The three statements of a batch. A position in the walk is `($1, $2,
/// $3)`: an account, the last address read there and, in the lane of
/// namespaces, the last namespace (NULL, and tested as NULL, in the lane
/// without one, so that both lanes number their parameters alike).
pub struct Walker {
    /// Where the window of the next `$4 + 1` index entries after the
    /// position ends: the account, address and namespace of its last entry,
    /// or no row when fewer remain (in the account, for a walk by account).
    /// Index: the lane's partial unique index, `$4 + 1` entries of it.
    pub window_end: &'static str,
    /// Deletes the prunable claims after the position up to and including
    /// the entry `($4, $5, $6)` (a walk by account binds `$4` NULL: the end
    /// is in its account), settled before `$7`. Index: the lane's partial
    /// unique index, over that window only.
    pub delete_window: &'static str,
    /// Deletes the prunable claims after the position to the end (of the
    /// account, for a walk by account): fewer than a batch, as
    /// [`Walker::window_end`] found. `$4` to `$6` are bound NULL and tested
    /// as NULL. Index: the lane's partial unique index, from the position
    /// on.
    pub delete_rest: &'static str,
    /// Compacts the claims past their value's window in the window
    /// [`Walker::delete_window`] covers, bound alike (`compactable!`), and
    /// returns them, for their steps; `None` in the lane of steps.
    pub compact_window: Option<&'static str>,
    /// The same, over what [`Walker::delete_rest`] covers.
    pub compact_rest: Option<&'static str>,
}

/// A [`Walker`] of claims, from its `window_end` statement and the test
/// of the rows in a window (`window`) and in the rest of the walk
/// (`rest`): each deletes the prunable claims there and compacts those
/// past their value's window.
macro_rules! claims_walker {
    (window_end: $end:literal, window: $window:literal, rest: $rest:literal $(,)?) => {
        Walker {
            window_end: $end,
            delete_window: concat!(
                "DELETE FROM idem_records WHERE ",
                $window,
                " AND ",
                prunable_in_batch!()
            ),
            delete_rest: concat!(
                "DELETE FROM idem_records WHERE ",
                $rest,
                " AND ",
                prunable_in_batch!()
            ),
            compact_window: Some(concat!(
                "UPDATE idem_records SET ",
                super::claims::compacted!(),
                " WHERE ",
                $window,
                " AND ",
                compactable_in_batch!()
            )),
            compact_rest: Some(concat!(
                "UPDATE idem_records SET ",
                super::claims::compacted!(),
                " WHERE ",
                $rest,
                " AND ",
                compactable_in_batch!()
            )),
        }
    };
}

/// The lane of claims without a namespace: `(account, kind, address) WHERE
/// namespace IS NULL`. By account, walked by address; across accounts, by
/// `(account, kind, address)`, a row comparison the index serves as one
/// range.
pub const WITHOUT_NAMESPACE: Lane = Lane {
    start_namespace: None,
    first_account: "SELECT min(account) AS account FROM idem_records \
                    WHERE kind = 'claim' AND namespace IS NULL",
    next_account: "SELECT min(account) AS account FROM idem_records \
                   WHERE account > $1 AND kind = 'claim' AND namespace IS NULL",
    by_account: claims_walker! {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE account = $1 AND kind = 'claim' AND namespace IS NULL \
                       AND address > $2 AND $3::text IS NULL \
                     ORDER BY address OFFSET $4 LIMIT 1",
        window: "account = $1 AND kind = 'claim' AND namespace IS NULL \
               AND address > $2 AND $3::text IS NULL \
               AND $4::text IS NULL AND address <= $5 AND $6::text IS NULL",
        rest: "account = $1 AND kind = 'claim' AND namespace IS NULL \
               AND address > $2 AND $3::text IS NULL \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL",
    },
    across: claims_walker! {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE kind = 'claim' AND namespace IS NULL \
                       AND (account, kind, address) > ($1, 'claim', $2) AND $3::text IS NULL \
                     ORDER BY account, kind, address OFFSET $4 LIMIT 1",
        window: "kind = 'claim' AND namespace IS NULL \
               AND (account, kind, address) > ($1, 'claim', $2) AND $3::text IS NULL \
               AND (account, kind, address) <= ($4, 'claim', $5) AND $6::text IS NULL",
        rest: "kind = 'claim' AND namespace IS NULL \
               AND (account, kind, address) > ($1, 'claim', $2) AND $3::text IS NULL \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL",
    },
};

/// The lane of claims in a namespace: `(account, kind, address, namespace)
/// WHERE namespace IS NOT NULL`. By account, walked by `(address,
/// namespace)`; across accounts, by all four columns: row comparisons the
/// index serves as one range.
pub const WITHIN_NAMESPACE: Lane = Lane {
    start_namespace: Some(""),
    first_account: "SELECT min(account) AS account FROM idem_records \
                    WHERE kind = 'claim' AND namespace IS NOT NULL",
    next_account: "SELECT min(account) AS account FROM idem_records \
                   WHERE account > $1 AND kind = 'claim' AND namespace IS NOT NULL",
    by_account: claims_walker! {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE account = $1 AND kind = 'claim' AND namespace IS NOT NULL \
                       AND (address, namespace) > ($2, $3) \
                     ORDER BY address, namespace OFFSET $4 LIMIT 1",
        window: "account = $1 AND kind = 'claim' AND namespace IS NOT NULL \
               AND (address, namespace) > ($2, $3) \
               AND $4::text IS NULL AND (address, namespace) <= ($5, $6)",
        rest: "account = $1 AND kind = 'claim' AND namespace IS NOT NULL \
               AND (address, namespace) > ($2, $3) \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL",
    },
    across: claims_walker! {
        window_end: "SELECT account, address, namespace FROM idem_records \
                     WHERE kind = 'claim' AND namespace IS NOT NULL \
                       AND (account, kind, address, namespace) > ($1, 'claim', $2, $3) \
                     ORDER BY account, kind, address, namespace OFFSET $4 LIMIT 1",
        window: "kind = 'claim' AND namespace IS NOT NULL \
               AND (account, kind, address, namespace) > ($1, 'claim', $2, $3) \
               AND (account, kind, address, namespace) <= ($4, 'claim', $5, $6)",
        rest: "kind = 'claim' AND namespace IS NOT NULL \
               AND (account, kind, address, namespace) > ($1, 'claim', $2, $3) \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL",
    },
};

/// The steps whose claim is gone, in the index of a claim's steps
/// (`idem_records_steps_of_claim`, `(account, claim_address) WHERE kind =
/// 'step'`): a lane of its own, walked after the claims' (whose steps go
/// with them, [`STEPS_OF_PRUNED`]), so that a released claim's steps are
/// pruned too, by the same age rule (`prunable_orphan_step!`). A position
/// is `($1, $2)`, an account and a claim's address (`$3`, `$6`: NULL, and
/// tested as NULL, numbered as in the claims' lanes); a window ends after
/// every step of its last claim, since `(account, claim_address)` is not
/// unique.
pub const ORPHAN_STEPS: Lane = Lane {
    start_namespace: None,
    first_account: "SELECT min(account) AS account FROM idem_records WHERE kind = 'step'",
    next_account: "SELECT min(account) AS account FROM idem_records \
                   WHERE account > $1 AND kind = 'step'",
    by_account: Walker {
        window_end: "SELECT account, claim_address AS address, NULL::text AS namespace \
                     FROM idem_records \
                     WHERE account = $1 AND kind = 'step' \
                       AND claim_address > $2 AND $3::text IS NULL \
                     ORDER BY claim_address OFFSET $4 LIMIT 1",
        delete_window: concat!(
            "DELETE FROM idem_records s \
             WHERE s.account = $1 AND s.kind = 'step' \
               AND s.claim_address > $2 AND $3::text IS NULL \
               AND $4::text IS NULL AND s.claim_address <= $5 AND $6::text IS NULL AND ",
            prunable_orphan_step!("$7"),
            " RETURNING s.kind, s.account, s.address, s.namespace"
        ),
        delete_rest: concat!(
            "DELETE FROM idem_records s \
             WHERE s.account = $1 AND s.kind = 'step' \
               AND s.claim_address > $2 AND $3::text IS NULL \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL AND ",
            prunable_orphan_step!("$7"),
            " RETURNING s.kind, s.account, s.address, s.namespace"
        ),
        compact_window: None,
        compact_rest: None,
    },
    across: Walker {
        window_end: "SELECT account, claim_address AS address, NULL::text AS namespace \
                     FROM idem_records \
                     WHERE kind = 'step' \
                       AND (account, claim_address) > ($1, $2) AND $3::text IS NULL \
                     ORDER BY account, claim_address OFFSET $4 LIMIT 1",
        delete_window: concat!(
            "DELETE FROM idem_records s \
             WHERE s.kind = 'step' \
               AND (s.account, s.claim_address) > ($1, $2) AND $3::text IS NULL \
               AND (s.account, s.claim_address) <= ($4, $5) AND $6::text IS NULL AND ",
            prunable_orphan_step!("$7"),
            " RETURNING s.kind, s.account, s.address, s.namespace"
        ),
        delete_rest: concat!(
            "DELETE FROM idem_records s \
             WHERE s.kind = 'step' \
               AND (s.account, s.claim_address) > ($1, $2) AND $3::text IS NULL \
               AND $4::text IS NULL AND $5::text IS NULL AND $6::text IS NULL AND ",
            prunable_orphan_step!("$7"),
            " RETURNING s.kind, s.account, s.address, s.namespace"
        ),
        compact_window: None,
        compact_rest: None,
    },
};

/// Deletes the prunable rows stored in heap pages `$1` (included) to `$2`
/// (excluded): claims settled before `$3`, and steps whose claim is gone,
/// by the same rule (`prunable_orphan_step!`); returns them, for their
/// steps ([`STEPS_OF_PRUNED`]). A batch of the walk in heap order. Index:
/// a TID range scan of those pages only (PostgreSQL 14 and later), of each
/// partition when partitioned; a step's claim, through the partial unique
/// index of its form.
pub const DELETE_HEAP_PAGES: &str = concat!(
    "DELETE FROM idem_records s \
     WHERE s.ctid >= ('(' || $1::int8 || ',0)')::tid AND s.ctid < ('(' || $2::int8 || ',0)')::tid \
       AND ((s.kind = 'claim' AND ",
    claim_prunable!("$3", "s"),
    ") OR (s.kind = 'step' AND ",
    prunable_orphan_step!("$3"),
    ")) RETURNING s.kind, s.account, s.address, s.namespace"
);

/// Compacts the claims past their value's window (`compactable!`) stored
/// in heap pages `$1` (included) to `$2` (excluded), and returns them, for
/// their steps; `$3`, the cut-off, is bound alike and not needed. The
/// compaction of a batch of the walk in heap order. Index: a TID range
/// scan of those pages only. A row compacted into a later page is not
/// compacted again there: it is 8 bytes of identity already.
pub const COMPACT_HEAP_PAGES: &str = concat!(
    "UPDATE idem_records SET ",
    super::claims::compacted!(),
    " WHERE ctid >= ('(' || $1::int8 || ',0)')::tid AND ctid < ('(' || $2::int8 || ',0)')::tid \
       AND ",
    super::claims::compactable!(),
    " AND $3::int8 IS NOT NULL RETURNING kind, account, address, namespace"
);

/// The statements that delete the steps of the claims a batch just
/// deleted, in the batch's transaction, in the two forms of the namespace
/// test: every step whose `claim_address` is a pruned claim's, in its
/// account and namespace. Whatever its state: its claim is gone for good
/// (settled, and past the horizon), and a retry runs anew, every step
/// with it. Index: the index of a claim's steps, `(account,
/// claim_address) WHERE kind = 'step'`, probed once per pruned claim.
pub struct StepsOfPruned {
    /// Claims of one account (a walk by account: every statement names
    /// it, for Citus to route): `$1` the account, `$2` the claims'
    /// addresses, `$3` their namespaces (NULL, and tested as NULL, in the
    /// form without one).
    pub by_account: SplitOnNamespace,
    /// Claims of any accounts: `$1` their accounts, `$2` their addresses,
    /// `$3` their namespaces (as above).
    pub across: SplitOnNamespace,
}

/// [`StepsOfPruned`].
pub const STEPS_OF_PRUNED: StepsOfPruned = StepsOfPruned {
    by_account: SplitOnNamespace {
        without_namespace: "DELETE FROM idem_records s \
             USING unnest($2::text[]) AS p(address) \
             WHERE s.account = $1 AND s.kind = 'step' AND s.claim_address = p.address \
               AND s.namespace IS NULL AND $3::text[] IS NULL",
        within_namespace: "DELETE FROM idem_records s \
             USING unnest($2::text[], $3::text[]) AS p(address, namespace) \
             WHERE s.account = $1 AND s.kind = 'step' AND s.claim_address = p.address \
               AND s.namespace = p.namespace",
    },
    across: SplitOnNamespace {
        without_namespace: "DELETE FROM idem_records s \
             USING unnest($1::text[], $2::text[]) AS p(account, address) \
             WHERE s.account = p.account AND s.kind = 'step' AND s.claim_address = p.address \
               AND s.namespace IS NULL AND $3::text[] IS NULL",
        within_namespace: "DELETE FROM idem_records s \
             USING unnest($1::text[], $2::text[], $3::text[]) AS p(account, address, namespace) \
             WHERE s.account = p.account AND s.kind = 'step' AND s.claim_address = p.address \
               AND s.namespace = p.namespace",
    },
};

/// How far the heap of `idem_records` goes, for a walk in heap order: the
/// pages of its largest heap (of the table, or of its largest partition),
/// the rows and pages the statistics last counted in all of them (for the
/// rows a page holds), and how many heaps a batch's page range covers (the
/// table's, or each partition's). Index: none; it reads the catalog.
pub(super) const HEAP_EXTENT: &str = "SELECT \
         coalesce(max(pg_relation_size(c.oid)), 0) / current_setting('block_size')::int8 \
             AS pages, \
         coalesce(sum(greatest(c.reltuples, 0)), 0)::float8 AS counted_rows, \
         coalesce(sum(c.relpages), 0)::int8 AS counted_pages, \
         count(*) AS heaps \
     FROM pg_class c \
     WHERE c.relkind = 'r' AND c.oid IN ( \
         SELECT to_regclass('idem_records') \
         UNION ALL \
         SELECT relid FROM pg_partition_tree(to_regclass('idem_records')) WHERE isleaf)";

/// The server's version, as a number (150004 for 15.4).
pub(super) const SERVER_VERSION: &str =
    "SELECT current_setting('server_version_num')::int4 AS version";

/// The first version whose planner turns `ctid` ranges into a TID range
/// scan; before it, [`DELETE_HEAP_PAGES`] would read the whole table for
/// every batch.
const TID_RANGE_SCANS_SINCE: i32 = 140_000;

/// Rows per heap page assumed when the statistics have never counted any:
/// about what a page holds of claims without a replayed value.
const ROWS_PER_PAGE_UNCOUNTED: f64 = 50.0;

/// The lanes, in the order a walk takes them: the claims' (with their
/// steps), then the steps whose claim is gone.
const LANES: [&Lane; 3] = [&WITHOUT_NAMESPACE, &WITHIN_NAMESPACE, &ORPHAN_STEPS];

/// A batch size of ten thousand: a batch then deletes in tens of
/// milliseconds and writes a few megabytes of WAL (a row lock each, held
/// that long), while its round trips and its commit stay a small part of
/// its time. BENCHMARKS.md ("Prune in batches") has the figures.
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

/// How many claims [`prune`] would compact now: successes past the window
/// in which their value is kept, in the filter's account or all
/// ([`Pruning::compacted`] says what compacting does). The cut-off plays
/// no part: every prune compacts them.
pub async fn count_compactable(pool: &PgPool, filter: &PruneFilter<'_>) -> Result<u64, Error> {
    let row = sqlx::query(COUNT_COMPACTABLE)
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
/// deletes the prunable claims among the next `batch_size` or so claims of
/// a walk through the table (on PostgreSQL 14 and later a range of heap
/// pages; before, and on Citus, the next entries of a partial unique index;
/// never a scan of the whole table) in a transaction of its own, and moves
/// on only once that has committed.
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
/// let filter = PruneFilter::new(ninety_days_ago);
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
    /// About how many claims a batch covers: index entries, or heap pages
    /// holding about that many.
    batch_size: NonZeroU32,
    /// How the walk goes, once the first batch has found out.
    walk: Option<Walk>,
    /// Which of [`LANES`] the walk is in; past the last: done.
    lane: usize,
    /// Where the walk is in the current lane.
    at: Position,
    /// Steps deleted so far: the pruned claims' and those whose claim is
    /// gone.
    steps_deleted: u64,
    /// Claims compacted so far, past their value's window.
    compacted: u64,
}

/// How a walk goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Walk {
    /// Through each lane one account after the other, every statement
    /// naming its account: on Citus, where that routes it to one shard (a
    /// window across shards is a `LIMIT` across shards, which Citus refuses
    /// in a `DELETE`), and for a prune of one account.
    ByAccount,
    /// Through each lane across accounts, in the index's order: on
    /// PostgreSQL 12 and 13, which cannot scan a range of heap pages.
    Across,
    /// Through the heap, `pages` pages a batch (each partition's, when
    /// partitioned), up to page `end`: on PostgreSQL 14 and later. A table
    /// fills its heap in the order claims are made, so a batch of
    /// neighbouring pages deletes claims settled about the same time, page
    /// after page; a window of an index holds claims from all over the
    /// heap, each batch dirtying (and writing to the WAL) thousands of
    /// pages that later batches dirty again.
    HeapOrder {
        /// Pages a batch covers.
        pages: i64,
        /// The page past the last one.
        end: i64,
    },
}

/// The order of a walk through the lanes' indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexOrder {
    /// [`Walk::ByAccount`].
    ByAccount,
    /// [`Walk::Across`].
    Across,
}

impl Walk {
    /// The walk for a table on a server of `version` (`server_version_num`)
    /// that Citus distributes or not, pruning one account or all: in heap
    /// order wherever it can be.
    fn choose(version: i32, distributed: bool, one_account: bool) -> Walk {
        if one_account || distributed {
            Walk::ByAccount
        } else if heap_walk_possible(version) {
            // Filled in from the heap's extent by the caller.
            Walk::HeapOrder { pages: 1, end: 0 }
        } else {
            Walk::Across
        }
    }
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
    /// In heap order: the next batch starts at this page.
    Page(i64),
}

impl Pruning {
    /// A walk over the claims `filter` selects, about `batch_size` claims a
    /// batch (index entries, or heap pages holding about that many).
    pub fn new(filter: &PruneFilter<'_>, batch_size: NonZeroU32) -> Pruning {
        Pruning {
            cut_off: micros_rounded_up(filter.settled_before),
            only_account: filter.account.map(str::to_owned),
            batch_size,
            walk: None,
            lane: 0,
            at: Position::Start,
            steps_deleted: 0,
            compacted: 0,
        }
    }

    /// The same walk through the indexes across accounts, whatever the
    /// server: what PostgreSQL 12 and 13 take, for the tests on a later one.
    pub fn across_indexes(mut self) -> Pruning {
        self.walk = Some(Walk::Across);
        self
    }

    /// How many steps the batches so far deleted: the steps of the claims
    /// they pruned, and steps whose claim is gone (released, and never
    /// claimed again) that were recorded before the cut-off.
    pub fn steps_deleted(&self) -> u64 {
        self.steps_deleted
    }

    /// How many claims the batches so far compacted: successes past the
    /// window in which their value is kept
    /// ([`keep_value_for`](crate::Guard::keep_value_for)), whose value,
    /// fingerprint and steps a batch deletes, and whose identity it
    /// replaces by the check a duplicate's collision test needs. Their
    /// slots stay; a duplicate is refused as before.
    pub fn compacted(&self) -> u64 {
        self.compacted
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
        let order = match walk {
            Walk::HeapOrder { pages, end } => return self.next_pages(pool, pages, end).await,
            Walk::ByAccount => IndexOrder::ByAccount,
            Walk::Across => IndexOrder::Across,
        };
        while let Some(&lane) = LANES.get(self.lane) {
            let start = || (String::new(), lane.start_namespace.map(str::to_owned));
            let (account, address, namespace) = match (&self.at, order) {
                (
                    Position::After {
                        account,
                        address,
                        namespace,
                    },
                    _,
                ) => (account.clone(), address.clone(), namespace.clone()),
                (Position::Start, IndexOrder::Across) => {
                    let (address, namespace) = start();
                    (String::new(), address, namespace)
                }
                (Position::Start | Position::Past(_) | Position::Page(_), _) => {
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
            let walker = match order {
                IndexOrder::ByAccount => &lane.by_account,
                IndexOrder::Across => &lane.across,
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
                        (order == IndexOrder::Across).then_some(end_account),
                        Some(end_address),
                        end_namespace.as_ref(),
                    ),
                ),
                None => (walker.delete_rest, (None, None, None)),
            };
            let compaction = match &window_end {
                Some(_) => walker.compact_window,
                None => walker.compact_rest,
            };
            let bound = |statement| {
                sqlx::query(statement)
                    .bind(&account)
                    .bind(&address)
                    .bind(&namespace)
                    .bind(end.0)
                    .bind(end.1)
                    .bind(end.2)
                    .bind(self.cut_off)
            };
            let steps_of = match order {
                IndexOrder::ByAccount => StepsOf::Account(&account),
                IndexOrder::Across => StepsOf::AnyAccount,
            };
            let deleted =
                delete_batch(pool, bound(statement), compaction.map(bound), steps_of).await?;
            self.steps_deleted += deleted.steps;
            self.compacted += deleted.compacted;
            // Committed: only now does the walk move on.
            self.at = match (window_end, order) {
                (Some((account, address, namespace)), _) => Position::After {
                    account,
                    address,
                    namespace,
                },
                (None, IndexOrder::ByAccount) => Position::Past(account),
                (None, IndexOrder::Across) => {
                    self.lane += 1;
                    Position::Start
                }
            };
            return Ok(Some(deleted.claims));
        }
        Ok(None)
    }

    /// A batch of the walk in heap order: the pages from where the last one
    /// stopped, `pages` of them, until page `end`.
    async fn next_pages(
        &mut self,
        pool: &PgPool,
        pages: i64,
        end: i64,
    ) -> Result<Option<u64>, Error> {
        let from = match self.at {
            Position::Page(page) => page,
            _ => 0,
        };
        if from >= end {
            self.lane = LANES.len();
            return Ok(None);
        }
        let to = from.saturating_add(pages);
        let bound = |statement| {
            sqlx::query(statement)
                .bind(from)
                .bind(to)
                .bind(self.cut_off)
        };
        let deleted = delete_batch(
            pool,
            bound(DELETE_HEAP_PAGES),
            Some(bound(COMPACT_HEAP_PAGES)),
            StepsOf::AnyAccount,
        )
        .await?;
        self.steps_deleted += deleted.steps;
        self.compacted += deleted.compacted;
        self.at = Position::Page(to);
        Ok(Some(deleted.claims))
    }

    /// How this walk goes ([`Walk::choose`]), asked of the server; a walk in
    /// heap order covers about `batch_size` claims a batch, by the rows a
    /// page held when the statistics last counted, and ends at the heap's
    /// end now (claims stored after it are newer than the prune).
    async fn choose_walk(&self, pool: &PgPool) -> Result<Walk, Error> {
        let mut conn = pool.acquire().await?;
        let distributed = match citus::citus_version(&mut conn).await? {
            None => false,
            Some(_) => citus::distribution(&mut conn)
                .await?
                .is_some_and(|distribution| distribution.column_name.is_some()),
        };
        let version: i32 = sqlx::query(SERVER_VERSION)
            .fetch_one(&mut *conn)
            .await?
            .try_get("version")?;
        let walk = Walk::choose(version, distributed, self.only_account.is_some());
        if walk != (Walk::HeapOrder { pages: 1, end: 0 }) {
            return Ok(walk);
        }
        let extent = sqlx::query(HEAP_EXTENT).fetch_one(&mut *conn).await?;
        let end: i64 = extent.try_get("pages")?;
        let counted_rows: f64 = extent.try_get("counted_rows")?;
        let counted_pages: i64 = extent.try_get("counted_pages")?;
        let heaps: i64 = extent.try_get("heaps")?;
        Ok(Walk::HeapOrder {
            pages: pages_per_batch(self.batch_size, counted_rows, counted_pages, heaps),
            end,
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

/// Whose steps a batch's claims are, for [`STEPS_OF_PRUNED`].
#[derive(Debug, Clone, Copy)]
enum StepsOf<'a> {
    /// One account's (a walk by account: the statement names it).
    Account(&'a str),
    /// Any accounts'.
    AnyAccount,
}

/// What one batch deleted, and compacted.
#[derive(Debug, Clone, Copy, Default)]
struct Deleted {
    claims: u64,
    steps: u64,
    compacted: u64,
}

/// Runs a batch's `DELETE`, which returns the rows it deleted (`kind`,
/// `account`, `address`, `namespace`), then its compaction, which returns
/// the claims it compacted alike, and deletes the steps of the claims
/// among both ([`STEPS_OF_PRUNED`]), in one transaction: a pruned or
/// compacted claim never leaves its steps behind, and a batch that fails
/// changes nothing. The claims' rows stay locked until the commit, so no
/// retry can claim the slot anew (and begin steps under it) in between.
async fn delete_batch(
    pool: &PgPool,
    delete: Query<'_, Postgres, PgArguments>,
    compact: Option<Query<'_, Postgres, PgArguments>>,
    steps_of: StepsOf<'_>,
) -> Result<Deleted, Error> {
    let mut conn = super::guarded::Guarded::acquire(pool).await?;
    let mut tx = conn.begin().await?;
    let rows = delete.fetch_all(&mut *tx).await?;
    let compacted = match compact {
        Some(compact) => compact.fetch_all(&mut *tx).await?,
        None => Vec::new(),
    };
    let mut deleted = Deleted {
        compacted: compacted.len() as u64,
        ..Deleted::default()
    };
    // The pruned claims, by the namespace test of the statement that
    // deletes their steps: accounts, addresses, namespaces.
    let mut without: (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let mut within: (Vec<String>, Vec<String>, Vec<String>) = (Vec::new(), Vec::new(), Vec::new());
    for (row, was_deleted) in rows
        .iter()
        .map(|row| (row, true))
        .chain(compacted.iter().map(|row| (row, false)))
    {
        let kind: String = row.try_get("kind")?;
        if kind != "claim" {
            deleted.steps += 1;
            continue;
        }
        deleted.claims += u64::from(was_deleted);
        let account: String = row.try_get("account")?;
        let address: String = row.try_get("address")?;
        match row.try_get::<Option<String>, _>("namespace")? {
            None => {
                without.0.push(account);
                without.1.push(address);
            }
            Some(namespace) => {
                within.0.push(account);
                within.1.push(address);
                within.2.push(namespace);
            }
        }
    }
    let (statements, account) = match steps_of {
        StepsOf::Account(account) => (&STEPS_OF_PRUNED.by_account, Some(account)),
        StepsOf::AnyAccount => (&STEPS_OF_PRUNED.across, None),
    };
    let forms = [
        (None, without.0, without.1, None),
        (Some(""), within.0, within.1, Some(within.2)),
    ];
    for (namespace, accounts, addresses, namespaces) in forms {
        if addresses.is_empty() {
            continue;
        }
        let statement = sqlx::query(statements.for_namespace(namespace));
        let statement = match account {
            Some(account) => statement.bind(account),
            None => statement.bind(accounts),
        };
        deleted.steps += statement
            .bind(addresses)
            .bind(namespaces)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    tx.commit().await?;
    Ok(deleted)
}

/// Whether a server of `version` (`server_version_num`) scans a range of
/// heap pages as such, so that a walk in heap order is bounded work.
pub fn heap_walk_possible(version: i32) -> bool {
    version >= TID_RANGE_SCANS_SINCE
}

/// Heap pages a batch of about `batch_size` claims covers in each of
/// `heaps` heaps, at the rows per page the statistics counted
/// (`counted_rows` in `counted_pages`), or [`ROWS_PER_PAGE_UNCOUNTED`]; at
/// least one.
fn pages_per_batch(
    batch_size: NonZeroU32,
    counted_rows: f64,
    counted_pages: i64,
    heaps: i64,
) -> i64 {
    let rows_per_page = if counted_pages > 0 && counted_rows >= 1.0 {
        counted_rows / counted_pages as f64
    } else {
        ROWS_PER_PAGE_UNCOUNTED
    };
    let rows_per_page_range = rows_per_page.max(1.0) * heaps.max(1) as f64;
    // Saturating: at most 2^32 claims over at least a row a page.
    ((f64::from(batch_size.get()) / rows_per_page_range).ceil() as i64).max(1)
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
    fn the_walk_goes_in_heap_order_where_tid_range_scans_exist_and_by_account_on_citus() {
        let heap = Walk::HeapOrder { pages: 1, end: 0 };
        assert_eq!(Walk::choose(120_000, false, false), Walk::Across);
        assert_eq!(Walk::choose(130_020, false, false), Walk::Across);
        assert_eq!(Walk::choose(140_000, false, false), heap);
        assert_eq!(Walk::choose(180_000, false, false), heap);
        assert_eq!(Walk::choose(150_000, true, false), Walk::ByAccount);
        assert_eq!(Walk::choose(150_000, false, true), Walk::ByAccount);
    }

    #[test]
    fn a_batch_of_pages_holds_about_the_batch_size_in_claims() {
        let size = |n| NonZeroU32::new(n).expect("not zero");
        assert_eq!(pages_per_batch(size(10_000), 5_000_000.0, 100_000, 1), 200);
        assert_eq!(pages_per_batch(size(10_000), 5_000_000.0, 100_000, 16), 13);
        assert_eq!(pages_per_batch(size(10_000), 0.0, 0, 1), 200);
        assert_eq!(pages_per_batch(size(1), 5_000_000.0, 100_000, 4), 1);
        assert_eq!(pages_per_batch(size(7), 2.0, 3, 1), 7);
    }

    #[test]
    fn every_batch_deletes_only_successes_and_a_walk_by_account_names_it() {
        for lane in LANES {
            let walker = &lane.by_account;
            for statement in [walker.window_end, walker.delete_window, walker.delete_rest] {
                assert!(statement.contains("account = $1"), "{statement}");
            }
            let compactions = [walker.compact_window, walker.compact_rest];
            for statement in compactions.into_iter().flatten() {
                assert!(statement.contains("account = $1"), "{statement}");
            }
            for walker in [&lane.by_account, &lane.across] {
                let compactions = [walker.compact_window, walker.compact_rest];
                let statements = [walker.delete_window, walker.delete_rest]
                    .into_iter()
                    .chain(compactions.into_iter().flatten());
                for statement in statements {
                    assert!(statement.contains("state = 'success'"), "{statement}");
                    assert!(statement.contains("$7"), "{statement}");
                    assert!(!statement.contains("LIMIT"), "{statement}");
                }
            }
        }
        assert!(DELETE_HEAP_PAGES.contains("state = 'success'"));
        assert!(COMPACT_HEAP_PAGES.contains("state = 'success'"));
    }
}
