//! The one SQL layer: every statement idem runs against its own tables
//! (`idem_records`, `idem_schema_version`) and the catalog queries about
//! them, and nothing else. The modules above it (the gate, the meter, the
//! schema set-up, the CLI through [`operations`]) decide what to do; this
//! layer says it to PostgreSQL and reads the answer back.
//!
//! | module | its statements |
//! |---|---|
//! | `claims` | the claim path: claim, lookup, take over, settle, release, extend, late successes, keep a failure, hold in doubt |
//! | `batch` | the claim path for many slots at once: claim, look up, and one statement per kind of outcome |
//! | `metering` | usage events: record a batch, total a meter |
//! | `ordered` | ordered events: the claim that takes an event's entity (in one statement; on Citus, in routed statements in one transaction), and what each outcome does to it |
//! | [`operations`] | what operators do (the `idem` command): list, show, release, resolve, prune |
//! | `browse` | what the operator console reads (re-exported by [`operations`]): open claims counted, pages of claims by keyset, one claim described |
//! | `gauges` | the claim gauges of feature `metrics`: pending past an age, in doubt, the oldest of each |
//! | `prune` | pruning settled claims, and their steps with them: counted, and deleted in batches (heap page ranges on PostgreSQL 14+, a keyset walk of the partial unique indexes before that and on Citus; re-exported by [`operations`]); steps whose claim is gone, by the same age rule |
//! | `steps` | steps inside one claim (`idem::step`): begin, look up, record, abandon, retake |
//! | `catalog` | schema set-up, its version, the verification and partition queries |
//! | `citus` | the Citus catalog: coordinator, distribution, indexes on every shard placement, and distributing the table |
//!
//! # Rules every statement follows
//!
//! - **Named.** Each statement is a `const` (or, where it must vary, a named
//!   function that joins fixed pieces) whose doc comment says what it does,
//!   what its parameters are, and which index serves it.
//! - **Written once.** A statement that can commit without waiting for the
//!   WAL flush ([`Commit::Async`]) is one `const` holding both forms
//!   ([`PerCommit`]), generated from the one text by `per_commit!`: the
//!   asynchronous form only joins the item that turns `synchronous_commit`
//!   off for its own transaction.
//! - **Found through a partial unique index.** A row is found by its address
//!   through one of the two partial unique indexes, `(account, kind,
//!   address) WHERE namespace IS NULL` and `(account, kind, address,
//!   namespace) WHERE namespace IS NOT NULL`. PostgreSQL uses a partial
//!   index only when the statement's own `WHERE` implies the index's
//!   predicate, so the namespace test is spelled out: every such statement
//!   comes in two forms ([`SplitOnNamespace`]), one with `namespace IS NULL`
//!   and one with `namespace = $n`, chosen by the caller's namespace. Never
//!   `namespace IS NOT DISTINCT FROM $n` or `($n IS NULL AND namespace IS
//!   NULL) OR namespace = $n`: neither implies either predicate, and each
//!   turns a lookup into a scan of the whole table. The `index_use` test
//!   (`tests/testsuite/store/index_use.rs`) runs `EXPLAIN` on each of them and fails on a plan that does not use
//!   one of the two indexes.
//! - **Open claims listed through their index.** A statement that lists or
//!   counts claims of an open state (the reconciler's listing, `claims list
//!   --state`, the gauges, the console's lists) says `open_claims!`, the
//!   predicate of the index of open claims, so it reads only the claims not
//!   settled, never the millions that are. The `index_use` test checks those
//!   too.
//! - **Decoded by column name.** Rows are read with `row.try_get("fence")`,
//!   never by position, so a select list can be reordered, or a row shared
//!   by two statements, without shifting one field into another.
//! - **One statement, one round trip.** Nothing here opens a transaction of
//!   its own except the schema set-up, and an ordered event's claim on
//!   Citus, whose routed statements must commit together (`ordered`): a
//!   claim commits the moment it is won.
//! - **The bottom layer.** Nothing here imports the gate, the claim, the
//!   expansion, the meter, the schema module or the test helpers; they
//!   import this.

// Public only through `idem_runtime::__internal::store`, for idem's own
// tests of the statements' plans and transitions (`tests/testsuite/store/`).
#[doc(hidden)]
pub mod batch;
#[doc(hidden)]
pub mod browse;
#[doc(hidden)]
pub mod catalog;
pub(crate) mod citus;
#[doc(hidden)]
pub mod claims;
#[cfg(feature = "metrics")]
#[doc(hidden)]
pub mod gauges;
// A pooled connection closed, not pooled again, when dropped mid-BEGIN.
pub(crate) mod guarded;
#[doc(hidden)]
pub mod metering;
pub mod operations;
#[doc(hidden)]
pub mod ordered;
#[doc(hidden)]
pub mod prune;
#[doc(hidden)]
pub mod steps;
#[cfg(feature = "cache")]
pub(crate) mod store_id;

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

pub(crate) use batch::{NewBatchItem, claim_batch, lookup_batch, record_batch};
// The batch claim's text, for benchmarks (`idem::__internal`).
pub(crate) use batch::CLAIM_BATCH;
pub(crate) use claims::{
    BODY_IN_DOUBT, ClaimAnswer, Existing, KEPT_FAILURE, KeptValue, LANDED_CHANNEL, LATE_SUCCESS,
    LEASE_EXPIRED, LateSuccess, NewClaim, SettledCarrying, Windows, Within, Wrote, claim,
    expire_in_doubt, extend, hold_in_doubt, keep, lookup, mark_awaited, release, reopen_expired,
    settle, settle_carrying_step, settle_over, settle_own_hold, settle_vacant, take_over, wake,
    wake_all,
};
pub(crate) use operations::{ClaimState, StepState};
pub(crate) use ordered::{NewOrderedItem, OrderedBy, claim_ordered_batch};
pub(crate) use steps::{
    CarriedRecord, NewStep, StepRow, abandon_step, begin_step, lookup_step, pending_steps,
    record_and_begin_step, record_step, record_unmarked_step, resolve_step, steps_for_replay,
};

/// Where a claim (or a usage event) lives, besides its address.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The account.
    pub account: &'a str,
    /// The namespace, if any.
    pub namespace: Option<&'a str>,
}

/// What the table is on, as far as the shape of a statement matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// One PostgreSQL, partitioned or not (or a table Citus does not
    /// distribute).
    PostgreSQL,
    /// A table Citus distributes: a statement whose CTE inserts into the
    /// table is not routed to the one worker holding the account's shard,
    /// but planned in steps whose intermediate results go to every worker,
    /// so the claim takes the routed two-statement form there, and an
    /// ordered event's claim its routed statements in one transaction
    /// (`ordered`).
    Citus,
}

/// How a settle or release commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Waits for the WAL flush, as every commit does by default.
    Durable,
    /// Returns before the WAL flush (`synchronous_commit = off`).
    Async,
}

/// A statement in the two forms a [`Commit`] calls for, both generated by
/// `per_commit!` from the one text of its durable form, so that a change
/// to the statement is a change to both.
pub struct PerCommit<S: 'static> {
    /// Waits for the WAL flush.
    pub durable: S,
    /// The durable form with `async_commit!()` joined into its `FROM` (or
    /// `USING`) list: nothing else differs.
    pub asynchronous: S,
}

impl<S> PerCommit<S> {
    /// The form that commits as `commit` says.
    fn committing(&self, commit: Commit) -> &S {
        match commit {
            Commit::Durable => &self.durable,
            Commit::Async => &self.asynchronous,
        }
    }
}

/// The item that makes a statement commit without waiting for its WAL to
/// reach the disk: `synchronous_commit` set for the statement's own
/// transaction only (`is_local`), from inside the statement, so it costs no
/// round trip and leaves nothing behind on the pooled connection.
macro_rules! async_commit {
    () => {
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
    };
}
use async_commit;

/// The test that a row of `idem_records` (aliased `$alias`, with its dot:
/// `"r."`, or `""`) is an open claim: pending, in doubt, or kept failed.
/// It is the predicate of the index of open claims (schema v9,
/// `idem_records_open_claims`, `(account, state, created_at, address)`),
/// word for word: PostgreSQL reads a partial index only for a statement
/// whose `WHERE` implies its predicate, and it cannot prove `state IS
/// DISTINCT FROM 'success'` from `state = 'in_doubt'`, only from the
/// predicate itself. That is the point of spelling it so: nor can it from a
/// settle's `state = 'pending'`, so no settle is ever planned on this index
/// (with `state <> 'success'` one was, on a small table).
macro_rules! open_claims {
    ($alias:literal) => {
        concat!(
            $alias,
            "kind = 'claim' AND ",
            $alias,
            "state IS DISTINCT FROM 'success'"
        )
    };
}
use open_claims;

/// When a claim began, over `idem_records r`: its `created_at`, or, for a
/// success a prune compacted (which keeps none: `sql/v11.sql`), its
/// settle. What every listing shows, counts ages from and orders by.
macro_rules! began_at {
    () => {
        "coalesce(r.created_at, r.settled_at)"
    };
}
use began_at;

/// Since when a claim's age counts, over `idem_records r`: a claim in
/// doubt's from when it went in doubt (or its creation, for a row that
/// turned before `in_doubt_since` existed), any other's from when it
/// began (`began_at!`). The rule `idem claims list --older-than` and the
/// console's filters follow.
macro_rules! age_since {
    () => {
        concat!(
            "CASE WHEN r.state = 'in_doubt' THEN coalesce(r.in_doubt_since, r.created_at) \
                  ELSE ",
            began_at!(),
            " END"
        )
    };
}
use age_since;

/// The end of a statement that deletes one claim (it opens with
/// `WITH released AS (DELETE FROM idem_records`, and its `WHERE` finds the
/// claim as [`per_row!`]'s does), in the form of `$entity_namespace_test`
/// (`"e.namespace IS NULL"` or `"e.namespace = $3"`, as the claim's). In
/// the same statement, when the claim was deleted:
/// - its steps are stamped `released_at = now()`, so that prune measures
///   their age from the release, not from when they were recorded (a claim
///   held in doubt for weeks and then released keeps the steps its retry
///   replays). They are found through `idem_records_steps_of_claim` (`$1`
///   the account, `$2` the claim's address); `namespace IS NOT DISTINCT
///   FROM $3` serves both namespace forms. The stamp waits for the
///   `DELETE` (the `EXISTS` reads its rows), so a release locks its claim
///   before its steps, as every other statement that locks both does.
/// - the entity of an ordered event (`entity`, schema v12) is freed, if
///   this claim holds it: a claim that finds its entity's holder missing
///   cannot tell a deleted row from one committed after its snapshot, and
///   takes the entity as held (`store::ordered`). Through the partial
///   unique index of the claim's form; a claim of no entity finds none.
///
/// It selects (`$select`, of the deleted row `r`) a row per claim deleted,
/// none when the claim was no longer there to delete, so the statement's
/// count is the `DELETE`'s.
macro_rules! stamping_released_steps {
    ($returning:literal, $select:expr, $entity_namespace_test:literal) => {
        concat!(
            "RETURNING entity AS released_entity, ",
            $returning,
            "), stamped AS (UPDATE idem_records SET released_at = now() \
             WHERE account = $1 AND kind = 'step' AND claim_address = $2 \
               AND namespace IS NOT DISTINCT FROM $3 AND EXISTS (SELECT FROM released)), \
             freed AS (UPDATE idem_records e SET held_by = NULL, event_order = NULL \
             FROM released r \
             WHERE e.account = $1 AND e.kind = 'entity' AND e.address = r.released_entity \
               AND ",
            $entity_namespace_test,
            " AND e.held_by = $2) \
             SELECT ",
            $select,
            " FROM released r"
        )
    };
}
use stamping_released_steps;

/// A [`PerCommit`] from one statement: `$form!($head, ...)` (a statement
/// macro, such as [`per_row!`], whose first argument is the statement up to
/// its `WHERE`) is the durable form; the asynchronous form is the same call
/// with `async_commit!()` joined into `$head`'s list:
/// - `opening "FROM"` (or `"USING"`): `$head` has no list, and the item
///   opens one;
/// - `leading`: `$head` ends with its list's `FROM` or `USING`, and the item
///   comes first in that list.
macro_rules! per_commit {
    (opening $keyword:literal, $form:ident!($head:expr $(, $($rest:tt)+)?)) => {
        $crate::store::PerCommit {
            durable: $form!($head $(, $($rest)+)?),
            asynchronous: $form!(
                concat!($head, " ", $keyword, " ", $crate::store::async_commit!())
                $(, $($rest)+)?
            ),
        }
    };
    (leading, $form:ident!($head:expr $(, $($rest:tt)+)?)) => {
        $crate::store::PerCommit {
            durable: $form!($head $(, $($rest)+)?),
            asynchronous: $form!(
                concat!($head, " ", $crate::store::async_commit!(), ",")
                $(, $($rest)+)?
            ),
        }
    };
}
use per_commit;

/// A statement in the two forms that the two partial unique indexes call
/// for: one for rows without a namespace (`namespace IS NULL`), one for rows
/// in a namespace (`namespace = $n`). Each form's `WHERE` implies its
/// index's predicate, so each can be served by that index.
pub struct SplitOnNamespace {
    without_namespace: &'static str,
    within_namespace: &'static str,
}

impl SplitOnNamespace {
    /// The form for rows in `namespace` (`None`: without one).
    pub fn for_namespace(&self, namespace: Option<&str>) -> &'static str {
        match namespace {
            None => self.without_namespace,
            Some(_) => self.within_namespace,
        }
    }

    /// The form for `scope`, with the parameters every statement over one
    /// row shares bound: `$1` the account, `$2` the address, `$3` the
    /// namespace (NULL, and tested as NULL, in the form without one, so that
    /// later parameters are numbered alike in both forms).
    fn for_row<'q>(&self, scope: Scope<'q>, address: &'q str) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(self.for_namespace(scope.namespace))
            .bind(scope.account)
            .bind(address)
            .bind(scope.namespace)
    }
}

/// A statement over one row found by its address, in both forms: `$1`
/// account, `$2` address, `$3` namespace ([`SplitOnNamespace::for_row`]),
/// then `AND $and` and a `$tail` (a `RETURNING` list) if given. A claim's
/// row unless `kind "..."` leads (a step's: `kind "step"`). A statement
/// that deletes the claim ends `; released(returning, select)`: the end
/// `stamping_released_steps!` writes, in each form's namespace test.
macro_rules! per_row {
    (kind $kind:literal, $statement:expr $(, $and:expr)? $(; $tail:expr)?) => {
        $crate::store::SplitOnNamespace {
            without_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = '", $kind, "' AND address = $2 \
                  AND namespace IS NULL AND $3::text IS NULL"
                $(, " AND ", $and)? $(, " ", $tail)?
            ),
            within_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = '", $kind, "' AND address = $2 AND namespace = $3"
                $(, " AND ", $and)? $(, " ", $tail)?
            ),
        }
    };
    ($statement:expr, $and:expr; released($returning:literal, $select:expr)) => {
        $crate::store::SplitOnNamespace {
            without_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = 'claim' AND address = $2 \
                  AND namespace IS NULL AND $3::text IS NULL AND ",
                $and,
                " ",
                $crate::store::stamping_released_steps!($returning, $select, "e.namespace IS NULL")
            ),
            within_namespace: concat!(
                $statement,
                " WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace = $3 AND ",
                $and,
                " ",
                $crate::store::stamping_released_steps!($returning, $select, "e.namespace = $3")
            ),
        }
    };
    ($statement:expr $(, $and:expr)? $(; $tail:expr)?) => {
        $crate::store::per_row!(kind "claim", $statement $(, $and)? $(; $tail)?)
    };
}
use per_row;

#[cfg(test)]
mod tests {
    use super::*;

    /// The item an asynchronous form joins, spelled out rather than taken
    /// from `async_commit!`, so that a change to it is seen here.
    const ASYNC_ITEM: &str =
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit";

    /// The source of every module of the store, by file name: what the
    /// tests below read to find every pair, so that a pair added without
    /// being listed in [`pairs`] is seen.
    const SOURCES: [(&str, &str); 14] = [
        ("mod.rs", include_str!("mod.rs")),
        ("batch.rs", include_str!("batch.rs")),
        ("browse.rs", include_str!("browse.rs")),
        ("catalog.rs", include_str!("catalog.rs")),
        ("citus.rs", include_str!("citus.rs")),
        ("claims.rs", include_str!("claims.rs")),
        ("gauges.rs", include_str!("gauges.rs")),
        ("guarded.rs", include_str!("guarded.rs")),
        ("metering.rs", include_str!("metering.rs")),
        ("operations.rs", include_str!("operations.rs")),
        ("ordered.rs", include_str!("ordered.rs")),
        ("prune.rs", include_str!("prune.rs")),
        ("steps.rs", include_str!("steps.rs")),
        ("store_id.rs", include_str!("store_id.rs")),
    ];

    /// Every statement pair's forms: the name of its const (and of what
    /// form: engine, namespace), durable text, asynchronous text.
    fn pairs() -> Vec<(String, &'static str, &'static str)> {
        let mut pairs = Vec::new();
        for (name, statement) in [
            ("SETTLE", &claims::SETTLE),
            ("SETTLE_CARRYING_STEP", &claims::SETTLE_CARRYING_STEP),
            ("RELEASE", &claims::RELEASE),
            ("KEEP", &claims::KEEP),
            ("RECORD_STEP", &steps::RECORD_STEP),
            ("ABANDON_STEP", &steps::ABANDON_STEP),
            ("RECORD_UNMARKED_STEP", &steps::RECORD_UNMARKED_STEP),
        ] {
            for namespace in [None, Some("n")] {
                pairs.push((
                    format!("{name} {namespace:?}"),
                    statement.durable.for_namespace(namespace),
                    statement.asynchronous.for_namespace(namespace),
                ));
            }
        }
        for (name, statement) in [
            ("SETTLE_BATCH", &batch::SETTLE_BATCH),
            ("RELEASE_BATCH", &batch::RELEASE_BATCH),
            ("KEEP_BATCH", &batch::KEEP_BATCH),
        ] {
            for engine in [Engine::PostgreSQL, Engine::Citus] {
                for namespace in [None, Some("n")] {
                    pairs.push((
                        format!("{name} {engine:?} {namespace:?}"),
                        statement.durable.text(engine, namespace),
                        statement.asynchronous.text(engine, namespace),
                    ));
                }
            }
        }
        pairs
    }

    /// An asynchronous form differs from its durable twin by the one item
    /// that turns `synchronous_commit` off, and by nothing else: the item
    /// opens a `FROM` or `USING` list, or leads the statement's own.
    #[test]
    fn every_asynchronous_statement_is_its_durable_twin_with_the_async_item() {
        let joined = [
            format!(" FROM {ASYNC_ITEM}"),
            format!(" USING {ASYNC_ITEM}"),
            format!(" {ASYNC_ITEM},"),
        ];
        for (name, durable, asynchronous) in pairs() {
            assert!(!durable.contains("synchronous_commit"), "{name}: {durable}");
            assert_eq!(
                asynchronous.matches(ASYNC_ITEM).count(),
                1,
                "{name}: {asynchronous}"
            );
            assert!(
                joined
                    .iter()
                    .any(|item| asynchronous.replacen(item.as_str(), "", 1) == durable),
                "{name}: {asynchronous}\n is not\n{durable}\n with the async item joined"
            );
        }
    }

    /// [`SOURCES`] is every module of the store, so a module added later is
    /// read too.
    #[test]
    fn the_sources_read_are_every_module_of_the_store() {
        let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store");
        let mut files: Vec<String> = std::fs::read_dir(directory)
            .expect("read the store's directory")
            .map(|entry| {
                let entry = entry.expect("read a directory entry");
                entry.file_name().to_string_lossy().into_owned()
            })
            .collect();
        files.sort();
        let mut read: Vec<String> = SOURCES.iter().map(|(file, _)| (*file).to_owned()).collect();
        read.sort();
        assert_eq!(files, read);
    }

    /// Every `PerCommit` const the store declares is one [`pairs`] checks:
    /// a pair added without being listed there would go unchecked, so the
    /// declarations are read from the source and compared with the list.
    #[test]
    fn every_statement_pair_the_store_declares_is_checked() {
        // Split so that this test's own source does not declare one.
        let declaration = [": Per", "Commit<"].concat();
        let mut declared: Vec<String> = SOURCES
            .iter()
            .flat_map(|(_, source)| source.lines())
            .filter(|line| line.contains(declaration.as_str()))
            .filter_map(|line| {
                let before = line.split(declaration.as_str()).next()?;
                Some(before.rsplit(' ').next()?.to_owned())
            })
            .collect();
        declared.sort();
        let mut checked: Vec<String> = pairs()
            .into_iter()
            .filter_map(|(name, _, _)| Some(name.split(' ').next()?.to_owned()))
            .collect();
        checked.sort();
        checked.dedup();
        assert_eq!(declared, checked);
    }

    /// Nothing in the store turns `synchronous_commit` off but the one item
    /// `per_commit!` joins (no `SET LOCAL`, no other `set_config`), so no
    /// statement commits asynchronously outside a checked pair.
    #[test]
    fn only_the_async_item_turns_synchronous_commit_off() {
        // Split so that this test's own source does not match.
        let setting = ["set_config('synchronous", "_commit'"].concat();
        let setting_name = ["synchronous", "_commit"].concat();
        for (file, source) in SOURCES {
            if file == "mod.rs" {
                // `async_commit!` and `ASYNC_ITEM` above.
                assert_eq!(source.matches(setting.as_str()).count(), 2, "{file}");
                continue;
            }
            for line in source.lines() {
                let code = !line.trim_start().starts_with("//");
                assert!(
                    !(code && line.contains(setting_name.as_str())),
                    "{file}: {line}"
                );
            }
        }
    }
}
