//! Attach without polling (issue 42, item 2): a duplicate that waits for a
//! claim this process holds awaits the holder's outcome as it lands, with
//! no statement and no polling; one whose holder is elsewhere (another
//! gate, another process) keeps polling the slot.
//!
//! Statements are counted by the fault proxy the gate's pool goes through.
//! Waiters are fired at the same instant behind a barrier, once the
//! holder's body runs (so every one of them finds the slot held).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::fault_proxy::Proxy;
use idem_test_support::{ChargeError, JobError};
use tokio::sync::{Barrier, Notify};

// The tower layer's wait, on the same attachment.
#[cfg(all(feature = "tower", feature = "axum"))]
mod http;

// A holder in another process wakes its waiters when they marked its claim.
mod across_processes;

// Waking across processes attacked at its edges (listeners cut, runtimes
// shut down, takeovers, batches of every outcome, accounts and namespaces).
mod across_processes_at_the_edges;

// Every promise of the docs attacked at its edges (leases run out under an
// attached waiter, takeovers, late successes, modes that differ, claims by
// hand, batches, detached runs, transactions, faults, the cache).
mod at_the_edges;

/// How many duplicates wait on one holder.
const WAITERS: usize = 6;

/// A gate in an account of its own whose pool goes through a fresh proxy,
/// with a connection per waiter and one for the holder.
async fn gate_behind_a_proxy() -> (Proxy, Gate) {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(WAITERS as u32 + 2).await).await;
    (proxy, gate)
}

/// Waits until `proxy` has executed `count` statements more than `from`
/// (every waiter's first look), failing the test past 10 s.
async fn executed(proxy: &Proxy, from: u64, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.executions() < from + count {
        assert!(
            Instant::now() < deadline,
            "the waiters never looked at the slot: {} of {count} statements",
            proxy.executions() - from
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until the waiters have looked at the slot: at least `count`
/// statements since `from`, then none for 150 ms. A look is one statement
/// on PostgreSQL, two on Citus (the routed insert, then the lookup), so
/// the count alone does not say the looks are over. Polling waiters are
/// never quiet: after 10 s it gives up, and the caller's count of the
/// statements sent while they wait fails.
async fn looked(proxy: &Proxy, from: u64, count: u64) {
    executed(proxy, from, count).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = proxy.executions();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let now = proxy.executions();
        if now == seen {
            return;
        }
        seen = now;
    }
}

/// A body that holds its claim until `go` is notified, saying on `entered`
/// that it runs.
async fn held_until<T>(entered: &Notify, go: &Notify, outcome: T) -> T {
    entered.notify_one();
    go.notified().await;
    outcome
}

/// `WAITERS` duplicates of `id` on `gate`, fired at once behind a barrier,
/// each waiting up to `wait` and replaying; a waiter that runs the body
/// counts in `ran` and returns its own value.
async fn waiters(
    gate: &Gate,
    id: &Identity,
    wait: Duration,
    ran: &AtomicUsize,
) -> Vec<Result<String, JobError>> {
    let barrier = Arc::new(Barrier::new(WAITERS));
    let calls = (0..WAITERS).map(|_| {
        let barrier = Arc::clone(&barrier);
        async move {
            barrier.wait().await;
            gate.guard(id)
                .replay()
                .wait(wait)
                .run(async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, JobError>("the waiter's".to_owned())
                })
                .await
        }
    });
    futures_util::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_process_get_the_holder_s_value_with_no_statement() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("attach_replay").part("ord_1");
    let (entered, go) = (Notify::new(), Notify::new());
    let ran = AtomicUsize::new(0);
    let holder = gate.guard(&id).replay().run(held_until(
        &entered,
        &go,
        Ok::<_, JobError>("the holder's".to_owned()),
    ));
    let waiting = async {
        entered.notified().await;
        let before = proxy.executions();
        let answered = async {
            // Every waiter looked once (its claim statement found the slot
            // held); from then on, polling would cost a statement each
            // 10 to 250 ms, attaching none.
            looked(&proxy, before, WAITERS as u64).await;
            let looked = proxy.executions();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let idle = proxy.executions() - looked;
            go.notify_one();
            (looked, idle)
        };
        let (results, (looked, idle)) =
            tokio::join!(waiters(&gate, &id, Duration::from_secs(20), &ran), answered);
        (results, looked, idle)
    };
    let (held, (results, looked, idle)) = tokio::join!(holder, waiting);
    assert_eq!(held.expect("the holder succeeds"), "the holder's");
    assert_eq!(
        idle, 0,
        "attached waiters send no statement while they wait"
    );
    // The holder's settle, and nothing else: no waiter looked again.
    assert_eq!(
        proxy.executions() - looked,
        1,
        "the settle is the only statement once the waiters attached: {results:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "no waiter ran the body");
    for result in results {
        assert_eq!(result.expect("replayed"), "the holder's");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_holder_lets_exactly_one_waiter_run() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("attach_release").part("ord_2");
    let (entered, go) = (Notify::new(), Notify::new());
    let ran = AtomicUsize::new(0);
    let holder = gate.guard(&id).replay().run(held_until(
        &entered,
        &go,
        Err::<String, _>(JobError::Failed),
    ));
    let waiting = async {
        entered.notified().await;
        let results = async { waiters(&gate, &id, Duration::from_secs(20), &ran).await };
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            go.notify_one();
        };
        tokio::join!(results, release).0
    };
    let (held, results) = tokio::join!(holder, waiting);
    assert!(matches!(held, Err(JobError::Failed)), "{held:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "exactly one waiter ran: {results:?}"
    );
    for result in results {
        assert_eq!(result.expect("run once, then replayed"), "the waiter's");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_in_doubt_refuses_its_waiters_in_doubt_and_a_kept_failure_already_failed() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    for (disposed, expected) in [
        (ChargeError::Timeout, "in_doubt"),
        (ChargeError::Declined, "already_failed"),
    ] {
        let id = Identity::new("attach_failures").part(expected);
        let (entered, go) = (Notify::new(), Notify::new());
        let holder = gate
            .guard(&id)
            .disposition(ChargeError::disposition)
            .run(held_until(&entered, &go, Err::<(), _>(disposed)));
        let waiting = async {
            entered.notified().await;
            let before = proxy.executions();
            let barrier = Arc::new(Barrier::new(WAITERS));
            let calls = (0..WAITERS).map(|_| {
                let barrier = Arc::clone(&barrier);
                let gate = &gate;
                let id = &id;
                async move {
                    barrier.wait().await;
                    gate.guard(id)
                        .disposition(ChargeError::disposition)
                        .wait(Duration::from_secs(20))
                        .run(async { Ok::<_, ChargeError>(()) })
                        .await
                }
            });
            let answered = async {
                looked(&proxy, before, WAITERS as u64).await;
                let looked = proxy.executions();
                go.notify_one();
                looked
            };
            tokio::join!(futures_util::future::join_all(calls), answered)
        };
        let (held, (results, looked)) = tokio::join!(holder, waiting);
        assert!(held.is_err(), "{held:?}");
        assert_eq!(
            proxy.executions() - looked,
            1,
            "the holder's one statement answers every waiter: {results:?}"
        );
        for result in results {
            let reason = match &result {
                Err(ChargeError::Rejected(rejected)) => rejected.reason(),
                other => panic!("a waiter of a {expected} holder got {other:?}"),
            };
            assert_eq!(reason, expected, "{result:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_is_refused_in_flight() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("attach_expiry").part("ord_3");
    let (entered, go) = (Notify::new(), Notify::new());
    let holder = gate
        .guard(&id)
        .run(held_until(&entered, &go, Ok::<_, JobError>(())));
    let waiting = async {
        entered.notified().await;
        let started = Instant::now();
        let waited: Result<(), JobError> = gate
            .guard(&id)
            .wait(Duration::from_millis(300))
            .run(async { Ok(()) })
            .await;
        let took = started.elapsed();
        go.notify_one();
        (waited, took)
    };
    let (held, (waited, took)) = tokio::join!(holder, waiting);
    held.expect("the holder succeeds");
    assert!(
        matches!(waited, Err(JobError::Rejected(Rejected::InFlight))),
        "{waited:?}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "refused once its wait ran out, not before nor long after: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_dropped_mid_body_leaves_no_waiter_hanging() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("attach_dropped").part("ord_4");
    let entered = Arc::new(Notify::new());
    let holding = {
        let (gate, id, entered) = (gate.clone(), id.clone(), Arc::clone(&entered));
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(Duration::from_millis(500))
                .run(async {
                    entered.notify_one();
                    std::future::pending::<Result<(), JobError>>().await
                })
                .await
        })
    };
    entered.notified().await;
    let waiter = {
        let (gate, id) = (gate.clone(), id.clone());
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .run(async { Ok::<_, JobError>("taken over") })
                .await
        })
    };
    // The waiter attaches; the holder's future is then dropped: its claim
    // stays pending until its lease runs out, and the waiter, told nothing
    // landed, looks for itself, polls, and takes the claim over.
    tokio::time::sleep(Duration::from_millis(100)).await;
    holding.abort();
    let _ = holding.await;
    let waited = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter is not left hanging")
        .expect("the waiter's task");
    assert_eq!(
        waited.expect("taken over once the lease ran out"),
        "taken over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_gate_still_gets_the_outcome_by_polling() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let elsewhere = testing::gate_on(testing::pool_with(2).await)
        .await
        .account(gate.account_name());
    let id = Identity::new("attach_elsewhere").part("ord_5");
    let (entered, go) = (Notify::new(), Notify::new());
    let holder = gate
        .guard(&id)
        .replay()
        .run(held_until(&entered, &go, Ok::<_, JobError>(7_i64)));
    let waiting = async {
        entered.notified().await;
        let waited = elsewhere
            .guard(&id)
            .replay()
            .wait(Duration::from_secs(20))
            .run(async { Ok::<_, JobError>(-1_i64) });
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            go.notify_one();
        };
        tokio::join!(waited, release).0
    };
    let (held, waited) = tokio::join!(holder, waiting);
    assert_eq!(held.expect("the holder succeeds"), 7);
    assert_eq!(waited.expect("replayed"), 7);
}
