//! Connection faults: the gate's backends are terminated while bodies run,
//! while a claim, a settle or a release is executing, and the whole server
//! is restarted mid-run (a throwaway cluster this test starts). The pool
//! recovers, no body runs twice, and every refusal says why: the random
//! runs are recorded as histories and held to the gate's promises by the
//! shared checker (`idem-test-support/src/history/`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::{self, PgPool};
use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::connections::{named_pool, terminate_lock_waiters};
use idem_test_support::history::{
    self, FaultKind, Faults, Inject, Left, Plans, Run, Target, Workload,
};
use idem_test_support::{JobError, XorShift, rows};

const SEED_VARIABLE: &str = "IDEM_FAULTS_SEED";

fn identity(n: usize) -> Identity {
    Identity::new("faults").part(n)
}

/// Says what to do: the body did not run, and retry or nothing to do.
fn says_why(rejected: &Rejected) -> bool {
    let message = rejected.to_string();
    !message.trim().is_empty()
        && message.contains("did not run")
        && (message.contains("retry") || message.contains("nothing to do"))
}

/// Waits until one of `name`'s backends waits on a lock, and terminates it
/// (on Citus too, where the lock is waited on in a worker).
async fn kill_when_blocked(admin: &PgPool, name: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let killed = terminate_lock_waiters(admin, name).await;
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

/// Once the body has run (`body_ran`), locks the claim row from `admin` and
/// lets the body finish (`locked`), so the gate's next statement on the row
/// (the settle or the release) blocks; then terminates that statement's
/// backend and unlocks. Returns how many backends were terminated.
async fn kill_the_statement_after_the_body(
    gate: &Gate,
    id: &Identity,
    admin: &PgPool,
    name: &str,
    body_ran: tokio::sync::oneshot::Receiver<()>,
    locked: tokio::sync::oneshot::Sender<()>,
) -> i64 {
    body_ran.await.expect("the body ran");
    let mut blocker = admin.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 FOR UPDATE")
        .bind(gate.account_name())
        .bind(id.address())
        .execute(&mut *blocker)
        .await
        .expect("lock the claim row");
    let _ = locked.send(());
    let killed = kill_when_blocked(admin, name).await;
    blocker.rollback().await.expect("rollback");
    killed
}

/// A gate whose connections are `name`d, and an admin pool to kill them.
async fn named_gate(connections: u32) -> (Gate, String, PgPool) {
    let name = testing::unique_name("faults");
    let gate = testing::gate_on(named_pool(&name, connections).await).await;
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
    let killer = kill_the_statement_after_the_body(&gate, &id, &admin, &name, won_rx, locked);
    let (result, killed) = tokio::join!(call, killer);
    assert_eq!(
        killed, 1,
        "the settle's backend was terminated mid-statement"
    );
    assert_eq!(result.expect("the body's value"), "receipt");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
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
    let killer = kill_the_statement_after_the_body(&gate, &id, &admin, &name, won_rx, locked);
    let (result, killed) = tokio::join!(call, killer);
    assert_eq!(
        killed, 1,
        "the release's backend was terminated mid-statement"
    );
    assert!(matches!(result, Err(JobError::Failed)), "{result:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await,
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
    let retried = gate
        .run(&id, async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await;
    if on_citus(&admin).await {
        // On Citus the terminated backend is the coordinator's: the insert
        // it had routed to the worker waits there, then lands once the
        // blocker rolls back, with nobody to hear of it. A claim whose
        // outcome nobody knows holds the slot (as a lost reply does) until
        // it is released: refused, never run.
        assert!(
            retried.is_ok() || matches!(retried, Err(Rejected::InFlight)),
            "{retried:?}"
        );
        assert!(runs.load(Ordering::SeqCst) <= 1);
        return;
    }
    retried.expect("the same gate claims once the store answers");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Whether `pool`'s `idem_records` is distributed by Citus.
async fn on_citus(pool: &PgPool) -> bool {
    matches!(
        idem::schema::layout(pool).await.expect("read the layout"),
        Some(idem::schema::Layout::Distributed { .. })
    )
}

/// The plain gate through `Gate::run`, bodies that succeed (60 %) or fail.
fn plain_workload(tasks: usize, calls: usize, identities: usize) -> Workload {
    let seed = XorShift::seed_from_env(SEED_VARIABLE);
    Workload::plain(tasks, calls, identities, Plans::succeed_or_fail(40), seed)
}

/// Faults of one kind, after pauses of `pause` milliseconds, at most `limit`.
fn only(kind: Inject, pause: std::ops::Range<u64>, limit: usize) -> Faults {
    Faults {
        kinds: vec![(1, kind)],
        pause,
        limit,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_killed_at_random_under_load_run_nothing_twice() {
    let target = Target::direct(8).await;
    // Every 10 to 60 ms: often enough to land in every phase of a call
    // (claim, body, settle, release).
    let kills = only(Inject::Terminate, 10..60, usize::MAX);
    let run = history::run(&target, &plain_workload(12, 720, 150), Some(&kills)).await;
    history::assert_no_anomalies(&run, "backends killed at random", SEED_VARIABLE);
    assert!(!run.history.faults.is_empty(), "no backend was terminated");
    // The killing is over: the same gate serves again.
    history::assert_recovers(&target).await;
}

/// Bodies that succeeded before `fault` began, and after it was over.
fn successes_around(run: &Run, fault: FaultKind) -> (usize, usize) {
    let fault = run
        .history
        .faults
        .iter()
        .find(|f| f.kind == fault)
        .unwrap_or_else(|| panic!("no {fault:?} happened"));
    let succeeded = run
        .history
        .invocations
        .iter()
        .filter_map(|call| call.body.as_ref())
        .filter(|body| matches!(body.left, Left::Ok(_)));
    let (mut before, mut after) = (0, 0);
    for body in succeeded {
        before += usize::from(body.end < fault.start);
        after += usize::from(body.start > fault.end);
    }
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_is_survived_without_duplicates() {
    let target = Target::cluster(8).await;
    let mut workload = plain_workload(8, usize::MAX, 400);
    // Long enough after the restart for the pool to reconnect and serve a
    // good many calls.
    workload.until = Some(Duration::from_millis(2_500));
    let restart = only(Inject::Restart, 500..501, 1);
    let run = history::run(&target, &workload, Some(&restart)).await;
    history::assert_no_anomalies(&run, "server restarted mid-run", SEED_VARIABLE);
    let (before, after) = successes_around(&run, FaultKind::Restart);
    assert!(
        before > 0,
        "no call succeeded before the restart: it did not happen mid-run"
    );
    assert!(after > 0, "the gate did not recover after the restart");
    history::assert_recovers(&target).await;
}
