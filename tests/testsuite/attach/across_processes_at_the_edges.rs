//! Red team: a duplicate told to `wait` on a claim of another process (a
//! gate with a registry of its own) is woken by a notification its holder
//! sends only because the waiter marked the claim (schema version 13). Each
//! test names the promise it attacks (`src/idempotent.md`, "The holder is
//! elsewhere"; `Guard::wait`; `docs/design-decisions.md`, "`wait` attaches
//! in process, and is woken across processes"; `docs/operations.md`, "The
//! wake-up listener").
//!
//! Every "process" is a gate of its own (`Gate::connect` on a pool of its
//! own, behind a proxy of its own that counts its statements).

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::postgres::PgListener;
use idem::sqlx::{self, PgPool};
use idem::{Identity, testing};
use idem_test_support::fault_proxy::Statement;
use idem_test_support::{ChargeError, JobError};
use tokio::sync::{Barrier, Notify, watch};

use super::across_processes::{direct, gate_in, held_and_awaited_elsewhere, marked, within};
use super::held_until;

/// What a gate's wake-up listener adds to its pool's application name.
const WAKE_UP: &str = " (idem wake-up)";

/// How many wake-up listeners of the gate whose pool is named
/// `application` are connected.
async fn listeners(pool: &PgPool, application: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(format!("{application}{WAKE_UP}"))
        .fetch_one(pool)
        .await
        .expect("count the listeners")
}

/// The backends of the wake-up listeners of `application`.
async fn listener_pids(pool: &PgPool, application: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(format!("{application}{WAKE_UP}"))
        .fetch_all(pool)
        .await
        .expect("list the listeners")
}

/// Terminates the wake-up listeners of `application`: how many.
async fn terminate_listeners(pool: &PgPool, application: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1",
    )
    .bind(format!("{application}{WAKE_UP}"))
    .fetch_one(pool)
    .await
    .expect("terminate the listeners")
}

/// Terminates the listeners of `applications` every 40 ms until `cutting`
/// turns false: how many it terminated.
async fn cut_over_and_over(pool: &PgPool, applications: &[String], cutting: &AtomicBool) -> i64 {
    let mut cut = 0;
    while cutting.load(Ordering::SeqCst) {
        for application in applications {
            cut += terminate_listeners(pool, application).await;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    cut
}

/// Waits until the pending claim at `address` in `account` and `namespace`
/// is marked as waited on, failing the test past 10 s.
async fn marked_in(pool: &PgPool, account: &str, namespace: Option<&str>, address: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let awaited: Option<Option<bool>> = sqlx::query_scalar(
            "SELECT awaited FROM idem_records WHERE account = $1 AND kind = 'claim' \
             AND address = $2 AND namespace IS NOT DISTINCT FROM $3",
        )
        .bind(account)
        .bind(address)
        .bind(namespace)
        .fetch_optional(pool)
        .await
        .expect("read the claim");
        if awaited == Some(Some(true)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no waiter marked the claim of {account}/{namespace:?} within 10 s: {awaited:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A connection of the test's own listening where the holders notify.
async fn landed_listener() -> PgListener {
    let mut listener = PgListener::connect(&testing::database_url())
        .await
        .expect("the test's listener connects");
    listener
        .listen("idem_landed")
        .await
        .expect("the test's listener listens");
    listener
}

/// The notifications for `addresses` heard within `quiet`.
async fn heard(listener: &mut PgListener, addresses: &[String], quiet: Duration) -> Vec<String> {
    let deadline = Instant::now() + quiet;
    let mut heard = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return heard;
        }
        match tokio::time::timeout(left, listener.try_recv()).await {
            Ok(Ok(Some(notification))) => {
                if addresses.iter().any(|a| a == notification.payload()) {
                    heard.push(notification.payload().to_owned());
                }
            }
            Ok(Ok(None)) => panic!("the test's own listener lost its connection"),
            Ok(Err(error)) => panic!("the test's own listener failed: {error}"),
            Err(_) => return heard,
        }
    }
}

/// What a call of a guarded payment said.
fn said<T: Debug>(result: &Result<T, ChargeError>) -> String {
    match result {
        Ok(value) => format!("ok:{value:?}"),
        Err(ChargeError::Rejected(rejected)) => rejected.reason().to_owned(),
        Err(other) => format!("error:{other:?}"),
    }
}

/// Slot `n`'s holder outcome: 0 succeeds (100), 1 releases, 2 keeps its
/// failure, 3 is held in doubt.
fn outcome(n: usize) -> Result<i64, ChargeError> {
    match n {
        0 => Ok(100),
        1 => Err(ChargeError::Invalid),
        2 => Err(ChargeError::Declined),
        _ => Err(ChargeError::Timeout),
    }
}

/// What a waiter on slot `n` must be told (slot 1's waiters run once: the
/// runner's value, `-2`, replayed to the others).
fn expected(n: usize) -> &'static str {
    match n {
        0 => "ok:100",
        1 => "ok:-2",
        2 => "already_failed",
        _ => "in_doubt",
    }
}

// ---------------------------------------------------------------------
// Promise 3: an outcome nobody waits on sends nothing more.
// ---------------------------------------------------------------------

/// Promise (`docs/operations.md`): "A holder sends `pg_notify` only for a
/// claim somebody marked as waited on ... so a settle nobody waits on sends
/// nothing more"; the mark is "compared on the holder's fence", "once per
/// claim". A waiter marks a claim whose holder then dies; when the lease
/// runs out, the waiter takes the claim over (a new fence) and settles it.
/// Nobody waits on the new claim, so its settle must be its one statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_does_not_inherit_the_mark_of_the_claim_it_replaced() {
    let account = testing::unique_name("edge_over");
    let (_holder_proxy, holder_gate) = gate_in(&account, "edge_over_holder", 2).await;
    let (waiter_proxy, waiter_gate) = gate_in(&account, "edge_over_waiter", 2).await;
    let direct = direct().await;
    let id = Identity::new("edge_over").part("ord_1");
    let entered = Arc::new(Notify::new());
    let holding = {
        let (gate, id, entered) = (holder_gate.clone(), id.clone(), Arc::clone(&entered));
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(Duration::from_secs(2))
                .run(async {
                    entered.notify_one();
                    std::future::pending::<Result<(), JobError>>().await
                })
                .await
        })
    };
    entered.notified().await;
    // The holder's process dies: its claim stays pending until its lease
    // runs out.
    holding.abort();
    let _ = holding.await;
    let settling_from = AtomicU64::new(u64::MAX);
    let waited = waiter_gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .run(async {
            settling_from.store(waiter_proxy.executions(), Ordering::SeqCst);
            Ok::<_, JobError>("taken over")
        });
    let address = id.address();
    let (waited, ()) = tokio::join!(
        within("the waiter that takes the claim over", waited),
        marked(&direct, &account, &address)
    );
    assert_eq!(
        waited.expect("taken over once the lease ran out"),
        "taken over"
    );
    let statements = waiter_proxy.executions() - settling_from.load(Ordering::SeqCst);
    assert_eq!(
        statements, 1,
        "the taker's settle is the only statement once its body ran: nobody waits on its \
         claim, yet it sent {statements} (TAKE_OVER keeps `awaited` of the claim it replaced, \
         so the settle reads the old mark and sends a pg_notify nobody asked for)"
    );
}

/// Promise 3 for batches: a batch nobody waits on (every kind of outcome)
/// and single calls of every outcome send no notification at all, and the
/// batch records with one statement per kind of outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_nobody_waits_on_send_no_notification_alone_or_in_a_batch() {
    let account = testing::unique_name("edge_quiet");
    let (proxy, gate) = gate_in(&account, "edge_quiet", 2).await;
    let mut listener = landed_listener().await;
    let batch_ids: Vec<Identity> = (0..4)
        .map(|n| Identity::new("edge_quiet_batch").part(n))
        .collect();
    let single_ids: Vec<Identity> = (0..4)
        .map(|n| Identity::new("edge_quiet_single").part(n))
        .collect();
    let mut batch = idem::batch::Batch::new();
    for (n, id) in batch_ids.iter().enumerate() {
        batch.push(n, id.clone());
    }
    let from = proxy.executions();
    let results = gate
        .guard_batch(batch)
        .disposition(ChargeError::disposition)
        .run(|n| async move { outcome(n) })
        .await;
    let batch_statements = proxy.executions() - from;
    for (n, result) in results.iter().enumerate() {
        assert_eq!(said(result), said(&outcome(n)), "batch item {n}");
    }
    for (n, id) in single_ids.iter().enumerate() {
        let from = proxy.executions();
        let result = gate
            .guard(id)
            .disposition(ChargeError::disposition)
            .run(async move { outcome(n) })
            .await;
        assert_eq!(said(&result), said(&outcome(n)), "single call {n}");
        assert_eq!(
            proxy.executions() - from,
            2,
            "single call {n}: its claim and its outcome, no wake-up"
        );
    }
    let addresses: Vec<String> = batch_ids
        .iter()
        .chain(&single_ids)
        .map(Identity::address)
        .collect();
    let woken = heard(&mut listener, &addresses, Duration::from_millis(500)).await;
    assert!(woken.is_empty(), "nobody waited, yet notified: {woken:?}");
    assert_eq!(
        batch_statements, 5,
        "the batch's claim and one statement per kind of outcome, no wake-up"
    );
}

// ---------------------------------------------------------------------
// Promise 2: no waiter left hanging, no wait overrun.
// ---------------------------------------------------------------------

/// Promise (`Guard::wait`, `docs/design-decisions.md`): a lost wake-up
/// costs at most a second; the listener's lost connection wakes every
/// waiter. Waiters of four slots (a success, a release, a kept failure, a
/// hold in doubt), in two processes, while both processes' listeners are
/// terminated every 40 ms from before the outcomes land until every waiter
/// is answered: each gets what a lookup gives, exactly one runs the
/// released slot, and each is answered within a few seconds of the
/// outcomes (not at its 10 s wait's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_many_slots_in_two_processes_are_answered_while_their_listeners_are_cut_over_and_over()
 {
    const SLOTS: usize = 4;
    let account = testing::unique_name("edge_cut");
    let applications = [
        testing::unique_name("edge_cut_a"),
        testing::unique_name("edge_cut_b"),
    ];
    let (_holder_proxy, holder_gate) = gate_in(&account, "edge_cut_holder", 4).await;
    let (_a, first) = gate_in(&account, &applications[0], 4).await;
    let (_b, second) = gate_in(&account, &applications[1], 4).await;
    let direct = direct().await;
    let ids: Vec<Identity> = (0..SLOTS)
        .map(|n| Identity::new("edge_cut").part(n))
        .collect();
    let entered = Barrier::new(SLOTS + 1);
    let (go, gone) = watch::channel(false);
    let holders = futures_util::future::join_all(ids.iter().enumerate().map(|(n, id)| {
        let (entered, mut gone) = (&entered, gone.clone());
        holder_gate
            .guard(id)
            .replay()
            .disposition(ChargeError::disposition)
            .run(async move {
                entered.wait().await;
                let _ = gone.wait_for(|go| *go).await;
                outcome(n)
            })
    }));
    let ran: Vec<AtomicUsize> = (0..SLOTS).map(|_| AtomicUsize::new(0)).collect();
    let start = Arc::new(Barrier::new(4 * SLOTS));
    let waiters = ids
        .iter()
        .enumerate()
        .flat_map(|(n, id)| [&first, &first, &second, &second].map(move |gate| (n, id, gate)))
        .map(|(n, id, gate)| {
            let (start, ran) = (Arc::clone(&start), &ran);
            async move {
                start.wait().await;
                let answer = gate
                    .guard(id)
                    .replay()
                    .disposition(ChargeError::disposition)
                    .wait(Duration::from_secs(10))
                    .run(async {
                        ran[n].fetch_add(1, Ordering::SeqCst);
                        Ok::<i64, ChargeError>(-(n as i64) - 1)
                    })
                    .await;
                (n, answer, Instant::now())
            }
        });
    let cutting = AtomicBool::new(true);
    let waiting = async {
        let answers = within(
            "waiters whose listeners are cut",
            futures_util::future::join_all(waiters),
        )
        .await;
        cutting.store(false, Ordering::SeqCst);
        answers
    };
    let conducting = async {
        for id in &ids {
            marked(&direct, &account, &id.address()).await;
        }
        let release = async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            let at = Instant::now();
            go.send_replace(true);
            at
        };
        tokio::join!(cut_over_and_over(&direct, &applications, &cutting), release)
    };
    let (held, (answers, (cut, released_at))) = tokio::join!(holders, async {
        entered.wait().await;
        tokio::join!(waiting, conducting)
    });
    for (n, held) in held.iter().enumerate() {
        assert_eq!(said(held), said(&outcome(n)), "holder {n}");
    }
    assert!(cut > 0, "the listeners were never terminated");
    for (n, ran) in ran.iter().enumerate() {
        let runs = ran.load(Ordering::SeqCst);
        assert_eq!(runs, usize::from(n == 1), "slot {n}: runs: {answers:?}");
    }
    for (n, answer, at) in &answers {
        assert_eq!(said(answer), expected(*n), "slot {n}: {answers:?}");
        let after = at.saturating_duration_since(released_at);
        assert!(
            after < Duration::from_secs(4),
            "slot {n}: answered {after:?} after the outcomes landed (a lost wake-up costs a \
             second; twice for the released slot's)"
        );
    }
}

/// Promise (`Guard::wait`): "past `wait`, it is refused `InFlight`"; the
/// brief: never more than about a second past it. Waits of 0.3 to 2 s on a
/// claim of another process that never lands, while the waiters'
/// listener is terminated every 40 ms (so they listen, lose it, wait for
/// it, poll): each is refused `InFlight`, not before its wait, and within
/// 1.5 s after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_run_out_on_another_process_s_claim_end_on_time_while_the_listener_is_cut() {
    let account = testing::unique_name("edge_expiry");
    let application = testing::unique_name("edge_expiry");
    let (_holder_proxy, holder_gate) = gate_in(&account, "edge_expiry_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, &application, 4).await;
    let direct = direct().await;
    let id = Identity::new("edge_expiry").part("ord_1");
    let (entered, go) = (Notify::new(), Notify::new());
    let holder = holder_gate
        .guard(&id)
        .run(held_until(&entered, &go, Ok::<_, JobError>(())));
    let waits = [300_u64, 300, 700, 700, 1200, 1200, 2000, 2000].map(Duration::from_millis);
    let start = Arc::new(Barrier::new(waits.len()));
    let cutting = AtomicBool::new(true);
    let waiting = async {
        entered.notified().await;
        let waiters = waits.iter().map(|&wait| {
            let (start, gate, id) = (Arc::clone(&start), &waiter_gate, &id);
            async move {
                start.wait().await;
                let began = Instant::now();
                let answer = gate
                    .guard(id)
                    .wait(wait)
                    .run(async { Ok::<_, JobError>(()) })
                    .await;
                (wait, answer, began.elapsed())
            }
        });
        let answers = async {
            let answers = within(
                "waits that run out",
                futures_util::future::join_all(waiters),
            )
            .await;
            cutting.store(false, Ordering::SeqCst);
            answers
        };
        let (answers, cut) = tokio::join!(
            answers,
            cut_over_and_over(&direct, std::slice::from_ref(&application), &cutting)
        );
        go.notify_one();
        (answers, cut)
    };
    let (held, (answers, cut)) = tokio::join!(holder, waiting);
    held.expect("the holder succeeds");
    assert!(cut > 0, "the listener was never terminated");
    for (wait, answer, took) in &answers {
        assert!(
            matches!(answer, Err(JobError::Rejected(idem::Rejected::InFlight))),
            "wait {wait:?}: {answers:?}"
        );
        assert!(
            *took >= *wait && *took < *wait + Duration::from_millis(1500),
            "wait {wait:?}: refused after {took:?}"
        );
    }
}

/// Promise (`docs/operations.md`): the listener "closes 10 s after the last
/// waiter leaves". Once the only waiter is answered, other processes keep
/// waking waiters of their own (a notification on `idem_landed` every
/// 500 ms, for a slot nobody here waits on): the listener must still close
/// (allowing 14 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_closes_when_nobody_waits_even_while_other_slots_are_woken() {
    let account = testing::unique_name("edge_idle");
    let application = testing::unique_name("edge_idle");
    let (_holder_proxy, holder_gate) = gate_in(&account, "edge_idle_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, &application, 2).await;
    let direct = direct().await;
    let id = Identity::new("edge_idle").part("ord_1");
    let (held, waited, ()) = held_and_awaited_elsewhere(
        (&holder_gate, &waiter_gate),
        &direct,
        &id,
        (7, Duration::from_secs(20)),
        async {},
    )
    .await;
    assert_eq!(held.expect("the holder succeeds"), 7);
    assert_eq!(waited.expect("replayed"), 7);
    let left = Instant::now();
    assert_eq!(
        listeners(&direct, &application).await,
        1,
        "the waiter's gate listened"
    );
    let noisy = AtomicBool::new(true);
    let noise = async {
        while noisy.load(Ordering::SeqCst) {
            sqlx::query("SELECT pg_notify('idem_landed', $1)")
                .bind("claim_nobody_waits_on_here")
                .execute(&direct)
                .await
                .expect("notify");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let closed = async {
        let closed = loop {
            if listeners(&direct, &application).await == 0 {
                break Some(left.elapsed());
            }
            if left.elapsed() > Duration::from_secs(14) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        noisy.store(false, Ordering::SeqCst);
        closed
    };
    let ((), closed) = tokio::join!(noise, closed);
    assert!(
        closed.is_some(),
        "the listener still listens 14 s after its last waiter left: every notification on \
         idem_landed, for any slot, restarts its 10 s idle timer (wakeup.rs, \
         `timeout(IDLE, listener.try_recv())` in the loop), so while other processes wake \
         waiters of their own it never closes"
    );
}

/// Promise (`docs/operations.md`): the listener "closes 10 s after the last
/// waiter leaves", and the next waiter starts it again. A waiter after the
/// listener idled out (11.5 s of no waiter) is still woken: its holder
/// sends the wake-up (so it was marked, which a waiter does only while
/// listening), and the waiter gets the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_after_the_listener_idled_out_listens_again_and_is_woken() {
    let account = testing::unique_name("edge_again");
    let application = testing::unique_name("edge_again");
    let (holder_proxy, holder_gate) = gate_in(&account, "edge_again_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, &application, 2).await;
    let direct = direct().await;
    for round in 0..2_i64 {
        if round == 1 {
            tokio::time::sleep(Duration::from_millis(11_500)).await;
        }
        let id = Identity::new("edge_again").part(round);
        let conduct = async {
            let listening = listeners(&direct, &application).await;
            (listening, holder_proxy.executions())
        };
        let (held, waited, (listening, from)) = held_and_awaited_elsewhere(
            (&holder_gate, &waiter_gate),
            &direct,
            &id,
            (round, Duration::from_secs(20)),
            conduct,
        )
        .await;
        assert_eq!(held.expect("the holder succeeds"), round);
        assert_eq!(waited.expect("replayed"), round, "round {round}");
        assert_eq!(listening, 1, "round {round}: one listener while it waits");
        assert_eq!(
            holder_proxy.executions() - from,
            2,
            "round {round}: the settle, then the wake-up"
        );
    }
}

/// Promise (brief: "the tokio runtime that spawned the listener shutting
/// down while another runtime's gate copy waits"). One gate shared by two
/// runtimes: a waiter on runtime A starts the listener (spawned on A);
/// a waiter of another slot on the test's runtime marks its claim and
/// waits; runtime A shuts down (its waiter and the listener with it). The
/// remaining waiter starts a listener of its own and learns its holder's
/// outcome; a later waiter is woken by that listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_shared_by_two_runtimes_survives_the_one_that_started_its_listener() {
    let account = testing::unique_name("edge_rt");
    let application = testing::unique_name("edge_rt");
    let (holder_proxy, holder_gate) = gate_in(&account, "edge_rt_holder", 4).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, &application, 3).await;
    let direct = direct().await;
    // Every connection of the shared pool is opened on this runtime, so
    // none dies with runtime A.
    {
        let pool = waiter_gate.pool();
        let warm = (0..3).map(|_| async move {
            sqlx::query("SELECT pg_sleep(0.05)")
                .execute(pool)
                .await
                .expect("warm")
        });
        futures_util::future::join_all(warm).await;
    }
    let ids: Vec<Identity> = (0..3).map(|n| Identity::new("edge_rt").part(n)).collect();
    let entered = Barrier::new(4);
    let gos: Vec<Notify> = (0..3).map(|_| Notify::new()).collect();
    let holders =
        futures_util::future::join_all(ids.iter().zip(&gos).enumerate().map(|(n, (id, go))| {
            let entered = &entered;
            holder_gate.guard(id).replay().run(async move {
                entered.wait().await;
                go.notified().await;
                Ok::<_, JobError>(n as i64)
            })
        }));
    let scenario = async {
        entered.wait().await;
        // Runtime A: a waiter on slot 0, which starts the listener there.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let on_a = {
            let (gate, id) = (waiter_gate.clone(), ids[0].clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("runtime A");
                runtime.block_on(async move {
                    tokio::select! {
                        _ = gate.guard(&id).wait(Duration::from_secs(60)).run(async {
                            Ok::<_, JobError>(-1_i64)
                        }) => panic!("the waiter on runtime A was answered"),
                        _ = stopped => {}
                    }
                });
                drop(runtime);
            })
        };
        marked(&direct, &account, &ids[0].address()).await;
        let on_runtime_a = listener_pids(&direct, &application).await;
        assert_eq!(on_runtime_a.len(), 1, "A listens");
        // The test's runtime: a waiter on slot 1, under the same listener.
        let waited = waiter_gate
            .guard(&ids[1])
            .replay()
            .wait(Duration::from_secs(30))
            .run(async { Ok::<_, JobError>(-1_i64) });
        let conduct = async {
            marked(&direct, &account, &ids[1].address()).await;
            stop.send(()).expect("runtime A still runs");
            tokio::task::spawn_blocking(move || on_a.join().expect("runtime A's thread"))
                .await
                .expect("join runtime A");
            // The listener went with its runtime (its task dropped); the
            // waiter on B, woken as it went, may start another at once.
            let deadline = Instant::now() + Duration::from_secs(10);
            while listener_pids(&direct, &application)
                .await
                .iter()
                .any(|pid| on_runtime_a.contains(pid))
            {
                assert!(
                    Instant::now() < deadline,
                    "the listener outlived its runtime"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The waiter on B, its listener gone under it, starts another
            // (rather than only looking once a second from now on).
            let deadline = Instant::now() + Duration::from_secs(10);
            while !listener_pids(&direct, &application)
                .await
                .iter()
                .any(|pid| !on_runtime_a.contains(pid))
            {
                assert!(
                    Instant::now() < deadline,
                    "the waiter on B, its listener gone, started no other"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let at = Instant::now();
            gos[1].notify_one();
            at
        };
        let (waited, released_at) = tokio::join!(within("the waiter on B", waited), conduct);
        let answered_after = released_at.elapsed();
        assert_eq!(waited.expect("replayed"), 1);
        assert!(
            answered_after < Duration::from_secs(3),
            "answered {answered_after:?} after its holder's outcome"
        );
        // A later waiter is woken through the listener B started.
        let waited = waiter_gate
            .guard(&ids[2])
            .replay()
            .wait(Duration::from_secs(30))
            .run(async { Ok::<_, JobError>(-1_i64) });
        let conduct = async {
            marked(&direct, &account, &ids[2].address()).await;
            let listening = listeners(&direct, &application).await;
            let from = holder_proxy.executions();
            gos[2].notify_one();
            (listening, from)
        };
        let (waited, (listening, from)) = tokio::join!(within("the later waiter", waited), conduct);
        assert_eq!(waited.expect("replayed"), 2);
        assert_eq!(listening, 1, "one listener, started anew");
        gos[0].notify_one();
        from
    };
    let (held, from) = tokio::join!(holders, scenario);
    for (n, held) in held.into_iter().enumerate() {
        assert_eq!(held.expect("the holder succeeds"), n as i64);
    }
    // Slot 2's settle and wake-up, then slot 0's settle (nobody waits any
    // more, but runtime A's waiter marked it: a wake-up too).
    assert!(
        holder_proxy.executions() - from >= 2,
        "slot 2's holder woke its waiter"
    );
}

/// Promise: "no waiter is left hanging" when waiters are cancelled or
/// gates dropped. Three waiters of one slot and one of another, on copies
/// of one gate (two accounts' worth of copies share its listener); after
/// they marked, two of the first slot's are cancelled and every other
/// copy of the gate is dropped. The remaining waiters are woken and
/// answered; and a fresh waiter of a slot whose every waiter was
/// cancelled after marking is woken too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_and_dropped_gate_copies_leave_the_others_woken() {
    let account = testing::unique_name("edge_cancel");
    let (holder_proxy, holder_gate) = gate_in(&account, "edge_cancel_holder", 4).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, "edge_cancel_waiter", 4).await;
    let direct = direct().await;
    let ids: Vec<Identity> = (0..3)
        .map(|n| Identity::new("edge_cancel").part(n))
        .collect();
    let entered = Barrier::new(4);
    let gos: Vec<Notify> = (0..3).map(|_| Notify::new()).collect();
    let holders =
        futures_util::future::join_all(ids.iter().zip(&gos).enumerate().map(|(n, (id, go))| {
            let entered = &entered;
            holder_gate.guard(id).replay().run(async move {
                entered.wait().await;
                go.notified().await;
                Ok::<_, JobError>(n as i64)
            })
        }));
    let (copy, copied_ids) = (waiter_gate.account(&account), ids.clone());
    let spawn_waiter = move |n: usize| {
        let (gate, id) = (copy.clone(), copied_ids[n].clone());
        tokio::spawn(async move {
            gate.guard(&id)
                .replay()
                .wait(Duration::from_secs(30))
                .run(async { Ok::<_, JobError>(-1_i64) })
                .await
        })
    };
    let scenario = async {
        entered.wait().await;
        let slot0: Vec<_> = (0..3).map(|_| spawn_waiter(0)).collect();
        let slot1 = spawn_waiter(1);
        let slot2: Vec<_> = (0..2).map(|_| spawn_waiter(2)).collect();
        for id in &ids {
            marked(&direct, &account, &id.address()).await;
        }
        let mut slot0 = slot0.into_iter();
        for cancelled in slot0.by_ref().take(2) {
            cancelled.abort();
            let _ = cancelled.await;
        }
        for cancelled in slot2 {
            cancelled.abort();
            let _ = cancelled.await;
        }
        let late2 = spawn_waiter(2);
        drop(spawn_waiter);
        drop(waiter_gate);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let from = holder_proxy.executions();
        for go in &gos {
            go.notify_one();
        }
        let remaining = slot0.next().expect("the third waiter of slot 0");
        let answers = within(
            "waiters left after others were cancelled",
            futures_util::future::join_all([remaining, slot1, late2]),
        )
        .await;
        (answers, from)
    };
    let (held, (answers, from)) = tokio::join!(holders, scenario);
    for (n, held) in held.into_iter().enumerate() {
        assert_eq!(held.expect("the holder succeeds"), n as i64);
    }
    let values: Vec<i64> = answers
        .into_iter()
        .map(|answer| answer.expect("the waiter's task").expect("replayed"))
        .collect();
    assert_eq!(values, [0, 1, 2]);
    assert_eq!(
        holder_proxy.executions() - from,
        6,
        "each slot's settle and wake-up (all were marked)"
    );
}

/// Promise 1 (exactly one runs across all processes) with a holder that
/// panics: its claim stays pending until its lease runs out; waiters in
/// two processes (two each) are not left hanging, and exactly one of them
/// runs the action; the others are handed its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_holder_s_waiters_in_two_processes_run_the_action_exactly_once() {
    let account = testing::unique_name("edge_panic");
    let (_holder_proxy, holder_gate) = gate_in(&account, "edge_panic_holder", 2).await;
    let (_a, first) = gate_in(&account, "edge_panic_a", 3).await;
    let (_b, second) = gate_in(&account, "edge_panic_b", 3).await;
    let direct = direct().await;
    let id = Identity::new("edge_panic").part("ord_1");
    let entered = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    let holding = {
        let (gate, id, entered, go) = (
            holder_gate.clone(),
            id.clone(),
            Arc::clone(&entered),
            Arc::clone(&go),
        );
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(Duration::from_secs(2))
                .run(async {
                    entered.notify_one();
                    go.notified().await;
                    if id.address().is_empty() {
                        return Ok::<_, JobError>(());
                    }
                    panic!("the holder panics");
                })
                .await
        })
    };
    entered.notified().await;
    let ran = AtomicUsize::new(0);
    let start = Arc::new(Barrier::new(4));
    let waiters = [&first, &first, &second, &second].map(|gate| {
        let (start, id, ran) = (Arc::clone(&start), &id, &ran);
        async move {
            start.wait().await;
            gate.guard(id)
                .replay()
                .lease(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .run(async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, JobError>("a waiter's".to_owned())
                })
                .await
        }
    });
    let panic = async {
        marked(&direct, &account, &id.address()).await;
        go.notify_one();
        holding.await.expect_err("the holder panicked").is_panic()
    };
    let (answers, panicked) = tokio::join!(
        within(
            "waiters of a panicked holder",
            futures_util::future::join_all(waiters)
        ),
        panic
    );
    assert!(panicked, "the holder's task panicked");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "exactly one waiter ran: {answers:?}"
    );
    for answer in answers {
        assert_eq!(answer.expect("run once, then replayed"), "a waiter's");
    }
}

// ---------------------------------------------------------------------
// Promise 4: batches wake their items' waiters.
// ---------------------------------------------------------------------

/// A batch holding five items (a success, a release, a kept failure, a
/// hold in doubt, and an ordered event that succeeds), each waited on by
/// one duplicate in each of two other processes. The answers per item,
/// how many times each item's waiters ran it, and the statements the
/// batch's process sent once its bodies were let go.
async fn a_mixed_batch_with_waiters_elsewhere(
    tag: &str,
) -> (Vec<(usize, String)>, Vec<usize>, u64) {
    const ITEMS: usize = 5;
    let account = testing::unique_name(tag);
    let (holder_proxy, holder_gate) = gate_in(&account, &format!("{tag}_holder"), 2).await;
    let (_a, first) = gate_in(&account, &format!("{tag}_a"), 4).await;
    let (_b, second) = gate_in(&account, &format!("{tag}_b"), 4).await;
    let direct = direct().await;
    let ids: Vec<Identity> = (0..ITEMS).map(|n| Identity::new(tag).part(n)).collect();
    let entity = Identity::new(format!("{tag}_entity")).part("sub_1");
    let mut batch = idem::batch::Batch::new();
    for (n, id) in ids.iter().enumerate() {
        if n == 4 {
            batch.push_ordered(n, id.clone(), &entity, 3_i64);
        } else {
            batch.push(n, id.clone());
        }
    }
    // Every item is claimed before any body runs; the bodies (one at a
    // time) all wait for `go`.
    let entered = Notify::new();
    let (go, gone) = watch::channel(false);
    let holder = holder_gate
        .guard_batch(batch)
        .replay()
        .disposition(ChargeError::disposition)
        .run(|n| {
            let (mut gone, entered) = (gone.clone(), &entered);
            async move {
                entered.notify_one();
                let _ = gone.wait_for(|go| *go).await;
                if n == 4 { Ok(104) } else { outcome(n) }
            }
        });
    let ran: Vec<AtomicUsize> = (0..ITEMS).map(|_| AtomicUsize::new(0)).collect();
    let start = Arc::new(Barrier::new(2 * ITEMS));
    let waiters = ids
        .iter()
        .enumerate()
        .flat_map(|(n, id)| [&first, &second].map(move |gate| (n, id, gate)))
        .map(|(n, id, gate)| {
            let (start, ran) = (Arc::clone(&start), &ran);
            async move {
                start.wait().await;
                let answer = gate
                    .guard(id)
                    .replay()
                    .disposition(ChargeError::disposition)
                    .wait(Duration::from_secs(20))
                    .run(async {
                        ran[n].fetch_add(1, Ordering::SeqCst);
                        Ok::<i64, ChargeError>(-(n as i64) - 1)
                    })
                    .await;
                (n, said(&answer))
            }
        });
    let waiting = async {
        entered.notified().await;
        let release = async {
            for id in &ids {
                marked(&direct, &account, &id.address()).await;
            }
            let from = holder_proxy.executions();
            go.send_replace(true);
            from
        };
        tokio::join!(
            within(
                "waiters of a batch's items",
                futures_util::future::join_all(waiters)
            ),
            release
        )
    };
    let (held, (answers, from)) = tokio::join!(holder, waiting);
    let statements = holder_proxy.executions() - from;
    for (n, held) in held.iter().enumerate() {
        let wanted = if n == 4 { Ok(104) } else { outcome(n) };
        assert_eq!(said(held), said(&wanted), "the batch's item {n}");
    }
    let runs = ran.iter().map(|ran| ran.load(Ordering::SeqCst)).collect();
    (answers, runs, statements)
}

/// Promise 4: every item's waiters in other processes get what a lookup
/// gives (replayed value, a run of the released item by exactly one of
/// them, `AlreadyFailed`, `InDoubt`, the ordered event's value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_every_outcome_answers_each_item_s_waiters_in_other_processes() {
    let (answers, runs, _) = a_mixed_batch_with_waiters_elsewhere("edge_mixed").await;
    assert_eq!(runs, [0, 1, 0, 0, 0], "runs per item: {answers:?}");
    for (n, answer) in &answers {
        let wanted = if *n == 4 { "ok:104" } else { expected(*n) };
        assert_eq!(answer, wanted, "item {n}: {answers:?}");
    }
}

/// Promise (`docs/design-decisions.md`: "only when it is `true` does the
/// holder send `SELECT pg_notify('idem_landed', address)` (a batch: one
/// statement for all its marked items)"; CHANGELOG: the batch's outcomes
/// wake its waiters "with one statement"). A batch with four kinds of
/// outcome, every item waited on: its four outcome statements and one
/// wake-up. (The released item's runner in another process sends nothing
/// through this proxy.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_every_outcome_wakes_all_its_waited_items_with_one_statement() {
    let (answers, _, statements) = a_mixed_batch_with_waiters_elsewhere("edge_mixed_n").await;
    assert_eq!(
        statements, 5,
        "one statement per kind of outcome (4) and one wake-up for all the waited items, as \
         the docs say; batch.rs `record_group` sends a wake-up per kind: {answers:?}"
    );
}

// ---------------------------------------------------------------------
// Promise 5: accounts and namespaces.
// ---------------------------------------------------------------------

/// Promise (`docs/design-decisions.md`): "two slots of one address in other
/// accounts or schemas share a wake-up: the other's waiter looks once for
/// nothing." One address held in three scopes (account 1, account 2,
/// account 1's namespace), by three holders of another process; waiters
/// of each scope on copies of one gate (one registry of waiters, one
/// listener). The outcomes land one scope at a time: a success, then a
/// release, then a kept failure. Every waiter gets its own scope's answer,
/// never another's, and the released scope's action runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_in_other_accounts_and_namespaces_is_never_answered_across() {
    let accounts = [
        testing::unique_name("edge_scope_1"),
        testing::unique_name("edge_scope_2"),
    ];
    let (_holder_proxy, holder_gate) = gate_in(&accounts[0], "edge_scope_holder", 4).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&accounts[0], "edge_scope_waiter", 4).await;
    let direct = direct().await;
    let scopes: [(&str, Option<&str>); 3] = [
        (&accounts[0], None),
        (&accounts[1], None),
        (&accounts[0], Some("edge_ns")),
    ];
    let scoped = |gate: &idem::Gate, (account, namespace): (&str, Option<&str>)| {
        let gate = gate.account(account);
        match namespace {
            Some(namespace) => gate.namespace(namespace),
            None => gate,
        }
    };
    let holder_gates = scopes.map(|scope| scoped(&holder_gate, scope));
    let waiter_gates = scopes.map(|scope| scoped(&waiter_gate, scope));
    let id = Identity::new("edge_scope").part("ord_1");
    // Scope 0 succeeds with 10, scope 1 releases, scope 2 keeps a failure.
    let outcomes = [
        Ok(10_i64),
        Err(ChargeError::Invalid),
        Err(ChargeError::Declined),
    ];
    let entered = Barrier::new(4);
    let gos: Vec<Notify> = (0..3).map(|_| Notify::new()).collect();
    let holders = futures_util::future::join_all(holder_gates.iter().zip(&gos).zip(outcomes).map(
        |((gate, go), outcome)| {
            let (entered, id) = (&entered, &id);
            gate.guard(id)
                .replay()
                .disposition(ChargeError::disposition)
                .run(async move {
                    entered.wait().await;
                    go.notified().await;
                    outcome
                })
        },
    ));
    let ran: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
    let finished: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
    let start = Arc::new(Barrier::new(6));
    let waiters = (0..3).flat_map(|scope| [scope, scope]).map(|scope| {
        let (start, ran, finished, gate, id) = (
            Arc::clone(&start),
            &ran,
            &finished,
            &waiter_gates[scope],
            &id,
        );
        async move {
            start.wait().await;
            let answer = gate
                .guard(id)
                .replay()
                .disposition(ChargeError::disposition)
                .wait(Duration::from_secs(30))
                .run(async {
                    ran[scope].fetch_add(1, Ordering::SeqCst);
                    Ok::<i64, ChargeError>(20 + scope as i64)
                })
                .await;
            finished[scope].fetch_add(1, Ordering::SeqCst);
            (scope, said(&answer))
        }
    });
    let conduct = async {
        for (account, namespace) in scopes {
            marked_in(&direct, account, namespace, &id.address()).await;
        }
        let mut early = Vec::new();
        for (scope, go) in gos.iter().enumerate() {
            go.notify_one();
            // The other scopes' waiters are woken by this one's wake-up
            // (same address), look, and must go on waiting.
            tokio::time::sleep(Duration::from_millis(600)).await;
            early.push(
                finished
                    .iter()
                    .skip(scope + 1)
                    .map(|finished| finished.load(Ordering::SeqCst))
                    .sum::<usize>(),
            );
        }
        early
    };
    let (held, (answers, early)) = tokio::join!(holders, async {
        entered.wait().await;
        tokio::join!(
            within(
                "waiters of one address in three scopes",
                futures_util::future::join_all(waiters)
            ),
            conduct
        )
    });
    for (scope, held) in held.iter().enumerate() {
        assert!(
            scope == 0 && said(held) == "ok:10" || scope > 0 && held.is_err(),
            "holder of scope {scope}: {held:?}"
        );
    }
    assert_eq!(
        early,
        [0, 0, 0],
        "no waiter of a scope whose holder had not finished was answered: {answers:?}"
    );
    let runs: Vec<usize> = ran.iter().map(|ran| ran.load(Ordering::SeqCst)).collect();
    assert_eq!(runs, [0, 1, 0], "runs per scope: {answers:?}");
    for (scope, answer) in &answers {
        let wanted = ["ok:10", "ok:21", "already_failed"][*scope];
        assert_eq!(answer, wanted, "scope {scope}: {answers:?}");
    }
}

// ---------------------------------------------------------------------
// Faults on the holder's side.
// ---------------------------------------------------------------------

/// Promise (`Guard::wait`): the holder in another process "wakes its
/// waiters with a notification"; the docs list what is not woken (a
/// takeover, a resolve, an outcome in the caller's transaction, a pooler)
/// and a lost reply of the holder's settle is not among them. The settle
/// commits, its reply is lost, the holder sends it again and reads its own
/// success back: its waiter must still be notified (and answered right).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_settle_reply_is_lost_still_wakes_its_waiter() {
    let account = testing::unique_name("edge_lost");
    let (holder_proxy, holder_gate) = gate_in(&account, "edge_lost_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, "edge_lost_waiter", 2).await;
    let direct = direct().await;
    let mut listener = landed_listener().await;
    let id = Identity::new("edge_lost").part("ord_1");
    let lose_the_settle_reply = async {
        assert!(holder_proxy.lose_next_reply(Statement::Settle));
    };
    let (held, waited, ()) = held_and_awaited_elsewhere(
        (&holder_gate, &waiter_gate),
        &direct,
        &id,
        (9, Duration::from_secs(20)),
        lose_the_settle_reply,
    )
    .await;
    assert_eq!(
        holder_proxy.take_lost_replies().len(),
        1,
        "the settle's reply was lost"
    );
    assert_eq!(held.expect("the holder's own success"), 9);
    assert_eq!(waited.expect("replayed"), 9);
    let woken = heard(&mut listener, &[id.address()], Duration::from_secs(2)).await;
    assert_eq!(
        woken.len(),
        1,
        "the holder's success landed on a marked claim, yet no wake-up was sent (claim.rs: \
         after the retried settle finds the row no longer pending, `no_longer_ours` reads \
         its own success back and never calls `wake`); the waiter learned at its next \
         once-a-second look"
    );
}
