//! Connection faults: the gate's backends are terminated while bodies run,
//! while a claim, a settle or a release is executing, and the whole server
//! is restarted mid-run (a throwaway cluster this test starts). The pool
//! recovers, no body runs twice, and every refusal says why.

mod common;
#[path = "../examples/support/server_binaries.rs"]
mod server_binaries;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::XorShift;
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, PgPool};
use idem::testing;
use idem::{Gate, Identity, Rejected};
use server_binaries::{is_root, server_binaries, server_command};

#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("the body failed, as the workload asked")]
    Failed,
}

/// What became of one body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Running,
    Succeeded,
    Failed,
}

/// Every body that ran, per identity, in the order they started, and any
/// body that started while an earlier one was running or had succeeded.
#[derive(Default)]
struct Ledger {
    bodies: Vec<Vec<End>>,
    duplicates: Vec<String>,
}

type SharedLedger = Arc<Mutex<Ledger>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A body that records itself, works a little and succeeds or fails.
async fn body(
    ledger: SharedLedger,
    n: usize,
    succeed: bool,
    work: Duration,
) -> Result<(), JobError> {
    let index = {
        let mut ledger = lock(&ledger);
        let earlier = ledger.bodies[n].clone();
        if earlier.iter().any(|end| *end != End::Failed) {
            let message = format!("identity {n} ran again after {earlier:?}");
            ledger.duplicates.push(message);
        }
        ledger.bodies[n].push(End::Running);
        ledger.bodies[n].len() - 1
    };
    tokio::time::sleep(work).await;
    let end = if succeed { End::Succeeded } else { End::Failed };
    lock(&ledger).bodies[n][index] = end;
    if succeed {
        Ok(())
    } else {
        Err(JobError::Failed)
    }
}

fn identity(n: usize) -> Identity {
    Identity::new("faults").part(n)
}

/// What the callers saw.
#[derive(Debug, Default)]
struct Tally {
    calls: usize,
    succeeded: usize,
    failed: usize,
    refused: BTreeMap<&'static str, usize>,
    /// Refusals whose message does not say that the body did not run and
    /// what to do.
    mute: Vec<String>,
    /// Calls that succeeded after `recovered_after` was set.
    succeeded_after: usize,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.calls += other.calls;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        for (reason, count) in other.refused {
            *self.refused.entry(reason).or_default() += count;
        }
        self.mute.extend(other.mute);
        self.succeeded_after += other.succeeded_after;
    }
}

/// Says what to do: the body did not run, and retry or nothing to do.
fn says_why(rejected: &Rejected) -> bool {
    let message = rejected.to_string();
    !message.trim().is_empty()
        && message.contains("did not run")
        && (message.contains("retry") || message.contains("nothing to do"))
}

/// One invoker: random identities until `stop`, or `calls` calls.
struct Invoker {
    gate: Gate,
    ledger: SharedLedger,
    seed: u64,
    calls: usize,
    stop: Arc<AtomicBool>,
    /// Set once the fault is over: successes after it prove recovery.
    recovered: Arc<AtomicBool>,
}

impl Invoker {
    async fn run(self) -> Tally {
        let mut rng = XorShift::new(self.seed);
        let identities = lock(&self.ledger).bodies.len() as u64;
        let mut tally = Tally::default();
        while tally.calls < self.calls && !self.stop.load(Ordering::SeqCst) {
            let n = rng.below(identities) as usize;
            let succeed = rng.below(100) < 60;
            let work = Duration::from_micros(rng.below(3_000));
            let recovered = self.recovered.load(Ordering::SeqCst);
            tally.calls += 1;
            let result = self
                .gate
                .run(&identity(n), body(self.ledger.clone(), n, succeed, work))
                .await;
            match result {
                Ok(()) => {
                    tally.succeeded += 1;
                    tally.succeeded_after += usize::from(recovered);
                }
                Err(JobError::Failed) => tally.failed += 1,
                Err(JobError::Rejected(rejected)) => {
                    *tally.refused.entry(rejected.reason()).or_default() += 1;
                    if !says_why(&rejected) {
                        tally.mute.push(rejected.to_string());
                    }
                    // A caller backs off when the store is down.
                    if matches!(rejected, Rejected::Unavailable { .. }) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
        tally
    }
}

/// Runs `tasks` invokers of `calls` calls each (or until `stop`).
async fn workload(
    gate: &Gate,
    ledger: &SharedLedger,
    seed: u64,
    tasks: usize,
    calls: usize,
    stop: &Arc<AtomicBool>,
    recovered: &Arc<AtomicBool>,
) -> Tally {
    let mut seeds = XorShift::new(seed);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            tokio::spawn(
                Invoker {
                    gate: gate.clone(),
                    ledger: ledger.clone(),
                    seed: seeds.next_u64(),
                    calls,
                    stop: stop.clone(),
                    recovered: recovered.clone(),
                }
                .run(),
            )
        })
        .collect();
    let mut tally = Tally::default();
    for handle in handles {
        tally.add(handle.await.expect("an invoker panicked"));
    }
    tally
}

/// Compares the ledger with the table, through `pool` (which must reach
/// the same database as the gate). Returns the rows by state.
async fn check(
    pool: &PgPool,
    account: &str,
    ledger: &Ledger,
    tally: &Tally,
) -> BTreeMap<String, usize> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT address, state FROM idem_records WHERE account = $1 AND kind = 'claim'",
    )
    .bind(account)
    .fetch_all(pool)
    .await
    .expect("read the workload's rows");
    let mut stored: BTreeMap<String, String> = rows.into_iter().collect();
    let mut states = BTreeMap::new();
    for state in stored.values() {
        *states.entry(state.clone()).or_default() += 1;
    }
    let mut mismatches = Vec::new();
    for (n, bodies) in ledger.bodies.iter().enumerate() {
        let succeeded = bodies.iter().filter(|end| **end == End::Succeeded).count();
        let row = stored.remove(&identity(n).address());
        // A success whose settle could not be recorded stays pending (fail
        // closed), and so does a failure whose release could not be; a
        // claim refused as unavailable may have committed before its
        // connection died, and stays pending too. What may never be: two
        // successes, a success row without a successful body, or no row
        // after a successful body.
        let consistent = match row.as_deref() {
            Some("success") => succeeded == 1,
            Some("pending") => succeeded <= 1,
            None => succeeded == 0,
            Some(_) => false,
        };
        if !consistent || bodies.contains(&End::Running) {
            mismatches.push(format!("identity {n}: bodies {bodies:?}, row {row:?}"));
        }
    }
    for (address, state) in &stored {
        mismatches.push(format!(
            "a row the workload does not own: {address} ({state})"
        ));
    }
    let not_a_claim_state: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE kind = 'claim' AND state NOT IN ('pending', 'success')",
    )
    .fetch_one(pool)
    .await
    .expect("count states");

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
        tally.mute.is_empty(),
        "refusals that do not say what to do: {:?}",
        tally.mute
    );
    let count = |end: End| {
        ledger
            .bodies
            .iter()
            .flatten()
            .filter(|e| **e == end)
            .count()
    };
    assert_eq!(
        tally.succeeded,
        count(End::Succeeded),
        "every successful body was returned"
    );
    assert_eq!(
        tally.failed,
        count(End::Failed),
        "every failed body was returned"
    );
    states
}

/// Waits until one of `name`'s backends waits on a lock, and terminates it.
async fn kill_when_blocked(admin: &PgPool, name: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(name)
        .fetch_one(admin)
        .await
        .expect("look for the blocked backend");
        if killed > 0 {
            return killed;
        }
        assert!(
            Instant::now() < deadline,
            "the gate's statement never blocked on the lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A gate whose connections are `name`d, and an admin pool to kill them.
async fn named_gate(connections: u32) -> (Gate, String, PgPool) {
    let name = testing::unique_name("faults");
    let gate = testing::gate_on(common::named_pool(&name, connections).await).await;
    (gate, name, testing::pool_with(2).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_during_the_settle_retries_and_the_success_lands() {
    let (gate, name, admin) = named_gate(4).await;
    let id = identity(1);
    let runs = AtomicUsize::new(0);
    let (won, won_rx) = tokio::sync::oneshot::channel();
    let (locked, locked_rx) = tokio::sync::oneshot::channel::<()>();
    let call = gate.run(&id, async {
        runs.fetch_add(1, Ordering::SeqCst);
        let _ = won.send(());
        let _ = locked_rx.await; // the row is locked: the settle will block
        Ok::<_, Rejected>("receipt")
    });
    let killer = async {
        won_rx.await.expect("the body ran");
        let mut blocker = admin.begin().await.expect("begin");
        sqlx::query("SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 FOR UPDATE")
            .bind(gate.account_name())
            .bind(id.address())
            .execute(&mut *blocker)
            .await
            .expect("lock the claim row");
        let _ = locked.send(());
        let killed = kill_when_blocked(&admin, &name).await;
        blocker.rollback().await.expect("rollback");
        killed
    };
    let (result, killed) = tokio::join!(call, killer);
    assert_eq!(
        killed, 1,
        "the settle's backend was terminated mid-statement"
    );
    assert_eq!(result.expect("the body's value"), "receipt");
    assert_eq!(
        common::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "the settle was retried on a fresh connection"
    );
    let again = gate.run(&id, async { Ok::<_, Rejected>("again") }).await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_during_the_release_retries_and_the_slot_frees() {
    let (gate, name, admin) = named_gate(4).await;
    let id = identity(2);
    let (won, won_rx) = tokio::sync::oneshot::channel();
    let (locked, locked_rx) = tokio::sync::oneshot::channel::<()>();
    let call = gate.run(&id, async {
        let _ = won.send(());
        let _ = locked_rx.await;
        Err::<(), _>(JobError::Failed)
    });
    let killer = async {
        won_rx.await.expect("the body ran");
        let mut blocker = admin.begin().await.expect("begin");
        sqlx::query("SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 FOR UPDATE")
            .bind(gate.account_name())
            .bind(id.address())
            .execute(&mut *blocker)
            .await
            .expect("lock the claim row");
        let _ = locked.send(());
        let killed = kill_when_blocked(&admin, &name).await;
        blocker.rollback().await.expect("rollback");
        killed
    };
    let (result, killed) = tokio::join!(call, killer);
    assert_eq!(
        killed, 1,
        "the release's backend was terminated mid-statement"
    );
    assert!(matches!(result, Err(JobError::Failed)), "{result:?}");
    assert_eq!(
        common::row_state(&gate, &id.address()).await,
        None,
        "released after a retry"
    );
    let retry = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(retry.is_ok(), "the failed action can be retried: {retry:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_during_the_claim_refuses_and_the_body_never_runs() {
    let (gate, name, admin) = named_gate(4).await;
    let id = identity(3);
    // An uncommitted row at the same address: the gate's insert waits on it.
    let mut blocker = admin.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity) \
         VALUES ($1, 'claim', $2, 'pending', $3)",
    )
    .bind(gate.account_name())
    .bind(id.address())
    .bind(id.canonical())
    .execute(&mut *blocker)
    .await
    .expect("hold the slot in an open transaction");
    let runs = AtomicUsize::new(0);
    let call = gate.run(&id, async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    });
    let (result, killed) = tokio::join!(call, kill_when_blocked(&admin, &name));
    assert_eq!(
        killed, 1,
        "the claim's backend was terminated mid-statement"
    );
    let Err(rejected @ Rejected::Unavailable { .. }) = &result else {
        panic!("a claim whose connection died is refused as unavailable, got {result:?}");
    };
    assert!(says_why(rejected), "{rejected}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "fail closed: the body did not run"
    );
    blocker.rollback().await.expect("rollback");
    gate.run(&id, async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    })
    .await
    .expect("the same gate claims once the store answers");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Terminates `name`'s backends every 10 to 60 ms until `stop`: often enough
/// to land in every phase of a call (claim, body, settle, release).
async fn killer(
    admin: PgPool,
    name: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    kills: Arc<AtomicI64>,
) {
    let mut rng = XorShift::new(seed);
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10 + rng.below(50))).await;
        kills.fetch_add(
            common::terminate_backends(&admin, &name).await,
            Ordering::SeqCst,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_killed_at_random_under_load_run_nothing_twice() {
    const TASKS: usize = 12;
    const CALLS: usize = 60;
    const IDENTITIES: usize = 150;
    let seed = XorShift::seed_from_env("IDEM_FAULTS_SEED");
    let (gate, name, admin) = named_gate(8).await;
    let ledger: SharedLedger = Arc::new(Mutex::new(Ledger {
        bodies: vec![Vec::new(); IDENTITIES],
        duplicates: Vec::new(),
    }));
    let kills = Arc::new(AtomicI64::new(0));
    let stop_killing = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let killing = tokio::spawn(killer(
        admin.clone(),
        name.clone(),
        seed,
        stop_killing.clone(),
        kills.clone(),
    ));
    // The workloads run their calls to the end: they have no stop signal.
    let no_stop = Arc::new(AtomicBool::new(false));
    let (during, recovered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(true)),
    );
    let tally = workload(&gate, &ledger, seed, TASKS, CALLS, &no_stop, &during).await;
    stop_killing.store(true, Ordering::SeqCst);
    killing.await.expect("the killer panicked");

    // The killing is over: the same gate serves again.
    let after = workload(&gate, &ledger, seed ^ 1, 4, 10, &no_stop, &recovered).await;
    let mut tally = tally;
    tally.add(after);
    let ledger = std::mem::take(&mut *lock(&ledger));
    let states = check(&admin, gate.account_name(), &ledger, &tally).await;
    println!(
        "faults: {} calls over {IDENTITIES} identities in {:.1} s (seed {seed}): {} backends \
         terminated; {} succeeded, {} failed, refused {:?}; rows {states:?}; duplicates found: {}",
        tally.calls,
        started.elapsed().as_secs_f64(),
        kills.load(Ordering::SeqCst),
        tally.succeeded,
        tally.failed,
        tally.refused,
        ledger.duplicates.len(),
    );
    assert!(
        kills.load(Ordering::SeqCst) > 0,
        "no backend was terminated"
    );
    // Whether any of the random calls after the kills succeeds depends on
    // how many identities the kills left unsettled: prove recovery on
    // identities of their own instead (another account, the same pool).
    let fresh = gate.account(format!("{}-after", gate.account_name()));
    for n in 0..8 {
        fresh
            .run(&identity(n), async { Ok::<_, JobError>(()) })
            .await
            .unwrap_or_else(|e| {
                panic!("the gate did not recover after the kills: {e} ({tally:?})")
            });
    }
}

/// A PostgreSQL cluster of this test's own, in a temporary directory, so
/// that it can be restarted; stopped and removed when dropped.
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// initdb refuses to run as root: then everything runs as `postgres`.
    as_postgres: bool,
    port: u16,
}

impl Cluster {
    /// Starts one, or panics saying what to install.
    fn start() -> Cluster {
        let bin = server_binaries().unwrap_or_else(|| {
            panic!(
                "the restart test needs PostgreSQL's server binaries (initdb, pg_ctl) on PATH or \
                 under /usr/lib/postgresql/*/bin: install them (Debian/Ubuntu: `apt-get install \
                 postgresql`; macOS: `brew install postgresql`)"
            )
        });
        let as_postgres = is_root();
        let dir = std::env::temp_dir().join(testing::unique_name("idem-restart"));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        let cluster = Cluster {
            dir,
            bin,
            as_postgres,
            port,
        };
        if as_postgres {
            run(Command::new("chown").arg("postgres").arg(&cluster.dir));
        }
        run(cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.data())
            .args(["-U", "postgres", "--auth=trust", "--no-sync"]));
        cluster.pg_ctl("start");
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// `pg_ctl start` or `restart`, fast, waiting until it answers.
    fn pg_ctl(&self, action: &str) {
        // pg_ctl hands `-o` to a shell: quote the socket directory. A
        // throwaway cluster needs no durability: fsync off.
        let options = format!(
            "-p {} -k '{}' -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40",
            self.port,
            self.dir.display()
        );
        let mut command = self.command("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-o", &options, "-m", "fast", "-w", "-t", "30", action]);
        run(&mut command);
    }

    fn command(&self, program: &str) -> Command {
        server_command(&self.bin, program, self.as_postgres, &self.dir)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `command`; its stdout, or a panic with its output.
fn run(command: &mut Command) -> String {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("could not run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_is_survived_without_duplicates() {
    const TASKS: usize = 8;
    const IDENTITIES: usize = 400;
    let seed = XorShift::seed_from_env("IDEM_FAULTS_SEED");
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .expect("start a throwaway cluster");
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(cluster.options())
        .await
        .expect("connect to the throwaway cluster");
    let gate = Gate::connect(pool)
        .await
        .expect("set idem up on the throwaway cluster");
    let ledger: SharedLedger = Arc::new(Mutex::new(Ledger {
        bodies: vec![Vec::new(); IDENTITIES],
        duplicates: Vec::new(),
    }));
    let (stop, recovered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let started = Instant::now();
    let calls = tokio::spawn({
        let (gate, ledger, stop, recovered) = (
            gate.clone(),
            ledger.clone(),
            stop.clone(),
            recovered.clone(),
        );
        async move { workload(&gate, &ledger, seed, TASKS, usize::MAX, &stop, &recovered).await }
    });

    tokio::time::sleep(Duration::from_millis(500)).await;
    let cluster = Arc::new(cluster);
    let restart_started = Instant::now();
    tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || cluster.pg_ctl("restart")
    })
    .await
    .expect("pg_ctl restart");
    let restart = restart_started.elapsed();
    recovered.store(true, Ordering::SeqCst);
    // Long enough for the pool to reconnect and serve a good many calls.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::SeqCst);
    let tally = calls.await.expect("the workload panicked");

    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(cluster.options())
        .await
        .expect("connect after the restart");
    let ledger = std::mem::take(&mut *lock(&ledger));
    let states = check(&admin, gate.account_name(), &ledger, &tally).await;
    println!(
        "restart: {} calls over {IDENTITIES} identities in {:.1} s (seed {seed}); the server \
         restarted in {:.2} s; {} succeeded ({} after the restart), {} failed, refused {:?}; \
         rows {states:?}; duplicates found: {}",
        tally.calls,
        started.elapsed().as_secs_f64(),
        restart.as_secs_f64(),
        tally.succeeded,
        tally.succeeded_after,
        tally.failed,
        tally.refused,
        ledger.duplicates.len(),
    );
    assert!(
        tally.succeeded_after > 0,
        "the gate did not recover after the restart: {tally:?}"
    );
    assert!(
        tally.succeeded > tally.succeeded_after,
        "no call succeeded before the restart: it did not happen mid-run: {tally:?}"
    );
    let fresh = gate
        .run(&Identity::new("after_restart").part(1), async {
            Ok::<_, Rejected>(())
        })
        .await;
    assert!(
        fresh.is_ok(),
        "the same gate claims and settles after the restart: {fresh:?}"
    );
    admin.close().await;
    gate.pool().close().await;
}
