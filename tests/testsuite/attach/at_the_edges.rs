//! Red team: a waiting duplicate attached to a claim held in its own
//! process, at the edges (leases running out under an attached waiter, late
//! successes, waiters of another mode than the holder, claims by hand,
//! batches, the caller's transaction, the store failing, the outcome cache,
//! the HTTP layer).
//!
//! Where a waiter's answer is checked against "what a lookup of the row
//! would give it", the lookup is a duplicate of the same mode on a gate of
//! its own (so never attached, never cached) run once the row is final.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::testing;
use idem::{Fingerprint, Gate, Identity};
use idem_test_support::{ChargeError, JobError};
use tokio::sync::{Barrier, Notify};

use super::{WAITERS, gate_behind_a_proxy, held_until, looked};

/// A gate on a pool of its own (never the holder's: no attaching, no
/// cache), in the account of `gate`.
async fn elsewhere(gate: &Gate) -> Gate {
    testing::gate_on(testing::pool_with(2).await)
        .await
        .account(gate.account_name())
}

/// What a guarded call returned, said in one word: `ok:<value>` or the
/// refusal's reason.
fn said(result: &Result<String, JobError>) -> String {
    match result {
        Ok(value) => format!("ok:{value}"),
        Err(JobError::Rejected(rejected)) => rejected.reason().to_owned(),
        Err(other) => format!("error:{other:?}"),
    }
}

fn said_charge(result: &Result<String, ChargeError>) -> String {
    match result {
        Ok(value) => format!("ok:{value}"),
        Err(ChargeError::Rejected(rejected)) => rejected.reason().to_owned(),
        Err(other) => format!("error:{other:?}"),
    }
}

// ---------------------------------------------------------------------
// Leases running out under an attached waiter.
// ---------------------------------------------------------------------

/// Promise (`Guard::lease`): "a claim whose holder has not recorded an
/// outcome within `lease` is taken over by the next duplicate with a higher
/// fencing token"; (`Guard::wait`): "A holder that goes without recording
/// (dropped, taken over, the store failing) sends its waiters back to the
/// store at once, then to polling: no waiter is left hanging."
///
/// The holder is alive but stuck past its lease. A waiting duplicate in
/// another gate (polling) takes the claim over within a poll or two of the
/// lease running out; one attached in this process must not wait for the
/// stuck holder (or for its own wait to run out) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_waiter_takes_over_a_lease_that_ran_out_as_a_polling_one_does() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let other = elsewhere(&gate).await;
    for (attached, waiter_gate) in [(false, &other), (true, &gate)] {
        let id = Identity::new("edges_lease_ran_out").part(if attached { "in" } else { "out" });
        let (entered, go) = (Notify::new(), Notify::new());
        let holder = gate
            .guard(&id)
            .lease(Duration::from_millis(300))
            .run(held_until(
                &entered,
                &go,
                Ok::<_, JobError>("the holder's".to_owned()),
            ));
        let waiting = async {
            entered.notified().await;
            let started = Instant::now();
            let ran_at = std::sync::Mutex::new(None);
            let waited = waiter_gate
                .guard(&id)
                .lease(Duration::from_secs(30))
                .wait(Duration::from_secs(6))
                .run(async {
                    *ran_at.lock().unwrap() = Some(started.elapsed());
                    Ok::<_, JobError>("the waiter's".to_owned())
                })
                .await;
            go.notify_one();
            (waited, ran_at.into_inner().unwrap(), started.elapsed())
        };
        let (_held, (waited, ran_at, took)) = tokio::join!(holder, waiting);
        assert_eq!(
            said(&waited),
            "ok:the waiter's",
            "attached = {attached}: the waiter takes the expired claim over"
        );
        let ran_at = ran_at.expect("the waiter ran");
        assert!(
            ran_at < Duration::from_secs(2),
            "attached = {attached}: the waiter took over {ran_at:?} after it began waiting \
             (the lease is 300 ms; its wait, 6 s, ended after {took:?})"
        );
    }
}

/// Promise (`Guard::lease`): a holder's "late settle only ever records the
/// success it reports (never undoing one)"; (`Guard::wait`): a waiter takes
/// "its outcome ... as a lookup would", "no waiter is left hanging".
///
/// A holder's lease runs out, a second caller takes the claim over and is
/// still running; a waiter attaches to the second caller's claim. The
/// first holder's late success is then written into the slot: the row is
/// final, a lookup replays it, yet the attached waiter hears nothing until
/// the second caller ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_over_a_taken_over_claim_answers_its_attached_waiters() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("edges_late_success").part("ord_1");
    let (first_entered, first_go) = (Notify::new(), Notify::new());
    let (second_entered, second_go) = (Notify::new(), Notify::new());
    let first = gate
        .guard(&id)
        .replay()
        .lease(Duration::from_millis(300))
        .run(held_until(
            &first_entered,
            &first_go,
            Ok::<_, JobError>("the first's".to_owned()),
        ));
    let second = async {
        first_entered.notified().await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        gate.guard(&id)
            .replay()
            .lease(Duration::from_secs(30))
            .run(held_until(
                &second_entered,
                &second_go,
                Ok::<_, JobError>("the second's".to_owned()),
            ))
            .await
    };
    let rest = async {
        second_entered.notified().await;
        let waiter = gate
            .guard(&id)
            .replay()
            .wait(Duration::from_secs(8))
            .run(async { Ok::<_, JobError>("the waiter's".to_owned()) });
        let late = async {
            // The waiter attaches to the second's claim; then the first
            // ends, late.
            tokio::time::sleep(Duration::from_millis(300)).await;
            first_go.notify_one();
            tokio::time::sleep(Duration::from_millis(300)).await;
            Instant::now()
        };
        let (waited, late_at) =
            tokio::join!(tokio::time::timeout(Duration::from_secs(10), waiter), late);
        let answered_after = late_at.elapsed();
        let looked = elsewhere(&gate)
            .await
            .guard(&id)
            .replay()
            .run(async { Ok::<_, JobError>("the lookup's".to_owned()) })
            .await;
        second_go.notify_one();
        (waited, answered_after, looked)
    };
    let (first, second, (waited, answered_after, looked)) = tokio::join!(first, second, rest);
    eprintln!("first: {first:?}; second: {second:?}; lookup: {looked:?}");
    let waited = waited.expect("the waiter is not left hanging");
    assert_eq!(
        said(&waited),
        said(&looked),
        "the waiter is told what a lookup of the row tells"
    );
    assert!(
        answered_after < Duration::from_secs(2),
        "the waiter was answered {answered_after:?} after the late success made the row final"
    );
}

/// Promise (`Guard::wait`): "no waiter is left hanging", and a holder in
/// doubt makes its waiters `InDoubt`; (`Guard::on_expiry`): the next
/// duplicate finding the lease ran out holds it in doubt.
///
/// With `on_expiry = in_doubt`, a polling duplicate is told `InDoubt` soon
/// after the lease runs out; an attached one must be too, not at the end
/// of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_waiter_of_an_expired_lease_with_on_expiry_in_doubt_is_told_in_doubt() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("edges_on_expiry").part("ord_1");
    let (entered, go) = (Notify::new(), Notify::new());
    let holder = gate
        .guard(&id)
        .lease(Duration::from_millis(300))
        .on_expiry(idem::OnExpiry::InDoubt)
        .run(held_until(
            &entered,
            &go,
            Ok::<_, JobError>("the holder's".to_owned()),
        ));
    let waiting = async {
        entered.notified().await;
        let started = Instant::now();
        let waited = gate
            .guard(&id)
            .lease(Duration::from_secs(30))
            .on_expiry(idem::OnExpiry::InDoubt)
            .wait(Duration::from_secs(6))
            .run(async { Ok::<_, JobError>("the waiter's".to_owned()) })
            .await;
        let took = started.elapsed();
        go.notify_one();
        (waited, took)
    };
    let (_held, (waited, took)) = tokio::join!(holder, waiting);
    assert_eq!(said(&waited), "in_doubt", "{waited:?}");
    assert!(
        took < Duration::from_secs(2),
        "told in doubt {took:?} after it began waiting (lease 300 ms, wait 6 s)"
    );
}

// ---------------------------------------------------------------------
// Waiters of another mode than the holder: exactly what a lookup gives.
// ---------------------------------------------------------------------

/// Runs a holder (`$holder`, a guard built on `$hg`) whose body succeeds
/// with "the holder's" (or fails with `$outcome`), and once it runs a
/// waiter (`$waiter`, built on `$wg`, waiting 10 s) on the same gate; then
/// the same waiter's mode on a gate elsewhere, with no wait, as the lookup.
macro_rules! waiter_and_lookup {
    ($gate:expr, $id:expr, $outcome:expr,
     holder = |$hg:ident| $holder:expr,
     waiter = |$wg:ident| $waiter:expr $(,)?) => {{
        let gate: &Gate = $gate;
        let id: &Identity = $id;
        let (entered, go) = (Notify::new(), Notify::new());
        let held = {
            let $hg = gate.guard(id);
            $holder.run(held_until(&entered, &go, $outcome))
        };
        let waiting = async {
            entered.notified().await;
            let waited = {
                let $wg = gate.guard(id);
                $waiter
                    .wait(Duration::from_secs(10))
                    .run(async { Ok::<String, JobError>("the waiter's".to_owned()) })
            };
            let release = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                go.notify_one();
            };
            tokio::join!(waited, release).0
        };
        let (held, waited) = tokio::join!(held, waiting);
        let other = elsewhere(gate).await;
        let looked = {
            let $wg = other.guard(id);
            $waiter
                .run(async { Ok::<String, JobError>("the lookup's".to_owned()) })
                .await
        };
        (held, waited, looked)
    }};
}

/// Promise (`src/idempotent.md`, `wait`): a duplicate that waits "returns
/// the replayed value, `AlreadyDone`, `AlreadyFailed` or `InDoubt` as a
/// lookup would"; (design decisions) "judged by the waiter by the very
/// rules a row read from the store is (identity, fingerprint, replay only
/// to a matching payload)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_another_mode_is_told_what_a_lookup_tells() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let fp = |n: i64| Fingerprint::new().part(n);
    let ok = || Ok::<_, JobError>("the holder's".to_owned());
    let mut mismatches = Vec::new();
    let mut check =
        |case: &str, waited: &Result<String, JobError>, looked: &Result<String, JobError>| {
            eprintln!("{case}: waiter {} / lookup {}", said(waited), said(looked));
            if said(waited) != said(looked) {
                mismatches.push(format!(
                    "{case}: waiter {} but lookup {}",
                    said(waited),
                    said(looked)
                ));
            }
        };

    let id = Identity::new("edges_modes").part("replay_to_plain");
    let (_, w, l) = waiter_and_lookup!(&gate, &id, ok(), holder = |g| g.replay(), waiter = |g| g);
    check("holder replays, waiter does not", &w, &l);

    let id = Identity::new("edges_modes").part("plain_to_replay");
    let (_, w, l) = waiter_and_lookup!(&gate, &id, ok(), holder = |g| g, waiter = |g| g.replay());
    check("holder does not replay, waiter does", &w, &l);

    let id = Identity::new("edges_modes").part("fp_mismatch");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().fingerprint(fp(1)),
        waiter = |g| g.replay().fingerprint(fp(2))
    );
    check("fingerprints differ", &w, &l);

    let id = Identity::new("edges_modes").part("fp_match");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().fingerprint(fp(1)),
        waiter = |g| g.replay().fingerprint(fp(1))
    );
    check("fingerprints match", &w, &l);

    let id = Identity::new("edges_modes").part("fp_holder_only");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().fingerprint(fp(1)),
        waiter = |g| g.replay()
    );
    check("only the holder fingerprints", &w, &l);

    let id = Identity::new("edges_modes").part("fp_waiter_only");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay(),
        waiter = |g| g.replay().fingerprint(fp(1))
    );
    check("only the waiter fingerprints", &w, &l);

    let id = Identity::new("edges_modes").part("holder_keeps_value_for");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().keep_value_for(Duration::from_secs(60)),
        waiter = |g| g.replay()
    );
    check("the holder keeps its value for a window", &w, &l);

    let id = Identity::new("edges_modes").part("waiter_keeps_value_for");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay(),
        waiter = |g| g.replay().keep_value_for(Duration::from_secs(60))
    );
    check("the waiter keeps its value for a window", &w, &l);

    let id = Identity::new("edges_modes").part("holder_keeps_slot_for");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().keep_slot_for(Duration::from_secs(60)),
        waiter = |g| g.replay()
    );
    check("the holder keeps its slot for a window", &w, &l);

    let id = Identity::new("edges_modes").part("ordered");
    let entity = Identity::new("edges_entity").part("sub_1");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().ordered(&entity, 5_i64),
        waiter = |g| g.replay().ordered(&entity, 5_i64)
    );
    check("an ordered event", &w, &l);

    let id = Identity::new("edges_modes").part("ordered_waiter_plain");
    let entity = Identity::new("edges_entity").part("sub_2");
    let (_, w, l) = waiter_and_lookup!(
        &gate,
        &id,
        ok(),
        holder = |g| g.replay().ordered(&entity, 5_i64),
        waiter = |g| g.replay()
    );
    check("an ordered event, a plain waiter", &w, &l);

    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

/// Promise: as above, for failures: a failure kept for good is
/// `AlreadyFailed`, a hold in doubt `InDoubt`, "judged likewise" (so a
/// waiter with another fingerprint is `KeyReused` if a lookup says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_a_failure_with_another_fingerprint_is_told_what_a_lookup_tells() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let fp = |n: i64| Fingerprint::new().part(n);
    let mut mismatches = Vec::new();
    for name in ["kept", "in_doubt"] {
        for (holder_fp, waiter_fp) in [(Some(1), Some(2)), (Some(1), None), (None, Some(2))] {
            let id = Identity::new("edges_failures")
                .part(name)
                .part(format!("{holder_fp:?}{waiter_fp:?}"));
            let (entered, go) = (Notify::new(), Notify::new());
            let failure = if name == "kept" {
                ChargeError::Declined
            } else {
                ChargeError::Timeout
            };
            let held = {
                let g = gate.guard(&id).disposition(ChargeError::disposition);
                let g = match holder_fp {
                    Some(n) => g.fingerprint(fp(n)),
                    None => g,
                };
                g.run(held_until(&entered, &go, Err::<String, _>(failure)))
            };
            let waiting = async {
                entered.notified().await;
                let g = gate.guard(&id).disposition(ChargeError::disposition);
                let g = match waiter_fp {
                    Some(n) => g.fingerprint(fp(n)),
                    None => g,
                };
                let waited = g
                    .wait(Duration::from_secs(10))
                    .run(async { Ok::<String, ChargeError>("the waiter's".to_owned()) });
                let release = async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    go.notify_one();
                };
                tokio::join!(waited, release).0
            };
            let (_held, waited) = tokio::join!(held, waiting);
            let other = elsewhere(&gate).await;
            let g = other.guard(&id).disposition(ChargeError::disposition);
            let g = match waiter_fp {
                Some(n) => g.fingerprint(fp(n)),
                None => g,
            };
            let looked = g
                .run(async { Ok::<String, ChargeError>("the lookup's".to_owned()) })
                .await;
            eprintln!(
                "{name} {holder_fp:?}/{waiter_fp:?}: waiter {} / lookup {}",
                said_charge(&waited),
                said_charge(&looked)
            );
            if said_charge(&waited) != said_charge(&looked) {
                mismatches.push(format!(
                    "{name}, holder fp {holder_fp:?}, waiter fp {waiter_fp:?}: waiter {} but lookup {}",
                    said_charge(&waited),
                    said_charge(&looked)
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

// ---------------------------------------------------------------------
// Claims by hand, batches, panics.
// ---------------------------------------------------------------------

/// Fires `WAITERS` replaying duplicates of `id` on `gate` behind a barrier,
/// each waiting `wait`; a waiter that runs counts in `ran`.
async fn barrier_waiters(
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
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, JobError>("the waiter's".to_owned())
                })
                .await
        }
    });
    futures_util::future::join_all(calls).await
}

/// Promise (`Guard::wait`): waiters of a holder in this process are handed
/// its outcome "with no statement"; a release "lets exactly one waiter
/// run"; "no waiter is left hanging". Here the holder is a claim made by
/// hand (`gate.guard(&id).replay().claim()`) on an `account` copy of the
/// waiters' gate, then settled with a value, released, or dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_by_hand_settled_released_or_dropped_answers_its_waiters() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let copy = gate.account(gate.account_name());
    for ending in ["settle_value", "release", "drop"] {
        let id = Identity::new("edges_by_hand").part(ending);
        let claim = copy
            .guard(&id)
            .replay()
            .lease(Duration::from_millis(800))
            .claim_or_replay::<String>()
            .await
            .expect("claimed by hand");
        let idem::ClaimOrReplay::Won(claim) = claim else {
            panic!("{ending}: nothing to replay yet")
        };
        let ran = AtomicUsize::new(0);
        let before = proxy.executions();
        let ending_of = async {
            looked(&proxy, before, WAITERS as u64).await;
            let looked = proxy.executions();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let idle = proxy.executions() - looked;
            match ending {
                "settle_value" => claim
                    .settle_value(&"by hand".to_owned())
                    .await
                    .expect("settled"),
                "release" => claim.release().await.expect("released"),
                _ => drop(claim),
            }
            idle
        };
        let started = Instant::now();
        let (results, idle) = tokio::join!(
            tokio::time::timeout(
                Duration::from_secs(12),
                barrier_waiters(&gate, &id, Duration::from_secs(8), &ran)
            ),
            ending_of
        );
        let results = results.unwrap_or_else(|_| panic!("{ending}: a waiter was left hanging"));
        let took = started.elapsed();
        eprintln!(
            "{ending}: {:?} in {took:?}",
            results.iter().map(said).collect::<Vec<_>>()
        );
        assert_eq!(
            idle, 0,
            "{ending}: attached waiters send no statement while they wait"
        );
        let expected = match ending {
            "settle_value" => "ok:by hand",
            _ => "ok:the waiter's",
        };
        for result in &results {
            assert_eq!(said(result), expected, "{ending}: {results:?}");
        }
        assert_eq!(
            ran.load(Ordering::SeqCst),
            usize::from(ending != "settle_value"),
            "{ending}: exactly one waiter ran"
        );
        assert!(
            took < Duration::from_secs(4),
            "{ending}: answered in {took:?} (the claim's lease is 800 ms)"
        );
    }
}

/// Promise (`Guard::wait`): "no waiter is left hanging (... panicked ...)".
/// The holder's body panics once the waiters are attached; its lease runs
/// out, and exactly one waiter takes over and runs, the others replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_panics_leaves_no_waiter_hanging() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("edges_panic").part("ord_1");
    let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let holder = {
        let (gate, id, entered, go) = (
            gate.clone(),
            id.clone(),
            Arc::clone(&entered),
            Arc::clone(&go),
        );
        tokio::spawn(async move {
            gate.guard(&id)
                .replay()
                .lease(Duration::from_millis(500))
                .run(async {
                    entered.notify_one();
                    go.notified().await;
                    panic!("the holder's body panics");
                    #[allow(unreachable_code)]
                    Ok::<String, JobError>(String::new())
                })
                .await
        })
    };
    entered.notified().await;
    let ran = AtomicUsize::new(0);
    let started = Instant::now();
    let panics = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        go.notify_one();
        holder.await
    };
    let (results, panicked) = tokio::join!(
        tokio::time::timeout(
            Duration::from_secs(12),
            barrier_waiters(&gate, &id, Duration::from_secs(8), &ran)
        ),
        panics
    );
    assert!(panicked.is_err_and(|e| e.is_panic()), "the holder panicked");
    let results = results.expect("no waiter is left hanging");
    let took = started.elapsed();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "exactly one waiter ran: {results:?}"
    );
    for result in &results {
        assert_eq!(said(result), "ok:the waiter's", "{results:?}");
    }
    assert!(
        took < Duration::from_secs(4),
        "answered in {took:?} (lease 500 ms)"
    );
}

/// Promise (`Guard::wait`): a holder in this process "hands its outcome to
/// its waiters as it records it: no statement, no polling", whichever way
/// it recorded it; here an item of a batch (`gate.guard_batch`), plain or
/// an ordered event (`Batch::push_ordered`, claimed with its entity by one
/// statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_item_in_flight_answers_its_attached_waiters() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    for ordered in [false, true] {
        let id = Identity::new("edges_batch").part(ordered.to_string());
        let entity = Identity::new("edges_batch_entity").part("sub_1");
        let (entered, go) = (Notify::new(), Notify::new());
        let mut batch = idem::batch::Batch::new();
        if ordered {
            batch.push_ordered("item", id.clone(), &entity, 3_i64);
        } else {
            batch.push("item", id.clone());
        }
        let holder = gate.guard_batch(batch).run(|_| async {
            entered.notify_one();
            go.notified().await;
            Ok::<_, JobError>(())
        });
        let waiting = async {
            entered.notified().await;
            let before = proxy.executions();
            let ran = AtomicUsize::new(0);
            let waited = async {
                let barrier = Arc::new(Barrier::new(WAITERS));
                futures_util::future::join_all((0..WAITERS).map(|_| {
                    let barrier = Arc::clone(&barrier);
                    let (gate, id, ran) = (&gate, &id, &ran);
                    async move {
                        barrier.wait().await;
                        gate.guard(id)
                            .wait(Duration::from_secs(10))
                            .run(async {
                                ran.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, JobError>("the waiter's".to_owned())
                            })
                            .await
                    }
                }))
                .await
            };
            let answered = async {
                looked(&proxy, before, WAITERS as u64).await;
                let looked = proxy.executions();
                tokio::time::sleep(Duration::from_millis(600)).await;
                let idle = proxy.executions() - looked;
                go.notify_one();
                idle
            };
            let (results, idle) = tokio::join!(waited, answered);
            (results, idle, ran.load(Ordering::SeqCst))
        };
        let (held, (results, idle, ran)) = tokio::join!(holder, waiting);
        assert!(held.iter().all(Result::is_ok), "{held:?}");
        assert_eq!(ran, 0, "ordered = {ordered}: no waiter ran: {results:?}");
        for result in &results {
            assert_eq!(
                said(result),
                "already_done",
                "ordered = {ordered}: {results:?}"
            );
        }
        assert_eq!(
            idle,
            0,
            "ordered = {ordered}: {}",
            "waiters on a batch item of this process attach: no statement while they wait \
         (polling sends one per waiter every 10 to 250 ms)"
        );
    }
}

// ---------------------------------------------------------------------
// The caller's transaction.
// ---------------------------------------------------------------------

/// Promise (`src/idempotent.md`, `wait`): "A claim made inside your
/// transaction is never attached to: it is not decided until your
/// transaction commits." A waiter must be answered neither before the
/// commit nor from a transaction that rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_never_answered_from_the_caller_s_transaction_before_its_commit() {
    let gate = testing::gate_on(testing::pool_with(4).await).await;
    for commit in [true, false] {
        let id = Identity::new("edges_tx").part(commit.to_string());
        let mut tx = gate.pool().begin().await.expect("begin");
        let claim = gate
            .guard(&id)
            .replay()
            .tx(&mut tx)
            .claim_or_replay::<String>()
            .await
            .expect("claimed in the transaction");
        let idem::ClaimOrReplay::Won(claim) = claim else {
            panic!("nothing to replay yet")
        };
        claim
            .settle_value(&mut tx, &"in the transaction".to_owned())
            .await
            .expect("settled in the transaction");
        let waiter = tokio::spawn({
            let (gate, id) = (gate.clone(), id.clone());
            async move {
                let waited = gate
                    .guard(&id)
                    .replay()
                    .wait(Duration::from_secs(10))
                    .run(async { Ok::<_, JobError>("the waiter's".to_owned()) })
                    .await;
                (waited, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiter.is_finished(),
            "commit = {commit}: answered before the transaction ended: {:?}",
            waiter.await
        );
        let ended = Instant::now();
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        let (waited, at) = tokio::time::timeout(Duration::from_secs(12), waiter)
            .await
            .expect("the waiter is not left hanging")
            .expect("the waiter's task");
        assert!(at >= ended, "answered before the transaction ended");
        let expected = if commit {
            "ok:in the transaction"
        } else {
            "ok:the waiter's"
        };
        assert_eq!(said(&waited), expected, "commit = {commit}");
    }
}

// ---------------------------------------------------------------------
// The store failing under the holder's settle.
// ---------------------------------------------------------------------

/// Promise (`Guard::wait`): "A holder that goes without recording (...
/// the store failing) sends its waiters back to the store at once ...: no
/// waiter is left hanging"; and a waiter is told only what landed.
///
/// The store is cut while the holder's body runs; its settle fails. No
/// waiter may be told the action is done (nothing was recorded), and none
/// may hang past its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_settle_fails_with_the_store_down_leaves_no_waiter_hanging() {
    let (mut proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("edges_store_down").part("ord_1");
    let (entered, go) = (Notify::new(), Notify::new());
    let holder = gate
        .guard(&id)
        .replay()
        .lease(Duration::from_secs(1))
        .run(held_until(
            &entered,
            &go,
            Ok::<_, JobError>("the holder's".to_owned()),
        ));
    let ran = AtomicUsize::new(0);
    let waiting = async {
        entered.notified().await;
        let before = proxy.executions();
        let cut = async {
            looked(&proxy, before, WAITERS as u64).await;
            proxy.cut().await;
            go.notify_one();
        };
        let started = Instant::now();
        let (results, ()) = tokio::join!(
            tokio::time::timeout(
                Duration::from_secs(20),
                barrier_waiters(&gate, &id, Duration::from_secs(5), &ran)
            ),
            cut
        );
        (results, started.elapsed())
    };
    let (held, (results, took)) = tokio::join!(holder, waiting);
    proxy.resume().await;
    let results = results.expect("no waiter is left hanging");
    eprintln!("holder: {held:?}; waiters after {took:?}: {results:?}");
    for result in &results {
        assert!(
            !matches!(said(result).as_str(), "ok:the holder's" | "already_done"),
            "told of an outcome that was never recorded: {results:?}"
        );
    }
    // (The holder's call returns its body's value whether or not it was
    // recorded: idem says so in its logs, and the slot stays held.)
}

/// Promise (`Guard::wait`): as above, with the holder's backend terminated
/// (`pg_terminate_backend`) while its body runs: its settle goes through a
/// fresh connection, and its waiters get the value it recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_backend_is_terminated_still_answers_its_waiters() {
    // The gate's own connections are named, so as to terminate only them.
    let application = format!("idem_edges_{}", std::process::id());
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .max_connections(WAITERS as u32 + 2)
        .connect_with(proxy.options().application_name(&application))
        .await
        .expect("a pool");
    let gate = testing::gate_on(pool).await;
    let id = Identity::new("edges_terminated").part("ord_1");
    let (entered, go) = (Notify::new(), Notify::new());
    let ran = AtomicUsize::new(0);
    let holder = gate.guard(&id).replay().run(held_until(
        &entered,
        &go,
        Ok::<_, JobError>("the holder's".to_owned()),
    ));
    let waiting = async {
        entered.notified().await;
        let kill = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Every connection of the gate's pool, by its name.
            let admin = testing::pool_with(1).await;
            let killed: i64 = idem::sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1) t",
            )
            .bind(&application)
            .fetch_one(&admin)
            .await
            .expect("terminate");
            go.notify_one();
            killed
        };
        tokio::join!(
            tokio::time::timeout(
                Duration::from_secs(20),
                barrier_waiters(&gate, &id, Duration::from_secs(10), &ran)
            ),
            kill
        )
    };
    let (held, (results, killed)) = tokio::join!(holder, waiting);
    eprintln!("terminated {killed} backends; holder {held:?}");
    let results = results.expect("no waiter is left hanging");
    assert_eq!(held.expect("the holder settles"), "the holder's");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "{results:?}");
    for result in &results {
        assert_eq!(said(result), "ok:the holder's", "{results:?}");
    }
}

// ---------------------------------------------------------------------
// The outcome cache.
// ---------------------------------------------------------------------

/// Promise (`Guard::wait` with `Gate::with_cache`): attached waiters on a
/// cached gate get what a lookup gives, and a release lets exactly one of
/// them run (a cached success of an earlier claim of the slot does not
/// answer them).
#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attached_waiters_on_a_cached_gate_get_what_a_lookup_gives() {
    use idem::cache::OutcomeCache;
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(
        OutcomeCache::builder()
            .max_entries(1_000)
            .ttl(Duration::from_secs(60))
            .build(),
    );
    // A success, then a release.
    for (outcome, expected_ran) in [
        (Ok::<_, JobError>("the holder's".to_owned()), 0),
        (Err(JobError::Failed), 1),
    ] {
        let id = Identity::new("edges_cache").part(expected_ran.to_string());
        let (entered, go) = (Notify::new(), Notify::new());
        let ran = AtomicUsize::new(0);
        let holder = gate
            .guard(&id)
            .replay()
            .run(held_until(&entered, &go, outcome));
        let waiting = async {
            entered.notified().await;
            let release = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                go.notify_one();
            };
            tokio::join!(
                barrier_waiters(&gate, &id, Duration::from_secs(10), &ran),
                release
            )
            .0
        };
        let (_held, results) = tokio::join!(holder, waiting);
        let looked = elsewhere(&gate)
            .await
            .guard(&id)
            .replay()
            .run(async { Ok::<_, JobError>("the lookup's".to_owned()) })
            .await;
        assert_eq!(ran.load(Ordering::SeqCst), expected_ran, "{results:?}");
        for result in &results {
            assert_eq!(said(result), said(&looked), "{results:?}");
        }
        // And a cached duplicate afterwards agrees too.
        let cached = gate
            .guard(&id)
            .replay()
            .run(async { Ok::<_, JobError>("ran again".to_owned()) })
            .await;
        assert_eq!(said(&cached), said(&looked));
    }
}

// ---------------------------------------------------------------------
// The HTTP layer.
// ---------------------------------------------------------------------

#[cfg(all(feature = "tower", feature = "axum"))]
fn charge_request(
    key: &str,
    body: &'static str,
) -> axum::http::Request<http_body_util::Full<bytes::Bytes>> {
    axum::http::Request::post("/charges")
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .expect("a request")
}

/// Promise (`IdempotencyLayer::wait`, as `Guard::wait` says): a duplicate
/// in flight that waits is answered as a lookup would answer it. A retry
/// with the same key and another body, waiting on the original in this
/// process, gets what the same retry gets once the original is done.
#[cfg(all(feature = "tower", feature = "axum"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_a_waiting_retry_with_another_body_is_answered_as_a_later_one() {
    use crate::support::http::{Effects, charges, send, serve};
    use idem::http::IdempotencyLayer;
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_secs(20));
    let (address, _server) = serve(charges(&effects, Duration::from_secs(1)).layer(layer)).await;
    let original = tokio::spawn(send(address, charge_request("edges-1", "amount=100")));
    effects.began().await;
    let same = tokio::spawn(send(address, charge_request("edges-1", "amount=100")));
    let waited = send(address, charge_request("edges-1", "amount=999")).await;
    let original = original.await.expect("the original's client");
    let same = same.await.expect("a same-body retry's client");
    let later = send(address, charge_request("edges-1", "amount=999")).await;
    eprintln!("original {original:?}\nsame {same:?}\nwaited {waited:?}\nlater {later:?}");
    assert_eq!(same.status, original.status, "{same:?}");
    assert_eq!(same.body, original.body, "{same:?}");
    assert_eq!(
        waited.status, later.status,
        "waited {waited:?}\nlater {later:?}"
    );
    assert_eq!(waited.problem_type(), later.problem_type());
    assert_eq!(effects.started(), 1, "one effect");
}

// ---------------------------------------------------------------------
// Detached bodies.
// ---------------------------------------------------------------------

/// Promise (`Guard::wait`): a holder in doubt makes its waiters `InDoubt`,
/// "no waiter is left hanging" (detached). A detached body whose caller
/// left runs on past its bound (or past a shutdown's grace) and is stopped:
/// its claim is held in doubt, and its attached waiters are told so then,
/// not at the end of their wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_body_stopped_past_its_bound_or_at_shutdown_tells_its_waiters_in_doubt() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    for at_shutdown in [false, true] {
        let detached = Arc::new(if at_shutdown {
            idem::Detached::new()
        } else {
            idem::Detached::with_bound(Duration::from_millis(400))
        });
        let id = Identity::new("edges_detached").part(at_shutdown.to_string());
        let entered = Arc::new(Notify::new());
        let caller = {
            let (gate, id, entered, detached) = (
                gate.clone(),
                id.clone(),
                Arc::clone(&entered),
                Arc::clone(&detached),
            );
            tokio::spawn(async move {
                gate.guard(&id)
                    .replay()
                    .run_detached(&detached, async move {
                        entered.notify_one();
                        std::future::pending::<Result<String, JobError>>().await
                    })
                    .await
            })
        };
        entered.notified().await;
        // The caller leaves; the body runs on.
        caller.abort();
        let _ = caller.await;
        let ran = AtomicUsize::new(0);
        let started = Instant::now();
        let stop = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if at_shutdown {
                let _ = detached.shutdown(Duration::from_millis(100)).await;
            }
        };
        let (results, ()) = tokio::join!(
            tokio::time::timeout(
                Duration::from_secs(10),
                barrier_waiters(&gate, &id, Duration::from_secs(6), &ran)
            ),
            stop
        );
        let results = results.expect("no waiter is left hanging");
        let took = started.elapsed();
        assert_eq!(ran.load(Ordering::SeqCst), 0, "{results:?}");
        for result in &results {
            assert_eq!(
                said(result),
                "in_doubt",
                "at_shutdown = {at_shutdown}: {results:?}"
            );
        }
        assert!(
            took < Duration::from_secs(3),
            "at_shutdown = {at_shutdown}: told in doubt after {took:?}"
        );
    }
}

/// Promise (`Guard::wait`): "no waiter is left hanging"; (`Guard::lease`)
/// the next duplicate takes over a claim whose lease ran out.
///
/// The holder is stuck for good (its body never ends) under a lease of
/// 300 ms; a duplicate waits with a long wait (an hour). Polling, it would
/// take the claim over within a poll of the lease running out; attached,
/// it must not hang on the stuck holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_waiter_with_a_long_wait_does_not_hang_on_a_stuck_holder_past_its_lease() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("edges_stuck").part("ord_1");
    let entered = Arc::new(Notify::new());
    let stuck = {
        let (gate, id, entered) = (gate.clone(), id.clone(), Arc::clone(&entered));
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(Duration::from_millis(300))
                .run(async {
                    entered.notify_one();
                    std::future::pending::<Result<(), JobError>>().await
                })
                .await
        })
    };
    entered.notified().await;
    let waited = tokio::time::timeout(
        Duration::from_secs(5),
        gate.guard(&id)
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(3600))
            .run(async { Ok::<_, JobError>("taken over".to_owned()) }),
    )
    .await;
    stuck.abort();
    let waited = waited
        .expect("the waiter hangs on a holder stuck past its lease (5 s, the lease being 300 ms)");
    assert_eq!(said(&waited), "ok:taken over");
}

/// Promise (`src/idempotent.md`, `wait`): "A holder that goes without
/// recording (its future dropped, its claim taken over, the store failing)
/// sends its waiters back to the store at once".
///
/// The holder's lease runs out while a duplicate waits attached to it;
/// another caller of this process (no wait) takes the claim over and
/// settles it at once. The slot is final: the waiter must be told so, not
/// at the end of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_a_holder_taken_over_and_settled_by_another_caller_is_answered() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("edges_taken_over").part("ord_1");
    let (entered, go) = (Notify::new(), Notify::new());
    let holder = gate
        .guard(&id)
        .replay()
        .lease(Duration::from_millis(300))
        .run(held_until(
            &entered,
            &go,
            Ok::<_, JobError>("the holder's".to_owned()),
        ));
    let rest = async {
        entered.notified().await;
        let waiter = gate
            .guard(&id)
            .replay()
            .wait(Duration::from_secs(8))
            .run(async { Ok::<_, JobError>("the waiter's".to_owned()) });
        let takeover = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // The waiter attached (to the holder) before the lease ran out.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let took = gate
                .guard(&id)
                .replay()
                .lease(Duration::from_secs(30))
                .run(async { Ok::<_, JobError>("the taker's".to_owned()) })
                .await;
            (took, Instant::now())
        };
        let (waited, (took, settled_at)) = tokio::join!(waiter, takeover);
        let after = settled_at.elapsed();
        go.notify_one();
        (waited, took, after)
    };
    let (_held, (waited, took, after)) = tokio::join!(holder, rest);
    eprintln!("taker: {took:?}; waiter: {waited:?}, answered {after:?} after the takeover settled");
    // Either the waiter took the claim over itself (as a polling one would,
    // once the lease ran out), or it is told the taker's value.
    assert!(
        matches!(said(&waited).as_str(), "ok:the taker's" | "ok:the waiter's"),
        "{waited:?}"
    );
    assert!(
        after < Duration::from_secs(2),
        "answered {after:?} after the takeover settled the slot (its wait was 8 s)"
    );
}

/// Promise (`Guard::ordered` with `Guard::wait`): an event of an entity
/// whose other event is in flight in this process waits for it, then is
/// judged against the order it applied: a newer event runs, an older one
/// is `Superseded`, as a lookup after would say; nobody hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_waiting_on_another_event_of_its_entity_is_judged_by_its_order() {
    let (_proxy, gate) = gate_behind_a_proxy().await;
    for (waiter_order, expected) in [(6_i64, "ok:the waiter's"), (4, "superseded")] {
        let entity = Identity::new("edges_ordered_entity").part(waiter_order);
        let first = Identity::new("edges_ordered_event").part(format!("{waiter_order}_first"));
        let second = Identity::new("edges_ordered_event").part(format!("{waiter_order}_second"));
        let (entered, go) = (Notify::new(), Notify::new());
        let holder = gate
            .guard(&first)
            .replay()
            .ordered(&entity, 5_i64)
            .run(held_until(
                &entered,
                &go,
                Ok::<_, JobError>("the holder's".to_owned()),
            ));
        let waiting = async {
            entered.notified().await;
            let waited = tokio::time::timeout(
                Duration::from_secs(10),
                gate.guard(&second)
                    .replay()
                    .ordered(&entity, waiter_order)
                    .wait(Duration::from_secs(6))
                    .run(async { Ok::<_, JobError>("the waiter's".to_owned()) }),
            );
            let release = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                go.notify_one();
            };
            tokio::join!(waited, release).0
        };
        let (held, waited) = tokio::join!(holder, waiting);
        assert_eq!(said(&held), "ok:the holder's");
        let waited = waited.expect("no waiter hangs");
        assert_eq!(said(&waited), expected, "order {waiter_order} after 5");
    }
}
