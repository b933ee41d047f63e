//! The Citus comparison's report: the ratios it exists for (the gate over
//! the floor on each server, Citus over one PostgreSQL for each scenario,
//! async over durable settles), each divided within a round
//! ([`crate::paired`]), the latency the coordinator adds, every run, and
//! what each scenario runs.

use std::fmt::Write as _;

use crate::citus::{Cell, Target};
use crate::flags::Flags;
use crate::paired::{self, Paired, Rounds};
use crate::report::{self, Row, Setting, per_concurrency_head, per_concurrency_line, section};
use crate::scenarios::{BASELINE, Group, Scenario};

/// A scenario on one server: what a ratio is made of.
#[derive(Debug, Clone, Copy)]
struct On {
    target: Target,
    group: Group,
    name: &'static str,
}

/// One line of the headline table: `of` ÷ `over` at each concurrency.
struct Ratio {
    what: &'static str,
    of: On,
    over: On,
}

/// The whole report, in markdown.
pub fn render(
    setting: Setting,
    rounds: &Rounds<Cell>,
    scenarios: &[Scenario],
    flags: &Flags,
) -> String {
    let mut out = setting.opening("Cluster, servers and run", "", "pre-loads");
    let mut ratios = ratios(rounds, flags);
    ratios.push('\n');
    ratios.push_str(&paired::method(rounds.each().len()));
    section(&mut out, "Ratios", &ratios);
    let cells = rounds.medians();
    section(
        &mut out,
        "Latency the coordinator adds",
        &added_latency(&cells, flags),
    );
    section(&mut out, "Results", &table(rounds, &cells, flags));
    section(&mut out, "Scenarios", &report::legend(scenarios, flags));
    out.push_str(ON_CITUS);
    out
}

/// Throughput ratios, one column per concurrency: the median of the
/// rounds' and their range.
fn ratios(rounds: &Rounds<Cell>, flags: &Flags) -> String {
    let new = Group::History(flags.citus_rows);
    let dup = Group::Duplicates;
    let on = |target, group, name| On {
        target,
        group,
        name,
    };
    let (pg, citus) = (Target::Postgres, Target::Citus);
    let lines = [
        Ratio {
            what: "gate ÷ floor, one PostgreSQL",
            of: on(pg, new, "gate"),
            over: on(pg, new, BASELINE),
        },
        Ratio {
            what: "gate ÷ floor, Citus",
            of: on(citus, new, "gate"),
            over: on(citus, new, BASELINE),
        },
        Ratio {
            what: "Citus ÷ PostgreSQL, floor (the coordinator hop on two bare statements)",
            of: on(citus, new, BASELINE),
            over: on(pg, new, BASELINE),
        },
        Ratio {
            what: "Citus ÷ PostgreSQL, gate",
            of: on(citus, new, "gate"),
            over: on(pg, new, "gate"),
        },
        Ratio {
            what: "on-conflict ÷ floor (the gate's `INSERT ... ON CONFLICT` alone), one PostgreSQL",
            of: on(pg, new, "on-conflict"),
            over: on(pg, new, BASELINE),
        },
        Ratio {
            what: "on-conflict ÷ floor, Citus",
            of: on(citus, new, "on-conflict"),
            over: on(citus, new, BASELINE),
        },
        Ratio {
            what: "fused-lookup-first ÷ floor (the gate's one-statement claim by hand), one PostgreSQL",
            of: on(pg, new, "fused-lookup-first"),
            over: on(pg, new, BASELINE),
        },
        Ratio {
            what: "fused-lookup-first ÷ floor, Citus",
            of: on(citus, new, "fused-lookup-first"),
            over: on(citus, new, BASELINE),
        },
        Ratio {
            what: "refused duplicate ÷ its floor (a bare `SELECT` by address), one PostgreSQL",
            of: on(pg, dup, "gate"),
            over: on(pg, dup, BASELINE),
        },
        Ratio {
            what: "refused duplicate ÷ its floor, Citus",
            of: on(citus, dup, "gate"),
            over: on(citus, dup, BASELINE),
        },
        Ratio {
            what: "Citus ÷ PostgreSQL, the bare `SELECT` by address",
            of: on(citus, dup, BASELINE),
            over: on(pg, dup, BASELINE),
        },
        Ratio {
            what: "Citus ÷ PostgreSQL, refused duplicate",
            of: on(citus, dup, "gate"),
            over: on(pg, dup, "gate"),
        },
        Ratio {
            what: "async ÷ durable settle, gate (`gate-async` ÷ `gate`), one PostgreSQL",
            of: on(pg, new, "gate-async"),
            over: on(pg, new, "gate"),
        },
        Ratio {
            what: "async ÷ durable settle, gate, Citus",
            of: on(citus, new, "gate-async"),
            over: on(citus, new, "gate"),
        },
        Ratio {
            what: "async ÷ durable settle, floor (`settle-async` ÷ `floor`), one PostgreSQL",
            of: on(pg, new, "settle-async"),
            over: on(pg, new, BASELINE),
        },
        Ratio {
            what: "async ÷ durable settle, floor, Citus",
            of: on(citus, new, "settle-async"),
            over: on(citus, new, BASELINE),
        },
    ];
    let mut out = per_concurrency_head("throughput ratio", flags);
    for line in &lines {
        per_concurrency_line(&mut out, line.what, flags, |concurrency| {
            ratio(rounds, line.of, line.over, concurrency).shown()
        });
    }
    out
}

/// What the gate's scenarios run on Citus, where the legend's counts are
/// one PostgreSQL's.
const ON_CITUS: &str = "\nOn Citus the gate claims with the `INSERT ... ON CONFLICT DO NOTHING \
RETURNING` alone (routed to the account's worker) and looks the holder up only when it \
inserted nothing: a new claim is one statement, a refused duplicate two. `gate-async` commits \
durably there (the setting would reach the coordinator only).\n";

/// The median latency on Citus less the median on one PostgreSQL, per
/// scenario and concurrency: the coordinator's hop in milliseconds.
fn added_latency(cells: &[Cell], flags: &Flags) -> String {
    let new = Group::History(flags.citus_rows);
    let dup = Group::Duplicates;
    let lines = [
        ("floor (2 statements)", new, BASELINE),
        ("gate (2 statements)", new, "gate"),
        ("bare `SELECT` by address (1 statement)", dup, BASELINE),
        ("refused duplicate (1 statement; 2 on Citus)", dup, "gate"),
    ];
    let mut out = per_concurrency_head("p50 Citus − p50 PostgreSQL, ms", flags);
    for (what, group, name) in lines {
        per_concurrency_line(&mut out, what, flags, |concurrency| {
            let at = |target| {
                let on = On {
                    target,
                    group,
                    name,
                };
                find(cells, on, concurrency)
            };
            let added = at(Target::Citus)
                .zip(at(Target::Postgres))
                .map(|(citus, pg)| citus.p50_ms - pg.p50_ms);
            added.map_or("–".to_owned(), |ms| format!("{ms:+.2}"))
        });
    }
    out
}

/// Every run (its median one, `cells`), in the order of the scenario list,
/// PostgreSQL before Citus, with its ratio to its server's floor and to the
/// same scenario on one PostgreSQL, each divided within the rounds.
fn table(rounds: &Rounds<Cell>, cells: &[Cell], flags: &Flags) -> String {
    let mut order: Vec<&Cell> = cells.iter().collect();
    order.sort_by_key(|cell| (cell.row.run.place, cell.target));
    let mut out = String::from(
        "| server | group | scenario | conc | pool | ops/s | p50 ms | p99 ms | × floor | × PostgreSQL |\n\
         |---|---|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for cell in order {
        let run = cell.row.run;
        let (group, name, concurrency) =
            (run.scenario.group, run.scenario.spec.name, run.concurrency);
        let this = On {
            target: cell.target,
            group,
            name,
        };
        let versus = |on| ratio(rounds, this, on, concurrency).shown();
        let floor = versus(On {
            target: cell.target,
            group,
            name: BASELINE,
        });
        let postgres = versus(On {
            target: Target::Postgres,
            group,
            name,
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {} | {} |",
            cell.target.label(),
            group.label(flags),
            name,
            concurrency,
            run.pool,
            cell.row.ops_per_second,
            cell.row.p50_ms,
            cell.row.p99_ms,
            floor,
            postgres,
        );
    }
    out
}

/// Operations per second of `of` over those of `over` at `concurrency`, in
/// each round where both ran.
fn ratio(rounds: &Rounds<Cell>, of: On, over: On, concurrency: u32) -> Paired {
    paired::paired(
        rounds.each(),
        |cell| matches(cell, of, concurrency),
        |cell| matches(cell, over, concurrency),
        |cell| cell.row.ops_per_second,
    )
}

fn find(cells: &[Cell], on: On, concurrency: u32) -> Option<&Row> {
    cells
        .iter()
        .find(|cell| matches(cell, on, concurrency))
        .map(|cell| &cell.row)
}

fn matches(cell: &Cell, on: On, concurrency: u32) -> bool {
    let run = cell.row.run;
    cell.target == on.target
        && run.scenario.group == on.group
        && run.scenario.spec.name == on.name
        && run.concurrency == concurrency
}
