//! River side by side's report: idem ÷ River for each pair at each
//! concurrency with its verdict, every run, and what each scenario sends.

use std::fmt::Write as _;
use std::time::Duration;

use super::scenarios::{Group, Run, Scenario, Side};
use super::side_label;
use crate::drive::Measurement;
use crate::flags::Flags;

/// One measured run.
pub struct Row {
    pub run: Run,
    /// The pool it ran with (River's worked jobs get a few more).
    pub pool: u32,
    pub ops_per_second: f64,
    /// Jobs (or keys) per second: operations times the batch size.
    pub jobs_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
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
        }
    }

    /// One line for the progress log.
    pub fn progress(&self) -> String {
        format!(
            "{} c={} pool={}: {:.0} ops/s ({:.0} jobs/s), p50 {:.2} ms, p99 {:.2} ms",
            self.run.scenario.id(),
            self.run.concurrency,
            self.pool,
            self.ops_per_second,
            self.jobs_per_second,
            self.p50_ms,
            self.p99_ms
        )
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
    /// `insert_many` commits a batch once; idem has no batch claim yet.
    NoBatchClaim,
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
        because: Because::Figures,
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
        what: "many keys, per key: gate per call ÷ River's `insert_many` (idem's batch claim is not there yet)",
        group: Group::Batch,
        idem: "gate",
        river: "river-insert-many",
        because: Because::NoBatchClaim,
    },
    Pair {
        what: "many keys, per key: `gate.claim` per call ÷ River's `insert_many`",
        group: Group::Batch,
        idem: "idem-claim",
        river: "river-insert-many",
        because: Because::NoBatchClaim,
    },
    Pair {
        what: "many keys, per key: the batch as one claim statement, by hand ÷ River's `insert_many`",
        group: Group::Batch,
        idem: "batch-claim-sql",
        river: "river-insert-many",
        because: Because::Figures,
    },
];

/// The whole report, in markdown.
pub fn render(
    environment: &str,
    took: Duration,
    rows: &[Row],
    scenarios: &[Scenario],
    flags: &Flags,
) -> String {
    let mut out = String::new();
    out.push_str("### Machine, server and run\n\n");
    out.push_str(environment);
    let seconds = took.as_secs();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "- River's batch: {} jobs per `insert_many`; its duplicates: {} existing jobs, idem's: \
         as many settled identities\n\
         - the runs took {} min {:02} s (lay-down, warm-ups and checkpoints included)",
        flags.river_batch,
        flags.river_duplicates,
        seconds / 60,
        seconds % 60
    );
    out.push_str("\n### idem ÷ River\n\n");
    out.push_str(&ratios(rows, flags));
    out.push_str("\n### Verdicts\n\n");
    out.push_str(&verdicts(rows, flags));
    out.push_str("\n### Results\n\n");
    out.push_str(&table(rows, flags));
    out.push_str("\n### Scenarios\n\n");
    out.push_str(&legend(scenarios, flags));
    out
}

fn find<'r>(rows: &'r [Row], group: Group, name: &str, concurrency: u32) -> Option<&'r Row> {
    rows.iter().find(|row| {
        row.run.scenario.group == group
            && row.run.scenario.name == name
            && row.run.concurrency == concurrency
    })
}

/// Jobs per second of `idem` over those of `river`, in `group`.
fn ratio(rows: &[Row], group: Group, idem: &str, river: &str, concurrency: u32) -> Option<f64> {
    let of = find(rows, group, idem, concurrency)?;
    let over = find(rows, group, river, concurrency)?;
    (over.jobs_per_second > 0.0).then(|| of.jobs_per_second / over.jobs_per_second)
}

fn shown(ratio: Option<f64>) -> String {
    ratio.map_or("–".to_owned(), |r| format!("{r:.2}"))
}

fn ratios(rows: &[Row], flags: &Flags) -> String {
    let mut out = String::from("| pair (throughput per key, idem ÷ River) |");
    for concurrency in &flags.concurrency {
        let _ = write!(out, " conc {concurrency} |");
    }
    out.push_str("\n|---|");
    for _ in &flags.concurrency {
        out.push_str("--:|");
    }
    out.push('\n');
    for pair in PAIRS {
        let _ = write!(out, "| {} |", pair.what);
        for &concurrency in &flags.concurrency {
            let r = ratio(rows, pair.group, pair.idem, pair.river, concurrency);
            let _ = write!(out, " {} |", shown(r));
        }
        out.push('\n');
    }
    out
}

/// One line per pair and concurrency: who is ahead, and when River is, why.
fn verdicts(rows: &[Row], flags: &Flags) -> String {
    let mut out = String::new();
    for pair in PAIRS {
        for &concurrency in &flags.concurrency {
            let Some(r) = ratio(rows, pair.group, pair.idem, pair.river, concurrency) else {
                continue;
            };
            let verdict = if r >= 1.0 {
                "idem ahead".to_owned()
            } else {
                format!(
                    "River ahead, because {}",
                    because(rows, pair, concurrency, flags)
                )
            };
            let _ = writeln!(
                out,
                "- {}, conc {concurrency}: {r:.2}× — {verdict}",
                pair.what
            );
        }
    }
    out
}

fn because(rows: &[Row], pair: &Pair, concurrency: u32, flags: &Flags) -> String {
    let figures = || {
        let idem = find(rows, pair.group, pair.idem, concurrency);
        let river = find(rows, pair.group, pair.river, concurrency);
        match (idem, river) {
            (Some(idem), Some(river)) => format!(
                "it completed more keys per second in this run (p50 per operation: idem {:.2} ms, \
                 River {:.2} ms), which the statements each sends (see Scenarios) do not explain",
                idem.p50_ms, river.p50_ms
            ),
            _ => "it completed more keys per second in this run".to_owned(),
        }
    };
    match pair.because {
        Because::Figures => figures(),
        Because::TwoCommits => format!(
            "the gate waits for two WAL flushes per call and River's insert for one: the same \
             gate with one durable commit (`gate-async`) is {}× River",
            shown(ratio(
                rows,
                pair.group,
                "gate-async",
                pair.river,
                concurrency
            ))
        ),
        Because::BatchedCompletions => format!(
            "the gate commits each outcome durably on its own while River's completer records \
             completions in batches (one UPDATE for many jobs): the gate with its outcome \
             committed asynchronously (`gate-async`) is {}× River",
            shown(ratio(
                rows,
                pair.group,
                "gate-async",
                pair.river,
                concurrency
            ))
        ),
        Because::NoBatchClaim => format!(
            "`insert_many` commits {} jobs with one WAL flush and idem has no batch claim yet \
             (issue 17, part 2), so it pays a commit per key: the same batch as one \
             hand-written claim statement (`batch-claim-sql`) is {}× River",
            flags.river_batch,
            shown(ratio(
                rows,
                pair.group,
                "batch-claim-sql",
                pair.river,
                concurrency
            ))
        ),
    }
}

/// Every run, in the order of the scenario list, with its ratio to its
/// group's River scenario at the same concurrency (per key).
fn table(rows: &[Row], flags: &Flags) -> String {
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
        "| group | scenario | side | conc | pool | ops/s | keys/s | p50 ms | p99 ms | × River |\n\
         |---|---|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for row in order {
        let scenario = row.run.scenario;
        let river = super::scenarios::ALL
            .iter()
            .find(|s| s.group == scenario.group && s.side == Side::River)
            .map(|s| s.name);
        let times = match (scenario.side, river) {
            (Side::Idem, Some(river)) => shown(ratio(
                rows,
                scenario.group,
                scenario.name,
                river,
                row.run.concurrency,
            )),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {} |",
            scenario.group.name(),
            scenario.name,
            side_label(scenario.side),
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

/// What each scenario sends.
pub fn legend(scenarios: &[Scenario], flags: &Flags) -> String {
    let mut out = String::from(
        "| group | scenario | side | keys per operation | what one operation sends |\n\
         |---|---|---|--:|---|\n",
    );
    for scenario in scenarios {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            scenario.group.name(),
            scenario.name,
            side_label(scenario.side),
            scenario.per_op(flags),
            scenario.sends
        );
    }
    out
}
