//! The report: one markdown table of every run, each run's ratio to its
//! group's floor at the same concurrency, the targets judged from
//! those ratios, and what each scenario runs.

use std::fmt::Write as _;
use std::time::Duration;

use crate::drive::Measurement;
use crate::flags::Flags;
use crate::scenarios::{BASELINE, Group, Run, Scenario, Spec};

/// One measured run, as the table shows it.
pub struct Row {
    pub run: Run,
    pub ops_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Row {
    /// The figures of `run`.
    pub fn new(run: Run, measurement: &Measurement) -> Row {
        Row {
            run,
            ops_per_second: measurement.ops_per_second(),
            p50_ms: measurement.latency_ms(0.50),
            p99_ms: measurement.latency_ms(0.99),
        }
    }

    /// One line for the progress log.
    pub fn progress(&self) -> String {
        format!(
            "{} c={} pool={}: {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms",
            self.run.scenario.id(),
            self.run.concurrency,
            self.run.pool,
            self.ops_per_second,
            self.p50_ms,
            self.p99_ms
        )
    }
}

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
        "- the runs took {} min {:02} s (pre-fills, warm-ups and checkpoints included)",
        seconds / 60,
        seconds % 60
    );
    out.push_str("\n### Results\n\n");
    out.push_str(&table(rows, flags));
    out.push_str("\n### Targets\n\n");
    out.push_str(&targets(rows, flags));
    out.push_str("\n### Scenarios\n\n");
    out.push_str(&legend(scenarios));
    out
}

/// Every run, with its ratio to its group's floor at the same concurrency,
/// in the order of the scenario list.
fn table(rows: &[Row], flags: &Flags) -> String {
    let mut rows: Vec<&Row> = rows.iter().collect();
    rows.sort_by_key(|row| row.run.place);
    let mut out = String::from(
        "| group | scenario | conc | pool | ops/s | p50 ms | p99 ms | × floor |\n\
         |---|---|--:|--:|--:|--:|--:|--:|\n",
    );
    for row in &rows {
        let scenario = row.run.scenario;
        let ratio = ratio(
            &rows,
            (scenario.group, scenario.spec.name),
            (scenario.group, BASELINE),
            row.run.concurrency,
        );
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {} |",
            scenario.group.label(flags),
            scenario.spec.name,
            row.run.concurrency,
            row.run.pool,
            row.ops_per_second,
            row.p50_ms,
            row.p99_ms,
            ratio.map_or("–".to_owned(), |r| format!("{r:.2}")),
        );
    }
    out
}

/// Throughput of `scenario` over throughput of `baseline`, at `concurrency`,
/// when both were run.
fn ratio(
    rows: &[&Row],
    scenario: (Group, &str),
    baseline: (Group, &str),
    concurrency: u32,
) -> Option<f64> {
    let find = |(group, name): (Group, &str)| {
        rows.iter().find(|row| {
            row.run.scenario.group == group
                && row.run.scenario.spec.name == name
                && row.run.concurrency == concurrency
        })
    };
    let (scenario, baseline) = (find(scenario)?, find(baseline)?);
    (baseline.ops_per_second > 0.0).then(|| scenario.ops_per_second / baseline.ops_per_second)
}

/// One of the targets: `scenario` must reach `at_least` × `baseline`.
struct Target {
    what: String,
    scenario: (Group, &'static str),
    baseline: (Group, &'static str),
    at_least: f64,
    /// Concurrencies where the target says nothing (shown, not judged).
    judged: fn(u32, &Flags) -> bool,
}

fn every_concurrency(_: u32, _: &Flags) -> bool {
    true
}

/// A held connection costs only when workers outnumber connections; below
/// that, both designs wait on the body alike.
fn pool_smaller_than_workers(concurrency: u32, flags: &Flags) -> bool {
    concurrency > flags.slow_pool
}

/// Each target at each concurrency: the measured ratio and whether it holds.
fn targets(rows: &[Row], flags: &Flags) -> String {
    let rows: Vec<&Row> = rows.iter().collect();
    let mut targets = vec![
        Target {
            what: "gate ≥ 0.90× floor".to_owned(),
            scenario: (Group::NoOp, "gate"),
            baseline: (Group::NoOp, BASELINE),
            at_least: 0.90,
            judged: every_concurrency,
        },
        Target {
            what: "gate ≥ 0.90× on-conflict (the gate's own client work)".to_owned(),
            scenario: (Group::NoOp, "gate"),
            baseline: (Group::NoOp, "on-conflict"),
            at_least: 0.90,
            judged: every_concurrency,
        },
        Target {
            what: "duplicate refusal ≥ 0.90× its floor".to_owned(),
            scenario: (Group::Duplicates, "gate"),
            baseline: (Group::Duplicates, BASELINE),
            at_least: 0.90,
            judged: every_concurrency,
        },
        Target {
            what: "cached duplicate refusal ≥ 50× its floor".to_owned(),
            scenario: (Group::Duplicates, "gate-cached"),
            baseline: (Group::Duplicates, BASELINE),
            at_least: 50.0,
            judged: every_concurrency,
        },
        Target {
            what: "gate ≥ 1.2× brandur".to_owned(),
            scenario: (Group::NoOp, "gate"),
            baseline: (Group::NoOp, "brandur"),
            at_least: 1.2,
            judged: every_concurrency,
        },
        Target {
            what: format!("gate ≥ 2× advisory, {} ms body", flags.slow_body_ms),
            scenario: (Group::SlowBody, "gate"),
            baseline: (Group::SlowBody, "advisory"),
            at_least: 2.0,
            judged: pool_smaller_than_workers,
        },
    ];
    if let Some(&largest) = flags.history_sizes().last() {
        targets.push(Target {
            what: format!(
                "gate on {} rows ≥ 0.85× gate on an empty table",
                crate::scenarios::count(largest)
            ),
            scenario: (Group::History(largest), "gate"),
            baseline: (Group::NoOp, "gate"),
            at_least: 0.85,
            judged: every_concurrency,
        });
    }
    let mut out = String::from("| target | conc | ratio | verdict |\n|---|--:|--:|---|\n");
    for target in &targets {
        for &concurrency in &flags.concurrency {
            let Some(ratio) = ratio(&rows, target.scenario, target.baseline, concurrency) else {
                continue;
            };
            let verdict = if !(target.judged)(concurrency, flags) {
                "not judged: the pool has a connection per worker"
            } else if ratio >= target.at_least {
                "met"
            } else {
                "**missed**"
            };
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "| {} | {concurrency} | {ratio:.2} | {verdict} |",
                target.what
            );
        }
    }
    out.push_str(
        "| identity + address < 2 µs for 4 short parts | – | – | see `cargo bench -p idem-bench` |\n",
    );
    out
}

/// What each scenario runs and costs by construction.
pub fn legend(scenarios: &[Scenario]) -> String {
    let mut specs: Vec<(Spec, Vec<&'static str>)> = Vec::new();
    for scenario in scenarios {
        match specs.iter_mut().find(|(spec, _)| *spec == scenario.spec) {
            Some((_, groups)) if groups.contains(&scenario.group.name()) => {}
            Some((_, groups)) => groups.push(scenario.group.name()),
            None => specs.push((scenario.spec, vec![scenario.group.name()])),
        }
    }
    let mut out = String::from(
        "| scenario | groups | what one operation runs | statements | pool acquires | durable commits | connection held across the body |\n\
         |---|---|---|--:|--:|--:|---|\n",
    );
    for (spec, groups) in specs {
        let cost = spec.cost;
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            spec.name,
            groups.join(", "),
            spec.summary,
            cost.statements,
            cost.acquires,
            cost.durable_commits,
            if cost.holds_connection { "yes" } else { "no" }
        );
    }
    out
}
