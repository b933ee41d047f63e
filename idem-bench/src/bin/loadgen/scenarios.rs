//! The scenario list: what is measured, in which group, and what each
//! operation costs by construction. Every ratio is against the scenario
//! named [`BASELINE`] in the same group at the same concurrency.

use crate::bench_db::Contents;
use crate::body::Body;
use crate::flags::Flags;
use crate::floor::{Claim, Floor, Settle};
use crate::fused::Fused;
use crate::http::Way;
use crate::runner::Planned;
use crate::stepped::{Commit, Steps};
use crate::targets::Side;
use crate::workload::{GateMode, Work};

/// The scenario every group's ratios are against.
pub const BASELINE: &str = "floor";

/// Scenarios that share a body, a pool rule and what the tables hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// New identities, a body that does nothing: the bookkeeping alone.
    NoOp,
    /// New identities, a body that does nothing, per call and in batches
    /// of `--batch-size` through `gate.guard_batch`: its ratios count
    /// messages, not operations.
    Batch,
    /// Identities that are already settled, refused.
    Duplicates,
    /// New identities, a body that sleeps (an external call), and fewer
    /// connections than workers.
    SlowBody,
    /// New identities, a guarded body of three no-op steps (issue 27),
    /// against the same phases as recovery points by hand and the guard
    /// with no steps.
    Steps,
    /// New identities on top of this many settled rows.
    History(u64),
}

impl Group {
    /// The name the `--scenarios` filter knows it by.
    pub fn name(self) -> &'static str {
        match self {
            Group::NoOp => "noop",
            Group::Batch => "batch",
            Group::Duplicates => "dup",
            Group::SlowBody => "slow",
            Group::Steps => "steps",
            Group::History(_) => "history",
        }
    }

    /// How the report's table shows it.
    pub fn label(self, flags: &Flags) -> String {
        match self {
            Group::NoOp => "no-op body".to_owned(),
            Group::Batch => format!("batch of {}, no-op body", flags.batch_size),
            Group::Duplicates => "duplicates".to_owned(),
            Group::SlowBody => format!("{} ms body", flags.slow_body_ms),
            Group::Steps => "three no-op steps".to_owned(),
            Group::History(rows) => format!("history {}", count(rows)),
        }
    }

    /// What runs between claim and outcome.
    pub fn body(self, flags: &Flags) -> Body {
        match self {
            Group::SlowBody => Body::Sleep(flags.slow_body()),
            _ => Body::NoOp,
        }
    }

    /// The pool at `concurrency`: one connection per worker, up to the cap
    /// (`--max-pool`; `--slow-pool` for the slow body).
    pub fn pool(self, concurrency: u32, flags: &Flags) -> u32 {
        match self {
            Group::SlowBody => concurrency.min(flags.slow_pool),
            _ => concurrency.min(flags.max_pool),
        }
    }

    /// What the tables hold when each of its runs starts.
    pub fn contents(self, flags: &Flags) -> Contents {
        match self {
            Group::Duplicates => Contents::Settled(flags.duplicates),
            Group::History(rows) => Contents::Preloaded {
                history: rows,
                settled: flags.duplicates,
            },
            Group::NoOp | Group::Batch | Group::SlowBody | Group::Steps => Contents::Empty,
        }
    }
}

/// What one operation costs by construction, counted from the SQL it runs
/// (for a batch scenario, one operation is the whole batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Statements sent, `BEGIN` and `COMMIT` included: each a round trip.
    pub statements: u32,
    /// Connections taken from the pool (with `--ping-on-acquire`, each one
    /// more round trip).
    pub acquires: u32,
    /// Commits that wait for their WAL to reach the disk.
    pub durable_commits: u32,
    /// Whether a pooled connection is held while the body runs.
    pub holds_connection: bool,
}

/// One scenario, before it is placed in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub name: &'static str,
    pub work: Work,
    pub summary: &'static str,
    pub cost: Cost,
}

impl Spec {
    /// Messages one operation handles, each with an identity of its own:
    /// `--batch-size` for the batch scenario, else one. Throughput and
    /// ratios count messages.
    pub fn messages(&self, flags: &Flags) -> u64 {
        match self.work {
            Work::GateBatch | Work::GateBatchOrdered => flags.batch_size,
            _ => 1,
        }
    }
}

const fn cost(statements: u32, acquires: u32, durable_commits: u32) -> Cost {
    Cost {
        statements,
        acquires,
        durable_commits,
        holds_connection: false,
    }
}

/// The floor's work: a claim row written and settled by hand, as `claim`
/// and `settle` say.
const fn floor(claim: Claim, settle: Settle) -> Work {
    Work::Floor(Floor { claim, settle })
}

const FLOOR: Spec = Spec {
    name: BASELINE,
    work: floor(Claim::Insert, Settle::Durable),
    summary: "by hand: INSERT a pending row, UPDATE it to success, each autocommitted",
    cost: cost(2, 2, 2),
};

const ON_CONFLICT: Spec = Spec {
    name: "on-conflict",
    work: floor(Claim::InsertOnConflict, Settle::Durable),
    summary: "the floor, its INSERT written as the gate's: ON CONFLICT DO NOTHING RETURNING",
    cost: cost(2, 2, 2),
};

const SETTLE_ASYNC: Spec = Spec {
    name: "settle-async",
    work: floor(Claim::Insert, Settle::AsyncInStatement),
    summary: "the floor, its UPDATE committing with synchronous_commit off, set inside the statement",
    cost: cost(2, 2, 1),
};

const SETTLE_ASYNC_TX: Spec = Spec {
    name: "settle-async-tx",
    work: floor(Claim::Insert, Settle::AsyncInTransaction),
    summary: "the floor, its UPDATE as BEGIN; SET LOCAL synchronous_commit = off; UPDATE; COMMIT",
    cost: cost(5, 2, 1),
};

const FUSED_INSERT_FIRST: Spec = Spec {
    name: "fused-insert-first",
    work: floor(Claim::Fused(Fused::InsertFirst), Settle::Durable),
    summary: "the floor, its INSERT replaced by the one-statement claim, insert first",
    cost: cost(2, 2, 2),
};

const FUSED_LOOKUP_FIRST: Spec = Spec {
    name: "fused-lookup-first",
    work: floor(Claim::Fused(Fused::LookupFirst), Settle::Durable),
    summary: "the floor, its INSERT replaced by the one-statement claim, lookup first",
    cost: cost(2, 2, 2),
};

const GATE: Spec = Spec {
    name: "gate",
    work: Work::Gate,
    summary: "an #[idempotent] async fn: claim (lookup, then INSERT ... ON CONFLICT DO NOTHING RETURNING, one statement), body, settle (UPDATE)",
    cost: cost(2, 2, 2),
};

const GUARD_BY_HAND: Spec = Spec {
    name: "guard-by-hand",
    work: Work::GuardByHand,
    summary: "the gate by hand: gate.guard(&id).run(body), the builder the #[idempotent] fn expands to",
    cost: cost(2, 2, 2),
};

const GATE_ASYNC: Spec = Spec {
    name: "gate-async",
    work: Work::GateMode(GateMode::AsyncOutcome),
    summary: "the gate with outcome_commit = \"async\": its settle commits with synchronous_commit off",
    cost: cost(2, 2, 1),
};

const GATE_REPLAY: Spec = Spec {
    name: "gate-replay",
    work: Work::GateMode(GateMode::Replay),
    summary: "the gate with replay: the settle also stores the value (jsonb) for duplicates",
    cost: cost(2, 2, 2),
};

const HTTP_ATTRIBUTE: Spec = Spec {
    name: "http-attribute",
    work: Work::Http(Way::Attribute),
    summary: "POST /charges in process through an axum router whose handler is #[idempotent(replay, fingerprint)] with the IdempotencyKey extractor",
    cost: cost(2, 2, 2),
};

const HTTP_LAYER: Spec = Spec {
    name: "http-layer",
    work: Work::Http(Way::Layer),
    summary: "the same POST through IdempotencyLayer around a plain handler: the body read and hashed, the response read whole and kept",
    cost: cost(2, 2, 2),
};

const GATE_FINGERPRINT: Spec = Spec {
    name: "gate-fingerprint",
    work: Work::GateMode(GateMode::Fingerprint),
    summary: "the gate with fingerprint = \"amount_cents, currency\": a 20-byte digest stored with the claim",
    cost: cost(2, 2, 2),
};

const GATE_LEASE: Spec = Spec {
    name: "gate-lease",
    work: Work::GateMode(GateMode::Lease),
    summary: "the gate with lease = \"30s\": the claim carries an expiry",
    cost: cost(2, 2, 2),
};

const GATE_ORDERED: Spec = Spec {
    name: "gate-ordered",
    work: Work::GateMode(GateMode::Ordered),
    summary: "the gate with entity and order: each call an event of one of 1,024 entities, newer than its last; \
              the claim statement also upserts the entity's row (and reads its last event's claim)",
    cost: cost(2, 2, 2),
};

const GATE_TX: Spec = Spec {
    name: "gate-tx",
    work: Work::GateMode(GateMode::InTransaction),
    summary: "the gate with tx: BEGIN; claim; body; settle; COMMIT on one connection",
    cost: Cost {
        holds_connection: true,
        ..cost(4, 1, 1)
    },
};

const GATE_BATCH: Spec = Spec {
    name: "gate-batch",
    work: Work::GateBatch,
    summary: "`gate.guard_batch` of new identities, no-op bodies: one INSERT ... SELECT FROM unnest(...) ORDER BY address \
              ON CONFLICT DO NOTHING RETURNING claims the whole batch, the bodies run, one UPDATE ... FROM unnest(...) \
              settles it, each autocommitted",
    cost: cost(2, 2, 2),
};

/// A batch of ordered events, each of an entity of its own: one statement
/// claims them and takes their entities, the batch's one settle records
/// them all.
const GATE_BATCH_ORDERED: Spec = Spec {
    name: "gate-batch-ordered",
    work: Work::GateBatchOrdered,
    summary: "`gate.guard_batch` of new identities, each pushed as an ordered event of its own entity (of 65,536): \
              one statement upserts the entities (INSERT ... SELECT FROM unnest(...) ON CONFLICT DO UPDATE) and \
              inserts the claims of the events that took theirs, the bodies run, one UPDATE ... FROM unnest(...) \
              settles the batch",
    cost: cost(2, 2, 2),
};

const BRANDUR: Spec = Spec {
    name: "brandur",
    work: Work::Brandur,
    summary: "idempotency_keys table: BEGIN; INSERT ... ON CONFLICT DO NOTHING; SELECT ... FOR UPDATE; \
              UPDATE locked_at; COMMIT; body; UPDATE response + unlock",
    cost: cost(6, 2, 2),
};

/// Three no-op steps inside one guarded call: the claim (1 statement),
/// per step its marker (`INSERT ... ON CONFLICT DO NOTHING`, durable),
/// which carries the record of the step before it, and the settle (1),
/// which carries the last record: 2 + 3 = 5 statements and 5 durable
/// commits, as many as [`RECOVERY_POINTS`] sends.
const THREE_STEPS: Spec = Spec {
    name: "three",
    work: Work::ThreeSteps(Steps::Marked, Commit::Durable),
    summary: "gate.guard(&id).run of a body of three no-op idem::step calls (a, b, c): claim; a's marker \
              (INSERT ... ON CONFLICT DO NOTHING); b's marker with a's record and c's with b's (an \
              UPDATE and an INSERT, writable CTEs of one statement); settle with c's record, each \
              autocommitted",
    cost: cost(5, 5, 5),
};

/// The same with `outcome_commit(OutcomeCommit::Async)`: the settle, and
/// the last record it carries, commit without waiting for the flush; the
/// claim and the three markers (with the records they carry) durably: 5
/// statements, 4 durable commits.
const THREE_STEPS_ASYNC: Spec = Spec {
    name: "three-async",
    work: Work::ThreeSteps(Steps::Marked, Commit::Async),
    summary: "the same with .outcome_commit(OutcomeCommit::Async): the settle (with the last record) \
              commits with synchronous_commit off, the claim and the markers (with the records they \
              carry) durably",
    cost: cost(5, 5, 4),
};

/// Three no-op repeatable steps: the claim, one read of the claim's steps
/// (a `SELECT`, at the first), per step its record alone (`INSERT ...
/// SELECT ... ON CONFLICT ... DO UPDATE`, committing as the outcome does),
/// the settle: 2 + 1 + 3 = 6 statements, 5 durable commits. The same
/// phases [`RECOVERY_POINTS`] writes by hand, with what they promise: a
/// phase cut off runs again.
const THREE_REPEATABLE_STEPS: Spec = Spec {
    name: "three-repeatable",
    work: Work::ThreeSteps(Steps::Repeatable, Commit::Durable),
    summary: "the same body with each step .repeatable(): claim; one read of the claim's steps \
              (SELECT); per step its record alone (INSERT ... SELECT ... ON CONFLICT ... DO UPDATE); \
              settle, each autocommitted",
    cost: cost(6, 6, 5),
};

/// The same with `outcome_commit(OutcomeCommit::Async)`: the three records
/// and the settle commit without waiting for the flush: 6 statements, 1
/// durable commit (the claim).
const THREE_REPEATABLE_STEPS_ASYNC: Spec = Spec {
    name: "three-repeatable-async",
    work: Work::ThreeSteps(Steps::Repeatable, Commit::Async),
    summary: "the repeatable steps with .outcome_commit(OutcomeCommit::Async): the records and the \
              settle commit with synchronous_commit off, the claim durably",
    cost: cost(6, 6, 1),
};

/// The same three phases by hand, as recovery points: `INSERT ... ON
/// CONFLICT DO NOTHING RETURNING` of the key's row, one `UPDATE ... SET
/// recovery_point` per phase, `UPDATE ... SET finished = true`: 1 + 3 + 1
/// = 5 statements and 5 durable commits, as many as the steps'.
const RECOVERY_POINTS: Spec = Spec {
    name: "recovery-points",
    work: Work::RecoveryPoints,
    summary: "by hand, brandur's recovery points in a table of their own: INSERT the key's row ... ON \
              CONFLICT DO NOTHING RETURNING; per phase (a, b, c) UPDATE recovery_point; UPDATE \
              finished = true, each autocommitted",
    cost: cost(5, 5, 5),
};

/// Not idem: a sketch of the design that would keep a claim's steps in its
/// own row, by hand: the claim, per step its marker carrying the record
/// before it (an `UPDATE` of the claim's row), the settle carrying the
/// last: 5 statements, 5 durable commits ([`crate::steps_in_row`]).
const STEPS_IN_ROW: Spec = Spec {
    name: "in-row-sketch",
    work: Work::StepsInRow,
    summary: "not idem: by hand, the three steps kept in the claim's own row (idem_records' shape \
              and indexes, a steps jsonb column): INSERT the claim ... ON CONFLICT DO NOTHING \
              RETURNING fence; per step UPDATE steps (its marker, the record before it) under the \
              fence; the settle with the last record, each autocommitted",
    cost: cost(5, 5, 5),
};

const ADVISORY: Spec = Spec {
    name: "advisory",
    work: Work::Advisory,
    summary: "pg_advisory_lock; SELECT outcome; body; INSERT outcome; pg_advisory_unlock, on one connection",
    cost: Cost {
        holds_connection: true,
        ..cost(4, 1, 1)
    },
};

const REFUSE_BY_LOOKUP: Spec = Spec {
    name: BASELINE,
    work: Work::RefuseByLookup,
    summary: "by hand: one SELECT by address, the stored identity re-checked",
    cost: cost(1, 1, 0),
};

const REFUSE_THROUGH_GATE: Spec = Spec {
    name: "gate",
    work: Work::RefuseThroughGate,
    summary: "the #[idempotent] fn on a settled identity: its claim statement finds the row, AlreadyDone",
    cost: cost(1, 1, 0),
};

const REFUSE_THROUGH_CACHED_GATE: Spec = Spec {
    name: "gate-cached",
    work: Work::RefuseThroughCachedGate,
    summary: "the #[idempotent] fn on a settled identity through a gate with the local outcome cache (feature cache), warmed: answered in process, AlreadyDone",
    cost: cost(0, 0, 0),
};

const REFUSE_BY_FUSED_INSERT_FIRST: Spec = Spec {
    name: "fused-insert-first",
    work: Work::RefuseByFusedClaim(Fused::InsertFirst),
    summary: "the one-statement claim, insert first, on a settled identity",
    cost: cost(1, 1, 0),
};

const REFUSE_BY_FUSED_LOOKUP_FIRST: Spec = Spec {
    name: "fused-lookup-first",
    work: Work::RefuseByFusedClaim(Fused::LookupFirst),
    summary: "the one-statement claim, lookup first, on a settled identity",
    cost: cost(1, 1, 0),
};

/// New identities with a body that does nothing: the gate, the floor, the
/// floor written as the gate writes its claim (which splits the gate's cost
/// into the SQL's and the client's), the levers on the floor, the
/// alternatives.
const NO_OP: &[Spec] = &[
    FLOOR,
    ON_CONFLICT,
    SETTLE_ASYNC,
    SETTLE_ASYNC_TX,
    FUSED_INSERT_FIRST,
    FUSED_LOOKUP_FIRST,
    GATE,
    // The same guard written by hand with the builder, beside the attribute.
    GUARD_BY_HAND,
    BRANDUR,
    ADVISORY,
    // The opt-in modes, each against the same floor.
    GATE_ASYNC,
    GATE_REPLAY,
    GATE_FINGERPRINT,
    GATE_LEASE,
    GATE_ORDERED,
    GATE_TX,
    // An HTTP request guarded per handler, then by the layer.
    HTTP_ATTRIBUTE,
    HTTP_LAYER,
];

/// The same with the slow body, less the fused claims (whose only question,
/// what they add to a new claim, the no-op group answers).
const SLOW_BODY: &[Spec] = &[
    FLOOR,
    SETTLE_ASYNC,
    SETTLE_ASYNC_TX,
    GATE,
    BRANDUR,
    ADVISORY,
    GATE_ASYNC,
    GATE_TX,
];

/// New identities with a body that does nothing, by the message: the floor
/// and the gate per call, against the gate's batch API, each of whose
/// operations is `--batch-size` messages.
const BATCH: &[Spec] = &[FLOOR, GATE, GATE_BATCH, GATE_BATCH_ORDERED];

const DUPLICATES: &[Spec] = &[
    REFUSE_BY_LOOKUP,
    REFUSE_THROUGH_GATE,
    REFUSE_BY_FUSED_INSERT_FIRST,
    REFUSE_BY_FUSED_LOOKUP_FIRST,
    REFUSE_THROUGH_CACHED_GATE,
];

/// Steps inside one claim, against the same phases by hand and against the
/// guard with no steps (plain and with its outcome asynchronous), beside
/// the floor every group has.
const STEPS: &[Spec] = &[
    FLOOR,
    GATE,
    GATE_ASYNC,
    RECOVERY_POINTS,
    THREE_STEPS,
    THREE_STEPS_ASYNC,
    THREE_REPEATABLE_STEPS,
    THREE_REPEATABLE_STEPS_ASYNC,
    STEPS_IN_ROW,
];

/// On a table of history (settled claims laid down in bulk, and the
/// duplicates group's settled identities): new claims through the floor
/// and the gate, a batch, and refused duplicates by a bare `SELECT` and
/// through the gate, each compared with its own figure on a table without
/// the history.
const HISTORY: &[Spec] = &[
    FLOOR,
    GATE,
    GATE_BATCH,
    Spec {
        name: "dup-select",
        ..REFUSE_BY_LOOKUP
    },
    Spec {
        name: "dup-gate",
        ..REFUSE_THROUGH_GATE
    },
];

/// The Citus comparison's new claims, on top of its pre-loaded rows: the
/// floor and the gate, each also with its settle committed asynchronously
/// (what `synchronous_commit` set inside the statement does when a
/// coordinator runs it), and the gate's claim taken apart by hand: its
/// `INSERT ... ON CONFLICT DO NOTHING RETURNING` alone, and its whole
/// one-statement claim (a writable CTE, which a coordinator cannot route
/// to one shard as it routes a plain `INSERT`).
const CITUS_NEW: &[Spec] = &[
    FLOOR,
    SETTLE_ASYNC,
    ON_CONFLICT,
    FUSED_LOOKUP_FIRST,
    GATE,
    GATE_ASYNC,
];

/// The Citus comparison's refusals: the bare `SELECT` by address and the
/// gate.
const CITUS_DUPLICATES: &[Spec] = &[REFUSE_BY_LOOKUP, REFUSE_THROUGH_GATE];

/// A spec placed in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub group: Group,
    pub spec: Spec,
}

impl Selectable for Scenario {
    fn id(&self) -> String {
        format!("{}/{}", self.group.name(), self.spec.name)
    }

    fn matches(&self, term: &str) -> bool {
        term == self.group.name() || term == self.spec.name || term == self.id()
    }
}

/// One measured run: a scenario at a concurrency, with its pool.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub scenario: Scenario,
    pub concurrency: u32,
    pub pool: u32,
    /// Where the report lists it: by group, then concurrency, then the
    /// scenario's place in its list, whatever order it ran in.
    pub place: (usize, usize, usize),
}

impl Planned for Run {
    fn name(&self) -> String {
        run_name(self.scenario.id(), self.concurrency)
    }
}

/// Every scenario of the full run, in order, before filtering: the
/// matrix's, or with `--citus-url` the Citus comparison's.
pub fn all(flags: &Flags) -> Vec<Scenario> {
    if flags.citus_url.is_some() {
        return in_groups(vec![
            (Group::History(flags.citus_rows), CITUS_NEW),
            (Group::Duplicates, CITUS_DUPLICATES),
        ]);
    }
    let mut groups = vec![
        (Group::NoOp, NO_OP),
        (Group::Batch, BATCH),
        (Group::Duplicates, DUPLICATES),
        (Group::SlowBody, SLOW_BODY),
        (Group::Steps, STEPS),
    ];
    for rows in flags.history_sizes() {
        groups.push((Group::History(rows), HISTORY));
    }
    in_groups(groups)
}

fn in_groups(groups: Vec<(Group, &[Spec])>) -> Vec<Scenario> {
    groups
        .into_iter()
        .flat_map(|(group, specs)| specs.iter().map(move |&spec| Scenario { group, spec }))
        .collect()
}

/// The scenarios `--scenarios` selects (all of them without it). A term
/// that selects nothing is an error that lists what there is.
pub fn selected(flags: &Flags) -> Result<Vec<Scenario>, String> {
    select(all(flags), &flags.scenarios, "")
}

/// A scenario `--scenarios` can select: the matrix's, and River's.
pub trait Selectable {
    /// `group/name`, as `--scenarios` and the progress lines spell it.
    fn id(&self) -> String;
    /// Whether `term` (a group, a name or an id) selects it.
    fn matches(&self, term: &str) -> bool;
}

/// The scenarios of `all` that `terms` select, all of them without terms.
/// A term that selects nothing is an error listing every id, `nothing`
/// saying where (River's list is not the matrix's), so a typo is not a run
/// that silently measures less.
pub fn select<S: Selectable>(
    all: Vec<S>,
    terms: &[String],
    nothing: &str,
) -> Result<Vec<S>, String> {
    if let Some(unknown) = terms
        .iter()
        .find(|term| !all.iter().any(|scenario| scenario.matches(term)))
    {
        let known: Vec<String> = all.iter().map(S::id).collect();
        return Err(format!(
            "--scenarios {unknown:?} selects nothing{nothing}; there are: {}",
            known.join(", ")
        ));
    }
    Ok(all
        .into_iter()
        .filter(|scenario| terms.is_empty() || terms.iter().any(|t| scenario.matches(t)))
        .collect())
}

/// The runs, in the order they run: group by group (so each group's table
/// contents are prepared once), and within a group every scenario at one
/// concurrency before the next, so the runs a ratio compares are close in
/// time. At each concurrency the two sides of every pair of `adjacent`
/// (a target's scenario and baseline, [`crate::targets::adjacent`]) run
/// back to back ([`back_to_back`]), then the group's other scenarios in
/// their listed order; at the next concurrency the same order reversed, so
/// a drift in the machine (a warming cache, a neighbour's load) does not
/// always fall on the same side of a ratio.
pub fn plan(scenarios: &[Scenario], flags: &Flags, adjacent: &[(Side, Side)]) -> Vec<Run> {
    let mut runs = Vec::new();
    let groups = by_group(scenarios, |scenario| scenario.group);
    for (group_place, (group, members)) in groups.into_iter().enumerate() {
        let place_of = |(of_group, name): Side| {
            (of_group == group)
                .then(|| members.iter().position(|m| m.spec.name == name))
                .flatten()
        };
        let pairs: Vec<(usize, usize)> = adjacent
            .iter()
            .filter_map(|&(of, over)| Some((place_of(of)?, place_of(over)?)))
            .collect();
        let listed = back_to_back(members.len(), &pairs);
        for (level, &concurrency) in flags.concurrency.iter().enumerate() {
            let mut order = listed.clone();
            if level % 2 == 1 {
                order.reverse();
            }
            for place in order {
                runs.push(Run {
                    scenario: members[place],
                    concurrency,
                    pool: group.pool(concurrency, flags),
                    place: (group_place, level, place),
                });
            }
        }
    }
    runs
}

/// The order `members` scenarios (by place in their list) run in so that
/// the two of each pair of `pairs` (scenario, baseline) run one right after
/// the other: each pair in turn joins the chain at an end that holds one
/// of its sides (a side not yet in the chain preferred), else at the back,
/// baseline first. A scenario in more pairs than it can have neighbours
/// runs twice (the gate, against the floor, on-conflict and brandur); the
/// report pairs the nearest runs of a round ([`crate::paired::paired`]).
/// The members in no pair follow, in listed order.
pub fn back_to_back(members: usize, pairs: &[(usize, usize)]) -> Vec<usize> {
    let mut chain: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    for &(of, over) in pairs {
        let next_to_each_other = chain
            .iter()
            .zip(chain.iter().skip(1))
            .any(|(&a, &b)| (a, b) == (of, over) || (a, b) == (over, of));
        if of == over || next_to_each_other {
            continue;
        }
        // (at the back?, side at that end, side to add), best first.
        let mut joins = Vec::new();
        for (back, end) in [(true, chain.back()), (false, chain.front())] {
            for (held, added) in [(of, over), (over, of)] {
                if end == Some(&held) {
                    joins.push((back, added));
                }
            }
        }
        joins.sort_by_key(|&(_, added)| chain.contains(&added));
        match joins.first() {
            Some(&(true, added)) => chain.push_back(added),
            Some(&(false, added)) => chain.push_front(added),
            None => {
                chain.push_back(over);
                chain.push_back(of);
            }
        }
    }
    let mut order: Vec<usize> = chain.into_iter().collect();
    for member in 0..members {
        if !order.contains(&member) {
            order.push(member);
        }
    }
    order
}

/// `scenarios` by group, the groups in the order they first appear and
/// each group's scenarios in theirs: what both plans run group by group.
pub fn by_group<S: Copy, G: PartialEq>(
    scenarios: &[S],
    group_of: impl Fn(&S) -> G,
) -> Vec<(G, Vec<S>)> {
    let mut groups: Vec<(G, Vec<S>)> = Vec::new();
    for scenario in scenarios {
        let group = group_of(scenario);
        match groups.iter_mut().find(|(known, _)| *known == group) {
            Some((_, members)) => members.push(*scenario),
            None => groups.push((group, vec![*scenario])),
        }
    }
    groups
}

/// A run as a failure names it: `noop/gate at concurrency 16`, where `id`
/// names the scenario (and for Citus, the server).
pub fn run_name(id: String, concurrency: u32) -> String {
    format!("{id} at concurrency {concurrency}")
}

/// `5M`, `250k`, `1234`.
pub fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{BASELINE, Group, Scenario, back_to_back, plan, selected};
    use crate::flags::Flags;
    use crate::workload::Work;

    fn flags(args: &[&str]) -> Flags {
        Flags::parse_from(["loadgen"].iter().chain(args))
    }

    fn names(scenarios: &[Scenario]) -> Vec<&'static str> {
        scenarios.iter().map(|s| s.spec.name).collect()
    }

    #[test]
    fn every_group_has_its_baseline_first() {
        let scenarios = selected(&flags(&[])).expect("every scenario");
        for (group, members) in super::by_group(&scenarios, |s| s.group) {
            assert_eq!(members[0].spec.name, BASELINE, "{}", group.name());
        }
    }

    #[test]
    fn the_batch_group_is_the_floor_and_the_gate_per_call_against_the_batch_guard() {
        let flags = flags(&["--scenarios", "batch"]);
        let scenarios = selected(&flags).expect("the batch group");
        assert_eq!(
            names(&scenarios),
            ["floor", "gate", "gate-batch", "gate-batch-ordered"]
        );
        assert!(scenarios.iter().all(|s| s.group == Group::Batch));
        assert_eq!(Group::Batch.label(&flags), "batch of 100, no-op body");
        let batch = scenarios[2].spec;
        assert_eq!(batch.work, Work::GateBatch);
        // Two statements and two durable commits per batch, whatever its
        // size; the messages per operation are the batch's.
        assert_eq!((batch.cost.statements, batch.cost.durable_commits), (2, 2));
        assert_eq!(batch.messages(&flags), 100);
        assert_eq!(scenarios[0].spec.messages(&flags), 1);
        assert_eq!(scenarios[1].spec.messages(&flags), 1);
    }

    #[test]
    fn the_batch_size_is_a_flag() {
        let flags = flags(&["--scenarios", "batch/gate-batch", "--batch-size", "250"]);
        let scenarios = selected(&flags).expect("the batch scenario");
        assert_eq!(scenarios.len(), 1);
        assert_eq!(scenarios[0].spec.messages(&flags), 250);
        assert_eq!(Group::Batch.label(&flags), "batch of 250, no-op body");
        assert!(Flags::try_parse_from(["loadgen", "--batch-size", "0"]).is_err());
    }

    #[test]
    fn a_name_selects_it_in_every_group_and_an_id_in_one() {
        let flags = flags(&["--scenarios", "gate", "--prefill", "0"]);
        let groups: Vec<&str> = selected(&flags)
            .expect("the gate")
            .iter()
            .map(|s| s.group.name())
            .collect();
        assert_eq!(groups, ["noop", "batch", "dup", "slow", "steps"]);
        let flags = self::flags(&["--scenarios", "batch/gate"]);
        let scenarios = selected(&flags).expect("one scenario");
        assert_eq!(scenarios.len(), 1);
        assert_eq!(scenarios[0].group, Group::Batch);
    }

    #[test]
    fn a_term_that_selects_nothing_is_refused() {
        let error = selected(&flags(&["--scenarios", "batch/nope"])).expect_err("a typo");
        assert!(error.contains("batch/gate-batch"), "{error}");
    }

    #[test]
    fn each_group_runs_every_scenario_at_one_concurrency_before_the_next_reversed() {
        let flags = flags(&["--scenarios", "noop/floor,batch", "--concurrency", "1,64"]);
        let scenarios = selected(&flags).expect("two groups");
        let runs = plan(&scenarios, &flags, &[]);
        let planned: Vec<(&str, &str, u32, u32)> = runs
            .iter()
            .map(|r| {
                let s = r.scenario;
                (s.group.name(), s.spec.name, r.concurrency, r.pool)
            })
            .collect();
        assert_eq!(
            planned,
            [
                ("noop", "floor", 1, 1),
                ("noop", "floor", 64, 32),
                ("batch", "floor", 1, 1),
                ("batch", "gate", 1, 1),
                ("batch", "gate-batch", 1, 1),
                ("batch", "gate-batch-ordered", 1, 1),
                ("batch", "gate-batch-ordered", 64, 32),
                ("batch", "gate-batch", 64, 32),
                ("batch", "gate", 64, 32),
                ("batch", "floor", 64, 32),
            ]
        );
        // The report lists them by group, concurrency and place in the list.
        assert_eq!(runs[7].place, (1, 1, 2));
    }

    #[test]
    fn the_two_sides_of_every_pair_run_back_to_back_one_repeated_where_it_must() {
        // The gate (6) against the floor (0), on-conflict (1) and brandur
        // (7): three neighbours, so it runs twice.
        let order = back_to_back(9, &[(6, 0), (6, 1), (6, 7)]);
        assert_eq!(order, [0, 6, 1, 7, 6, 2, 3, 4, 5, 8]);
        // The gate and the cached gate against one floor: it takes the
        // middle, nothing repeated.
        assert_eq!(back_to_back(5, &[(1, 0), (4, 0)]), [4, 0, 1, 2, 3]);
        // No pairs: the listed order.
        assert_eq!(back_to_back(3, &[]), [0, 1, 2]);
    }

    #[test]
    fn every_target_whose_sides_share_a_group_is_run_back_to_back_at_every_concurrency() {
        let flags = flags(&["--concurrency", "1,16", "--prefill", "1000"]);
        let scenarios = selected(&flags).expect("every scenario");
        let runs = plan(&scenarios, &flags, &crate::targets::adjacent(&flags));
        let is = |run: &super::Run, (group, name): crate::targets::Side, concurrency| {
            run.scenario.group == group
                && run.scenario.spec.name == name
                && run.concurrency == concurrency
        };
        let mut checked = 0;
        for (of, over) in crate::targets::adjacent(&flags) {
            if of.0 != over.0 {
                continue;
            }
            for &concurrency in &flags.concurrency {
                let adjacent = runs.windows(2).any(|w| {
                    (is(&w[0], of, concurrency) && is(&w[1], over, concurrency))
                        || (is(&w[1], of, concurrency) && is(&w[0], over, concurrency))
                });
                assert!(
                    adjacent,
                    "{}/{} and {} at {concurrency}",
                    of.0.name(),
                    of.1,
                    over.1
                );
                checked += 1;
            }
        }
        // Eight targets within a group, and the seven comparisons of steps.
        assert_eq!(checked, 2 * (8 + 7));
        // Every scenario runs; more than once per concurrency, those with
        // more than two neighbours: the no-op gate (three) twice, the
        // recovery points (five: each way of writing the steps, and the
        // sketch of steps in the claim's row) four times.
        for (repeated, times) in [
            ((Group::NoOp, "gate"), 2),
            ((Group::Steps, "recovery-points"), 4),
        ] {
            let runs_of = runs.iter().filter(|r| is(r, repeated, 1)).count();
            assert_eq!(runs_of, times, "{repeated:?}");
        }
        assert_eq!(runs.len(), 2 * (scenarios.len() + 1 + 3));
    }
}
