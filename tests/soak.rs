//! Soak: many tasks invoke a few hundred identities thousands of times, with
//! bodies that succeed, fail or are cancelled mid-body at random. Each body
//! writes what became of it in an in-memory ledger; afterwards the ledger
//! and `idem_records` must agree exactly:
//!
//! - no identity's body ran while another of its bodies was running, had
//!   succeeded, or had been cancelled (the duplicates: none);
//! - a `success` row exactly where one body succeeded;
//! - a `pending` row exactly where the last body was cancelled (its outcome
//!   is unknown, so the slot stays held) and none succeeded;
//! - no row where every body failed or none ran (failures are released);
//! - no claim in any state other than `pending` and `success`, anywhere.
//!
//! The default size (4,800 calls over 800 identities) takes about ten
//! seconds. `IDEM_SOAK_CALLS` sets the number of calls (identities follow,
//! one per six calls, unless `IDEM_SOAK_IDENTITIES` says otherwise);
//! `cargo test --test soak -- --ignored --nocapture` runs the long soak of
//! 200,000 calls. Every run prints its seed, and `IDEM_SOAK_SEED` replays
//! its choices (the interleaving is the scheduler's).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::XorShift;
use idem::sqlx;
use idem::{Gate, Identity, Rejected, idempotent};

/// Concurrent invokers; twice the pool, so claims also queue for connections.
const TASKS: usize = 32;
const POOL_CONNECTIONS: u32 = 16;
/// The CI size: 32 tasks × 150 calls, 6 per identity on average (so most
/// identities see failures and retries before a success or a cancellation).
const CALLS: usize = 4_800;
const CALLS_PER_IDENTITY: usize = 6;
/// The long soak's size, for the ignored test.
const LONG_CALLS: usize = 200_000;

#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("the body failed, as the workload asked")]
    Failed,
}

/// What one invocation's body is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Succeed,
    Fail,
    /// Signal that it runs, then never finish: the caller drops it.
    Cancel,
}

/// What became of one body, in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// Every body that ran, per identity, in the order they started. Bodies of
/// one identity never overlap when the gate holds, so this is also the
/// order in which they held its claim.
#[derive(Default)]
struct Ledger {
    bodies: Vec<Vec<End>>,
    /// Bodies that started while an earlier one of the same identity was
    /// running, had succeeded or had been cancelled.
    duplicates: Vec<String>,
}

type SharedLedger = Arc<Mutex<Ledger>>;

fn lock(ledger: &SharedLedger) -> std::sync::MutexGuard<'_, Ledger> {
    ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A body: it records its start, then does what its plan says.
struct Body {
    ledger: SharedLedger,
    identity: usize,
    plan: Plan,
    /// Told the body's ledger index once it runs (for a cancellation).
    started: Option<tokio::sync::oneshot::Sender<usize>>,
    /// How long the body works before it returns, in microseconds.
    work_micros: u64,
}

impl Body {
    async fn run(mut self) -> Result<(), JobError> {
        let index = {
            let mut ledger = lock(&self.ledger);
            let earlier = ledger.bodies[self.identity].clone();
            if let Some(end) = earlier.iter().find(|end| **end != End::Failed) {
                let message = format!(
                    "identity {} ran again after a body that {end:?}: {earlier:?}",
                    self.identity
                );
                ledger.duplicates.push(message);
            }
            ledger.bodies[self.identity].push(End::Running);
            ledger.bodies[self.identity].len() - 1
        };
        if let Some(started) = self.started.take() {
            let _ = started.send(index);
        }
        if self.plan == Plan::Cancel {
            return std::future::pending().await;
        }
        tokio::time::sleep(Duration::from_micros(self.work_micros)).await;
        // Written before the body returns, so before the gate settles or
        // releases: a later holder always sees it.
        let end = match self.plan {
            Plan::Succeed => End::Succeeded,
            _ => End::Failed,
        };
        lock(&self.ledger).bodies[self.identity][index] = end;
        match end {
            End::Succeeded => Ok(()),
            _ => Err(JobError::Failed),
        }
    }
}

/// The same identity as [`identity`], through the attribute.
#[idempotent(key = "identity", action = "soak")]
async fn act(gate: &Gate, identity: u32, body: Body) -> Result<(), JobError> {
    body.run().await
}

fn identity(n: usize) -> Identity {
    Identity::new("soak").part(n)
}

/// What the callers saw, summed over tasks.
#[derive(Debug, Default)]
struct Tally {
    calls: usize,
    succeeded: usize,
    failed: usize,
    cancelled: usize,
    refused: BTreeMap<&'static str, usize>,
    /// Identities refused `AlreadyDone`, to check against the ledger.
    already_done: Vec<usize>,
    /// Refusals whose message does not say what to do.
    mute_refusals: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.calls += other.calls;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        for (reason, count) in other.refused {
            *self.refused.entry(reason).or_default() += count;
        }
        self.already_done.extend(other.already_done);
        self.mute_refusals.extend(other.mute_refusals);
    }
}

/// One invoker: `calls` invocations of random identities and plans.
async fn invoker(
    gate: Gate,
    ledger: SharedLedger,
    seed: u64,
    calls: usize,
    identities: usize,
) -> Tally {
    let mut rng = XorShift::new(seed);
    let mut tally = Tally::default();
    for _ in 0..calls {
        let n = rng.below(identities as u64) as usize;
        let plan = match rng.below(100) {
            0..45 => Plan::Succeed,
            45..82 => Plan::Fail,
            _ => Plan::Cancel,
        };
        let (started, started_rx) = tokio::sync::oneshot::channel();
        let body = Body {
            ledger: ledger.clone(),
            identity: n,
            plan,
            started: Some(started),
            work_micros: rng.below(1_500),
        };
        let by_attribute = rng.below(2) == 0;
        let call = async {
            if by_attribute {
                act(&gate, n as u32, body).await
            } else {
                gate.run(&identity(n), body.run()).await
            }
        };
        tally.calls += 1;
        let result = if plan == Plan::Cancel {
            tokio::pin!(call);
            tokio::select! {
                result = &mut call => result,
                started = started_rx => match started {
                    Ok(index) => {
                        // The body runs and will never finish: drop it
                        // mid-body, at once or a moment later.
                        if rng.below(2) == 0 {
                            let pause = Duration::from_micros(rng.below(500));
                            let _ = tokio::time::timeout(pause, &mut call).await;
                        }
                        lock(&ledger).bodies[n][index] = End::Cancelled;
                        tally.cancelled += 1;
                        // `continue` drops the call, and the body with it.
                        continue;
                    }
                    // Refused: the body was dropped unstarted.
                    Err(_) => call.await,
                }
            }
        } else {
            call.await
        };
        match result {
            Ok(()) => tally.succeeded += 1,
            Err(JobError::Failed) => tally.failed += 1,
            Err(JobError::Rejected(rejected)) => {
                *tally.refused.entry(rejected.reason()).or_default() += 1;
                if matches!(rejected, Rejected::AlreadyDone) {
                    tally.already_done.push(n);
                }
                let message = rejected.to_string();
                if !(message.contains("did not run")
                    && (message.contains("retry") || message.contains("nothing to do")))
                {
                    tally.mute_refusals.push(message);
                }
            }
        }
    }
    tally
}

/// Runs the soak and checks ledger against table; returns the figures line.
async fn soak(calls: usize, identities: usize) -> String {
    let seed = XorShift::seed_from_env("IDEM_SOAK_SEED");
    println!("soak: seed {seed} (IDEM_SOAK_SEED={seed} replays its choices)");
    let gate = idem::testing::gate_on(idem::testing::pool_with(POOL_CONNECTIONS).await).await;
    let ledger: SharedLedger = Arc::new(Mutex::new(Ledger {
        bodies: vec![Vec::new(); identities],
        duplicates: Vec::new(),
    }));
    let started = Instant::now();
    let mut seeds = XorShift::new(seed);
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let share = calls / TASKS + usize::from(task < calls % TASKS);
            tokio::spawn(invoker(
                gate.clone(),
                ledger.clone(),
                seeds.next_u64(),
                share,
                identities,
            ))
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.add(task.await.expect("an invoker panicked"));
    }
    let elapsed = started.elapsed();

    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT address, state FROM idem_records WHERE account = $1 AND kind = 'claim'",
    )
    .bind(gate.account_name())
    .fetch_all(gate.pool())
    .await
    .expect("read the soak's rows");
    let mut stored: BTreeMap<String, String> = rows.into_iter().collect();
    // Every invoker is done: the ledger is final.
    let ledger = std::mem::take(&mut *lock(&ledger));
    let mut mismatches = Vec::new();
    for (n, bodies) in ledger.bodies.iter().enumerate() {
        let succeeded = bodies.iter().filter(|end| **end == End::Succeeded).count();
        let expected = match bodies.last() {
            _ if succeeded > 0 => Some("success"),
            Some(End::Cancelled) => Some("pending"),
            _ => None,
        };
        let row = stored.remove(&identity(n).address());
        if succeeded > 1 || row.as_deref() != expected {
            mismatches.push(format!("identity {n}: bodies {bodies:?}, row {row:?}"));
        }
        if bodies.contains(&End::Running) {
            mismatches.push(format!(
                "identity {n}: a body never recorded its end: {bodies:?}"
            ));
        }
    }
    for (address, state) in &stored {
        mismatches.push(format!(
            "a row no identity of the soak owns: {address} ({state})"
        ));
    }
    for &n in &tally.already_done {
        if !ledger.bodies[n].contains(&End::Succeeded) {
            mismatches.push(format!(
                "identity {n} refused AlreadyDone, but no body succeeded"
            ));
        }
    }
    let not_a_claim_state: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE kind = 'claim' AND state NOT IN ('pending', 'success')",
    )
    .fetch_one(gate.pool())
    .await
    .expect("count states");

    let count = |end: End| {
        ledger
            .bodies
            .iter()
            .flatten()
            .filter(|e| **e == end)
            .count()
    };
    let figures = format!(
        "soak: {} calls by {TASKS} tasks over {identities} identities in {:.1} s (seed {seed}): \
         {} bodies ran ({} succeeded, {} failed, {} cancelled mid-body); refused {:?}; \
         faults injected: {} cancellations; duplicates found: {}",
        tally.calls,
        elapsed.as_secs_f64(),
        ledger.bodies.iter().map(Vec::len).sum::<usize>(),
        count(End::Succeeded),
        count(End::Failed),
        count(End::Cancelled),
        tally.refused,
        tally.cancelled,
        ledger.duplicates.len(),
    );
    println!("{figures}");

    assert!(
        ledger.duplicates.is_empty(),
        "bodies ran twice:\n{}",
        ledger.duplicates.join("\n")
    );
    assert!(
        mismatches.is_empty(),
        "ledger and idem_records disagree:\n{}",
        mismatches.join("\n")
    );
    assert_eq!(
        not_a_claim_state, 0,
        "claims in a state other than pending or success"
    );
    assert!(
        tally.mute_refusals.is_empty(),
        "refusals that do not say what to do: {:?}",
        tally.mute_refusals
    );
    assert_eq!(
        tally.refused.get("unavailable"),
        None,
        "the store never went down here"
    );
    assert_eq!(
        tally.succeeded,
        count(End::Succeeded),
        "every success the ledger saw was returned"
    );
    assert_eq!(
        tally.failed,
        count(End::Failed),
        "every failure the ledger saw was returned"
    );
    assert_eq!(tally.cancelled, count(End::Cancelled));
    assert_eq!(
        tally.calls,
        tally.succeeded + tally.failed + tally.cancelled + tally.refused.values().sum::<usize>()
    );
    figures
}

fn from_env(variable: &str, default: usize) -> usize {
    std::env::var(variable).map_or(default, |text| {
        text.parse()
            .unwrap_or_else(|e| panic!("{variable}={text} is not a count: {e}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_random_outcomes_leaves_exactly_what_the_ledger_says() {
    let calls = from_env("IDEM_SOAK_CALLS", CALLS);
    let identities = from_env("IDEM_SOAK_IDENTITIES", (calls / CALLS_PER_IDENTITY).max(1));
    soak(calls, identities).await;
}

/// The long soak: `cargo test --test soak -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long soak (minutes): run it with -- --ignored"]
async fn a_long_soak_of_random_outcomes_leaves_exactly_what_the_ledger_says() {
    let calls = from_env("IDEM_SOAK_CALLS", LONG_CALLS);
    let identities = from_env("IDEM_SOAK_IDENTITIES", (calls / CALLS_PER_IDENTITY).max(1));
    soak(calls, identities).await;
}
