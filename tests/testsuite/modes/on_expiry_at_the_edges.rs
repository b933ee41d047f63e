//! "A claim's `on_expiry` is recorded with the claim, and the stricter side
//! wins" (`src/idempotent.md` `on_expiry`, `OnExpiry`, `Guard::on_expiry`,
//! docs/operations.md, CHANGELOG "Modes"), at its edges, as the docs alone
//! promise it: every claim form, chains of holders, late holders, batches,
//! ordered events, waiters, transactions, the reconciler and the operator's
//! tools.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::batch::Batch;
use idem::operations::{self, Resolved, Slot};
use idem::reconcile::{Reconciler, Verdict};
use idem::sqlx;
use idem::testing::{self, race};
use idem::{Detached, Disposition, Gate, Identity, OnExpiry, Outcome, Rejected, idempotent};
use idem_test_support::rows;
use tokio::sync::Notify;

const LEASE: Duration = Duration::from_millis(200);

/// Long enough for `LEASE` to have run out, with room for a loaded machine.
async fn expire() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

fn ident(action: &str, key: &str) -> Identity {
    Identity::new(action).part(key)
}

/// A gate on a small pool of its own, in the account of `gate`: another
/// process, as far as attaching goes.
async fn elsewhere(gate: &Gate) -> Gate {
    testing::gate_on(testing::pool_with(3).await)
        .await
        .account(gate.account_name())
}

/// Claims `id` with `LEASE` (and `policy`, when given) and lets the holder
/// vanish without a word. Returns the claim's fence.
async fn abandon(gate: &Gate, id: &Identity, policy: Option<OnExpiry>) -> i64 {
    let claim = match policy {
        Some(policy) => gate.guard(id).lease(LEASE).on_expiry(policy).claim().await,
        None => gate.guard(id).lease(LEASE).claim().await,
    }
    .expect("the first claim is won");
    let fence = claim.fence().expect("gated");
    crate::support::holders::vanish(claim);
    fence
}

/// The row's recorded policy column (`expires_in_doubt`, docs/operations.md).
async fn policy_column(gate: &Gate, address: &str) -> Option<bool> {
    sqlx::query_scalar::<_, Option<bool>>(
        "SELECT expires_in_doubt FROM idem_records WHERE account = $1 AND kind = 'claim' \
         AND address = $2 AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("read expires_in_doubt")
    .flatten()
}

async fn fence_of(gate: &Gate, address: &str) -> Option<i64> {
    sqlx::query_scalar::<_, i64>(
        "SELECT fence FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2 \
         AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("read fence")
}

/// A run of `id` with `policy` (`None`: lease, no on_expiry; the body counts).
async fn leased_run(
    gate: &Gate,
    id: &Identity,
    policy: Option<OnExpiry>,
    runs: &AtomicUsize,
) -> Result<(), Rejected> {
    let body = async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    };
    match policy {
        Some(policy) => {
            gate.guard(id)
                .lease(LEASE)
                .on_expiry(policy)
                .run(body)
                .await
        }
        None => gate.guard(id).lease(LEASE).run(body).await,
    }
}

fn reason<T>(result: &Result<T, Rejected>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(rejected) => rejected.reason(),
    }
}

type Boxed<'a> = Pin<Box<dyn Future<Output = Result<(), Rejected>> + 'a>>;

// ---------------------------------------------------------------------
// Races
// ---------------------------------------------------------------------

/// Promise: "a duplicate that finds the lease run out holds the slot in
/// doubt when either the claim or the duplicate says in_doubt"; a
/// duplicate with no lease at all counts as take_over. Eighteen duplicates
/// of every form, fired at one instant, on this gate and on another: nobody
/// runs, everyone is refused InDoubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_race_of_every_form_against_an_expired_in_doubt_claim_runs_nobody() {
    let gate = testing::gate_on(testing::pool_with(8).await).await;
    let other = elsewhere(&gate).await;
    let id = ident("rt_exp_race", "ord_1");
    abandon(&gate, &id, Some(OnExpiry::InDoubt)).await;
    expire().await;

    let runs = AtomicUsize::new(0);
    let which = AtomicUsize::new(0);
    let report = race(18, || -> Boxed<'_> {
        let (gate, other, id, runs) = (&gate, &other, &id, &runs);
        let body = async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        };
        match which.fetch_add(1, Ordering::SeqCst) % 9 {
            0 => Box::pin(
                gate.guard(id)
                    .lease(LEASE)
                    .on_expiry(OnExpiry::TakeOver)
                    .run(body),
            ),
            1 => Box::pin(
                gate.guard(id)
                    .lease(LEASE)
                    .on_expiry(OnExpiry::InDoubt)
                    .run(body),
            ),
            2 => Box::pin(gate.guard(id).run(body)),
            3 => Box::pin(other.guard(id).lease(LEASE).run(body)),
            4 => Box::pin(async move {
                let claim = gate.guard(id).lease(LEASE).claim().await?;
                runs.fetch_add(1, Ordering::SeqCst);
                claim.settle().await
            }),
            5 => Box::pin(async move {
                let batch = Batch::from_iter([((), id.clone())]);
                let mut results = gate
                    .guard_batch(batch)
                    .lease(Duration::from_secs(30))
                    .run(|()| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Rejected>(())
                    })
                    .await;
                results.remove(0)
            }),
            6 => Box::pin(async move {
                let batch = Batch::from_iter([((), id.clone())]);
                let mut results = other
                    .guard_batch(batch)
                    .run(|()| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Rejected>(())
                    })
                    .await;
                results.remove(0)
            }),
            7 => Box::pin(
                gate.guard(id)
                    .lease(LEASE)
                    .wait(Duration::from_secs(2))
                    .run(body),
            ),
            _ => Box::pin(async move {
                match gate
                    .guard(id)
                    .replay()
                    .lease(LEASE)
                    .claim_or_replay::<u32>()
                    .await?
                {
                    idem::ClaimOrReplay::Won(claim) => {
                        runs.fetch_add(1, Ordering::SeqCst);
                        claim.settle_value(&7_u32).await
                    }
                    idem::ClaimOrReplay::Replayed(_) => Ok(()),
                }
            }),
        }
    })
    .await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the stricter side wins: a duplicate ran an expired claim made in_doubt: {report}"
    );
    for invocation in &report.invocations {
        assert!(
            matches!(invocation.refusal(), Some(Rejected::InDoubt)),
            "every duplicate of an expired in_doubt claim is refused InDoubt: {report}"
        );
    }
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("in_doubt"),
        "the row turns in_doubt"
    );
}

/// The converse race: a claim made take_over, sixteen take_over duplicates
/// and one in_doubt duplicate at once. Either exactly one takes it over and
/// runs (a higher fence) while everyone else is InFlight, or the slot ends
/// in doubt and nobody runs; never two runs, never a run over an in_doubt row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn take_over_and_in_doubt_duplicates_racing_for_a_take_over_claim_never_both_win() {
    let gate = testing::gate_on(testing::pool_with(8).await).await;
    for round in 0..4 {
        let id = ident("rt_exp_race_mixed", &format!("ord_{round}"));
        let first = abandon(&gate, &id, None).await;
        expire().await;
        let runs = AtomicUsize::new(0);
        let which = AtomicUsize::new(0);
        let hold = Notify::new();
        let report = race(17, || {
            let policy = if which.fetch_add(1, Ordering::SeqCst) == 8 {
                OnExpiry::InDoubt
            } else {
                OnExpiry::TakeOver
            };
            let (runs, hold) = (&runs, &hold);
            gate.guard(&id)
                .lease(Duration::from_secs(30))
                .on_expiry(policy)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Hold the slot until everyone was answered.
                    let _ = tokio::time::timeout(Duration::from_millis(500), hold.notified()).await;
                    Ok::<_, Rejected>(())
                })
        })
        .await;
        let ran = runs.load(Ordering::SeqCst);
        let state = rows::row_state(&gate, &id.address()).await;
        match ran {
            0 => assert_eq!(
                state.as_deref(),
                Some("in_doubt"),
                "round {round}: nobody ran, so the in_doubt duplicate held it: {report}"
            ),
            1 => {
                assert_eq!(state.as_deref(), Some("success"), "round {round}: {report}");
                assert!(
                    fence_of(&gate, &id.address()).await.unwrap_or(0) > first,
                    "round {round}: a takeover runs with a higher fence"
                );
                assert!(
                    report.invocations.iter().all(|i| i.refusal().is_none()
                        || matches!(i.refusal(), Some(Rejected::InFlight))),
                    "round {round}: once taken over, every other duplicate is in flight: {report}"
                );
            }
            more => panic!("round {round}: {more} bodies ran for one expired claim: {report}"),
        }
    }
}

// ---------------------------------------------------------------------
// Late holders
// ---------------------------------------------------------------------

/// Promise (`Claim::settle`): "A claim its lease turned in doubt (nobody
/// took it over) is settled with this success ... and Ok is returned";
/// here the claim said take_over and the duplicate's in_doubt turned it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_claim_turned_in_doubt_by_an_in_doubt_retry_takes_its_holder_s_late_success() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_late", "settle");
    let holder = gate
        .guard(&id)
        .lease(LEASE)
        .on_expiry(OnExpiry::TakeOver)
        .claim()
        .await
        .expect("won");
    expire().await;
    let runs = AtomicUsize::new(0);
    let retry = leased_run(&gate, &id, Some(OnExpiry::InDoubt), &runs).await;
    assert!(
        matches!(retry, Err(Rejected::InDoubt)),
        "an in_doubt retry holds an expired take_over claim in doubt: {retry:?}"
    );
    let settled = holder.settle().await;
    assert!(
        settled.is_ok(),
        "the slow holder's late success over its claim turned in doubt is Ok: {settled:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
    let again = leased_run(&gate, &id, None, &runs).await;
    assert!(
        matches!(again, Err(Rejected::AlreadyDone)),
        "a late success is never lost: {again:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nobody ran it a second time"
    );
}

/// Promise (on_expiry): "A holder that was only slow ... then succeeds
/// records its success over the hold, and its caller gets the body's
/// value: not LeaseLost". Through `Guard::run`, with the claim made
/// take_over and turned in doubt by the duplicate's own policy, and with
/// the claim made in_doubt and turned by a take_over duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_run_whose_claim_was_turned_in_doubt_returns_its_value_whichever_side_said_so() {
    let gate = testing::gate().await;
    for (key, holder_policy, retry_policy) in [
        ("claim_take_over", OnExpiry::TakeOver, OnExpiry::InDoubt),
        ("claim_in_doubt", OnExpiry::InDoubt, OnExpiry::TakeOver),
    ] {
        let id = ident("rt_exp_slow_run", key);
        let entered = Notify::new();
        let go = Notify::new();
        let holder = gate
            .guard(&id)
            .lease(LEASE)
            .on_expiry(holder_policy)
            .run(async {
                entered.notify_one();
                go.notified().await;
                Ok::<_, Rejected>("the holder's value")
            });
        let runs = AtomicUsize::new(0);
        let retry = async {
            entered.notified().await;
            expire().await;
            let retry = leased_run(&gate, &id, Some(retry_policy), &runs).await;
            go.notify_one();
            retry
        };
        let (held, retried) = tokio::join!(holder, retry);
        assert!(
            matches!(retried, Err(Rejected::InDoubt)),
            "{key}: the duplicate is refused InDoubt: {retried:?}"
        );
        assert!(
            matches!(held, Ok("the holder's value")),
            "{key}: a slow holder whose claim was turned in doubt gets its body's value: {held:?}"
        );
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("success"),
            "{key}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{key}");
    }
}

/// Promise: the old holder's late release "changes nothing"; `Claim::release`:
/// "A claim somebody else recorded meanwhile is left as it is, with
/// NotRecorded"; `dispose`: a claim whose "lease ran out under
/// on_expiry = in_doubt" is left as it is, NotRecorded. With both
/// policy mixes: the slot stays in doubt, no retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_or_dispose_of_a_claim_turned_in_doubt_leaves_it_in_doubt() {
    let gate = testing::gate().await;
    for (n, (holder_policy, retry_policy, how)) in [
        (OnExpiry::InDoubt, OnExpiry::TakeOver, Disposition::Release),
        (OnExpiry::TakeOver, OnExpiry::InDoubt, Disposition::Release),
        (OnExpiry::InDoubt, OnExpiry::TakeOver, Disposition::Keep),
        (OnExpiry::TakeOver, OnExpiry::InDoubt, Disposition::Keep),
    ]
    .into_iter()
    .enumerate()
    {
        let id = ident("rt_exp_late_release", &format!("case_{n}"));
        let holder = gate
            .guard(&id)
            .lease(LEASE)
            .on_expiry(holder_policy)
            .claim()
            .await
            .expect("won");
        expire().await;
        let runs = AtomicUsize::new(0);
        let retry = leased_run(&gate, &id, Some(retry_policy), &runs).await;
        assert!(
            matches!(retry, Err(Rejected::InDoubt)),
            "case {n}: {retry:?}"
        );
        let late = match how {
            Disposition::Release => holder.release().await,
            other => holder.dispose(other).await,
        };
        assert!(
            matches!(late, Err(Rejected::NotRecorded { .. })),
            "case {n} ({holder_policy:?} claim, {retry_policy:?} retry, late {how:?}): a late \
             failure on a claim its lease turned in doubt is told NotRecorded: {late:?}"
        );
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("in_doubt"),
            "case {n}: the late holder's failure changes nothing: the slot stays in doubt"
        );
        let again = leased_run(&gate, &id, None, &runs).await;
        assert!(
            matches!(again, Err(Rejected::InDoubt)),
            "case {n}: {again:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "case {n}: nobody ran it");
    }
}

// ---------------------------------------------------------------------
// Chains
// ---------------------------------------------------------------------

/// take_over claim A, taken over by take_over B (higher fence); B vanishes;
/// an in_doubt retry C finds B run out: held in doubt; then A's late
/// success is kept (LeaseLost), B's late success is told NotRecorded, and
/// nothing runs a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_takeover_then_a_vanished_taker_then_an_in_doubt_retry() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_chain", "ord_1");
    let a = gate.guard(&id).lease(LEASE).claim().await.expect("A wins");
    let a_fence = a.fence().expect("gated");
    expire().await;
    let b = gate
        .guard(&id)
        .lease(LEASE)
        .on_expiry(OnExpiry::TakeOver)
        .claim()
        .await
        .expect("B takes over A's expired take_over claim");
    let b_fence = b.fence().expect("gated");
    assert!(b_fence > a_fence, "a takeover has a higher fence");
    assert_eq!(
        policy_column(&gate, &id.address()).await,
        None,
        "B's take_over policy is recorded"
    );
    expire().await;
    let runs = AtomicUsize::new(0);
    let c = leased_run(&gate, &id, Some(OnExpiry::InDoubt), &runs).await;
    assert!(matches!(c, Err(Rejected::InDoubt)), "C: {c:?}");
    let d = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(d, Err(Rejected::InDoubt)),
        "D, a take_over retry of a row in doubt: {d:?}"
    );
    let a_late = a.settle().await;
    assert!(
        matches!(a_late, Err(Rejected::LeaseLost { .. })),
        "A's late settle reports LeaseLost: {a_late:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "A's late success is recorded (never lost)"
    );
    let b_late = b.settle().await;
    assert!(
        matches!(b_late, Err(Rejected::NotRecorded { .. })),
        "B, whose row A's late success settled, is told NotRecorded: {b_late:?}"
    );
    let e = leased_run(&gate, &id, None, &runs).await;
    assert!(matches!(e, Err(Rejected::AlreadyDone)), "E: {e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A take_over claim taken over by a take_over retry is still taken over
/// when its taker vanishes and another take_over retry comes: the stricter
/// rule must not leak into chains where nobody said in_doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_where_nobody_says_in_doubt_is_still_taken_over_each_time() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_chain_take", "ord_1");
    let mut last = abandon(&gate, &id, None).await;
    for step in 0..2 {
        expire().await;
        let claim = gate
            .guard(&id)
            .lease(LEASE)
            .on_expiry(OnExpiry::TakeOver)
            .claim()
            .await;
        let claim = claim.unwrap_or_else(|refused| {
            panic!("step {step}: a take_over claim is still taken over: {refused:?}")
        });
        let fence = claim.fence().expect("gated");
        assert!(fence > last, "step {step}: higher fence");
        last = fence;
        crate::support::holders::vanish(claim);
    }
    expire().await;
    let runs = AtomicUsize::new(0);
    let last_run = leased_run(&gate, &id, None, &runs).await;
    assert_eq!(reason(&last_run), "ok", "{last_run:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `Claim::extend` keeps an in_doubt claim alive (a take_over duplicate is
/// in flight past the first lease), the renewal keeps its policy, and once
/// the renewed lease runs out a take_over duplicate holds it in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_claim_extended_then_expiring_is_held_in_doubt() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_extend", "ord_1");
    let claim = gate
        .guard(&id)
        .lease(Duration::from_millis(300))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(100)).await;
    claim
        .extend(Duration::from_millis(900))
        .await
        .expect("extend a live claim");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let runs = AtomicUsize::new(0);
    let during = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(during, Err(Rejected::InFlight)),
        "Claim::extend keeps the claim alive past its first lease: {during:?}"
    );
    assert_eq!(
        policy_column(&gate, &id.address()).await,
        Some(true),
        "the renewal keeps the claim's policy"
    );
    crate::support::holders::vanish(claim);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(after, Err(Rejected::InDoubt)),
        "an extended in_doubt claim that then expires is held in doubt: {after:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A claim turned in doubt (nobody took it over) whose holder then tries to
/// extend it: nobody may run it meanwhile; whatever `extend` answers, a
/// duplicate must not run the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_a_claim_already_turned_in_doubt_lets_no_duplicate_run() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_extend_late", "ord_1");
    let claim = gate
        .guard(&id)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    expire().await;
    let runs = AtomicUsize::new(0);
    let turned = leased_run(&gate, &id, None, &runs).await;
    assert!(matches!(turned, Err(Rejected::InDoubt)), "{turned:?}");
    let extended = claim.extend(Duration::from_millis(300)).await;
    let state = rows::row_state(&gate, &id.address()).await;
    eprintln!("extend of a claim turned in doubt: {extended:?}, row {state:?}");
    expire().await;
    let after = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(after, Err(Rejected::InDoubt)),
        "a claim turned in doubt stays held after its holder's extend ({extended:?}, row \
         {state:?}): {after:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A claim released, then claimed again with the other policy: the new
/// claim's policy, not the old one's, is what the next expiry goes by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_released_and_claimed_again_goes_by_the_new_claim_s_policy() {
    let gate = testing::gate().await;
    // in_doubt, released, then take_over: taken over.
    let id = ident("rt_exp_reclaim", "to_take_over");
    gate.guard(&id)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won")
        .release()
        .await
        .expect("released");
    let fence = abandon(&gate, &id, Some(OnExpiry::TakeOver)).await;
    expire().await;
    let taken = gate.guard(&id).lease(LEASE).claim().await;
    let taken = taken.unwrap_or_else(|refused| {
        panic!("a claim re-made take_over after an in_doubt one was released is taken over: {refused:?}")
    });
    assert!(taken.fence().expect("gated") > fence);
    taken.settle().await.expect("settle");

    // take_over, released, then in_doubt: held.
    let id = ident("rt_exp_reclaim", "to_hold");
    gate.guard(&id)
        .lease(LEASE)
        .claim()
        .await
        .expect("won")
        .release()
        .await
        .expect("released");
    abandon(&gate, &id, Some(OnExpiry::InDoubt)).await;
    expire().await;
    let runs = AtomicUsize::new(0);
    let held = leased_run(&gate, &id, None, &runs).await;
    assert!(
        matches!(held, Err(Rejected::InDoubt)),
        "a claim re-made in_doubt after a take_over one was released is held: {held:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Past `keep_slot_for` the same key runs again "as a new action": the row
/// of the old outcome is reused, and the new claim's policy must be the one
/// recorded, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_run_again_past_its_window_goes_by_the_new_claim_s_policy() {
    let gate = testing::gate().await;
    let window = Duration::from_millis(300);
    for (key, first, second, held) in [
        (
            "take_over_then_in_doubt",
            OnExpiry::TakeOver,
            OnExpiry::InDoubt,
            true,
        ),
        (
            "in_doubt_then_take_over",
            OnExpiry::InDoubt,
            OnExpiry::TakeOver,
            false,
        ),
    ] {
        let id = ident("rt_exp_window", key);
        gate.guard(&id)
            .lease(LEASE)
            .on_expiry(first)
            .keep_slot_for(window)
            .claim()
            .await
            .expect("won")
            .settle()
            .await
            .expect("settled");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let again = gate
            .guard(&id)
            .lease(LEASE)
            .on_expiry(second)
            .keep_slot_for(window)
            .claim()
            .await
            .expect("past its window the key runs again");
        let fence = again.fence().expect("gated");
        crate::support::holders::vanish(again);
        assert_eq!(
            policy_column(&gate, &id.address()).await.unwrap_or(false),
            held,
            "{key}: the re-claim records its own policy"
        );
        expire().await;
        let retry = gate
            .guard(&id)
            .lease(LEASE)
            .on_expiry(OnExpiry::TakeOver)
            .keep_slot_for(window)
            .claim()
            .await;
        if held {
            assert!(
                matches!(retry, Err(Rejected::InDoubt)),
                "{key}: a re-claim made in_doubt is held: {:?}",
                retry.map(|c| c.fence())
            );
        } else {
            let retry = retry.unwrap_or_else(|refused| {
                panic!("{key}: a re-claim made take_over is taken over: {refused:?}")
            });
            assert!(retry.fence().expect("gated") > fence, "{key}");
            retry.settle().await.expect("settle");
        }
    }
}

// ---------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------

/// One batch over items whose claims were made with different policies:
/// each item is judged by its own claim's policy and the batch's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_claims_of_different_policies_judges_each_by_its_own() {
    let gate = testing::gate().await;
    let doubt = ident("rt_exp_batch_mix", "made_in_doubt");
    let take = ident("rt_exp_batch_mix", "made_take_over");
    let fresh = ident("rt_exp_batch_mix", "fresh");
    abandon(&gate, &doubt, Some(OnExpiry::InDoubt)).await;
    abandon(&gate, &take, Some(OnExpiry::TakeOver)).await;
    expire().await;
    let runs = std::sync::Mutex::new(Vec::<String>::new());
    let batch = Batch::from_iter([
        ("made_in_doubt", doubt.clone()),
        ("made_take_over", take.clone()),
        ("fresh", fresh.clone()),
        // The same identity twice: the second copy of a slot in doubt.
        ("made_in_doubt", doubt.clone()),
    ]);
    let results = gate
        .guard_batch(batch)
        .lease(Duration::from_secs(30))
        .on_expiry(OnExpiry::TakeOver)
        .run(|key| {
            let runs = &runs;
            async move {
                runs.lock().unwrap().push(key.to_owned());
                Ok::<_, Rejected>(key)
            }
        })
        .await;
    let said: Vec<&str> = results.iter().map(reason).collect();
    assert_eq!(
        said,
        ["in_doubt", "ok", "ok", "in_doubt"],
        "a take_over batch: the in_doubt claim is held (twice), the take_over one taken over: \
         {results:?}"
    );
    assert_eq!(
        *runs.lock().unwrap(),
        ["made_take_over", "fresh"],
        "only the take_over claim and the fresh item ran"
    );

    // A batch saying in_doubt over an expired take_over claim holds it.
    let take2 = ident("rt_exp_batch_mix", "made_take_over_2");
    abandon(&gate, &take2, None).await;
    expire().await;
    let batch = Batch::from_iter([("made_take_over_2", take2.clone())]);
    let results = gate
        .guard_batch(batch)
        .lease(Duration::from_secs(30))
        .on_expiry(OnExpiry::InDoubt)
        .run(|key| async move { Ok::<_, Rejected>(key) })
        .await;
    assert!(
        matches!(results[0], Err(Rejected::InDoubt)),
        "an in_doubt batch holds an expired take_over claim: {results:?}"
    );
}

/// A batch claimed with `on_expiry(InDoubt)` whose consumer died mid-body
/// (its future dropped): its claims carry the batch's policy, so a single
/// take_over retry after the lease holds them in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_in_doubt_batch_s_claims_are_held_by_a_take_over_retry() {
    let gate = testing::gate().await;
    let a = ident("rt_exp_batch_drop", "a");
    let b = ident("rt_exp_batch_drop", "b");
    let batch = Batch::from_iter([("a", a.clone()), ("b", b.clone())]);
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        gate.guard_batch(batch)
            .lease(LEASE)
            .on_expiry(OnExpiry::InDoubt)
            .concurrency(2)
            .run(|key| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, Rejected>(key)
            }),
    )
    .await;
    assert!(dropped.is_err(), "the batch's future was dropped mid-body");
    for id in [&a, &b] {
        assert_eq!(
            policy_column(&gate, &id.address()).await,
            Some(true),
            "a batch's claim records its in_doubt policy"
        );
    }
    expire().await;
    let runs = AtomicUsize::new(0);
    for id in [&a, &b] {
        let retry = leased_run(&gate, id, Some(OnExpiry::TakeOver), &runs).await;
        assert!(
            matches!(retry, Err(Rejected::InDoubt)),
            "a take_over retry of an expired in_doubt batch claim is refused InDoubt: {retry:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A batch item whose claim runs out while it waits for its turn (one body
/// at a time, the first one slow), found meanwhile by a take_over single
/// call: the batch's in_doubt policy holds it; the item's body never starts
/// ("Should the claim be lost already (taken over, turned in doubt,
/// released), its body does not start").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_item_that_expires_waiting_for_its_turn_is_neither_taken_over_nor_run() {
    let gate = testing::gate().await;
    let slow = ident("rt_exp_batch_turn", "slow");
    let queued = ident("rt_exp_batch_turn", "queued");
    let ran = std::sync::Mutex::new(Vec::<&str>::new());
    let batch = Batch::from_iter([("slow", slow.clone()), ("queued", queued.clone())]);
    let batch_run = gate
        .guard_batch(batch)
        .lease(Duration::from_millis(300))
        .on_expiry(OnExpiry::InDoubt)
        .concurrency(1)
        .run(|key| {
            let ran = &ran;
            async move {
                ran.lock().unwrap().push(key);
                if key == "slow" {
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                }
                Ok::<_, Rejected>(key)
            }
        });
    let runs = AtomicUsize::new(0);
    let single = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        leased_run(&gate, &queued, Some(OnExpiry::TakeOver), &runs).await
    };
    let (results, single) = tokio::join!(batch_run, single);
    assert!(
        matches!(single, Err(Rejected::InDoubt)),
        "a take_over single call finding the batch's expired in_doubt claim is refused InDoubt: \
         {single:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the single call never ran");
    assert_eq!(
        *ran.lock().unwrap(),
        ["slow"],
        "the queued item's body never started on a claim turned in doubt: {results:?}"
    );
    assert!(
        matches!(results[1], Err(Rejected::InDoubt)),
        "the queued item is refused InDoubt: {results:?}"
    );
}

// ---------------------------------------------------------------------
// Ordered events
// ---------------------------------------------------------------------

async fn event(
    gate: &Gate,
    event: &Identity,
    entity: &Identity,
    order: i64,
    policy: Option<OnExpiry>,
    runs: &AtomicUsize,
) -> Result<(), Rejected> {
    let body = async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    };
    match policy {
        Some(policy) => {
            gate.guard(event)
                .ordered(entity, order)
                .lease(LEASE)
                .on_expiry(policy)
                .run(body)
                .await
        }
        None => gate.guard(event).ordered(entity, order).run(body).await,
    }
}

/// An event claimed in_doubt whose holder vanished: its own take_over (or
/// unleased) retry holds it in doubt, and the entity stays held (later and
/// earlier events refused, never run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_in_doubt_event_keeps_its_entity_held_against_take_over_retries() {
    let gate = testing::gate().await;
    let entity = ident("rt_exp_entity", "sub_1");
    let e2 = ident("rt_exp_event", "evt_2");
    let claim = gate
        .guard(&e2)
        .ordered(&entity, 2_i64)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    crate::support::holders::vanish(claim);
    expire().await;
    let runs = AtomicUsize::new(0);
    let e3 = ident("rt_exp_event", "evt_3");
    let e1 = ident("rt_exp_event", "evt_1");
    let newer = event(&gate, &e3, &entity, 3, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(newer, Err(Rejected::InFlight)),
        "a newer event of an entity held by an expired event is in flight: {newer:?}"
    );
    let own = event(&gate, &e2, &entity, 2, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(own, Err(Rejected::InDoubt)),
        "the event's own take_over retry holds it in doubt: {own:?}"
    );
    let unleased = event(&gate, &e2, &entity, 2, None, &runs).await;
    assert!(matches!(unleased, Err(Rejected::InDoubt)), "{unleased:?}");
    for (id, order) in [(&e3, 3), (&e1, 1)] {
        let other = event(&gate, id, &entity, order, Some(OnExpiry::TakeOver), &runs).await;
        assert!(
            matches!(other, Err(Rejected::InFlight)),
            "an outcome in doubt holds the entity: event {order} is refused InFlight: {other:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no event ran");
}

/// An ordered event claimed take_over whose own retry says in_doubt: held
/// in doubt, entity held; and an event released then re-claimed with the
/// other policy goes by the new policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_event_re_claimed_with_the_other_policy_goes_by_the_new_one() {
    let gate = testing::gate().await;
    let entity = ident("rt_exp_entity", "sub_2");
    let e1 = ident("rt_exp_event2", "evt_1");
    // take_over, released (a failure: nothing applied), then in_doubt.
    gate.guard(&e1)
        .ordered(&entity, 1_i64)
        .lease(LEASE)
        .claim()
        .await
        .expect("won")
        .release()
        .await
        .expect("released");
    let claim = gate
        .guard(&e1)
        .ordered(&entity, 1_i64)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won again");
    crate::support::holders::vanish(claim);
    expire().await;
    let runs = AtomicUsize::new(0);
    let held = event(&gate, &e1, &entity, 1, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(held, Err(Rejected::InDoubt)),
        "an event re-claimed in_doubt is held by a take_over retry: {held:?}"
    );

    // in_doubt, released, then take_over: taken over.
    let entity = ident("rt_exp_entity", "sub_3");
    let e1 = ident("rt_exp_event3", "evt_1");
    gate.guard(&e1)
        .ordered(&entity, 1_i64)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won")
        .release()
        .await
        .expect("released");
    let claim = gate
        .guard(&e1)
        .ordered(&entity, 1_i64)
        .lease(LEASE)
        .claim()
        .await
        .expect("won again");
    crate::support::holders::vanish(claim);
    expire().await;
    let taken = event(&gate, &e1, &entity, 1, Some(OnExpiry::TakeOver), &runs).await;
    assert_eq!(
        reason(&taken),
        "ok",
        "an event re-claimed take_over is taken over by its take_over retry: {taken:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A batch of ordered events saying take_over, over an event whose claim
/// was made in_doubt and ran out: held in doubt, and the entity's newer
/// event in the same batch is not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ordered_events_holds_an_expired_in_doubt_event_and_its_entity() {
    let gate = testing::gate().await;
    let entity = ident("rt_exp_entity", "sub_4");
    let e1 = ident("rt_exp_event4", "evt_1");
    let e2 = ident("rt_exp_event4", "evt_2");
    let claim = gate
        .guard(&e1)
        .ordered(&entity, 1_i64)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    crate::support::holders::vanish(claim);
    expire().await;
    let ran = std::sync::Mutex::new(Vec::<&str>::new());
    let mut batch = Batch::new();
    batch.push_ordered("evt_1", e1.clone(), &entity, 1_i64);
    batch.push_ordered("evt_2", e2.clone(), &entity, 2_i64);
    let results = gate
        .guard_batch(batch)
        .lease(Duration::from_secs(30))
        .run(|key| {
            let ran = &ran;
            async move {
                ran.lock().unwrap().push(key);
                Ok::<_, Rejected>(())
            }
        })
        .await;
    assert!(
        matches!(results[0], Err(Rejected::InDoubt)),
        "the expired in_doubt event is held in doubt: {results:?}"
    );
    assert!(
        ran.lock().unwrap().is_empty(),
        "no event of an entity held in doubt ran: {:?} {results:?}",
        ran.lock().unwrap()
    );
}

// ---------------------------------------------------------------------
// Waiters, transactions, the attribute, detached runs
// ---------------------------------------------------------------------

/// A take_over duplicate that waits on an in_doubt holder of this process
/// (attached) or of another (polling): when the holder's lease runs out it
/// must be told InDoubt, never take the claim over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_waiter_on_an_in_doubt_holder_whose_lease_runs_out_is_told_in_doubt() {
    let gate = testing::gate().await;
    let other = elsewhere(&gate).await;
    for (n, waiter_gate) in [&gate, &other].into_iter().enumerate() {
        let id = ident("rt_exp_wait", &format!("ord_{n}"));
        let entered = Notify::new();
        let go = Notify::new();
        let holder = gate
            .guard(&id)
            .lease(Duration::from_millis(300))
            .on_expiry(OnExpiry::InDoubt)
            .run(async {
                entered.notify_one();
                go.notified().await;
                Ok::<_, Rejected>(())
            });
        let runs = AtomicUsize::new(0);
        let waiting = async {
            entered.notified().await;
            let started = Instant::now();
            let waited = waiter_gate
                .guard(&id)
                .lease(Duration::from_secs(30))
                .on_expiry(OnExpiry::TakeOver)
                .wait(Duration::from_secs(6))
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Rejected>(())
                })
                .await;
            let took = started.elapsed();
            go.notify_one();
            (waited, took)
        };
        let (held, (waited, took)) = tokio::join!(holder, waiting);
        assert!(
            matches!(waited, Err(Rejected::InDoubt)),
            "waiter {n}: a take_over waiter on an in_doubt claim that ran out is told InDoubt \
             (took {took:?}): {waited:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "waiter {n} ran the body");
        assert!(
            held.is_ok(),
            "waiter {n}: the slow holder gets its value: {held:?}"
        );
    }
}

/// A duplicate made inside a transaction counts as take_over: it holds an
/// expired in_doubt claim in doubt, and still takes over a take_over one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_duplicate_holds_an_in_doubt_claim_and_takes_over_a_take_over_one() {
    let gate = testing::gate().await;
    let doubt = ident("rt_exp_tx", "made_in_doubt");
    let take = ident("rt_exp_tx", "made_take_over");
    abandon(&gate, &doubt, Some(OnExpiry::InDoubt)).await;
    let fence = abandon(&gate, &take, None).await;
    expire().await;
    let runs = AtomicUsize::new(0);
    let mut tx = gate.pool().begin().await.expect("begin");
    let held = gate
        .guard(&doubt)
        .tx(&mut tx)
        .run(async |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await;
    tx.commit().await.expect("commit");
    assert!(
        matches!(held, Err(Rejected::InDoubt)),
        "a tx duplicate of an expired in_doubt claim is refused InDoubt: {held:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let mut tx = gate.pool().begin().await.expect("begin");
    let taken = gate
        .guard(&take)
        .tx(&mut tx)
        .run(async |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await;
    tx.commit().await.expect("commit");
    assert_eq!(
        reason(&taken),
        "ok",
        "a tx duplicate takes over an expired take_over claim: {taken:?}"
    );
    assert!(fence_of(&gate, &take.address()).await.unwrap_or(0) > fence);
    assert_eq!(
        rows::row_state(&gate, &doubt.address()).await.as_deref(),
        Some("in_doubt")
    );
}

#[idempotent(
    key = "order",
    action = "rt_exp_attr",
    lease = "200ms",
    on_expiry = "in_doubt"
)]
async fn charge_cautious(
    gate: &Gate,
    order: &str,
    runs: &AtomicUsize,
    hang: bool,
) -> Result<(), Rejected> {
    runs.fetch_add(1, Ordering::SeqCst);
    if hang {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    Ok(())
}

/// The deploy that dropped the option.
#[idempotent(key = "order", action = "rt_exp_attr", lease = "200ms")]
async fn charge_dropped_option(
    gate: &Gate,
    order: &str,
    runs: &AtomicUsize,
) -> Result<(), Rejected> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Another call site that never had a lease.
#[idempotent(key = "order", action = "rt_exp_attr")]
async fn charge_unleased(gate: &Gate, order: &str, runs: &AtomicUsize) -> Result<(), Rejected> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `on_expiry` (attribute): "A deploy that drops the option, or another
/// call site of the same action that never had it, cannot take over a
/// claim made with it".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_s_in_doubt_claim_is_held_by_a_deploy_without_the_option() {
    let gate = testing::gate().await;
    let runs = AtomicUsize::new(0);
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        charge_cautious(&gate, "ord_attr_1", &runs, true),
    )
    .await;
    assert!(cut.is_err(), "the first call was cut off mid-body");
    expire().await;
    let dropped = charge_dropped_option(&gate, "ord_attr_1", &runs).await;
    let unleased = charge_unleased(&gate, "ord_attr_1", &runs).await;
    assert!(
        matches!(dropped, Err(Rejected::InDoubt)),
        "a deploy that dropped on_expiry cannot take over: {dropped:?}"
    );
    assert!(
        matches!(unleased, Err(Rejected::InDoubt)),
        "an unleased call site is refused InDoubt: {unleased:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the first call ran");
}

/// A detached run made with `on_expiry(InDoubt)` records its policy, and
/// keeps it across its own renewals (every third of its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_run_records_and_keeps_its_in_doubt_policy() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_detached", "ord_1");
    let detached = Detached::with_bound(Duration::from_secs(10));
    let go = Arc::new(Notify::new());
    let running = {
        let (gate, id, detached, go) = (gate.clone(), id.clone(), detached.clone(), go.clone());
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(Duration::from_millis(300))
                .on_expiry(OnExpiry::InDoubt)
                .run_detached(&detached, async move {
                    go.notified().await;
                    Ok::<_, Rejected>(())
                })
                .await
        })
    };
    // Past two renewals.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        policy_column(&gate, &id.address()).await,
        Some(true),
        "a detached run's claim records (and its renewals keep) on_expiry = in_doubt"
    );
    let runs = AtomicUsize::new(0);
    let during = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(during, Err(Rejected::InFlight)),
        "a renewed detached claim is in flight: {during:?}"
    );
    go.notify_one();
    let done = running.await.expect("joined");
    assert!(done.is_ok(), "{done:?}");
    detached.shutdown(Duration::from_secs(1)).await;
}

/// Every claim form records the policy: `claim`, `claim_or_replay`, `run`,
/// an ordered event, a batch item, a batch of ordered events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_form_records_an_in_doubt_policy_and_none_for_take_over() {
    let gate = testing::gate().await;
    for (policy, expected) in [(OnExpiry::InDoubt, Some(true)), (OnExpiry::TakeOver, None)] {
        let tag = format!("{policy:?}");
        let by_hand = ident("rt_exp_forms_claim", &tag);
        let c = gate
            .guard(&by_hand)
            .lease(LEASE)
            .on_expiry(policy)
            .claim()
            .await
            .expect("won");
        assert_eq!(
            policy_column(&gate, &by_hand.address()).await,
            expected,
            "claim {tag}"
        );
        crate::support::holders::vanish(c);

        let replayed = ident("rt_exp_forms_replay", &tag);
        match gate
            .guard(&replayed)
            .replay()
            .lease(LEASE)
            .on_expiry(policy)
            .claim_or_replay::<u32>()
            .await
            .expect("won")
        {
            idem::ClaimOrReplay::Won(c) => {
                assert_eq!(
                    policy_column(&gate, &replayed.address()).await,
                    expected,
                    "claim_or_replay {tag}"
                );
                crate::support::holders::vanish(c);
            }
            idem::ClaimOrReplay::Replayed(v) => panic!("nothing to replay: {v}"),
        }

        let entity = ident("rt_exp_forms_entity", &tag);
        let ev = ident("rt_exp_forms_event", &tag);
        let c = gate
            .guard(&ev)
            .ordered(&entity, 1_i64)
            .lease(LEASE)
            .on_expiry(policy)
            .claim()
            .await
            .expect("won");
        assert_eq!(
            policy_column(&gate, &ev.address()).await,
            expected,
            "ordered {tag}"
        );
        crate::support::holders::vanish(c);

        let item = ident("rt_exp_forms_batch", &tag);
        let bentity = ident("rt_exp_forms_bentity", &tag);
        let bevent = ident("rt_exp_forms_bevent", &tag);
        let mut batch = Batch::new();
        batch.push("item", item.clone());
        batch.push_ordered("event", bevent.clone(), &bentity, 1_i64);
        let (g, i, e) = (&gate, &item, &bevent);
        let seen = std::sync::Mutex::new(Vec::new());
        let results = gate
            .guard_batch(batch)
            .lease(Duration::from_secs(30))
            .on_expiry(policy)
            .run(|which| {
                let seen = &seen;
                async move {
                    let address = if which == "item" {
                        i.address()
                    } else {
                        e.address()
                    };
                    let column = policy_column(g, &address).await;
                    seen.lock().unwrap().push((which, column));
                    Ok::<_, Rejected>(())
                }
            })
            .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        for (which, column) in seen.into_inner().unwrap() {
            assert_eq!(column, expected, "batch {which} {tag}");
        }
    }
}

// ---------------------------------------------------------------------
// The reconciler and the operator
// ---------------------------------------------------------------------

/// The reconciler lists an expired in_doubt-policy claim while it is still
/// pending ("lease_expired"); while its probe hangs, a take_over retry is
/// refused InDoubt (never runs); an Unknown leaves it held; NotHappened
/// then releases it, and the next retry runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_and_a_take_over_retry_racing_over_an_expired_in_doubt_claim() {
    let gate = testing::gate().await;
    let action = testing::unique_name("rt_exp_rec");
    let id = ident(&action, "ord_1");
    abandon(&gate, &id, Some(OnExpiry::InDoubt)).await;
    expire().await;

    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let unknown = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe(action.clone(), {
            let seen = seen.clone();
            move |doubt| {
                seen.lock()
                    .unwrap()
                    .push((doubt.state, doubt.reason.clone()));
                async { Verdict::Unknown }
            }
        });
    let pass = unknown.reconcile_once().await.expect("a pass");
    assert_eq!(
        pass.probed, 1,
        "an expired pending claim is probed: {pass:?}"
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0].1.as_deref(),
            Some("lease_expired"),
            "Doubt::reason of an expired pending claim is lease_expired: {seen:?}"
        );
    }
    let runs = AtomicUsize::new(0);
    let after_unknown = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
    assert!(
        matches!(after_unknown, Err(Rejected::InDoubt)),
        "Unknown leaves an in_doubt claim held against a take_over retry: {after_unknown:?}"
    );

    // A second claim: the retry races a probe that is still thinking.
    let id2 = ident(&action, "ord_2");
    abandon(&gate, &id2, Some(OnExpiry::InDoubt)).await;
    expire().await;
    let asked = Arc::new(Notify::new());
    let answer = Arc::new(Notify::new());
    let slow = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe(action.clone(), {
            let (asked, answer) = (asked.clone(), answer.clone());
            let id2 = id2.address();
            move |doubt| {
                let (asked, answer, mine) = (asked.clone(), answer.clone(), doubt.address == id2);
                async move {
                    if !mine {
                        return Verdict::Unknown;
                    }
                    asked.notify_one();
                    answer.notified().await;
                    Verdict::NotHappened
                }
            }
        });
    let reconciling = slow.reconcile_once();
    let retrying = async {
        asked.notified().await;
        let retry = leased_run(&gate, &id2, Some(OnExpiry::TakeOver), &runs).await;
        answer.notify_one();
        retry
    };
    let (pass, retry) = tokio::join!(reconciling, retrying);
    let pass = pass.expect("a pass");
    assert!(
        matches!(retry, Err(Rejected::InDoubt)),
        "a take_over retry racing the reconciler's probe never runs an in_doubt claim: {retry:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nobody ran while in doubt");
    let state = rows::row_state(&gate, &id2.address()).await;
    eprintln!("after the slow pass: {pass:?}, row {state:?}");
    match state.as_deref() {
        None => {
            let next = leased_run(&gate, &id2, None, &runs).await;
            assert_eq!(
                reason(&next),
                "ok",
                "released: the next retry runs: {next:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1);
        }
        Some("in_doubt") => {
            assert_eq!(pass.resolved, 0, "{pass:?}");
        }
        other => panic!("after NotHappened the row is released or still in doubt: {other:?}"),
    }
}

/// The operator: `resolve` a stale pending in_doubt-policy claim (its
/// lease run out, nobody looked yet) is allowed; a live one is refused;
/// `release_pending` of a row turned in doubt is refused ("a claim in doubt
/// (use resolve)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_on_expired_in_doubt_claims() {
    let gate = testing::gate().await;
    let live = ident("rt_exp_op", "live");
    let c = gate
        .guard(&live)
        .lease(Duration::from_secs(60))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    let address = live.address();
    let slot = Slot::new(gate.account_name(), None, &address);
    let resolved = operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Release))
        .await
        .expect("resolve");
    assert!(
        !matches!(resolved, Resolved::Changed { .. }),
        "a pending claim whose lease is live is refused: {resolved:?}"
    );
    c.release().await.expect("release");

    // Stale pending (lease run out, nobody looked): resolvable.
    let stale = ident("rt_exp_op", "stale");
    abandon(&gate, &stale, Some(OnExpiry::InDoubt)).await;
    expire().await;
    let address = stale.address();
    let slot = Slot::new(gate.account_name(), None, &address);
    let resolved = operations::resolve(gate.pool(), slot, Outcome::Succeeded(None))
        .await
        .expect("resolve");
    assert!(
        matches!(resolved, Resolved::Changed { .. }),
        "a stale pending claim can be resolved: {resolved:?}"
    );
    let runs = AtomicUsize::new(0);
    let after = leased_run(&gate, &stale, None, &runs).await;
    assert!(matches!(after, Err(Rejected::AlreadyDone)), "{after:?}");

    // Turned in doubt by a take_over retry: release refuses it.
    let turned = ident("rt_exp_op", "turned");
    abandon(&gate, &turned, Some(OnExpiry::InDoubt)).await;
    expire().await;
    let retry = leased_run(&gate, &turned, Some(OnExpiry::TakeOver), &runs).await;
    assert!(matches!(retry, Err(Rejected::InDoubt)), "{retry:?}");
    let address = turned.address();
    let released =
        operations::release_pending(gate.pool(), Slot::new(gate.account_name(), None, &address))
            .await;
    eprintln!("release_pending of a claim in doubt: {released:?}");
    assert_eq!(
        rows::row_state(&gate, &address).await.as_deref(),
        Some("in_doubt"),
        "release deletes only a pending claim; one in doubt is refused: {released:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A slow `Guard::run` whose claim a duplicate turned in doubt, and whose
/// body then returns a failure that releases: its caller gets its own
/// error (it said nothing happened, which the doubt does not contradict),
/// and the slot stays in doubt until resolved, whichever side said so
/// (src/idempotent.md, `lease`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_run_failing_late_on_a_claim_turned_in_doubt_leaves_the_slot_in_doubt() {
    let gate = testing::gate().await;
    for (key, holder_policy, retry_policy) in [
        ("claim_take_over", OnExpiry::TakeOver, OnExpiry::InDoubt),
        ("claim_in_doubt", OnExpiry::InDoubt, OnExpiry::TakeOver),
    ] {
        let id = ident("rt_exp_late_fail", key);
        let entered = Notify::new();
        let go = Notify::new();
        let holder = gate
            .guard(&id)
            .lease(LEASE)
            .on_expiry(holder_policy)
            .run(async {
                entered.notify_one();
                go.notified().await;
                Err::<(), _>(idem_test_support::JobError::Failed)
            });
        let runs = AtomicUsize::new(0);
        let retry = async {
            entered.notified().await;
            expire().await;
            let retry = leased_run(&gate, &id, Some(retry_policy), &runs).await;
            go.notify_one();
            retry
        };
        let (held, retried) = tokio::join!(holder, retry);
        assert!(
            matches!(retried, Err(Rejected::InDoubt)),
            "{key}: {retried:?}"
        );
        assert!(
            matches!(held, Err(idem_test_support::JobError::Failed)),
            "{key}: a late releasing failure is returned as it is: {held:?}"
        );
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("in_doubt"),
            "{key}: a late failure over a claim turned in doubt changes nothing"
        );
        let again = leased_run(&gate, &id, Some(OnExpiry::TakeOver), &runs).await;
        assert!(matches!(again, Err(Rejected::InDoubt)), "{key}: {again:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{key}: a retry ran");
    }
}

/// A batch body that runs past its lease while a duplicate turns its claim
/// in doubt (nobody took it over), then succeeds: recorded, and the item's
/// answer is the body's value, as `Guard::run` answers a slow holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_batch_body_whose_claim_was_turned_in_doubt_records_its_success() {
    let gate = testing::gate().await;
    let id = ident("rt_exp_batch_slow", "item");
    let entered = Notify::new();
    let go = Notify::new();
    let batch = Batch::from_iter([("item", id.clone())]);
    let batch_run = gate.guard_batch(batch).lease(LEASE).run(|key| {
        let (entered, go) = (&entered, &go);
        async move {
            entered.notify_one();
            go.notified().await;
            Ok::<_, Rejected>(key)
        }
    });
    let runs = AtomicUsize::new(0);
    let retry = async {
        entered.notified().await;
        expire().await;
        let retry = leased_run(&gate, &id, Some(OnExpiry::InDoubt), &runs).await;
        go.notify_one();
        retry
    };
    let (results, retried) = tokio::join!(batch_run, retry);
    assert!(
        matches!(retried, Err(Rejected::InDoubt)),
        "an in_doubt duplicate holds the batch's expired take_over claim: {retried:?}"
    );
    assert!(
        matches!(results[0], Ok("item")),
        "a slow batch body whose claim was turned in doubt (nobody else ran it) gets its value: \
         {results:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "its late success is recorded"
    );
}
