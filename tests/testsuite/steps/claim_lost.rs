//! What a step does once its claim is no longer its holder's
//! (taken over, released by an operator, resolved by a reconciler), and of
//! steps given the wrong connection in the caller's transaction.
//!
//! Each test names the doc sentence it holds the library to. A test that
//! fails shows a promise that does not hold; its assertion says which.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::batch::Batch;
use idem::operations::{self, Slot};
use idem::testing;
use idem::{Disposition, Gate, Identity, Outcome, OutcomeCommit, Rejected};

use crate::support::doubt::state_of;
use crate::support::steps::recorded;

/// A gate on a pool of 4 connections, in an account of its own.
async fn small_gate() -> Gate {
    testing::gate_on(testing::pool_with(4).await).await
}

/// An operator's release of `id`'s pending claim.
async fn operator_release(gate: &Gate, id: &Identity) {
    let address = id.address();
    let released = operations::release_pending(
        gate.pool(),
        Slot::new(gate.account_name(), gate.namespace_name(), &address),
    )
    .await
    .expect("release");
    assert!(
        released.is_some(),
        "the operator released the pending claim"
    );
}

fn lost(r: &Rejected) -> bool {
    matches!(r, Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. })
}

// ---------------------------------------------------------------------
// The reconciler resolving a step while its holder is still inside it
// ---------------------------------------------------------------------

/// src/idempotent.md, "Fenced": "every run sees one value"; "finds what the
/// new holder recorded if it asks again"; reconcile.rs: "A retry that takes
/// it over first raises its fence, and the resolution ... changes nothing".
/// A holder stalls inside a step that is not repeatable past its lease; the
/// reconciler (its holder presumed gone) is told the step happened and
/// returned 7, records it, and releases the claim. Then the holder's step
/// finishes with 1. Its record goes nowhere (the step is recorded, as 7),
/// yet it must not go on with a value the record does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reconciler_s_step_verdict_under_a_live_holder_leaves_one_value() {
    use idem::reconcile::{Reconciler, Verdict};
    let gate = small_gate().await;
    let action = testing::unique_name("lb_reconcile_live");
    let id = Identity::new(&action).part(1);
    let lease = Duration::from_millis(250);
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish) = tokio::sync::oneshot::channel::<()>();
    let saw = Mutex::new(None::<Result<u64, String>>);
    let ship_ran = AtomicUsize::new(0);
    let holder = gate.guard(&id).lease(lease).run(async {
        let charge = idem::step("charge", async {
            let _ = started_tx.send(());
            let _ = finish.await;
            Ok::<u64, Rejected>(1)
        })
        .await;
        *saw.lock().unwrap() = Some(charge.as_ref().map(|v| *v).map_err(|e| format!("{e:?}")));
        let charge = charge?;
        idem::step("ship", async {
            ship_ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(2)
        })
        .await?;
        Ok::<u64, Rejected>(charge)
    });
    let reconcile = async {
        let _ = started.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let reconciler = Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe(action.clone(), |_doubt| async {
                Verdict::step_succeeded_with("charge", &7_u64).expect("a value")
            });
        let pass = reconciler.reconcile_once().await.expect("a pass");
        let _ = finish_tx.send(());
        pass
    };
    let (outcome, pass) = tokio::join!(holder, reconcile);
    assert_eq!(pass.resolved, 1, "the reconciler resolved it: {pass:?}");
    let record = recorded(&gate, &id, "charge").await;
    assert_eq!(
        record.as_deref(),
        Some("7"),
        "the reconciler's verdict is the record"
    );
    let saw = saw.into_inner().unwrap();
    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async { idem::step("charge", async { Ok::<u64, Rejected>(9) }).await })
        .await;
    assert!(
        matches!(saw, Some(Ok(7)) | Some(Err(_))),
        "promise broken (idempotent.md, Fenced: \"every run sees one value\"; reconcile.rs: \
         the resolution of a claim whose holder is presumed gone): the reconciler recorded \
         step \"charge\" as 7 and released the claim while its holder was still inside the \
         step; the holder's own record then went nowhere, yet its step handed it {saw:?} \
         (its own value, taken for its record because the fence matched), and the holder's \
         body went on to \"ship\" ({} run(s)) and ended {outcome:?}; the retry replays \
         {retry:?}: two runs, two values of one step",
        ship_ran.load(Ordering::SeqCst)
    );
}

// ---------------------------------------------------------------------
// The caller's transaction, the right connection and the wrong one
// ---------------------------------------------------------------------

/// `Step::on`: "A step of a claim made inside a transaction must be given
/// it"; `claim_gone`'s WrongConnection says "the step did not run";
/// CHANGELOG/fix: "a repeatable step given a connection other than its
/// claim's transaction ... is now an error". Here the first repeatable step
/// is given the right connection (the run's one read is made there), and a
/// later repeatable step the wrong one: it must be refused before it runs,
/// as the first one would have been.
#[tokio::test]
async fn a_later_repeatable_step_given_the_wrong_connection_is_refused_before_it_runs() {
    let gate = small_gate().await;
    let id = Identity::new("lb_tx_right_then_wrong").part(1);
    let ran = AtomicUsize::new(0);
    let mut other = gate.pool().acquire().await.expect("another connection");
    let mut tx = gate.pool().begin().await.expect("begin");
    let saw = Mutex::new(None::<Result<u64, Rejected>>);
    let out: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection: &mut idem::sqlx::PgConnection| {
            let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .on(&mut *connection)
                .await?;
            let b = idem::step("b", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .repeatable()
            .on(&mut other)
            .await;
            *saw.lock().unwrap() = Some(b.clone());
            Ok::<u64, Rejected>(a + b?)
        })
        .await;
    tx.commit().await.expect("commit");
    let saw = saw.into_inner().unwrap();
    let ran = ran.load(Ordering::SeqCst);
    assert!(
        matches!(saw, Some(Err(Rejected::WrongConnection { .. }))) && ran == 0,
        "wrong or misleading error (Step::on: a step of a claim made inside a transaction \
         must be given it; WrongConnection says \"the step did not run\"): a repeatable step \
         given another connection after the run's first repeatable step was given the right \
         one ran {ran} time(s) and the body was told {saw:?}; the body ended {out:?}"
    );
}

/// The same mistake on a later step that is not repeatable: its marker is
/// refused on the wrong connection, and it does not run. (Held.)
#[tokio::test]
async fn a_later_unrepeatable_step_given_the_wrong_connection_does_not_run() {
    let gate = small_gate().await;
    let id = Identity::new("lb_tx_right_then_wrong_plain").part(1);
    let ran = AtomicUsize::new(0);
    let mut other = gate.pool().acquire().await.expect("another connection");
    let mut tx = gate.pool().begin().await.expect("begin");
    let out: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection: &mut idem::sqlx::PgConnection| {
            let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .on(&mut *connection)
                .await?;
            let b: u64 = idem::step("b", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .on(&mut other)
            .await?;
            Ok::<u64, Rejected>(a + b)
        })
        .await;
    tx.commit().await.expect("commit");
    assert!(
        matches!(out, Err(Rejected::WrongConnection { .. })),
        "{out:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The wrong connection first, then the right one: nothing read on the
/// wrong connection is kept (the run reads again on the right one and
/// replays what the right one sees), and the wrong connection's refusal
/// does not stop the right connection's steps. (Held.)
#[tokio::test]
async fn a_wrong_connection_first_leaks_nothing_into_the_right_connection_s_steps() {
    let gate = small_gate().await;
    let id = Identity::new("lb_tx_wrong_then_right").part(1);
    // A first run records "b" (5) and fails, releasing the claim: the steps
    // stay, and a retry replays "b".
    let mut tx = gate.pool().begin().await.expect("begin");
    let first: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection: &mut idem::sqlx::PgConnection| {
            idem::step("b", async { Ok::<u64, Rejected>(5) })
                .repeatable()
                .on(&mut *connection)
                .await?;
            Err(Rejected::InFlight)
        })
        .await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    tx.commit().await.expect("commit");
    let ran = AtomicUsize::new(0);
    let mut other = gate.pool().acquire().await.expect("another connection");
    let mut tx = gate.pool().begin().await.expect("begin");
    let wrong = Mutex::new(None::<Result<u64, Rejected>>);
    let out: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection: &mut idem::sqlx::PgConnection| {
            let a = idem::step("a", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(100)
            })
            .repeatable()
            .on(&mut other)
            .await;
            *wrong.lock().unwrap() = Some(a);
            let b: u64 = idem::step("b", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(6)
            })
            .repeatable()
            .on(&mut *connection)
            .await?;
            let c: u64 = idem::step("c", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(7)
            })
            .on(&mut *connection)
            .await?;
            Ok::<u64, Rejected>(b + c)
        })
        .await;
    tx.commit().await.expect("commit");
    assert!(
        matches!(
            *wrong.lock().unwrap(),
            Some(Err(Rejected::WrongConnection { .. }))
        ),
        "{:?}",
        wrong.lock().unwrap()
    );
    assert_eq!(out.ok(), Some(12), "b replayed (5), c run (7)");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "only c ran");
}

// ---------------------------------------------------------------------
// An operator's release mid-body
// ---------------------------------------------------------------------

/// error.rs, `LeaseLost`: "the lease on {address} ran out while the body
/// ran ... renew long leases with Claim::extend"; `ClaimLost`: "The claim
/// was released or removed by someone else while the body ran (an
/// operator's `idem claims release`, say) ... A claim whose lease had run
/// out when it was removed is told LeaseLost instead." A claim with no
/// lease at all, released by an operator mid-body: the next step must not
/// run, and the body must be told what happened (ClaimLost), not that a
/// lease it never had ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_after_an_operator_release_of_a_lease_less_claim_is_told_claim_lost() {
    let gate = small_gate().await;
    let id = Identity::new("lb_operator_no_lease").part(1);
    let ran = AtomicUsize::new(0);
    let (at_tx, at) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let told = Mutex::new(Vec::<Result<u64, Rejected>>::new());
    let body = gate.guard(&id).run(async {
        let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) })
            .repeatable()
            .await?;
        let _ = at_tx.send(());
        let _ = go.await;
        let b = idem::step("b", async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(2)
        })
        .await;
        told.lock().unwrap().push(b.clone());
        b?;
        Ok::<u64, Rejected>(a)
    });
    let operator = async {
        let _ = at.await;
        operator_release(&gate, &id).await;
        let _ = go_tx.send(());
    };
    let (out, ()) = tokio::join!(body, operator);
    let told = told.into_inner().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0, "b ran after the release");
    assert!(
        matches!(told.as_slice(), [Err(Rejected::ClaimLost { .. })]),
        "misleading error (error.rs: LeaseLost is \"the lease ... ran out while the body ran\", \
         ClaimLost is \"released or removed by someone else while the body ran (an operator's \
         idem claims release, say)\"): a claim claimed with no lease, released by an \
         operator, and the body's next step is told {told:?}; the body ended {out:?}"
    );
}

/// An operator releases a pending claim mid-body and a new holder claims it
/// anew, in a namespace, under the async commit; the old holder (which read
/// its claim's steps before the release) and the new one race at a barrier
/// over a repeatable "b" and a "c" that is not repeatable. "Its record
/// never goes in over the new holder's: the step hands back the new
/// holder's recorded value ..., and is LeaseLost otherwise; from then on no
/// step of that body runs". (Held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_holder_and_a_new_one_race_after_an_operator_release_in_a_namespace() {
    let gate = small_gate().await.namespace("lb_live");
    let id = Identity::new("lb_operator_race").part(1);
    let (b_old, c_old, c_new) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let (at_tx, at) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let (new_b_tx, new_b) = tokio::sync::oneshot::channel::<()>();
    let (new_go_tx, new_go) = tokio::sync::oneshot::channel::<()>();
    let saw = Mutex::new((None::<Result<u64, Rejected>>, None::<Result<u64, Rejected>>));
    let old = gate
        .guard(&id)
        .outcome_commit(OutcomeCommit::Async)
        .run(async {
            let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .await?;
            let _ = at_tx.send(());
            let _ = go.await;
            let b = idem::step("b", async {
                b_old.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(10)
            })
            .repeatable()
            .await;
            saw.lock().unwrap().0 = Some(b.clone());
            let c = idem::step("c", async {
                c_old.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(100)
            })
            .await;
            saw.lock().unwrap().1 = Some(c.clone());
            Ok::<u64, Rejected>(a + b? + c?)
        });
    let newer = async {
        let _ = at.await;
        operator_release(&gate, &id).await;
        gate.guard(&id)
            .outcome_commit(OutcomeCommit::Async)
            .run(async {
                let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await?;
                let b: u64 = idem::step("b", async { Ok::<u64, Rejected>(20) })
                    .repeatable()
                    .await?;
                let _ = new_b_tx.send(());
                let _ = new_go.await;
                let c: u64 = idem::step("c", async {
                    c_new.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(200)
                })
                .await?;
                Ok::<u64, Rejected>(a + b + c)
            })
            .await
    };
    let conductor = async {
        let _ = new_b.await;
        let _ = go_tx.send(());
        // The old holder's "b" and "c" go first, then the new holder's "c".
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = new_go_tx.send(());
    };
    let (old, newer, ()) = tokio::join!(old, newer, conductor);
    let (b, c) = saw.into_inner().unwrap();
    assert_eq!(newer.as_ref().ok(), Some(&221), "the new holder: {newer:?}");
    assert!(
        matches!(&b, Some(Ok(20))) || matches!(&b, Some(Err(e)) if lost(e)),
        "the old holder's b: {b:?} (ran {})",
        b_old.load(Ordering::SeqCst)
    );
    assert!(
        matches!(&c, Some(Err(e)) if lost(e)) && c_old.load(Ordering::SeqCst) == 0,
        "no step of the old holder's body runs after its claim was found lost: c {c:?}, ran {}",
        c_old.load(Ordering::SeqCst)
    );
    assert_eq!(c_new.load(Ordering::SeqCst), 1);
    assert!(old.is_err(), "{old:?}");
    assert_eq!(recorded(&gate, &id, "b").await.as_deref(), Some("20"));
    assert_eq!(recorded(&gate, &id, "c").await.as_deref(), Some("200"));
}

// ---------------------------------------------------------------------
// A body that catches LeaseLost and goes on
// ---------------------------------------------------------------------

/// src/idempotent.md, "Fenced": "from then on no step of that body runs (a
/// recorded one is still replayed)". A stale holder is told its claim was
/// taken over, catches it, and goes on to steps of every kind: none runs,
/// a recorded one replays the new holder's value; the new holder, still
/// running, is not disturbed. (Held, for the steps; see the next test for
/// what its Ok does.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_catches_lease_lost_runs_no_later_step() {
    let gate = small_gate().await;
    let id = Identity::new("lb_catch").part(1);
    let lease = Duration::from_millis(250);
    let ran_old = AtomicUsize::new(0);
    let (in_a_tx, in_a) = tokio::sync::oneshot::channel::<()>();
    let (a_go_tx, a_go) = tokio::sync::oneshot::channel::<()>();
    let (new_mid_tx, new_mid) = tokio::sync::oneshot::channel::<()>();
    let (new_go_tx, new_go) = tokio::sync::oneshot::channel::<()>();
    let told = Mutex::new(Vec::<(&'static str, Result<u64, Rejected>)>::new());
    let old = gate.guard(&id).lease(lease).run(async {
        let a = idem::step("a", async {
            let _ = in_a_tx.send(());
            let _ = a_go.await;
            Ok::<u64, Rejected>(1)
        })
        .repeatable()
        .await;
        told.lock().unwrap().push(("a", a));
        // Caught: the body goes on whatever each step says.
        let x = idem::step("x", async {
            ran_old.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(3)
        })
        .await;
        told.lock().unwrap().push(("x", x));
        let y = idem::step("y", async {
            ran_old.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(4)
        })
        .repeatable()
        .await;
        told.lock().unwrap().push(("y", y));
        let b = idem::step("b", async {
            ran_old.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(5)
        })
        .await;
        told.lock().unwrap().push(("b", b));
        Err::<u64, Rejected>(Rejected::InFlight)
    });
    let newer = async {
        let _ = in_a.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        gate.guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await?;
                let b: u64 = idem::step("b", async { Ok::<u64, Rejected>(20) }).await?;
                let _ = new_mid_tx.send(());
                let _ = new_go.await;
                let x: u64 = idem::step("x", async { Ok::<u64, Rejected>(30) }).await?;
                let y: u64 = idem::step("y", async { Ok::<u64, Rejected>(40) })
                    .repeatable()
                    .await?;
                Ok::<u64, Rejected>(a + b + x + y)
            })
            .await
    };
    let conductor = async {
        let _ = new_mid.await;
        let _ = a_go_tx.send(());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = new_go_tx.send(());
    };
    let (old, newer, ()) = tokio::join!(old, newer, conductor);
    let told = told.into_inner().unwrap();
    assert_eq!(
        newer.as_ref().ok(),
        Some(&92),
        "the new holder: {newer:?}; old told {told:?}"
    );
    assert_eq!(ran_old.load(Ordering::SeqCst), 0, "old told {told:?}");
    for (name, result) in &told {
        let ok = match *name {
            "a" => matches!(result, Ok(2)),
            "b" => matches!(result, Ok(20)) || matches!(result, Err(e) if lost(e)),
            _ => matches!(result, Err(e) if lost(e)),
        };
        assert!(ok, "the old holder's {name}: {result:?} (all: {told:?})");
    }
    assert!(old.is_err(), "{old:?}");
}

/// The same stale holder, told LeaseLost at its step "ship" (which it did
/// not run), catches it and returns Ok, while the new holder, which took the
/// claim over, is between "charge" and "ship". idempotent.md: the body
/// "resumes at the first step that did not finish" on every later run (a
/// takeover too), and "from then on no step of that body runs". The stale
/// body's Ok is recorded as a late success over the new holder's pending
/// claim: the new holder's "ship" is then refused, and so is every retry
/// (AlreadyDone), so "ship" is never run by anyone while the slot says the
/// action succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_body_s_ok_after_a_refused_step_does_not_end_the_new_holder_s_run() {
    let gate = small_gate().await;
    let id = Identity::new("lb_catch_ok").part(1);
    let lease = Duration::from_millis(250);
    let ship_ran = AtomicUsize::new(0);
    let (in_charge_tx, in_charge) = tokio::sync::oneshot::channel::<()>();
    let (charge_go_tx, charge_go) = tokio::sync::oneshot::channel::<()>();
    let (new_mid_tx, new_mid) = tokio::sync::oneshot::channel::<()>();
    let (new_go_tx, new_go) = tokio::sync::oneshot::channel::<()>();
    let old_ship = Mutex::new(None::<Result<u64, Rejected>>);
    let old = gate.guard(&id).lease(lease).run(async {
        let charge: u64 = idem::step("charge", async {
            let _ = in_charge_tx.send(());
            let _ = charge_go.await;
            Ok::<u64, Rejected>(1)
        })
        .repeatable()
        .await?;
        // "ship" is best effort in this body: its error is logged and
        // swallowed.
        let ship = idem::step("ship", async {
            ship_ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(5)
        })
        .await;
        *old_ship.lock().unwrap() = Some(ship);
        Ok::<u64, Rejected>(charge)
    });
    let newer = async {
        let _ = in_charge.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        gate.guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                let charge: u64 = idem::step("charge", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await?;
                let _ = new_mid_tx.send(());
                let _ = new_go.await;
                let ship: u64 = idem::step("ship", async {
                    ship_ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(50)
                })
                .await?;
                Ok::<u64, Rejected>(charge + ship)
            })
            .await
    };
    let conductor = async {
        let _ = new_mid.await;
        let _ = charge_go_tx.send(());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = new_go_tx.send(());
    };
    let (old, newer, ()) = tokio::join!(old, newer, conductor);
    let old_ship = old_ship.into_inner().unwrap();
    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            let charge: u64 = idem::step("charge", async { Ok::<u64, Rejected>(3) })
                .repeatable()
                .await?;
            let ship: u64 = idem::step("ship", async {
                ship_ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(500)
            })
            .await?;
            Ok::<u64, Rejected>(charge + ship)
        })
        .await;
    let ship_ran = ship_ran.load(Ordering::SeqCst);
    assert!(
        matches!(&old_ship, Some(Err(e)) if lost(e)),
        "the stale holder's ship: {old_ship:?}"
    );
    assert!(
        ship_ran == 1,
        "claim wrongly settled (idempotent.md: the body \"resumes at the first step that did \
         not finish\"; Fenced: \"from then on no step of that body runs\"): a stale holder \
         whose step \"ship\" was refused LeaseLost swallowed it and returned Ok; that Ok was \
         recorded over the new holder's pending claim (stale holder: {old:?}), the new \
         holder, between \"charge\" and \"ship\", was cut off ({newer:?}), and the retry is \
         {retry:?}: \"ship\" ran {ship_ran} time(s) in all, the slot says the action \
         succeeded ({:?})",
        state_of(&gate, &id).await
    );
}

// ---------------------------------------------------------------------
// A stale holder's unrepeatable record finds the new holder's
// ---------------------------------------------------------------------

/// "Should a cut-off holder's record ... land while the new holder runs it
/// again, the new holder goes on with the recorded value"; the fix: "a
/// record that finds another holder's record hands the body that recorded
/// value (for steps with or without a marker)". A live stale holder inside
/// a step that is NOT repeatable (its marker is in) past its lease; a new
/// holder takes over, declares the step repeatable, runs it over the marker
/// and records 2; then the stale holder's step finishes with 1: its record
/// finds 2 and it goes on with 2, and runs nothing after. (Held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_unrepeatable_record_that_finds_the_new_holder_s_goes_on_with_it() {
    let gate = small_gate().await;
    let id = Identity::new("lb_stale_plain_record").part(1);
    let lease = Duration::from_millis(250);
    let (in_s_tx, in_s) = tokio::sync::oneshot::channel::<()>();
    let (s_go_tx, s_go) = tokio::sync::oneshot::channel::<()>();
    let t_ran = AtomicUsize::new(0);
    let saw = Mutex::new((None::<Result<u64, Rejected>>, None::<Result<u64, Rejected>>));
    let old = gate.guard(&id).lease(lease).run(async {
        let s = idem::step("s", async {
            let _ = in_s_tx.send(());
            let _ = s_go.await;
            Ok::<u64, Rejected>(1)
        })
        .await;
        saw.lock().unwrap().0 = Some(s.clone());
        let t = idem::step("t", async {
            t_ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(10)
        })
        .await;
        saw.lock().unwrap().1 = Some(t.clone());
        Ok::<u64, Rejected>(s? + t?)
    });
    let newer = async {
        let _ = in_s.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let out = gate
            .guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                let s: u64 = idem::step("s", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await?;
                Ok::<u64, Rejected>(s)
            })
            .await;
        let _ = s_go_tx.send(());
        out
    };
    let (old, newer) = tokio::join!(old, newer);
    let (s, t) = saw.into_inner().unwrap();
    assert_eq!(newer.ok(), Some(2));
    assert!(
        matches!(s, Some(Ok(2))),
        "one value: the stale holder's s is {s:?}"
    );
    assert!(
        matches!(&t, Some(Err(e)) if lost(e)) && t_ran.load(Ordering::SeqCst) == 0,
        "t: {t:?}"
    );
    assert!(old.is_err(), "{old:?}");
    assert_eq!(recorded(&gate, &id, "s").await.as_deref(), Some("2"));
}

// ---------------------------------------------------------------------
// Steps joined in one body
// ---------------------------------------------------------------------

/// Steps joined with `tokio::join!` in a stale holder, one not repeatable
/// (whose marker meets the new holder's marker) and one repeatable that
/// has not been read yet... both after a takeover. Neither runs in the
/// stale holder, and neither leaves a record of its value. (Held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joined_steps_of_a_stale_holder_neither_run_nor_record() {
    let gate = small_gate().await;
    let id = Identity::new("lb_joined").part(1);
    let lease = Duration::from_millis(250);
    let ran_old = AtomicUsize::new(0);
    let (paused_tx, paused) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let (new_in_x_tx, new_in_x) = tokio::sync::oneshot::channel::<()>();
    let (new_go_tx, new_go) = tokio::sync::oneshot::channel::<()>();
    let saw = Mutex::new(None);
    let old = gate.guard(&id).lease(lease).run(async {
        let _ = paused_tx.send(());
        let _ = go.await;
        let (x, y) = tokio::join!(
            idem::step("x", async {
                ran_old.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(1)
            })
            .into_future_boxed(),
            idem::step("y", async {
                ran_old.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .repeatable()
            .into_future_boxed()
        );
        *saw.lock().unwrap() = Some((x.clone(), y.clone()));
        Ok::<u64, Rejected>(x? + y?)
    });
    let newer = async {
        let _ = paused.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        gate.guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                let x: u64 = idem::step("x", async {
                    let _ = new_in_x_tx.send(());
                    let _ = new_go.await;
                    Ok::<u64, Rejected>(10)
                })
                .await?;
                let y: u64 = idem::step("y", async { Ok::<u64, Rejected>(20) })
                    .repeatable()
                    .await?;
                Ok::<u64, Rejected>(x + y)
            })
            .await
    };
    let conductor = async {
        let _ = new_in_x.await;
        let _ = go_tx.send(());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = new_go_tx.send(());
    };
    let (old, newer, ()) = tokio::join!(old, newer, conductor);
    let saw = saw.into_inner().unwrap();
    assert_eq!(newer.ok(), Some(30));
    assert_eq!(ran_old.load(Ordering::SeqCst), 0, "{saw:?}");
    let (x, y) = saw.expect("joined");
    assert!(matches!(&x, Err(e) if lost(e)), "x: {x:?}");
    assert!(matches!(&y, Err(e) if lost(e)), "y: {y:?}");
    assert!(old.is_err());
    assert_eq!(recorded(&gate, &id, "x").await.as_deref(), Some("10"));
    assert_eq!(recorded(&gate, &id, "y").await.as_deref(), Some("20"));
}

/// Boxes a step into its future, so that `tokio::join!` can take two steps
/// of different future types.
trait IntoFutureBoxed: std::future::IntoFuture + Sized {
    fn into_future_boxed(self) -> Self::IntoFuture {
        self.into_future()
    }
}
impl<T: std::future::IntoFuture> IntoFutureBoxed for T {}

// ---------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------

/// A batch of two items under a lease: item 1's body stalls inside its
/// repeatable "a" past the lease and its claim is taken over by a single
/// call, which records "a" (99) and "b" (98); item 2 runs alone. Item 1's
/// stale body gets the recorded values (or LeaseLost) and runs nothing
/// more; item 2's steps are its own and recorded. (Held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_item_taken_over_runs_nothing_more_and_its_neighbour_is_untouched() {
    let gate = small_gate().await;
    let lease = Duration::from_millis(300);
    let ids: Vec<Identity> = (1..=2_u64)
        .map(|n| Identity::new("lb_batch").part(n))
        .collect();
    let b_ran = Arc::new(AtomicUsize::new(0));
    let (in_a_tx, in_a) = tokio::sync::oneshot::channel::<()>();
    let in_a_tx = Arc::new(Mutex::new(Some(in_a_tx)));
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let go = Arc::new(tokio::sync::Mutex::new(Some(go)));
    let saw = Arc::new(Mutex::new(Vec::new()));
    let batch: Batch<u64> = (1..=2_u64)
        .map(|n| (n, ids[n as usize - 1].clone()))
        .collect::<Batch<u64>>();
    let run = gate.guard_batch(batch).concurrency(2).lease(lease).run({
        let (b_ran, in_a_tx, go, saw) = (
            Arc::clone(&b_ran),
            Arc::clone(&in_a_tx),
            Arc::clone(&go),
            Arc::clone(&saw),
        );
        move |n: u64| {
            let (b_ran, in_a_tx, go, saw) = (
                Arc::clone(&b_ran),
                Arc::clone(&in_a_tx),
                Arc::clone(&go),
                Arc::clone(&saw),
            );
            async move {
                let a = idem::step("a", async move {
                    if n == 1 {
                        if let Some(tx) = in_a_tx.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                        let go = go.lock().await.take();
                        if let Some(go) = go {
                            let _ = go.await;
                        }
                    }
                    Ok::<u64, Rejected>(n)
                })
                .repeatable()
                .await;
                let b = idem::step("b", {
                    let b_ran = Arc::clone(&b_ran);
                    async move {
                        b_ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Rejected>(n * 10)
                    }
                })
                .await;
                saw.lock().unwrap().push((n, a.clone(), b.clone()));
                Ok::<u64, Rejected>(a? + b?)
            }
        }
    });
    let taker = async {
        let _ = in_a.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let taken: Result<u64, Rejected> = gate
            .guard(&ids[0])
            .lease(Duration::from_secs(30))
            .run(async {
                let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(99) })
                    .repeatable()
                    .await?;
                let b: u64 = idem::step("b", async { Ok::<u64, Rejected>(98) }).await?;
                Ok::<u64, Rejected>(a + b)
            })
            .await;
        let _ = go_tx.send(());
        taken
    };
    let (outs, taken) = tokio::join!(run, taker);
    let saw = saw.lock().unwrap().clone();
    assert_eq!(taken.ok(), Some(197), "the taker: saw {saw:?}");
    assert_eq!(outs[1].as_ref().ok(), Some(&22), "item 2: {outs:?}");
    assert_eq!(
        b_ran.load(Ordering::SeqCst),
        1,
        "only item 2's b ran: {saw:?}"
    );
    let item1 = saw.iter().find(|(n, ..)| *n == 1).expect("item 1 ran");
    assert!(
        matches!(&item1.1, Ok(99))
            && (matches!(&item1.2, Ok(98)) || matches!(&item1.2, Err(e) if lost(e))),
        "item 1 (stale): {item1:?}"
    );
    assert!(outs[0].is_err(), "item 1: {outs:?}");
    assert_eq!(recorded(&gate, &ids[0], "a").await.as_deref(), Some("99"));
    assert_eq!(recorded(&gate, &ids[1], "b").await.as_deref(), Some("20"));
}

// ---------------------------------------------------------------------
// An operator resolving the claim while its body runs
// ---------------------------------------------------------------------

/// Rejected::NotRecorded, src/idempotent.md ("Fenced"): a holder whose
/// claim an operator resolved while its body ran is told `NotRecorded`
/// (the slot is decided for good), with steps as without them: never
/// `ClaimLost`, which would tell it the action may run twice. Each kind of
/// step, after a resolution as succeeded and as failed.
#[tokio::test]
async fn a_step_after_an_operator_resolved_the_claim_is_told_not_recorded() {
    let gate = small_gate().await;
    for repeatable in [false, true] {
        for succeeded in [true, false] {
            let id = Identity::new("lb_operator_resolved")
                .part(repeatable)
                .part(succeeded);
            let second_ran = AtomicUsize::new(0);
            let saw = Mutex::new(None::<Result<u64, Rejected>>);
            let outcome: Result<u64, Rejected> = gate
                .guard(&id)
                .run(async {
                    let step = |name: &'static str, value: u64| {
                        let step = idem::step(name, async move { Ok::<u64, Rejected>(value) });
                        if repeatable { step.repeatable() } else { step }
                    };
                    let first = step("first", 1).await?;
                    let address = id.address();
                    let resolution = if succeeded {
                        Outcome::Succeeded(None)
                    } else {
                        Outcome::Failed(Disposition::Keep)
                    };
                    operations::resolve(
                        gate.pool(),
                        Slot::new(gate.account_name(), gate.namespace_name(), &address),
                        resolution,
                    )
                    .await
                    .expect("the operator resolves the claim");
                    let second = idem::step("second", async {
                        second_ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Rejected>(2)
                    });
                    let second = if repeatable {
                        second.repeatable().await
                    } else {
                        second.await
                    };
                    *saw.lock().unwrap() = Some(second.clone());
                    Ok(first + second?)
                })
                .await;
            let saw = saw.into_inner().unwrap();
            let case = format!("repeatable {repeatable}, resolved as succeeded {succeeded}");
            assert!(
                matches!(saw, Some(Err(Rejected::NotRecorded { .. }))),
                "{case}: the step after the resolution was told {saw:?}, not NotRecorded"
            );
            assert!(
                matches!(outcome, Err(Rejected::NotRecorded { .. })),
                "{case}: the holder was told {outcome:?}, not NotRecorded"
            );
            if !repeatable {
                assert_eq!(
                    second_ran.load(Ordering::SeqCst),
                    0,
                    "{case}: no step runs after"
                );
            }
            let expected = if succeeded { "success" } else { "failed" };
            assert_eq!(
                state_of(&gate, &id)
                    .await
                    .map(|(state, _)| state)
                    .as_deref(),
                Some(expected),
                "{case}: the operator's resolution stands"
            );
        }
    }
}
