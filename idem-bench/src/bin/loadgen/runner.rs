//! What the matrix, the Citus comparison and River side by side do alike
//! around their runs: the benchmark schema made at the start and dropped at
//! the end, every planned run measured in turn, and the report published,
//! also when a run failed part way (the rows measured so far are still
//! worth reading).

use std::sync::Arc;

use crate::BoxError;
use crate::accounts::Accounts;
use crate::bench_db::{BenchDb, TableLayout};
use crate::flags::Flags;
use crate::paired::Rounds;
use crate::splice::{self, Markers};

/// The benchmark's schema (`--schema`) made afresh on the server at `url`,
/// its tables laid out as `layout` says, its rows `accounts`'.
pub async fn create_db(
    flags: &Flags,
    url: &str,
    layout: TableLayout,
    accounts: Arc<Accounts>,
) -> Result<BenchDb, BoxError> {
    BenchDb::create(url, &flags.schema, layout, flags.checkpoint, accounts).await
}

/// Drops the schema on every server of `dbs` (unless `--keep-schema`),
/// then hands the run's `outcome` back.
pub async fn drop_dbs(
    flags: &Flags,
    dbs: Vec<BenchDb>,
    outcome: Result<(), BoxError>,
) -> Result<(), BoxError> {
    if flags.keep_schema {
        // Only the Citus comparison has two servers.
        let servers = if dbs.len() > 1 {
            " on both servers"
        } else {
            ""
        };
        eprintln!("kept schema {} and its rows{servers}", flags.schema);
    } else {
        for db in dbs {
            db.drop_schema().await?;
        }
    }
    outcome
}

/// A planned run, as a failure names it.
pub trait Planned {
    /// `noop/gate at concurrency 16`.
    fn name(&self) -> String;
}

/// A measured run, as the progress log shows it.
pub trait Measured {
    /// One line: the run and its figures.
    fn progress(&self) -> String;
    /// What a results table's median run of several is chosen by:
    /// messages (or keys, or jobs) per second.
    fn throughput(&self) -> f64;
}

/// Measures `runs` in order with `measure`, `--rounds` times over (the
/// whole plan once per round), each one's progress to stderr, and stops at
/// the first failure; then renders every round's runs (a report divides
/// each ratio within a round, [`paired`](crate::paired)), and publishes it
/// between `markers`. The failure, with its run's name, is the error.
pub async fn measure_each<R: Planned, T: Measured + Clone>(
    flags: &Flags,
    markers: Markers,
    runs: &[R],
    mut measure: impl AsyncFnMut(&R) -> Result<T, BoxError>,
    render: impl FnOnce(&Rounds<T>) -> String,
) -> Result<(), BoxError> {
    let rounds = usize::try_from(flags.rounds).unwrap_or(1).max(1);
    let mut measured = Rounds::new(runs.iter().map(Planned::name).collect());
    let mut failure = None;
    let total = runs.len() * rounds;
    'rounds: for round in 0..rounds {
        for (index, run) in runs.iter().enumerate() {
            match measure(run).await {
                Ok(result) => {
                    let done = round * runs.len() + index + 1;
                    eprintln!("[{done}/{total}] {}", result.progress());
                    measured.push(result);
                }
                Err(error) => {
                    failure = Some(format!("{}: {error}", run.name()));
                    break 'rounds;
                }
            }
        }
    }
    publish(flags, &render(&measured), markers)?;
    match failure {
        Some(failure) => Err(failure.into()),
        None => Ok(()),
    }
}

/// Prints the report, and writes it to `--out` and between `markers` of
/// `--into`.
fn publish(flags: &Flags, report: &str, markers: Markers) -> Result<(), BoxError> {
    println!("{report}");
    if let Some(path) = &flags.out {
        std::fs::write(path, report)?;
    }
    if let Some(path) = &flags.into {
        splice::write(path, markers, report)?;
    }
    Ok(())
}
