//! River side by side: the scenarios, in four groups, each run at every
//! concurrency, and the pairs the report divides (idem ÷ River).

use crate::flags::Flags;
use crate::runner::Planned;
use crate::scenarios::Selectable;

/// Scenarios that share what the tables hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// A new key each time, nothing run: River's unique insert against
    /// idem's claim.
    New,
    /// A key already taken each time: River's skipped insert against idem's
    /// refusal.
    Duplicate,
    /// "Run this once per key", end to end: a job inserted and worked to
    /// completion against the gate running the same (no-op) body.
    EndToEnd,
    /// Many new keys at once: River's `insert_many` against idem per call
    /// and through its batch API, `gate.guard_batch`.
    Batch,
}

impl Group {
    /// The name `--scenarios` knows it by.
    pub fn name(self) -> &'static str {
        match self {
            Group::New => "new",
            Group::Duplicate => "dup",
            Group::EndToEnd => "e2e",
            Group::Batch => "batch",
        }
    }
}

/// Who a scenario measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    River,
    Idem,
}

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// `client.insert(job)`, unique by args, a new key.
    RiverInsert,
    /// The same, on a key whose job exists: skipped as a duplicate.
    RiverInsertAgain,
    /// Inserted, then awaited until a started client reports it completed.
    RiverWorked,
    /// `client.insert_many` of `--river-batch` new unique jobs.
    RiverInsertMany,
    /// `gate.claim`: the claim alone, left pending as River's job is left
    /// available.
    IdemClaim,
    /// The `#[idempotent]` fn: claim, body, durable settle.
    Gate,
    /// The same with `outcome_commit = "async"`.
    GateAsync,
    /// The `#[idempotent]` fn on a settled identity: refused.
    GateRefusal,
    /// `gate.guard_batch` of `--river-batch` new keys, no-op bodies: claim
    /// and settle, one statement each for the whole batch.
    IdemRunBatch,
    /// A batch of new claims as one hand-written statement: the statement
    /// `gate.guard_batch` sends to claim (the runtime's `CLAIM_BATCH`), sent
    /// alone and left pending, so run-batch's claim on its own.
    BatchClaimSql,
}

/// One scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub group: Group,
    pub name: &'static str,
    pub side: Side,
    pub work: Work,
    /// What one operation sends, and its durable commits.
    pub sends: &'static str,
}

impl Selectable for Scenario {
    fn id(&self) -> String {
        format!("{}/{}", self.group.name(), self.name)
    }

    fn matches(&self, term: &str) -> bool {
        term == "river" || term == self.group.name() || term == self.name || term == self.id()
    }
}

impl Scenario {
    /// Jobs (or keys) one operation handles: the batch size for the batch
    /// scenarios, else one.
    pub fn per_op(&self, flags: &Flags) -> u64 {
        match self.work {
            Work::RiverInsertMany | Work::IdemRunBatch | Work::BatchClaimSql => flags.river_batch,
            _ => 1,
        }
    }
}

const fn scenario(
    group: Group,
    name: &'static str,
    side: Side,
    work: Work,
    sends: &'static str,
) -> Scenario {
    Scenario {
        group,
        name,
        side,
        work,
        sends,
    }
}

const RIVER_INSERT_SENDS: &str = "BEGIN; INSERT ... ON CONFLICT (unique_key) DO UPDATE SET kind = kind \
     RETURNING (a writable CTE); pg_notify at most once per 100 ms (the fetch cooldown); COMMIT: \
     3 round trips, 1 durable commit";

/// Every scenario, in report order.
pub const ALL: &[Scenario] = &[
    scenario(
        Group::New,
        "river-insert",
        Side::River,
        Work::RiverInsert,
        RIVER_INSERT_SENDS,
    ),
    scenario(
        Group::New,
        "idem-claim",
        Side::Idem,
        Work::IdemClaim,
        "`gate.claim`: one statement (lookup, then INSERT ... ON CONFLICT DO NOTHING RETURNING), \
         autocommitted: 1 round trip, 1 durable commit; the claim is left pending",
    ),
    scenario(
        Group::New,
        "gate-async",
        Side::Idem,
        Work::GateAsync,
        "the `#[idempotent]` fn, `outcome_commit = \"async\"`: claim, no-op body, settle with \
         synchronous_commit off: 2 round trips, 1 durable commit",
    ),
    scenario(
        Group::New,
        "gate",
        Side::Idem,
        Work::Gate,
        "the `#[idempotent]` fn: claim, no-op body, settle: 2 round trips, 2 durable commits",
    ),
    scenario(
        Group::Duplicate,
        "river-insert",
        Side::River,
        Work::RiverInsertAgain,
        "River's unique insert of a key whose job exists: the same statements; the conflict \
         path updates the existing row (a new row version, WAL) and returns it: 3 round trips, \
         1 durable commit",
    ),
    scenario(
        Group::Duplicate,
        "gate",
        Side::Idem,
        Work::GateRefusal,
        "the `#[idempotent]` fn on a settled identity: its claim statement finds the row, \
         `AlreadyDone`: 1 round trip, nothing written",
    ),
    scenario(
        Group::EndToEnd,
        "river-worked",
        Side::River,
        Work::RiverWorked,
        "River's unique insert, then the wait until a started client (same process, fetch \
         cooldown 1 ms) has fetched the job, run the no-op worker and committed `completed` \
         (fetch and completion are batched across jobs; completions up to 10 ms apart)",
    ),
    scenario(
        Group::EndToEnd,
        "gate-async",
        Side::Idem,
        Work::GateAsync,
        "the `#[idempotent]` fn, async outcome, the same no-op body: 2 round trips, 1 durable commit",
    ),
    scenario(
        Group::EndToEnd,
        "gate",
        Side::Idem,
        Work::Gate,
        "the `#[idempotent]` fn, the same no-op body: 2 round trips, 2 durable commits",
    ),
    scenario(
        Group::Batch,
        "river-insert-many",
        Side::River,
        Work::RiverInsertMany,
        "`client.insert_many` of a batch of new unique jobs: BEGIN; one INSERT ... ON CONFLICT \
         per job (the Rust client loops; it has no multi-row insert); pg_notify at most once per \
         100 ms; COMMIT: batch + 2 round trips, 1 durable commit per batch",
    ),
    scenario(
        Group::Batch,
        "run-batch",
        Side::Idem,
        Work::IdemRunBatch,
        "`gate.guard_batch` of a batch of new keys, no-op bodies: one INSERT ... SELECT FROM \
         unnest(...) ORDER BY address ON CONFLICT DO NOTHING RETURNING claims the batch, the \
         bodies run, one UPDATE ... FROM unnest(...) settles it, each autocommitted: 2 round \
         trips, 2 durable commits per batch",
    ),
    scenario(
        Group::Batch,
        "gate",
        Side::Idem,
        Work::Gate,
        "the `#[idempotent]` fn per key, one call per message (not the batch API): 2 round \
         trips, 2 durable commits per key",
    ),
    scenario(
        Group::Batch,
        "idem-claim",
        Side::Idem,
        Work::IdemClaim,
        "`gate.claim` per key: 1 round trip, 1 durable commit per key",
    ),
    scenario(
        Group::Batch,
        "batch-claim-sql",
        Side::Idem,
        Work::BatchClaimSql,
        "by hand, not through idem's API: the statement `gate.guard_batch` sends to claim a batch \
         (`CLAIM_BATCH`, idem-runtime/src/store/batch.rs), INSERT ... SELECT FROM unnest(...) \
         ORDER BY address ON CONFLICT DO NOTHING RETURNING, with the same addresses and \
         identities, autocommitted and left pending: run-batch's claim alone, 1 round trip, \
         1 durable commit per batch",
    ),
];

/// The scenarios `--scenarios` selects (all of them without it, or with
/// `river`); a term that selects nothing is an error that lists them.
pub fn selected(flags: &Flags) -> Result<Vec<Scenario>, String> {
    crate::scenarios::select(ALL.to_vec(), &flags.scenarios, " with --river")
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub scenario: Scenario,
    pub concurrency: u32,
    pub pool: u32,
}

impl Planned for Run {
    fn name(&self) -> String {
        crate::scenarios::run_name(self.scenario.id(), self.concurrency)
    }
}

/// The runs in the order they run: group by group (each group's tables
/// prepared once), and within a group every scenario at one concurrency
/// before the next, in listed order at one concurrency and reversed at the
/// next, so every pair is measured back to back and a drift in the machine
/// falls on both sides of a ratio alike.
pub fn plan(scenarios: &[Scenario], flags: &Flags) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut level = 0;
    for (_, members) in crate::scenarios::by_group(scenarios, |scenario| scenario.group) {
        for &concurrency in &flags.concurrency {
            let mut order = members.clone();
            if level % 2 == 1 {
                order.reverse();
            }
            level += 1;
            runs.extend(order.into_iter().map(|scenario| Run {
                scenario,
                concurrency,
                pool: concurrency.min(flags.max_pool),
            }));
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{ALL, Side, Work, plan, selected};
    use crate::flags::Flags;

    #[test]
    fn every_group_has_river_and_idem_and_every_run_is_planned_once() {
        let flags = Flags::parse_from(["loadgen", "--river", "--concurrency", "1,16"]);
        let scenarios = selected(&flags).expect("every scenario");
        assert_eq!(scenarios.len(), ALL.len());
        for group in scenarios.iter().map(|s| s.group) {
            let sides: Vec<Side> = ALL
                .iter()
                .filter(|s| s.group == group)
                .map(|s| s.side)
                .collect();
            assert!(sides.contains(&Side::River) && sides.contains(&Side::Idem));
        }
        let runs = plan(&scenarios, &flags);
        assert_eq!(runs.len(), 2 * ALL.len());
        // Within a group, the order alternates from one concurrency to the
        // next.
        assert_eq!(runs[0].scenario.name, "river-insert");
        assert_eq!(runs[7].scenario.name, "river-insert");
        assert_eq!(runs[7].concurrency, 16);
    }

    #[test]
    fn a_term_that_selects_nothing_is_refused() {
        let flags = Flags::parse_from(["loadgen", "--river", "--scenarios", "nope"]);
        assert!(selected(&flags).is_err());
    }

    #[test]
    fn the_batch_group_measures_run_batch_per_key_next_to_insert_many() {
        let flags = Flags::parse_from([
            "loadgen",
            "--river",
            "--scenarios",
            "batch",
            "--river-batch",
            "50",
            "--concurrency",
            "1,16",
        ]);
        let scenarios = selected(&flags).expect("the batch group");
        let names: Vec<&str> = scenarios.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "river-insert-many",
                "run-batch",
                "gate",
                "idem-claim",
                "batch-claim-sql"
            ]
        );
        let keys: Vec<u64> = scenarios.iter().map(|s| s.per_op(&flags)).collect();
        assert_eq!(keys, [50, 50, 1, 1, 50]);
        assert_eq!(scenarios[1].work, Work::IdemRunBatch);
        // run-batch and insert_many run back to back at each concurrency.
        let runs: Vec<(&str, u32)> = plan(&scenarios, &flags)
            .iter()
            .map(|run| (run.scenario.name, run.concurrency))
            .collect();
        assert_eq!(&runs[..2], [("river-insert-many", 1), ("run-batch", 1)]);
        assert_eq!(&runs[8..], [("run-batch", 16), ("river-insert-many", 16)]);
    }
}
