//! Retention windows at their edges (`Guard::keep_value_for`,
//! `Guard::keep_slot_for`, `PruneFilter::expired`), attacked from their
//! documentation: races at the instant a window ends, prune racing
//! the claims that reopen a slot, stale readers, steps across an expiry,
//! mixed windows on one key, faults while a slot is reopened, leases, `tx`
//! mode, batches, the outcome cache, and hostile windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use idem::operations::{self, PruneFilter};
use idem::sqlx::{self, PgConnection};
use idem::{Disposition, Fingerprint, Identity, Rejected, testing};
use idem_test_support::connections;
use idem_test_support::fault_proxy::{Proxy, Statement};

use super::{WINDOW, counted, past_the_window};

/// The slot window of the runs that reopen a slot in the races below:
/// long enough that the checks after a race (on a loaded machine, or
/// through Citus, seconds past it) still find the new run inside its
/// window, so that a duplicate that runs there is a fault, never the
/// window ending. The window that ends in the race is the first run's:
/// a slot's window is the one its claim recorded.
const REOPENED_SLOT: Duration = Duration::from_secs(120);

/// Races `n` callers every few milliseconds from `from` to `until` after
/// `start`, each through `invoke`; returns how many won a claim in all.
async fn race_across<F, Fut, T>(
    start: Instant,
    from: Duration,
    until: Duration,
    n: usize,
    invoke: F,
) -> usize
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, Rejected>>,
{
    if let Some(wait) = (start + from).checked_duration_since(Instant::now()) {
        tokio::time::sleep(wait).await;
    }
    let mut wins = 0;
    while start.elapsed() < until {
        let report = testing::race(n, &invoke).await;
        assert!(
            report.claimed() <= 1,
            "two callers won one claim in one race: {report}"
        );
        wins += report.claimed();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    wins
}

/// Prunes `account` in a loop, with the expired filter and with a cut-off
/// a minute in the future, until `stop`; returns how many it deleted.
async fn prune_until(pool: &sqlx::PgPool, account: &str, stop: &AtomicBool) -> u64 {
    let mut deleted = 0;
    while !stop.load(Ordering::SeqCst) {
        let expired = PruneFilter::expired().account(account);
        deleted += operations::prune(pool, &expired)
            .await
            .expect("prune expired");
        let horizon = SystemTime::now() + Duration::from_secs(60);
        let ahead = PruneFilter::new(horizon).account(account);
        deleted += operations::prune(pool, &ahead).await.expect("prune ahead");
    }
    deleted
}

// ---------------------------------------------------------------------
// 1. Races at the window's edge
// ---------------------------------------------------------------------

/// Promise: past `keep_slot_for` the key runs again ONCE however many race,
/// and never twice inside a window. Callers race every few milliseconds
/// from before the window ends to well after it: exactly one new run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_racing_across_the_instant_the_window_ends_run_it_once() {
    let gate = testing::gate().await;
    let id = Identity::new("edge_race").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = gate.guard(&id).keep_slot_for(WINDOW);
    assert!(first.run(counted(&runs, "first")).await.is_ok());
    let settled = Instant::now();
    let wins = race_across(
        settled,
        WINDOW - Duration::from_millis(150),
        WINDOW + Duration::from_millis(350),
        6,
        || {
            gate.guard(&id)
                .keep_slot_for(REOPENED_SLOT)
                .run(counted(&runs, "again"))
        },
    )
    .await;
    assert_eq!(wins, 1, "one new run for one expiry");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "first run plus one reopen");
}

/// Promise: prune never deletes a claim inside its window whatever its
/// cut-off; with prune (expired, and a cut-off in the future) looping
/// while callers race across the window's end, each key runs exactly once
/// more, and the new run's slot survives the prunes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_racing_the_reopening_claims_never_runs_a_key_twice() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let pool = testing::pool_with(2).await;
    let ids: Vec<Identity> = (0..4)
        .map(|n| Identity::new("edge_prune").part(n))
        .collect();
    let runs: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    for (id, runs) in ids.iter().zip(&runs) {
        let ran = gate
            .guard(id)
            .keep_slot_for(WINDOW)
            .run(counted(runs, "first"))
            .await;
        assert!(ran.is_ok(), "{ran:?}");
    }
    let settled = Instant::now();
    let stop = AtomicBool::new(false);
    let gate_ref = &gate;
    let racing = async {
        let wins: usize =
            futures_util::future::join_all(ids.iter().zip(&runs).map(|(id, runs)| {
                race_across(
                    settled,
                    WINDOW - Duration::from_millis(100),
                    WINDOW + Duration::from_millis(250),
                    2,
                    move || {
                        gate_ref
                            .guard(id)
                            .keep_slot_for(REOPENED_SLOT)
                            .run(counted(runs, "again"))
                    },
                )
            }))
            .await
            .into_iter()
            .sum();
        stop.store(true, Ordering::SeqCst);
        wins
    };
    let (wins, _deleted) = tokio::join!(racing, prune_until(&pool, &account, &stop));
    for (n, runs) in runs.iter().enumerate() {
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "key {n}: the first run and exactly one for its expiry"
        );
    }
    assert_eq!(wins, 4, "one reopening per key");
    // Prune once more, with a far cut-off: every new run is inside its
    // window (REOPENED_SLOT) and refuses its duplicate.
    let far = PruneFilter::new(SystemTime::now() + Duration::from_secs(3600 * 24 * 365))
        .account(account.as_str());
    operations::prune(&pool, &far).await.expect("prune far");
    for (id, runs) in ids.iter().zip(&runs) {
        let dup = gate
            .guard(id)
            .keep_slot_for(REOPENED_SLOT)
            .run(counted(runs, "dup"))
            .await;
        assert!(
            matches!(dup, Err(Rejected::AlreadyDone)),
            "inside the new window, after a prune with a far cut-off: {dup:?}"
        );
    }
}

/// Promise: a claim judged against a stale view of an expired row (a
/// REPEATABLE READ snapshot taken before another caller reopened and
/// re-ran the slot) never commits a second new run for that one expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_snapshot_of_the_expired_row_does_not_run_it_a_second_time() {
    let gate = testing::gate().await;
    let id = Identity::new("edge_stale").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "first"))
            .await
            .is_ok()
    );
    past_the_window().await;
    let mut stale = gate.pool().begin().await.expect("begin");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *stale)
        .await
        .expect("repeatable read");
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(&mut *stale)
        .await
        .expect("take the snapshot");
    assert!(seen >= 1);
    // Another caller reopens the slot and runs it.
    assert!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "second"))
            .await
            .is_ok()
    );
    let stale_runs = AtomicUsize::new(0);
    let result: Result<(), Rejected> = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .tx(&mut stale)
        .run(async |_conn: &mut PgConnection| {
            stale_runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await;
    let committed = match &result {
        Ok(()) => stale.commit().await.is_ok(),
        Err(_) => {
            let _ = stale.rollback().await;
            false
        }
    };
    assert!(
        !committed,
        "a stale snapshot committed a third run for one expiry (result {result:?}, body ran {} \
         times)",
        stale_runs.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------
// 2. Steps across an expiry
// ---------------------------------------------------------------------

/// A body with one step "charge" that takes the next charge number, then
/// fails when `fail`.
fn charging(
    charges: &Arc<AtomicUsize>,
    fail: bool,
) -> impl std::future::Future<Output = Result<usize, Rejected>> + use<> {
    let charges = Arc::clone(charges);
    async move {
        let charge: usize = idem::step("charge", async move {
            Ok::<usize, Rejected>(charges.fetch_add(1, Ordering::SeqCst) + 1)
        })
        .await?;
        if fail {
            return Err(Rejected::InFlight);
        }
        Ok(charge)
    }
}

/// Promise: a run on a reopened slot is a new action (no step of the
/// expired run replayed), yet a run of it that is released and retried
/// still replays its own finished steps, as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_run_that_is_released_and_retried_replays_its_own_steps_only() {
    let gate = testing::gate().await;
    let id = Identity::new("steps_reopen_release").part(1);
    let charges = Arc::new(AtomicUsize::new(0));
    let guard = || gate.guard(&id).keep_slot_for(WINDOW);
    assert_eq!(guard().run(charging(&charges, false)).await.ok(), Some(1));
    past_the_window().await;
    // The new action charges anew, then fails and is released.
    let failed = guard().run(charging(&charges, true)).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        charges.load(Ordering::SeqCst),
        2,
        "the reopened run charged anew"
    );
    // Its retry replays its charge (2): not the expired run's (1), not a new one.
    assert_eq!(
        guard().run(charging(&charges, false)).await.ok(),
        Some(2),
        "the retry of the reopened run must replay its own step"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 2);
}

/// Promise: a released claim has no recorded outcome, so nothing of it
/// expires: its finished steps are replayed by a retry that comes after
/// its window would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_claim_s_steps_are_replayed_even_after_its_window() {
    let gate = testing::gate().await;
    let id = Identity::new("steps_release_late").part(1);
    let charges = Arc::new(AtomicUsize::new(0));
    let guard = || gate.guard(&id).keep_slot_for(WINDOW);
    assert!(guard().run(charging(&charges, true)).await.is_err());
    past_the_window().await;
    assert_eq!(
        guard().run(charging(&charges, false)).await.ok(),
        Some(1),
        "the retry replays the released run's charge"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
}

/// Promise: a kept failure's slot expires like a success's, and the new run
/// runs its steps anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_failure_with_steps_past_its_window_runs_its_steps_anew() {
    let gate = testing::gate().await;
    let id = Identity::new("steps_kept_failure").part(1);
    let charges = Arc::new(AtomicUsize::new(0));
    let guard = || {
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .disposition(|_: &Rejected| Disposition::Keep)
    };
    assert!(guard().run(charging(&charges, true)).await.is_err());
    assert!(matches!(
        guard().run(charging(&charges, false)).await,
        Err(Rejected::AlreadyFailed)
    ));
    past_the_window().await;
    assert_eq!(
        guard().run(charging(&charges, false)).await.ok(),
        Some(2),
        "the expired failure's step was replayed into the new action"
    );
}

/// Promise: a pending claim never expires: a holder whose body (with steps)
/// runs well past the window keeps every duplicate out, with a lease or
/// without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_still_running_past_the_window_is_never_expired() {
    let gate = testing::gate().await;
    for lease in [None, Some(Duration::from_secs(30))] {
        let id =
            Identity::new("steps_slow_holder").part(if lease.is_some() { "lease" } else { "none" });
        let runs = Arc::new(AtomicUsize::new(0));
        let body = {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) }).await?;
                tokio::time::sleep(WINDOW * 2 + Duration::from_millis(300)).await;
                let b: u64 = idem::step("b", async { Ok::<u64, Rejected>(2) }).await?;
                Ok::<u64, Rejected>(a + b)
            }
        };
        let holder = async {
            match lease {
                Some(lease) => {
                    gate.guard(&id)
                        .keep_slot_for(WINDOW)
                        .lease(lease)
                        .run(body)
                        .await
                }
                None => gate.guard(&id).keep_slot_for(WINDOW).run(body).await,
            }
        };
        let duplicates = async {
            tokio::time::sleep(WINDOW + Duration::from_millis(300)).await;
            let report = testing::race(4, || {
                gate.guard(&id)
                    .keep_slot_for(WINDOW)
                    .run(counted(&runs, "dup"))
            })
            .await;
            report.assert_all_refused(&Rejected::InFlight);
        };
        let (held, ()) = tokio::join!(holder, duplicates);
        assert_eq!(held.ok(), Some(3), "{lease:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{lease:?}");
    }
}

// ---------------------------------------------------------------------
// 3. Mixed windows on one key
// ---------------------------------------------------------------------

/// Promise: the window written with the claim governs. A claim with a slot
/// window expires even for a later caller that sets none; the new claim,
/// made without one, then holds for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_claim_s_window_governs_a_later_call_without_one() {
    let gate = testing::gate().await;
    let id = Identity::new("mixed_window").part("then_none");
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "a"))
            .await
            .is_ok()
    );
    assert!(matches!(
        gate.guard(&id).run(counted(&runs, "b")).await,
        Err(Rejected::AlreadyDone)
    ));
    past_the_window().await;
    let reopened = gate.guard(&id).run(counted(&runs, "c")).await;
    assert!(
        reopened.is_ok(),
        "the claim's own window is over, whatever the caller says: {reopened:?}"
    );
    past_the_window().await;
    let held = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .run(counted(&runs, "d"))
        .await;
    assert!(
        matches!(held, Err(Rejected::AlreadyDone)),
        "the new claim was written without a window: {held:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Promise: a later caller's (shorter) window does not shorten the window
/// written with an existing claim: a slot kept for ever, or for an hour,
/// is not reopened by a caller asking for a short window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_caller_s_shorter_window_does_not_open_a_slot_held_longer() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let for_ever = Identity::new("mixed_window").part("for_ever");
    let an_hour = Identity::new("mixed_window").part("an_hour");
    assert!(gate.guard(&for_ever).run(counted(&runs, "a")).await.is_ok());
    assert!(
        gate.guard(&an_hour)
            .keep_slot_for(Duration::from_secs(3600))
            .run(counted(&runs, "a"))
            .await
            .is_ok()
    );
    past_the_window().await;
    for id in [&for_ever, &an_hour] {
        let late = gate
            .guard(id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "b"))
            .await;
        assert!(matches!(late, Err(Rejected::AlreadyDone)), "{late:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Promise: a value window longer than the slot window ends with the slot
/// ("at the latest"): past the slot's window a replaying caller runs anew
/// and gets the new value, never the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_window_longer_than_the_slot_window_ends_with_the_slot() {
    let gate = testing::gate().await;
    let id = Identity::new("mixed_window").part("value_longer");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = || {
        gate.guard(&id)
            .replay()
            .keep_value_for(Duration::from_secs(3600))
            .keep_slot_for(WINDOW)
    };
    assert_eq!(
        guard().run(counted(&runs, "r_1")).await.ok().as_deref(),
        Some("r_1")
    );
    assert_eq!(
        guard().run(counted(&runs, "r_x")).await.ok().as_deref(),
        Some("r_1")
    );
    past_the_window().await;
    assert_eq!(
        guard().run(counted(&runs, "r_2")).await.ok().as_deref(),
        Some("r_2"),
        "past the slot's window the old value was handed out instead of a new run"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Promise: past the value window the fingerprint is gone too: a caller
/// that does not replay, with another payload, is refused `AlreadyDone`
/// (the action is done) and never runs; inside it, it was `KeyReused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_value_window_a_non_replaying_other_payload_is_already_done() {
    let gate = testing::gate().await;
    let id = Identity::new("mixed_window").part("fp_no_replay");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = |amount: i64| {
        gate.guard(&id)
            .fingerprint(Fingerprint::new().part(amount))
            .keep_value_for(WINDOW)
    };
    assert!(guard(1).run(counted(&runs, "a")).await.is_ok());
    assert!(matches!(
        guard(2).run(counted(&runs, "b")).await,
        Err(Rejected::KeyReused)
    ));
    past_the_window().await;
    for amount in [1, 2] {
        let late = guard(amount).run(counted(&runs, "c")).await;
        assert!(
            matches!(late, Err(Rejected::AlreadyDone)),
            "{amount}: {late:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------
// 4. Faults while a slot is reopened
// ---------------------------------------------------------------------

/// Promise: past the window the key runs again once, and a lost reply
/// never makes it run twice. The reply of the statement that reopens the
/// slot (the claim, or a delete of the expired row) is lost after its
/// commit; then callers retry and race: at most one new run in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_reopening_an_expired_slot_never_runs_it_twice() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(crate::support::proxy::pool_through(&proxy).await).await;
    for case in ["claim", "release", "delete"] {
        let id = Identity::new("fault_reopen").part(case);
        let runs = Arc::new(AtomicUsize::new(0));
        let guard = || gate.guard(&id).keep_slot_for(WINDOW);
        assert!(guard().run(counted(&runs, "first")).await.is_ok(), "{case}");
        past_the_window().await;
        match case {
            "claim" => assert!(proxy.lose_next_reply(Statement::Claim)),
            "release" => assert!(proxy.lose_next_reply(Statement::Release)),
            _ => assert!(proxy.lose_next_reply_to("DELETE FROM idem_records")),
        }
        let faulted = guard().run(counted(&runs, "faulted")).await;
        proxy.disarm();
        eprintln!(
            "{case}: faulted call {faulted:?}; lost {:?} {:?}",
            proxy
                .take_lost_replies()
                .iter()
                .map(|l| l.statement)
                .collect::<Vec<_>>(),
            proxy.take_lost_fragment_replies()
        );
        let report = testing::race(4, || guard().run(counted(&runs, "retry"))).await;
        assert!(report.claimed() <= 1, "{case}: {report}");
        assert!(
            runs.load(Ordering::SeqCst) <= 2,
            "{case}: ran {} times for one expiry (faulted call: {faulted:?}; race: {report})",
            runs.load(Ordering::SeqCst)
        );
        let last = guard().run(counted(&runs, "last")).await;
        assert!(
            matches!(last, Err(Rejected::AlreadyDone | Rejected::InFlight)),
            "{case}: {last:?}"
        );
        assert!(runs.load(Ordering::SeqCst) <= 2, "{case}");
    }
}

/// Promise: one new run per expiry, even when the server terminates the
/// gate's connections while callers race to reopen the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_while_reopening_an_expired_slot_never_run_it_twice() {
    let name = testing::unique_name("ret_killed");
    let gate = testing::gate_on(connections::named_pool(&name, 4).await).await;
    let killer = testing::pool_with(1).await;
    for round in 0..3_u32 {
        let id = Identity::new("fault_terminate").part(round);
        let runs = Arc::new(AtomicUsize::new(0));
        let guard = || gate.guard(&id).keep_slot_for(WINDOW);
        assert!(guard().run(counted(&runs, "first")).await.is_ok());
        past_the_window().await;
        let terminate = async {
            tokio::time::sleep(Duration::from_millis(u64::from(round) * 2)).await;
            let _: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1",
            )
            .bind(&name)
            .fetch_all(&killer)
            .await
            .expect("terminate");
        };
        let (report, ()) = tokio::join!(
            testing::race(4, || guard().run(counted(&runs, "again"))),
            terminate
        );
        assert!(report.claimed() <= 1, "round {round}: {report}");
        // Calls until one is answered by the store.
        let mut answered = None;
        for _ in 0..20 {
            match guard().run(counted(&runs, "after")).await {
                Err(Rejected::Unavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => {
                    answered = Some(other);
                    break;
                }
            }
        }
        assert!(
            answered.is_some(),
            "round {round}: the store never answered"
        );
        assert!(
            runs.load(Ordering::SeqCst) <= 2,
            "round {round}: ran {} times for one expiry; race: {report}",
            runs.load(Ordering::SeqCst)
        );
    }
}

// ---------------------------------------------------------------------
// 5. Leases, tx mode, batches, the outcome cache
// ---------------------------------------------------------------------

/// Promise: the slot is held for the window *after the outcome is
/// recorded*. In `tx` mode the outcome is recorded when the caller's
/// transaction commits; a transaction that lasts longer than the window
/// must still leave its slot held right after its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_claim_whose_transaction_outlasts_the_window_holds_its_slot_after_commit() {
    let gate = testing::gate().await;
    let id = Identity::new("tx_long").part(1);
    let runs = AtomicUsize::new(0);
    let mut tx = gate.pool().begin().await.expect("begin");
    let done: Result<(), Rejected> = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .tx(&mut tx)
        .run(async |_conn: &mut PgConnection| {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(WINDOW + Duration::from_millis(400)).await;
            Ok(())
        })
        .await;
    assert!(done.is_ok(), "{done:?}");
    tx.commit().await.expect("commit");
    let dup = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await;
    assert!(
        matches!(dup, Err(Rejected::AlreadyDone)),
        "right after the commit that recorded the outcome, the slot was already expired: \
         {dup:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Promise: the value is kept for the window after the outcome. In `tx`
/// mode, a transaction longer than the value window must not commit a
/// value that is already past its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_claim_whose_transaction_outlasts_the_value_window_still_replays_after_commit() {
    let gate = testing::gate().await;
    let id = Identity::new("tx_long_value").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let done: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .keep_value_for(WINDOW)
        .tx(&mut tx)
        .run(async |_conn: &mut PgConnection| {
            tokio::time::sleep(WINDOW + Duration::from_millis(400)).await;
            Ok("r_1".to_owned())
        })
        .await;
    assert_eq!(done.ok().as_deref(), Some("r_1"));
    tx.commit().await.expect("commit");
    let dup = gate
        .guard(&id)
        .replay()
        .keep_value_for(WINDOW)
        .run(async { Ok::<_, Rejected>("r_2".to_owned()) })
        .await;
    assert_eq!(
        dup.as_deref().ok(),
        Some("r_1"),
        "right after the commit, the value was already past its window: {dup:?}"
    );
}

/// Control for the two above, on the pool: a body longer than the window
/// still holds its slot right after it settles (the window counts from
/// the outcome, not the claim), with and without a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_body_longer_than_the_window_holds_its_slot_after_it_settles() {
    let gate = testing::gate().await;
    for lease in [None, Some(Duration::from_secs(30))] {
        let id = Identity::new("pool_long").part(if lease.is_some() { "lease" } else { "none" });
        let runs = Arc::new(AtomicUsize::new(0));
        let slow = {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(WINDOW + Duration::from_millis(400)).await;
                Ok::<_, Rejected>(())
            }
        };
        let done = match lease {
            Some(lease) => {
                gate.guard(&id)
                    .keep_slot_for(WINDOW)
                    .lease(lease)
                    .run(slow)
                    .await
            }
            None => gate.guard(&id).keep_slot_for(WINDOW).run(slow).await,
        };
        assert!(done.is_ok(), "{done:?}");
        let dup = gate
            .guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "dup"))
            .await;
        assert!(
            matches!(dup, Err(Rejected::AlreadyDone)),
            "{lease:?}: {dup:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

/// Promise: a `tx` reopening that rolls back changes nothing: the expired
/// slot is still open to exactly one new run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_tx_reopening_leaves_the_expired_slot_to_one_new_run() {
    let gate = testing::gate().await;
    let id = Identity::new("tx_rollback").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let charges = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(charging(&charges, false))
            .await
            .ok(),
        Some(1)
    );
    past_the_window().await;
    let mut tx = gate.pool().begin().await.expect("begin");
    let rolled: Result<(), Rejected> = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .tx(&mut tx)
        .run(async |_conn: &mut PgConnection| Ok(()))
        .await;
    assert!(rolled.is_ok(), "the tx caller reopens the slot: {rolled:?}");
    tx.rollback().await.expect("rollback");
    let report = testing::race(4, || {
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "again"))
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // And a step-bearing run after the rollback runs its step anew.
    past_the_window().await;
    assert_eq!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(charging(&charges, false))
            .await
            .ok(),
        Some(2)
    );
}

/// Promise: one new run per expiry whoever races: a batch and single
/// callers racing for the same expired slots run each item once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_and_single_callers_racing_for_expired_slots_run_each_once() {
    let gate = testing::gate().await;
    let gate = &gate;
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let ids: Vec<Identity> = (0..4_u32)
        .map(|n| Identity::new("batch_race").part(n))
        .collect();
    let batch_run = || {
        let mut batch = idem::batch::Batch::new();
        for (n, id) in ids.iter().enumerate() {
            batch.push(n, id.clone());
        }
        let runs = Arc::clone(&runs);
        gate.guard_batch(batch)
            .keep_slot_for(WINDOW)
            .run(move |n: usize| {
                let runs = Arc::clone(&runs);
                async move {
                    runs[n].fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Rejected>(())
                }
            })
    };
    assert!(batch_run().await.iter().all(Result::is_ok));
    past_the_window().await;
    let singles = async {
        futures_util::future::join_all(ids.iter().enumerate().flat_map(|(n, id)| {
            let runs = Arc::clone(&runs);
            (0..2).map(move |_| {
                let runs = Arc::clone(&runs);
                async move {
                    gate.guard(id)
                        .keep_slot_for(WINDOW)
                        .run(async move {
                            runs[n].fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Rejected>(())
                        })
                        .await
                }
            })
        }))
        .await
    };
    let (_batched, _singles) = tokio::join!(batch_run(), singles);
    for (n, runs) in runs.iter().enumerate() {
        assert_eq!(runs.load(Ordering::SeqCst), 2, "item {n}");
    }
}

/// Promise: windowed outcomes never enter the outcome cache. A caller
/// without a window that is refused by a windowed slot must not cache that
/// refusal past the slot's window.
#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_seen_by_a_caller_without_a_window_is_not_cached_past_the_slot_s_window() {
    let gate = testing::gate()
        .await
        .with_cache(idem::cache::OutcomeCache::builder().build());
    let id = Identity::new("cache_mixed").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "a"))
            .await
            .is_ok()
    );
    for _ in 0..3 {
        assert!(matches!(
            gate.guard(&id).run(counted(&runs, "b")).await,
            Err(Rejected::AlreadyDone)
        ));
    }
    past_the_window().await;
    let windowed = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .run(counted(&runs, "c"))
        .await;
    assert!(
        windowed.is_ok(),
        "a cached refusal outlived the slot's window (windowed caller): {windowed:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Promise: windowed outcomes never enter the outcome cache; the window
/// written with the claim governs every caller. A caller without a window
/// past the slot's window runs again, even after it saw the refusal
/// through the cache-enabled gate before.
#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_a_window_on_a_cached_gate_runs_past_the_claim_s_window() {
    let gate = testing::gate()
        .await
        .with_cache(idem::cache::OutcomeCache::builder().build());
    let id = Identity::new("cache_mixed").part(2);
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .run(counted(&runs, "a"))
            .await
            .is_ok()
    );
    assert!(matches!(
        gate.guard(&id).run(counted(&runs, "b")).await,
        Err(Rejected::AlreadyDone)
    ));
    past_the_window().await;
    let plain = gate.guard(&id).run(counted(&runs, "c")).await;
    assert!(
        plain.is_ok(),
        "the cache answered for a claim whose window was over: {plain:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Promise: a value past its window is no longer handed out, whoever asks;
/// a replaying caller without a window must not have cached the value and
/// hand it out past the window.
#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_replayed_to_a_caller_without_a_window_is_not_cached_past_the_value_window() {
    let gate = testing::gate()
        .await
        .with_cache(idem::cache::OutcomeCache::builder().build());
    let id = Identity::new("cache_value").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        gate.guard(&id)
            .replay()
            .keep_value_for(WINDOW)
            .run(counted(&runs, "r_1"))
            .await
            .ok()
            .as_deref(),
        Some("r_1")
    );
    for _ in 0..3 {
        assert_eq!(
            gate.guard(&id)
                .replay()
                .run(counted(&runs, "r_x"))
                .await
                .ok()
                .as_deref(),
            Some("r_1")
        );
    }
    past_the_window().await;
    for windowed in [false, true] {
        let late = if windowed {
            gate.guard(&id)
                .replay()
                .keep_value_for(WINDOW)
                .run(counted(&runs, "r_2"))
                .await
        } else {
            gate.guard(&id).replay().run(counted(&runs, "r_2")).await
        };
        assert!(
            matches!(late, Err(Rejected::ValueNotKept)),
            "windowed caller {windowed}: the value was handed out past its window: {late:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------
// 6. Hostile windows
// ---------------------------------------------------------------------

/// Promise: any window above zero is accepted; a 1 ns slot window is over
/// by the next call (it never rounds to "for ever"), and a 1 ns value
/// window is past by the next replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_nanosecond_window_is_accepted_and_over_by_the_next_call() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = Identity::new("hostile").part("slot_1ns");
    let guard = || gate.guard(&id).keep_slot_for(Duration::from_nanos(1));
    let first = guard().run(counted(&runs, "a")).await;
    assert!(first.is_ok(), "{first:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = guard().run(counted(&runs, "b")).await;
    assert!(
        second.is_ok(),
        "a 1 ns slot window held the slot: {second:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let id = Identity::new("hostile").part("value_1ns");
    let guard = || {
        gate.guard(&id)
            .replay()
            .keep_value_for(Duration::from_nanos(1))
    };
    assert!(guard().run(counted(&runs, "v")).await.is_ok());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let late = guard().run(counted(&runs, "w")).await;
    assert!(
        matches!(late, Err(Rejected::ValueNotKept)),
        "a 1 ns value window still handed out the value: {late:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// Promise: a window over `MAX_WINDOW` (`Duration::MAX`, `MAX_WINDOW` + 1
/// ns) is refused `InvalidOption` naming the option, before any statement
/// (counted through the proxy), and without a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_past_the_maximum_are_refused_before_any_statement() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(crate::support::proxy::pool_through(&proxy).await).await;
    let id = Identity::new("hostile").part("max");
    for window in [
        Duration::MAX,
        idem::MAX_WINDOW + Duration::from_nanos(1),
        idem::MAX_WINDOW + Duration::from_micros(1),
    ] {
        for option in ["keep_value_for", "keep_slot_for"] {
            let before = proxy.executions();
            let refused = match option {
                "keep_value_for" => {
                    gate.guard(&id)
                        .keep_value_for(window)
                        .run(async { Ok::<_, Rejected>(()) })
                        .await
                }
                _ => {
                    gate.guard(&id)
                        .keep_slot_for(window)
                        .run(async { Ok::<_, Rejected>(()) })
                        .await
                }
            };
            match refused {
                Err(Rejected::InvalidOption { option: named, .. }) => {
                    assert_eq!(named, option, "{window:?}")
                }
                other => panic!("{option}({window:?}): {other:?}"),
            }
            assert_eq!(
                proxy.executions(),
                before,
                "{option}({window:?}) ran a statement before refusing"
            );
        }
    }
    // Nothing was claimed.
    assert!(
        gate.guard(&id)
            .run(async { Ok::<_, Rejected>(()) })
            .await
            .is_ok()
    );
}

/// Promise: exactly `MAX_WINDOW` is accepted, holds the slot and the value,
/// and no prune deletes it, not even one with a cut-off two centuries
/// ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_maximum_window_is_accepted_and_survives_every_prune() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let id = Identity::new("hostile").part("exact_max");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = || {
        gate.guard(&id)
            .replay()
            .keep_value_for(idem::MAX_WINDOW)
            .keep_slot_for(idem::MAX_WINDOW)
    };
    let first = guard().run(counted(&runs, "r_1")).await;
    assert_eq!(first.as_deref().ok(), Some("r_1"), "{first:?}");
    let pool = gate.pool();
    for filter in [
        PruneFilter::expired().account(account.as_str()),
        PruneFilter::new(SystemTime::now() + Duration::from_secs(200 * 366 * 24 * 3600))
            .account(account.as_str()),
    ] {
        assert_eq!(operations::prune(pool, &filter).await.expect("prune"), 0);
    }
    assert_eq!(
        guard().run(counted(&runs, "r_2")).await.ok().as_deref(),
        Some("r_1")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Promise: pending and in-doubt claims are never pruned, whatever their
/// window and the cut-off, and a kept failure without a window is never
/// pruned either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_never_takes_a_pending_windowed_claim_nor_a_kept_failure_without_one() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let pending = Identity::new("prune_held").part("pending");
    let failed = Identity::new("prune_held").part("failed");
    let claim = gate
        .guard(&pending)
        .keep_slot_for(WINDOW)
        .claim()
        .await
        .expect("won");
    let kept = gate
        .guard(&failed)
        .disposition(|_: &Rejected| Disposition::Keep)
        .run(async { Err::<(), Rejected>(Rejected::InFlight) })
        .await;
    assert!(kept.is_err());
    past_the_window().await;
    let pool = gate.pool();
    for filter in [
        PruneFilter::expired().account(account.as_str()),
        PruneFilter::new(SystemTime::now() + Duration::from_secs(3600)).account(account.as_str()),
    ] {
        assert_eq!(operations::prune(pool, &filter).await.expect("prune"), 0);
    }
    assert!(matches!(
        gate.guard(&pending)
            .keep_slot_for(WINDOW)
            .run(async { Ok::<_, Rejected>(()) })
            .await,
        Err(Rejected::InFlight)
    ));
    assert!(matches!(
        gate.guard(&failed)
            .run(async { Ok::<_, Rejected>(()) })
            .await,
        Err(Rejected::AlreadyFailed)
    ));
    claim.settle().await.expect("settle");
}
