//! River side by side (`--river`): River's Rust client (`riverqueue`, its
//! unique jobs) against idem on the same PostgreSQL, the same pools and the
//! same driver, in one run, so that every comparison is a ratio within it.
//!
//! Four groups ([`scenarios`]): a new unique insert against idem's claim, a
//! duplicate unique insert against idem's refusal, "run this once per key"
//! end to end (a unique job inserted and worked to completion against the
//! gate with the same body), and River's `insert_many` against idem's
//! batch API (`gate.guard_batch`: one claim statement and one settle for the
//! whole batch), against idem per call, and against the batch guard's claim
//! statement alone, sent by hand. River's tables are created by River's own
//! migrations in the benchmark's schema, next to idem's, and dropped with
//! it. The report ([`report`]) has its own markers in BENCHMARKS.md.

mod report;
mod scenarios;
mod side;

use std::sync::Arc;
use std::time::Instant;

use idem::sqlx::{self, PgPool};
use idem::{Gate, Identity};
use riverqueue::Client;

use crate::accounts::{Accounts, Gates};
use crate::bench_db::{BenchDb, Contents, TableLayout};
use crate::body::Body;
use crate::cpu::CpuClock;
use crate::drive::{self, Operation};
use crate::duplicates::Settled;
use crate::flags::Flags;
use crate::report::Setting;
use crate::{BoxError, environment, gated, keys, runner, splice};

use report::Row;
use scenarios::{Group, Run, Scenario, Side, Work};
use side::{Duplicates, Worker};

/// The River client this benchmark depends on (idem-bench's Cargo.toml):
/// the report names it.
pub const RIVER_VERSION: &str = "0.5.0";

/// Connections a started River client takes from its pool besides its
/// callers' (its producer's fetches, its completer's batches, leadership):
/// the end-to-end pair gives River this many more than the gate.
const WORKER_EXTRA_CONNECTIONS: u32 = 2;

/// Sets the schema up (idem's tables by idem, River's by River's
/// migrations), measures, reports, drops the schema.
pub async fn run(flags: &Flags) -> Result<(), BoxError> {
    let scenarios = scenarios::selected(flags)?;
    if let Some(path) = &flags.into {
        splice::check(path, splice::RIVER)?;
    }
    if flags.list {
        print!("{}", report::legend(&scenarios, flags));
        return Ok(());
    }
    let mut db = runner::create_db(
        flags,
        &flags.database_url(),
        TableLayout::Plain,
        Arc::new(Accounts::default_only()),
    )
    .await?;
    let outcome = match side::migrate(db.admin(), &flags.schema).await {
        Ok(_) => measure_all(flags, &mut db, &scenarios).await,
        Err(error) => Err(format!("River's migrations: {error}").into()),
    };
    runner::drop_dbs(flags, vec![db], outcome).await
}

/// What River's tables hold now.
#[derive(Default)]
struct RiverJobs {
    duplicates: Option<Arc<Duplicates>>,
}

/// Runs every planned run, then prints (and writes) the report.
async fn measure_all(
    flags: &Flags,
    db: &mut BenchDb,
    scenarios: &[Scenario],
) -> Result<(), BoxError> {
    let mut environment = environment::describe(db.admin(), flags).await?;
    let river_schema = side::schema_version(db.admin(), &flags.schema).await?;
    environment.push_str(&format!(
        "- River: `riverqueue` {RIVER_VERSION} (crates.io), its tables from its own migrations \
         (version {river_schema}) in the same schema as idem's\n"
    ));
    eprint!("{environment}");
    let runs = scenarios::plan(scenarios, flags);
    // Kept from one run to the next: laying the duplicates down is slow.
    let mut river = RiverJobs::default();
    let began = Instant::now();
    runner::measure_each(
        flags,
        splice::RIVER,
        &runs,
        async |&run: &Run| measure(flags, db, &mut river, run).await,
        |rounds| report::render(Setting::new(&environment, began), rounds, scenarios, flags),
    )
    .await
}

/// Brings both sides' tables to what `group` runs on, then checkpoints
/// (through [`BenchDb::prepare`]): empty for new keys, settled identities
/// and existing jobs (kept from one run to the next) for duplicates.
async fn prepare(
    flags: &Flags,
    db: &mut BenchDb,
    river: &mut RiverJobs,
    group: Group,
) -> Result<(), BoxError> {
    if group == Group::Duplicate {
        if river.duplicates.is_none() {
            side::empty(db.admin()).await?;
            eprintln!(
                "laying down {} River jobs for the duplicates ...",
                flags.river_duplicates
            );
            let client = side::inserter(db.admin().clone(), &flags.schema)?;
            let duplicates = Duplicates::lay_down(&client, flags.river_duplicates).await?;
            river.duplicates = Some(Arc::new(duplicates));
        }
        return db.prepare(Contents::Settled(flags.river_duplicates)).await;
    }
    side::empty(db.admin()).await?;
    river.duplicates = None;
    db.prepare(Contents::Empty).await
}

/// One run: the tables prepared, a fresh pool (and River client), the
/// warm-up, the measured window.
async fn measure(
    flags: &Flags,
    db: &mut BenchDb,
    river: &mut RiverJobs,
    run: Run,
) -> Result<Row, BoxError> {
    let scenario = run.scenario;
    prepare(flags, db, river, scenario.group).await?;
    let pool_size = match scenario.work {
        Work::RiverWorked => run.pool + WORKER_EXTRA_CONNECTIONS,
        _ => run.pool,
    };
    let pool = db.pool(pool_size, flags.ping_on_acquire).await?;
    let gate = Gate::connect_without_setup(pool.clone()).await?;
    let accounts = db.accounts();
    let mut op = Op {
        work: scenario.work,
        batch: flags.river_batch,
        pool: pool.clone(),
        gates: accounts.gates(&gate),
        gate,
        settled: db.settled(),
        client: None,
        worker: None,
        duplicates: river.duplicates.clone(),
    };
    match scenario.work {
        Work::RiverInsert | Work::RiverInsertAgain | Work::RiverInsertMany => {
            op.client = Some(side::inserter(pool.clone(), &flags.schema)?);
        }
        Work::RiverWorked => op.worker = Some(Worker::start(pool.clone(), &flags.schema)?),
        _ => {}
    }
    let op = Arc::new(op);
    let clock = CpuClock::find(&pool).await;
    let measured = drive::drive(
        Arc::clone(&op),
        run.concurrency,
        flags.warmup,
        flags.measured,
        Some(clock),
    )
    .await;
    let stopped = match Arc::into_inner(op).and_then(|op| op.worker) {
        Some(worker) => worker.stop().await,
        None => Ok(()),
    };
    pool.close().await;
    let row = Row::new(run, pool_size, scenario.per_op(flags), &measured?);
    stopped?;
    Ok(row)
}

/// One operation of a River-side-by-side scenario.
struct Op {
    work: Work,
    batch: u64,
    pool: PgPool,
    gate: Gate,
    gates: Gates,
    settled: Option<Arc<Settled>>,
    client: Option<Client>,
    worker: Option<Worker>,
    duplicates: Option<Arc<Duplicates>>,
}

/// The statement `gate.guard_batch` sends to claim a batch, from the
/// runtime itself.
const CLAIM_BATCH: &str = idem::__internal::BATCH_CLAIM_SQL;

impl Op {
    async fn run(&self, n: u64) -> Result<(), BoxError> {
        match self.work {
            Work::RiverInsert => side::insert_new(self.client()?, n).await.map(drop),
            Work::RiverInsertAgain => {
                let duplicates = self
                    .duplicates
                    .as_deref()
                    .ok_or("the duplicate River scenario ran without its jobs")?;
                duplicates.insert_again(self.client()?, n).await
            }
            Work::RiverInsertMany => side::insert_many_new(self.client()?, n, self.batch).await,
            Work::RiverWorked => {
                let worker = self
                    .worker
                    .as_ref()
                    .ok_or("no River client works the jobs")?;
                worker.run_once(n).await
            }
            Work::IdemClaim => {
                let claim = self
                    .gate
                    .claim(&Identity::new(gated::ACTION).part(n))
                    .await?;
                // River's job stays `available` after its insert; the claim
                // stays pending alike. Forgetting it skips only the handle's
                // warning that its slot stays pending (a log line per
                // operation would be measured too).
                std::mem::forget(claim);
                Ok(())
            }
            Work::Gate => Ok(gated::guarded(self.gates.of(n), n, Body::NoOp).await?),
            Work::GateAsync => Ok(gated::guarded_async(self.gates.of(n), n, Body::NoOp).await?),
            Work::GateRefusal => {
                let settled = self
                    .settled
                    .as_deref()
                    .ok_or("the refusal ran without settled identities")?;
                settled.refuse_through_gate(&self.gates, n).await
            }
            // `n` picks the account; the keys are fresh ones of their own.
            Work::IdemRunBatch => {
                let keys = keys::next_many(self.batch);
                gated::batch(self.gates.of(n), keys, Body::NoOp).await
            }
            Work::BatchClaimSql => self.batch_claim().await,
        }
    }

    fn client(&self) -> Result<&Client, BoxError> {
        self.client
            .as_ref()
            .ok_or_else(|| "a River scenario ran without a River client".into())
    }

    /// `batch` fresh keys claimed with [`CLAIM_BATCH`], bound as
    /// `gate.guard_batch` binds it for them: the identities `run-batch`
    /// gives its keys, their addresses, no namespace, fingerprint or lease.
    async fn batch_claim(&self) -> Result<(), BoxError> {
        let identities: Vec<Identity> = keys::next_many(self.batch)
            .map(|key| Identity::new(gated::ACTION).part(key))
            .collect();
        let addresses: Vec<String> = identities.iter().map(Identity::address).collect();
        let canonical: Vec<&[u8]> = identities.iter().map(Identity::canonical).collect();
        let fingerprints: Vec<Option<&[u8]>> = vec![None; identities.len()];
        let won = sqlx::query(CLAIM_BATCH)
            .bind(self.gate.account_name())
            .bind(&addresses)
            .bind(None::<&str>)
            .bind(&canonical)
            .bind(&fingerprints)
            .bind(None::<i64>)
            .bind(None::<i64>)
            .bind(None::<i64>)
            .bind(None::<bool>)
            .fetch_all(&self.pool)
            .await?;
        if won.len() as u64 != self.batch {
            return Err(format!(
                "the batch claim won {} of {} fresh keys",
                won.len(),
                self.batch
            )
            .into());
        }
        Ok(())
    }
}

impl Operation for Op {
    fn run(&self, n: u64) -> impl Future<Output = Result<(), BoxError>> + Send {
        Op::run(self, n)
    }
}

/// Which side a scenario measures, as the report labels it.
fn side_label(side: Side) -> &'static str {
    match side {
        Side::River => "River",
        Side::Idem => "idem",
    }
}

#[cfg(test)]
mod tests {
    use super::RIVER_VERSION;

    #[test]
    fn the_reported_river_version_is_the_one_depended_on() {
        let manifest = include_str!("../../../../Cargo.toml");
        assert!(
            manifest.contains(&format!("riverqueue = \"{RIVER_VERSION}\"")),
            "update RIVER_VERSION to idem-bench's riverqueue dependency"
        );
    }
}
