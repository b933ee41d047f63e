//! The Citus comparison (`--citus-url`): the core scenarios against one
//! PostgreSQL (`DATABASE_URL`) and against a Citus coordinator whose
//! `idem_records` idem distributed by account, in one run, so that both
//! "what does the gate cost over the floor on Citus" and "what does the
//! coordinator's hop cost over one PostgreSQL" are ratios within it.
//!
//! Both servers get the same tables, laid down once before anything is
//! measured: `--citus-rows` settled rows of history and `--duplicates`
//! settled identities for the refusals, spread over `--citus-accounts`
//! accounts (so over every shard and both workers). The runs interleave:
//! each scenario at each concurrency runs on one server and then at once
//! on the other, the first server alternating from one pair to the next,
//! so a drift in the machine falls on both sides of a Citus ÷ PostgreSQL
//! ratio alike.

use std::sync::Arc;
use std::time::Instant;

use crate::accounts::Accounts;
use crate::bench_db::{BenchDb, Contents, TableLayout};
use crate::flags::Flags;
use crate::report::{Row, Setting};
use crate::runner::{self, Measured, Planned};
use crate::scenarios::{self, Run, Scenario, Selectable};
use crate::{BoxError, citus_report, environment, splice};

/// Which server a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// One PostgreSQL, at `DATABASE_URL`.
    Postgres,
    /// The Citus coordinator, at `--citus-url`.
    Citus,
}

impl Target {
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Target::Postgres => "PostgreSQL",
            Target::Citus => "Citus",
        }
    }
}

/// One planned run on one server.
#[derive(Debug, Clone, Copy)]
pub struct TargetRun {
    pub target: Target,
    pub run: Run,
}

impl Planned for TargetRun {
    fn name(&self) -> String {
        let on = format!("{} on {}", self.run.scenario.id(), self.target.label());
        scenarios::run_name(on, self.run.concurrency)
    }
}

/// One measured run on one server.
#[derive(Debug, Clone)]
pub struct Cell {
    pub target: Target,
    pub row: Row,
}

impl Measured for Cell {
    fn progress(&self) -> String {
        format!("{}: {}", self.target.label(), self.row.progress())
    }

    fn throughput(&self) -> f64 {
        self.row.throughput()
    }
}

/// The matrix's plan ([`scenarios::plan`], without its targets' pairs:
/// the Citus ratios are not the matrix's targets), each run on both servers
/// back to back, the first server alternating, so every Citus ÷ PostgreSQL
/// ratio divides two runs measured one after the other.
pub fn plan(scenarios: &[Scenario], flags: &Flags) -> Vec<TargetRun> {
    scenarios::plan(scenarios, flags, &[])
        .into_iter()
        .enumerate()
        .flat_map(|(place, run)| {
            let order = if place % 2 == 0 {
                [Target::Postgres, Target::Citus]
            } else {
                [Target::Citus, Target::Postgres]
            };
            order.map(move |target| TargetRun { target, run })
        })
        .collect()
}

/// Sets both servers up, measures, reports, and drops both schemas (unless
/// `--keep-schema`).
pub async fn run(flags: &Flags, scenarios: &[Scenario], citus_url: &str) -> Result<(), BoxError> {
    let accounts = Arc::new(Accounts::spread(flags.citus_accounts));
    let mut postgres = runner::create_db(
        flags,
        &flags.database_url(),
        flags.table_layout(),
        Arc::clone(&accounts),
    )
    .await?;
    let citus = runner::create_db(flags, citus_url, TableLayout::Distributed, accounts).await;
    let mut citus = match citus {
        Ok(citus) => citus,
        Err(error) => {
            postgres.drop_schema().await?;
            return Err(format!("--citus-url {citus_url}: {error}").into());
        }
    };
    let outcome = measure_all(flags, &mut postgres, &mut citus, scenarios, citus_url).await;
    runner::drop_dbs(flags, vec![postgres, citus], outcome).await
}

/// Lays the rows down on both servers, then runs every planned run and
/// prints (and writes) the report.
async fn measure_all(
    flags: &Flags,
    postgres: &mut BenchDb,
    citus: &mut BenchDb,
    scenarios: &[Scenario],
    citus_url: &str,
) -> Result<(), BoxError> {
    let began = Instant::now();
    let contents = Contents::Preloaded {
        history: flags.citus_rows,
        settled: flags.duplicates,
    };
    for (target, db) in [
        (Target::Postgres, &mut *postgres),
        (Target::Citus, &mut *citus),
    ] {
        eprintln!("{}: laying down the rows ...", target.label());
        db.prepare(contents).await?;
    }
    let environment =
        environment::describe_citus(postgres.admin(), citus.admin(), citus_url, flags).await?;
    eprint!("{environment}");
    let on_target = async |&TargetRun { target, run }: &TargetRun| {
        let db = match target {
            Target::Postgres => &mut *postgres,
            Target::Citus => &mut *citus,
        };
        let row = crate::measure(flags, db, run, contents).await?;
        Ok(Cell { target, row })
    };
    runner::measure_each(
        flags,
        splice::CITUS,
        &plan(scenarios, flags),
        on_target,
        |rounds| citus_report::render(Setting::new(&environment, began), rounds, scenarios, flags),
    )
    .await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Target, plan};
    use crate::flags::Flags;
    use crate::scenarios;

    #[test]
    fn every_run_is_measured_on_both_servers_back_to_back_the_first_alternating() {
        let flags = Flags::parse_from([
            "loadgen",
            "--citus-url",
            "postgres://coordinator",
            "--concurrency",
            "1,16",
        ]);
        let scenarios = scenarios::selected(&flags).expect("the Citus scenarios");
        let runs = plan(&scenarios, &flags);
        assert_eq!(runs.len(), 2 * 2 * scenarios.len());
        for (place, pair) in runs.chunks(2).enumerate() {
            assert_eq!(pair[0].run.place, pair[1].run.place);
            let first = if place % 2 == 0 {
                Target::Postgres
            } else {
                Target::Citus
            };
            assert_eq!(pair[0].target, first);
            assert_ne!(pair[0].target, pair[1].target);
        }
    }
}
