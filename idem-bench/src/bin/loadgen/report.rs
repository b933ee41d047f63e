//! The report: one markdown table of every run, each run's ratio to its
//! group's floor at the same concurrency, the targets judged from
//! those ratios, and what each scenario runs. Also the pieces the Citus and
//! River reports share with it ([`Setting::opening`], [`section`],
//! [`shown`], the tables with a column per concurrency), so the three read
//! alike and a change of wording reaches all three.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::cpu::CpuUse;
use crate::drive::Measurement;
use crate::flags::Flags;
use crate::runner::Measured;
use crate::scenarios::{BASELINE, Group, Run, Scenario, Selectable, Spec};

/// One measured run, as the table shows it.
pub struct Row {
    pub run: Run,
    pub ops_per_second: f64,
    /// Messages each operation handled: one but for the batch scenario.
    pub messages: u64,
    /// Operations per second times `messages`: what the ratios divide.
    pub messages_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU time per message over the measured window, when it was read.
    pub cpu: Option<CpuUse>,
}

impl Row {
    /// The figures of `run`, each of whose operations handled `messages`.
    pub fn new(run: Run, messages: u64, measurement: &Measurement) -> Row {
        let ops_per_second = measurement.ops_per_second();
        Row {
            run,
            ops_per_second,
            messages,
            messages_per_second: ops_per_second * messages as f64,
            p50_ms: measurement.latency_ms(0.50),
            p99_ms: measurement.latency_ms(0.99),
            cpu: measurement.cpu.map(|per_op| per_op.per(messages)),
        }
    }
}

impl Measured for Row {
    fn progress(&self) -> String {
        // Messages only where they are not the operations.
        let messages = match self.messages {
            1 => String::new(),
            _ => format!(" ({:.0} msgs/s)", self.messages_per_second),
        };
        format!(
            "{} c={} pool={}: {:.0} ops/s{messages}, p50 {:.2} ms, p99 {:.2} ms",
            self.run.scenario.id(),
            self.run.concurrency,
            self.run.pool,
            self.ops_per_second,
            self.p50_ms,
            self.p99_ms
        )
    }

    fn throughput(&self) -> f64 {
        self.messages_per_second
    }
}

/// The whole report, in markdown.
pub fn render(setting: Setting, rows: &[Row], scenarios: &[Scenario], flags: &Flags) -> String {
    let cpu = "- CPU per message: the client's (this process) and the server's (its postmaster \
               and every process it started), read from `/proc` at the edges of each measured \
               window; – when the server is not on this machine\n";
    let mut out = setting.opening("Machine, server and run", cpu, "pre-fills");
    section(&mut out, "Results", &table(rows, flags));
    section(&mut out, "Targets", &targets(rows, flags));
    section(&mut out, "Scenarios", &legend(scenarios, flags));
    out
}

/// Where the runs ran and how long they took: what every report opens
/// with.
#[derive(Clone, Copy)]
pub struct Setting<'a> {
    environment: &'a str,
    took: Duration,
}

impl<'a> Setting<'a> {
    /// Runs in `environment` that `began` then: taken once they are done,
    /// so the report states their whole time.
    pub fn new(environment: &'a str, began: Instant) -> Setting<'a> {
        Setting {
            environment,
            took: began.elapsed(),
        }
    }

    /// A report's opening: `### heading`, the environment, the `extra`
    /// lines (each ending in a newline) and how long the runs took, their
    /// `set_up` (the rows laid down), warm-ups and checkpoints included.
    pub fn opening(self, heading: &str, extra: &str, set_up: &str) -> String {
        let seconds = self.took.as_secs();
        format!(
            "### {heading}\n\n{}{extra}- the runs took {} min {:02} s ({set_up}, warm-ups and checkpoints included)\n",
            self.environment,
            seconds / 60,
            seconds % 60
        )
    }
}

/// Appends the section `### title` and its `body`, after a blank line.
pub fn section(out: &mut String, title: &str, body: &str) {
    // Writing to a String cannot fail.
    let _ = write!(out, "\n### {title}\n\n{body}");
}

/// A ratio as the tables show it: two decimals, or a dash when one of its
/// runs is missing.
pub fn shown(ratio: Option<f64>) -> String {
    ratio.map_or("–".to_owned(), |r| format!("{r:.2}"))
}

/// Throughput `of` over throughput `over`, none when `over` measured
/// nothing (a run that failed at once would divide by zero).
pub fn divided(of: f64, over: f64) -> Option<f64> {
    (over > 0.0).then(|| of / over)
}

/// `| what | conc 1 | conc 16 |` and its alignment line: the head of a
/// table with a column per concurrency.
pub fn per_concurrency_head(what: &str, flags: &Flags) -> String {
    let mut out = format!("| {what} |");
    for concurrency in &flags.concurrency {
        let _ = write!(out, " conc {concurrency} |");
    }
    out.push_str("\n|---|");
    for _ in &flags.concurrency {
        out.push_str("--:|");
    }
    out.push('\n');
    out
}

/// One line of such a table: `what`, then `cell` at each concurrency.
pub fn per_concurrency_line(
    out: &mut String,
    what: &str,
    flags: &Flags,
    cell: impl Fn(u32) -> String,
) {
    let _ = write!(out, "| {what} |");
    for &concurrency in &flags.concurrency {
        let _ = write!(out, " {} |", cell(concurrency));
    }
    out.push('\n');
}

/// Every run, with its ratio to its group's floor at the same concurrency
/// (per message), in the order of the scenario list.
fn table(rows: &[Row], flags: &Flags) -> String {
    let mut rows: Vec<&Row> = rows.iter().collect();
    rows.sort_by_key(|row| row.run.place);
    let mut out = String::from(
        "| group | scenario | conc | pool | ops/s | msgs/s | p50 ms | p99 ms | client CPU µs/msg | server CPU µs/msg | × floor |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for row in &rows {
        let scenario = row.run.scenario;
        let ratio = ratio(
            &rows,
            (scenario.group, scenario.spec.name),
            (scenario.group, BASELINE),
            row.run.concurrency,
        );
        let (client_cpu, server_cpu) = CpuUse::cells(row.cpu);
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {client_cpu} | {server_cpu} | {} |",
            scenario.group.label(flags),
            scenario.spec.name,
            row.run.concurrency,
            row.run.pool,
            row.ops_per_second,
            row.messages_per_second,
            row.p50_ms,
            row.p99_ms,
            shown(ratio),
        );
    }
    out
}

/// Throughput of `scenario` over throughput of `baseline`, at `concurrency`,
/// when both were run: messages per second, so a batch is compared with a
/// call per message.
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
    divided(scenario.messages_per_second, baseline.messages_per_second)
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

impl Target {
    /// `scenario` must reach `at_least` × `baseline`, both of `group`, at
    /// every concurrency: what all but two targets are.
    fn within(
        group: Group,
        scenario: &'static str,
        baseline: &'static str,
        at_least: f64,
    ) -> Target {
        Target {
            what: String::new(),
            scenario: (group, scenario),
            baseline: (group, baseline),
            at_least,
            judged: every_concurrency,
        }
    }

    /// The target, as the report's table names it.
    fn named(self, what: impl Into<String>) -> Target {
        Target {
            what: what.into(),
            ..self
        }
    }
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
    let (noop, batch, dup) = (Group::NoOp, Group::Batch, Group::Duplicates);
    let mut targets = vec![
        Target::within(noop, "gate", BASELINE, 0.90).named("gate ≥ 0.90× floor"),
        Target::within(noop, "gate", "on-conflict", 0.90)
            .named("gate ≥ 0.90× on-conflict (the gate's own client work)"),
        Target::within(dup, "gate", BASELINE, 0.90).named("duplicate refusal ≥ 0.90× its floor"),
        Target::within(dup, "gate-cached", BASELINE, 50.0)
            .named("cached duplicate refusal ≥ 50× its floor"),
        Target::within(noop, "gate", "brandur", 1.2).named("gate ≥ 1.2× brandur"),
        Target::within(batch, "gate-batch", "gate", 10.0).named(format!(
            "gate-batch ≥ 10× gate, per message (batches of {})",
            flags.batch_size
        )),
        Target {
            judged: pool_smaller_than_workers,
            ..Target::within(Group::SlowBody, "gate", "advisory", 2.0).named(format!(
                "gate ≥ 2× advisory, {} ms body",
                flags.slow_body_ms
            ))
        },
    ];
    if let Some(&largest) = flags.history_sizes().last() {
        let rows = crate::scenarios::count(largest);
        targets.push(Target {
            scenario: (Group::History(largest), "gate"),
            ..Target::within(noop, "gate", "gate", 0.85).named(format!(
                "gate on {rows} rows ≥ 0.85× gate on an empty table"
            ))
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

/// What each scenario runs and costs by construction (a batch scenario's
/// costs per batch, which its line says).
pub fn legend(scenarios: &[Scenario], flags: &Flags) -> String {
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
        let per_batch = match spec.messages(flags) {
            1 => String::new(),
            messages => format!(
                "; one operation is {messages} messages (`--batch-size`): its costs are per batch \
                 of {messages}, its msgs/s and × floor per message, its p50 and p99 per batch"
            ),
        };
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "| {} | {} | {}{per_batch} | {} | {} | {} | {} |",
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Row, table, targets};
    use crate::drive::Measurement;
    use crate::flags::Flags;
    use crate::scenarios::{self, Run};

    /// The batch group at concurrency 1, its floor, gate and gate-batch
    /// having completed these operations per second.
    fn rows(flags: &Flags, ops: [u64; 3]) -> Vec<Row> {
        let scenarios = scenarios::selected(flags).expect("the batch group");
        scenarios::plan(&scenarios, flags)
            .into_iter()
            .zip(ops)
            .map(|(run, ops): (Run, u64)| {
                Row::new(
                    run,
                    run.scenario.spec.messages(flags),
                    &Measurement::of_ops(ops),
                )
            })
            .collect()
    }

    #[test]
    fn a_batch_counts_messages_and_is_compared_per_message() {
        let flags = Flags::parse_from(["loadgen", "--scenarios", "batch", "--concurrency", "1"]);
        let rows = rows(&flags, [400, 300, 40]);
        let table = table(&rows, &flags);
        assert!(
            table.contains("| batch of 100, no-op body | gate-batch | 1 | 1 | 40 | 4000 | 1.00 | 1.00 | – | – | 10.00 |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| batch of 100, no-op body | gate | 1 | 1 | 300 | 300 | 1.00 | 1.00 | – | – | 0.75 |"
            ),
            "{table}"
        );
        let targets = targets(&rows, &flags);
        assert!(
            targets.contains(
                "| gate-batch ≥ 10× gate, per message (batches of 100) | 1 | 13.33 | met |"
            ),
            "{targets}"
        );
    }

    #[test]
    fn a_batch_below_ten_times_the_gate_per_message_misses() {
        let flags = Flags::parse_from(["loadgen", "--scenarios", "batch", "--concurrency", "1"]);
        let targets = targets(&rows(&flags, [400, 300, 29]), &flags);
        assert!(
            targets.contains(
                "| gate-batch ≥ 10× gate, per message (batches of 100) | 1 | 9.67 | **missed** |"
            ),
            "{targets}"
        );
    }
}
