//! Load generator: what the gate costs per call, against the floor it cannot
//! go below and the alternatives users would write instead, in one run
//! against one PostgreSQL, so the figures that matter are ratios.
//!
//! ```text
//! cargo run -p idem-bench --release --bin loadgen                  # the full run of BENCHMARKS.md
//! cargo run -p idem-bench --release --bin loadgen -- --seconds 1 --concurrency 1,4 --prefill 0
//! cargo run -p idem-bench --release --bin loadgen -- --list        # the scenarios, and their SQL costs
//! cargo run -p idem-bench --release --bin loadgen -- --citus-url postgres://postgres@127.0.0.1:9800/postgres \
//!     --seconds 6 --concurrency 1,16 --into BENCHMARKS.md          # the Citus comparison
//! cargo run -p idem-bench --release --bin loadgen -- --river --seconds 4 --concurrency 1,16 \
//!     --into BENCHMARKS.md                                         # River side by side
//! ```
//!
//! Uses `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/postgres`.
//! Everything it creates lives in a schema of its own (`--schema`,
//! `idem_bench` by default), dropped and created afresh at start and dropped
//! at the end, so the millions of history rows never touch anyone's tables.
//! Every run uses the same kind of sqlx pool, prepared statements (sqlx
//! caches them per connection), a fresh identity per operation and the same
//! warm-up. Progress goes to stderr; the report (markdown) to stdout, to
//! `--out FILE` as well, and with `--into BENCHMARKS.md` between that file's
//! report markers. With `--citus-url`, the same program runs the Citus
//! comparison instead ([`citus`]), which has markers of its own; with
//! `--river`, River side by side ([`river`]), which has its own too.

mod accounts;
mod advisory;
mod bench_db;
mod body;
mod brandur;
mod cached;
mod citus;
mod citus_report;
mod cpu;
mod drive;
mod duplicates;
mod environment;
mod flags;
mod floor;
mod fused;
mod gated;
mod http;
mod keys;
mod paired;
mod recovery_points;
mod report;
mod river;
mod runner;
mod scenarios;
mod stepped;
mod steps_in_row;
mod targets;
mod workload;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use idem::Gate;

use accounts::Accounts;
use bench_db::{BenchDb, Contents};
use cpu::CpuClock;
use flags::Flags;
use report::{Row, Setting};
use scenarios::{Run, Scenario};
use workload::Workload;

/// Any error, with its message: the load generator reports and stops.
use idem_bench::{BoxError, splice};

#[tokio::main]
async fn main() -> ExitCode {
    // Warnings and errors: the gate reports a failed settle through tracing
    // alone. sqlx's slow-statement warnings are left out: the pre-fill and
    // CHECKPOINT are slow by design.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,sqlx::query=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Flags::parse();
    match run(&flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: &Flags) -> Result<(), BoxError> {
    if flags.river {
        return river::run(flags).await;
    }
    let scenarios = scenarios::selected(flags)?;
    // A file without its markers fails now, not after the run.
    if let Some(path) = &flags.into {
        let markers = match flags.citus_url {
            Some(_) => splice::CITUS,
            None => splice::MATRIX,
        };
        splice::check(path, markers)?;
    }
    if flags.list {
        print!("{}", report::legend(&scenarios, flags));
        return Ok(());
    }
    if let Some(citus_url) = &flags.citus_url {
        return citus::run(flags, &scenarios, citus_url).await;
    }
    let mut db = runner::create_db(
        flags,
        &flags.database_url(),
        flags.table_layout(),
        Arc::new(Accounts::default_only()),
    )
    .await?;
    let outcome = measure_all(flags, &mut db, &scenarios).await;
    runner::drop_dbs(flags, vec![db], outcome).await
}

/// Runs every planned run, then prints (and writes) the report.
async fn measure_all(
    flags: &Flags,
    db: &mut BenchDb,
    scenarios: &[Scenario],
) -> Result<(), BoxError> {
    let environment = environment::describe(db.admin(), flags).await?;
    eprint!("{environment}");
    let runs = scenarios::plan(scenarios, flags, &targets::adjacent(flags));
    let began = Instant::now();
    runner::measure_each(
        flags,
        splice::MATRIX,
        &runs,
        async |&run: &Run| measure(flags, db, run, run.scenario.group.contents(flags)).await,
        |rounds| report::render(Setting::new(&environment, began), rounds, scenarios, flags),
    )
    .await
}

/// One run: the tables as `contents` says, a fresh pool, the warm-up, the
/// measured window.
async fn measure(
    flags: &Flags,
    db: &mut BenchDb,
    run: Run,
    contents: Contents,
) -> Result<Row, BoxError> {
    let group = run.scenario.group;
    db.prepare(contents).await?;
    let sizes = match group {
        scenarios::Group::History(_) => db.sizes().await?,
        _ => Vec::new(),
    };
    let pool = db.pool(run.pool, flags.ping_on_acquire).await?;
    let gate = Gate::connect_without_setup(pool.clone()).await?;
    let accounts = db.accounts();
    let work = run.scenario.spec.work;
    let workload = Arc::new(Workload {
        work,
        body: group.body(flags),
        pool: pool.clone(),
        gates: accounts.gates(&cached::gate_for(work, &gate, flags.duplicates)),
        batch_size: flags.batch_size,
        routers: http::Routers::new(&gate, group.body(flags)),
        accounts,
        settled: db.settled(),
    });
    cached::warm(&workload, flags.duplicates).await?;
    let clock = CpuClock::find(&pool).await;
    let measured = drive::drive(
        workload,
        run.concurrency,
        flags.warmup,
        flags.measured,
        Some(clock),
    )
    .await;
    pool.close().await;
    let mut row = Row::new(run, run.scenario.spec.messages(flags), &measured?);
    row.sizes = sizes;
    Ok(row)
}
