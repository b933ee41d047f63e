//! River side by side's report: idem ÷ River for each pair at each
//! concurrency with its verdict (each ratio divided within a round,
//! [`crate::paired`]), every run, and what each scenario sends.

use std::fmt::Write as _;

use super::scenarios::{Group, Run, Scenario, Side};
use super::side_label;
use crate::cpu::CpuUse;
use crate::drive::Measurement;
use crate::flags::Flags;
use crate::paired::{self, Paired, Rounds, Verdict};
use crate::report::{Setting, per_concurrency_head, per_concurrency_line, section};
use crate::runner::Measured;
use crate::scenarios::Selectable;

/// One measured run.
#[derive(Debug, Clone)]
pub struct Row {
    pub run: Run,
    /// The pool it ran with (River's worked jobs get a few more).
    pub pool: u32,
    pub ops_per_second: f64,
    /// Jobs (or keys) per second: operations times the batch size.
    pub jobs_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU time per key over the measured window, when it was read.
    pub cpu: Option<CpuUse>,
}

/// The pool in the line is the one the run had, not the planned one:
/// River's worked jobs get a few more connections.
impl Measured for Row {
    fn progress(&self) -> String {
        let (run, pool) = (self.run, self.pool);
        format!(
            "{} c={} pool={pool}: {:.0} ops/s ({:.0} jobs/s), p50 {:.2} ms, p99 {:.2} ms",
            run.scenario.id(),
            run.concurrency,
            self.ops_per_second,
            self.jobs_per_second,
            self.p50_ms,
            self.p99_ms
        )
    }

    fn throughput(&self) -> f64 {
        self.jobs_per_second
    }
}

impl Row {
    pub fn new(run: Run, pool: u32, per_op: u64, measured: &Measurement) -> Row {
        let ops_per_second = measured.ops_per_second();
        Row {
            run,
            pool,
            ops_per_second,
            jobs_per_second: ops_per_second * per_op as f64,
            p50_ms: measured.latency_ms(0.50),
            p99_ms: measured.latency_ms(0.99),
            cpu: measured.cpu.map(|cpu| cpu.per(per_op)),
        }
    }
}

/// One line of the headline: idem's scenario ÷ River's, per job.
struct Pair {
    what: &'static str,
    group: Group,
    idem: &'static str,
    river: &'static str,
    /// Why River is ahead, when it is, from the run's own figures.
    because: Because,
}

/// The reason a verdict gives when River is ahead.
#[derive(Clone, Copy)]
enum Because {
    /// Only the figures: how far, and the medians.
    Figures,
    /// The gate commits twice durably; its one-commit form is `gate-async`.
    TwoCommits,
    /// River batches completions; the gate commits each outcome.
    BatchedCompletions,
    /// `insert_many` commits a batch once; idem per call commits each key.
    PerCallCommits,
    /// `gate.guard_batch` commits a batch twice (claim, settle);
    /// `insert_many` once.
    BatchTwoCommits,
    /// The gate writes each key twice (its claim, then its settle) where
    /// River's insert writes it once, its job not yet run.
    SecondWrite,
}

const PAIRS: &[Pair] = &[
    Pair {
        what: "new key: `gate.claim` ÷ River's unique insert (one statement each)",
        group: Group::New,
        idem: "idem-claim",
        river: "river-insert",
        because: Because::Figures,
    },
    Pair {
        what: "new key: gate, async outcome ÷ River's unique insert (one durable commit each)",
        group: Group::New,
        idem: "gate-async",
        river: "river-insert",
        because: Because::SecondWrite,
    },
    Pair {
        what: "new key: gate (claim + settle, two durable commits) ÷ River's unique insert (one)",
        group: Group::New,
        idem: "gate",
        river: "river-insert",
        because: Because::TwoCommits,
    },
    Pair {
        what: "duplicate: gate's refusal ÷ River's skipped unique insert",
        group: Group::Duplicate,
        idem: "gate",
        river: "river-insert",
        because: Because::Figures,
    },
    Pair {
        what: "once per key, end to end: gate ÷ River job worked to completion",
        group: Group::EndToEnd,
        idem: "gate",
        river: "river-worked",
        because: Because::BatchedCompletions,
    },
    Pair {
        what: "once per key, end to end: gate, async outcome ÷ River job worked to completion",
        group: Group::EndToEnd,
        idem: "gate-async",
        river: "river-worked",
        because: Because::Figures,
    },
    Pair {
        what: "many keys, per key: `gate.guard_batch` (claim + settle per batch) ÷ River's `insert_many`",
        group: Group::Batch,
        idem: "run-batch",
        river: "river-insert-many",
        because: Because::BatchTwoCommits,
    },
    Pair {
        what: "many keys, per key: gate per call ÷ River's `insert_many`",
        group: Group::Batch,
        idem: "gate",
        river: "river-insert-many",
        because: Because::PerCallCommits,
    },
    Pair {
        what: "many keys, per key: `gate.claim` per call ÷ River's `insert_many`",
        group: Group::Batch,
        idem: "idem-claim",
        river: "river-insert-many",
        because: Because::PerCallCommits,
    },
    Pair {
        what: "many keys, per key: the batch guard's claim statement alone, by hand ÷ River's `insert_many`",
        group: Group::Batch,
        idem: "batch-claim-sql",
        river: "river-insert-many",
        because: Because::Figures,
    },
];

/// The whole report, in markdown.
pub fn render(
    setting: Setting,
    rounds: &Rounds<Row>,
    scenarios: &[Scenario],
    flags: &Flags,
) -> String {
    let batch = format!(
        "- River's batch: {} jobs per `insert_many`; its duplicates: {} existing jobs, idem's: \
         as many settled identities\n",
        flags.river_batch, flags.river_duplicates,
    );
    let mut out = setting.opening("Machine, server and run", &batch, "lay-down");
    let mut ratios = ratios(rounds, flags);
    ratios.push('\n');
    ratios.push_str(&paired::method(rounds.each().len()));
    section(&mut out, "idem ÷ River", &ratios);
    let rows = rounds.medians();
    section(&mut out, "Verdicts", &verdicts(rounds, &rows, flags));
    section(&mut out, "Results", &table(rounds, &rows, flags));
    section(&mut out, "Scenarios", &legend(scenarios, flags));
    out
}

fn find<'r>(rows: &'r [Row], group: Group, name: &str, concurrency: u32) -> Option<&'r Row> {
    rows.iter().find(|row| {
        row.run.scenario.group == group
            && row.run.scenario.name == name
            && row.run.concurrency == concurrency
    })
}

/// Jobs per second of `idem` over those of `river`, in `group`, in each
/// round where both ran.
fn ratio(rounds: &Rounds<Row>, group: Group, idem: &str, river: &str, concurrency: u32) -> Paired {
    let is = |name: &str| {
        let name = name.to_owned();
        move |row: &Row| {
            row.run.scenario.group == group
                && row.run.scenario.name == name
                && row.run.concurrency == concurrency
        }
    };
    paired::paired(rounds.each(), is(idem), is(river), |row| {
        row.jobs_per_second
    })
}

fn ratios(rounds: &Rounds<Row>, flags: &Flags) -> String {
    let mut out = per_concurrency_head("pair (throughput per key, idem ÷ River)", flags);
    for pair in PAIRS {
        per_concurrency_line(&mut out, pair.what, flags, |concurrency| {
            ratio(rounds, pair.group, pair.idem, pair.river, concurrency).shown()
        });
    }
    out
}

/// One line per pair and concurrency: who is ahead on the median of the
/// rounds' ratios, and when River is, why; neither when the rounds
/// disagree (the rule of [`crate::paired`], against 1).
fn verdicts(rounds: &Rounds<Row>, rows: &[Row], flags: &Flags) -> String {
    let mut out = String::new();
    for pair in PAIRS {
        for &concurrency in &flags.concurrency {
            let ratio = ratio(rounds, pair.group, pair.idem, pair.river, concurrency);
            let Some(verdict) = ratio.judge(1.0) else {
                continue;
            };
            let verdict = match verdict {
                Verdict::Met => "idem ahead".to_owned(),
                Verdict::Missed => format!(
                    "River ahead, because {}",
                    because(rounds, rows, pair, concurrency, flags)
                ),
                neither => neither.text(1.0),
            };
            let _ = writeln!(
                out,
                "- {}, conc {concurrency}: {}× — {verdict}",
                pair.what,
                ratio.shown()
            );
        }
    }
    out
}

fn because(
    rounds: &Rounds<Row>,
    rows: &[Row],
    pair: &Pair,
    concurrency: u32,
    flags: &Flags,
) -> String {
    let figures = || {
        let idem = find(rows, pair.group, pair.idem, concurrency);
        let river = find(rows, pair.group, pair.river, concurrency);
        match (idem, river) {
            (Some(idem), Some(river)) => {
                let cpu = match (idem.cpu, river.cpu) {
                    (Some(ours), Some(theirs)) => format!(
                        "; CPU per key, client + server: idem {}, River {}",
                        cpu_sum(ours),
                        cpu_sum(theirs)
                    ),
                    _ => String::new(),
                };
                format!(
                    "it completed more keys per second in this run (p50 per operation: idem \
                     {:.2} ms, River {:.2} ms{cpu})",
                    idem.p50_ms, river.p50_ms
                )
            }
            _ => "it completed more keys per second in this run".to_owned(),
        }
    };
    // The same group's other idem scenario that shows what River's edge is
    // made of, against the same River scenario.
    let instead = |idem| ratio(rounds, pair.group, idem, pair.river, concurrency).shown();
    // CPU per key of `name` in the pair's group, as a verdict cites it.
    let cpu_of = |name| {
        find(rows, pair.group, name, concurrency)
            .and_then(|row| row.cpu)
            .map_or("unknown".to_owned(), cpu_sum)
    };
    match pair.because {
        Because::Figures => figures(),
        Because::SecondWrite => format!(
            "the gate writes each key twice, its claim and then its settle (two statements, \
             each on a pooled connection of its own), where River's insert writes it once and \
             its job has not run: the claim alone (`idem-claim`) is {}× River, at {} of CPU per \
             key against River's {}; the async settle adds the rest of the gate's {}. Once \
             River's job has run too (end to end), the gate is ahead",
            instead("idem-claim"),
            cpu_of("idem-claim"),
            cpu_of(pair.river),
            cpu_of(pair.idem),
        ),
        Because::TwoCommits => format!(
            "the gate waits for two WAL flushes per call and River's insert for one: the same \
             gate with one durable commit (`gate-async`) is {}× River",
            instead("gate-async")
        ),
        Because::BatchedCompletions => format!(
            "the gate commits each outcome durably on its own while River's completer records \
             completions in batches (one UPDATE for many jobs): the gate with its outcome \
             committed asynchronously (`gate-async`) is {}× River",
            instead("gate-async")
        ),
        Because::PerCallCommits => format!(
            "`insert_many` commits {} jobs with one WAL flush and a call per key pays a commit \
             per key: idem's batch API on the same keys (`run-batch`, two commits per batch) is \
             {}× River",
            flags.river_batch,
            instead("run-batch")
        ),
        Because::BatchTwoCommits => format!(
            "`gate.guard_batch` claims and then settles each batch of {}, two statements and two \
             WAL flushes, where `insert_many` commits once: the batch guard's claim statement alone \
             (`batch-claim-sql`, one flush) is {}× River",
            flags.river_batch,
            instead("batch-claim-sql")
        ),
    }
}

/// Every run (its median one, `rows`), in the order of the scenario list,
/// with its ratio to its group's River scenario at the same concurrency
/// (per key), divided within the rounds.
fn table(rounds: &Rounds<Row>, rows: &[Row], flags: &Flags) -> String {
    // Group by group in the list's order, then concurrency, then the
    // scenario's place in the list, whatever order they ran in.
    let place_in_list = |row: &Row| {
        let all = super::scenarios::ALL;
        let group = all.iter().position(|s| s.group == row.run.scenario.group);
        let level = flags
            .concurrency
            .iter()
            .position(|&c| c == row.run.concurrency);
        let scenario = all.iter().position(|s| *s == row.run.scenario);
        (group, level, scenario)
    };
    let mut order: Vec<&Row> = rows.iter().collect();
    order.sort_by_key(|row| place_in_list(row));
    let mut out = String::from(
        "| group | scenario | side | conc | pool | ops/s | keys/s | p50 ms | p99 ms | client CPU µs/key | server CPU µs/key | × River |\n\
         |---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for row in order {
        let scenario = row.run.scenario;
        let river = super::scenarios::ALL
            .iter()
            .find(|s| s.group == scenario.group && s.side == Side::River)
            .map(|s| s.name);
        let times = match (scenario.side, river) {
            (Side::Idem, Some(river)) => ratio(
                rounds,
                scenario.group,
                scenario.name,
                river,
                row.run.concurrency,
            )
            .shown(),
            _ => "–".to_owned(),
        };
        let (client_cpu, server_cpu) = CpuUse::cells(row.cpu);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {client_cpu} | {server_cpu} | {} |",
            named(scenario),
            row.run.concurrency,
            row.pool,
            row.ops_per_second,
            row.jobs_per_second,
            row.p50_ms,
            row.p99_ms,
            times
        );
    }
    out
}

/// `client + server = total µs`, as a verdict cites it.
fn cpu_sum(cpu: CpuUse) -> String {
    match cpu.server_us {
        Some(server) => format!(
            "{:.0} + {server:.0} = {:.0} µs",
            cpu.client_us,
            cpu.client_us + server
        ),
        None => format!("{:.0} µs (client only)", cpu.client_us),
    }
}

/// The group, scenario and side cells both tables start with.
fn named(scenario: Scenario) -> String {
    let side = side_label(scenario.side);
    format!("{} | {} | {side}", scenario.group.name(), scenario.name)
}

/// What each scenario sends.
pub fn legend(scenarios: &[Scenario], flags: &Flags) -> String {
    let mut out = String::from(
        "| group | scenario | side | keys per operation | what one operation sends |\n\
         |---|---|---|--:|---|\n",
    );
    for scenario in scenarios {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            named(*scenario),
            scenario.per_op(flags),
            scenario.sends
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{PAIRS, Row, verdicts};
    use crate::drive::Measurement;
    use crate::flags::Flags;
    use crate::paired::Rounds;
    use crate::river::scenarios::{ALL, Side, plan, selected};
    use crate::runner::Planned;

    #[test]
    fn every_pair_divides_an_idem_scenario_by_a_river_one_of_its_group() {
        let side_of = |group, name| {
            ALL.iter()
                .find(|s| s.group == group && s.name == name)
                .map(|s| s.side)
        };
        for pair in PAIRS {
            assert_eq!(
                side_of(pair.group, pair.idem),
                Some(Side::Idem),
                "{}",
                pair.what
            );
            assert_eq!(
                side_of(pair.group, pair.river),
                Some(Side::River),
                "{}",
                pair.what
            );
        }
        assert!(PAIRS.iter().any(|pair| pair.idem == "run-batch"));
    }

    #[test]
    fn the_batch_verdicts_are_explained_by_the_runs_own_batch_figures() {
        let flags = Flags::parse_from([
            "loadgen",
            "--river",
            "--scenarios",
            "batch",
            "--concurrency",
            "1",
        ]);
        let scenarios = selected(&flags).expect("the batch group");
        // Operations per second of river-insert-many, run-batch, gate,
        // idem-claim and batch-claim-sql: the batch guard behind River here.
        let ops = [50, 40, 800, 1600, 500];
        let plan = plan(&scenarios, &flags);
        let mut rounds = Rounds::new(plan.iter().map(Planned::name).collect());
        for (run, ops) in plan.into_iter().zip(ops) {
            let keys = run.scenario.per_op(&flags);
            rounds.push(Row::new(run, run.pool, keys, &Measurement::of_ops(ops)));
        }
        let verdicts = verdicts(&rounds, &rounds.medians(), &flags);
        assert!(
            verdicts.contains(
                "`gate.guard_batch` (claim + settle per batch) ÷ River's `insert_many`, conc 1: \
                 0.80× — River ahead, because `gate.guard_batch` claims and then settles each \
                 batch of 100"
            ),
            "{verdicts}"
        );
        assert!(verdicts.contains("(`batch-claim-sql`, one flush) is 10.00× River"));
        assert!(verdicts.contains("(`run-batch`, two commits per batch) is 0.80× River"));
        assert!(!verdicts.contains("no batch claim"), "{verdicts}");
    }
}
