//! River's side: the real `riverqueue` client, used as its docs show a
//! Rust user would use it for "at most one job per key": a job kind unique
//! by its arguments, inserted through a [`Client`], and for the end-to-end
//! pair worked to completion by a started client.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use riverqueue::database::{PostgresDatabase, SchemaName};
use riverqueue::migrate::PostgresMigrator;
use riverqueue::sqlx::{self, AssertSqlSafe, PgPool};
use riverqueue::{
    Client, EventKind, EventRecvError, FETCH_COOLDOWN_MIN, InsertOpts, Job, JobArgs, QueueConfig,
    RunHandle, SubscribeConfig, WorkContext, WorkOutcome, Workers,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::BoxError;

/// The job every River scenario inserts: one key, unique by its arguments
/// (River's default unique states: a duplicate is skipped while the first
/// job is available, running, retryable, scheduled, pending or completed).
#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
#[river(kind = "loadgen_once", unique(by_args))]
pub struct Once {
    pub key: u64,
}

/// River's queue for the worked jobs.
const QUEUE: &str = "default";

/// Jobs a started client works at once: never the limit, whatever the
/// concurrency.
const MAX_WORKERS: usize = 256;

/// How long an inserted job may take to be reported completed before the
/// run is called broken.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys of the jobs the duplicate scenario re-inserts start here, far above
/// anything [`crate::keys::next`] hands out (and apart from idem's settled
/// identities, which live in another table anyway).
const DUPLICATE_KEYS: u64 = 1 << 61;

/// Jobs per `insert_many` while laying the duplicates down.
const LAY_DOWN_CHUNK: usize = 1000;

/// Creates River's tables in `schema` (already created: the benchmark's
/// own), or brings them up to date: `migrate_up` is idempotent.
pub async fn migrate(admin: &PgPool, schema: &str) -> Result<Vec<i64>, BoxError> {
    Ok(PostgresMigrator::new(admin.clone())
        .with_schema(SchemaName::new(schema)?)
        .migrate_up()
        .await?)
}

/// The newest River migration version the tables are at.
pub async fn schema_version(admin: &PgPool, schema: &str) -> Result<i64, BoxError> {
    let versions = PostgresMigrator::new(admin.clone())
        .with_schema(SchemaName::new(schema)?)
        .existing_versions()
        .await?;
    versions
        .into_iter()
        .max()
        .ok_or_else(|| format!("River's migrations left no version in {schema}").into())
}

/// Empties River's job table (and what it keeps about clients and leaders,
/// so that each run's client starts like a fresh deployment's).
pub async fn empty(admin: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(AssertSqlSafe(
        "TRUNCATE river_job; DELETE FROM river_leader".to_owned(),
    ))
    .execute(admin)
    .await?;
    Ok(())
}

/// An insert-only client on `pool`, River's defaults throughout (the docs'
/// "an insert-only client needs no workers or queues").
pub fn inserter(pool: PgPool, schema: &str) -> Result<Client, BoxError> {
    Ok(
        Client::builder(PostgresDatabase::new(pool).with_schema(SchemaName::new(schema)?))
            .build()?,
    )
}

/// Inserts job `key` as new: an error unless River inserted it.
pub async fn insert_new(client: &Client, key: u64) -> Result<i64, BoxError> {
    let inserted = client.insert(Once { key }).await?;
    if inserted.unique_skipped_as_duplicate {
        return Err(format!("River skipped the fresh key {key} as a duplicate").into());
    }
    Ok(inserted.id())
}

/// `count` jobs `key * count ..`, in one `insert_many`: an error unless
/// every one was new.
pub async fn insert_many_new(client: &Client, key: u64, count: u64) -> Result<(), BoxError> {
    let first = key * count;
    let jobs = (first..first + count).map(|key| (Once { key }, InsertOpts::default()));
    let inserted = client.insert_many(jobs).await?;
    if inserted.len() as u64 != count || inserted.iter().any(|r| r.unique_skipped_as_duplicate) {
        return Err(format!("River's insert_many of {count} fresh keys skipped some").into());
    }
    Ok(())
}

/// The jobs the duplicate scenario re-inserts: `count` of them, laid down
/// once (never worked, so they stay `available`, one of the unique states).
pub struct Duplicates {
    count: u64,
}

impl Duplicates {
    /// Inserts the `count` jobs.
    pub async fn lay_down(client: &Client, count: u64) -> Result<Duplicates, BoxError> {
        let keys: Vec<u64> = (DUPLICATE_KEYS..DUPLICATE_KEYS + count).collect();
        for chunk in keys.chunks(LAY_DOWN_CHUNK) {
            let jobs = chunk
                .iter()
                .map(|&key| (Once { key }, InsertOpts::default()));
            client.insert_many(jobs).await?;
        }
        Ok(Duplicates { count })
    }

    /// Re-inserts one of them, round robin: an error unless River skipped
    /// it as a duplicate.
    pub async fn insert_again(&self, client: &Client, n: u64) -> Result<(), BoxError> {
        let key = DUPLICATE_KEYS + n % self.count;
        let inserted = client.insert(Once { key }).await?;
        if !inserted.unique_skipped_as_duplicate {
            return Err(format!("River inserted key {key} again instead of skipping it").into());
        }
        Ok(())
    }
}

/// What a waiting inserter finds about its job.
enum Completion {
    /// Its inserter waits on this.
    Awaited(oneshot::Sender<()>),
    /// Reported completed before its inserter started waiting.
    Arrived,
}

type Completions = Arc<Mutex<HashMap<i64, Completion>>>;

/// A started client that works [`Once`] jobs (a no-op body, as the gate's
/// in the same pair) and reports each completion, once its state
/// `completed` is committed, to the inserter waiting for it.
pub struct Worker {
    client: Client,
    run: RunHandle,
    completions: Completions,
    dispatcher: JoinHandle<Result<(), String>>,
}

impl Worker {
    /// Builds and starts the client on `pool`: River's defaults except the
    /// fetch cooldown, at River's minimum (1 ms) instead of 100 ms, so
    /// that a job inserted by a lone caller is fetched within a millisecond
    /// rather than at the next 100 ms tick.
    pub fn start(pool: PgPool, schema: &str) -> Result<Worker, BoxError> {
        let mut workers = Workers::new();
        workers.add_fn(work_once)?;
        let client =
            Client::builder(PostgresDatabase::new(pool).with_schema(SchemaName::new(schema)?))
                .workers(workers)
                .queue(QUEUE, QueueConfig::new(MAX_WORKERS))
                .fetch_cooldown(FETCH_COOLDOWN_MIN)
                .build()?;
        let capacity = NonZeroUsize::new(1 << 16).ok_or("a zero event buffer")?;
        let events = client.subscribe_config(
            SubscribeConfig::new([EventKind::JobCompleted])?.with_buffer_capacity(capacity),
        )?;
        let run = client.start()?;
        let completions = Completions::default();
        let dispatcher = tokio::spawn(dispatch(events, Arc::clone(&completions)));
        Ok(Worker {
            client,
            run,
            completions,
            dispatcher,
        })
    }

    /// Inserts job `key` and waits until River reports it completed.
    pub async fn run_once(&self, key: u64) -> Result<(), BoxError> {
        let id = insert_new(&self.client, key).await?;
        let done = {
            let mut completions = self
                .completions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match completions.remove(&id) {
                Some(Completion::Arrived) => return Ok(()),
                Some(Completion::Awaited(_)) => {
                    return Err(format!("job {id} was awaited twice").into());
                }
                None => {
                    let (sender, receiver) = oneshot::channel();
                    completions.insert(id, Completion::Awaited(sender));
                    receiver
                }
            }
        };
        match tokio::time::timeout(COMPLETION_TIMEOUT, done).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(format!("River's events stopped before job {id} completed").into()),
            Err(_) => Err(format!(
                "job {id} was not reported completed within {} s",
                COMPLETION_TIMEOUT.as_secs()
            )
            .into()),
        }
    }

    /// Stops the client (letting running jobs finish) and its dispatcher.
    pub async fn stop(mut self) -> Result<(), BoxError> {
        self.run.stop().await?;
        drop(self.client);
        if !self.dispatcher.is_finished() {
            self.dispatcher.abort();
            return Ok(());
        }
        match self.dispatcher.await {
            Ok(Err(lost)) => Err(lost.into()),
            _ => Ok(()),
        }
    }
}

/// River's worker for [`Once`]: the no-op body.
async fn work_once(
    _context: WorkContext,
    _job: Job<Once>,
) -> Result<WorkOutcome, std::convert::Infallible> {
    Ok(WorkOutcome::Complete)
}

/// Hands each completion to its inserter. A lagging receiver would lose
/// completions, and their inserters would time out: say why instead.
async fn dispatch(
    mut events: riverqueue::EventReceiver,
    completions: Completions,
) -> Result<(), String> {
    loop {
        match events.recv().await {
            Ok(event) => {
                let Some(job) = event.as_job() else { continue };
                let id = job.job.id;
                let mut completions = completions.lock().unwrap_or_else(PoisonError::into_inner);
                match completions.remove(&id) {
                    Some(Completion::Awaited(sender)) => {
                        // The inserter may have timed out and gone.
                        let _ = sender.send(());
                    }
                    _ => {
                        completions.insert(id, Completion::Arrived);
                    }
                }
            }
            Err(EventRecvError::Lagged(lost)) => {
                let lost = format!("the completion events lagged: {lost} lost");
                eprintln!("{lost}");
                return Err(lost);
            }
            Err(_) => return Ok(()),
        }
    }
}
