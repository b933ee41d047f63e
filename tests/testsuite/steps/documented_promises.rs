//! Steps: each promise the docs of `idem::step`,
//! `idem::downstream_key`, `Rejected::{StepInDoubt, NotGuarded}`, the
//! reconciler's step verdicts and the operators' step functions make,
//! attacked against the real PostgreSQL from the docs alone: races at a
//! barrier, faults (a connection cut, a body dropped mid-step, a lease run
//! out, a panic inside a step, a stale holder racing the new one), misuse
//! (a step escaping its body, `join!` of steps, ungated bodies, the wrong
//! connection, values that do not serialize or no longer read back, hostile
//! names), scopes that must never meet, and the reconciler.
//!
//! A test marked `#[ignore = "break: ..."]` fails against the library as it
//! is: the promise it names does not hold (see the reason).

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::operations::{self, Slot};
use idem::reconcile::{Reconciler, Verdict};
use idem::testing;
use idem::{Disposition, Gate, Identity, OnUnavailable, Outcome, Rejected};
use idem_test_support::Proxy;

use crate::support::doubt::state_of;
use crate::support::proxy::pool_through;
use crate::support::steps::{LEASE, cut_off_inside, past_the_lease, pending_of, steps_of};

// ---------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------

/// "A step cut off — its body dropped or panicking inside it ... A later
/// run is told StepInDoubt instead of running it, and a body that fails for
/// it holds the claim in doubt."
#[tokio::test]
async fn a_panic_inside_a_step_leaves_it_in_doubt_and_it_never_runs_again() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_panic").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let panicked = tokio::spawn({
        let (gate, id, ran) = (gate.clone(), id.clone(), Arc::clone(&ran));
        async move {
            gate.guard(&id)
                .lease(LEASE)
                .run(async move {
                    idem::step("charge", async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        if ran.load(Ordering::SeqCst) > 0 {
                            panic!("the provider's client panicked mid-call");
                        }
                        Ok::<u64, Rejected>(1)
                    })
                    .await
                })
                .await
        }
    })
    .await;
    assert!(panicked.is_err(), "the panic goes on up: {panicked:?}");
    past_the_lease().await;
    let again = Arc::new(AtomicUsize::new(0));
    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(LEASE)
        .disposition(|_: &Rejected| Disposition::Release)
        .run({
            let again = Arc::clone(&again);
            async move {
                idem::step("charge", async move {
                    again.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(2)
                })
                .await
            }
        })
        .await;
    assert!(
        matches!(&retry, Err(Rejected::StepInDoubt { step, .. }) if step == "charge"),
        "{retry:?}"
    );
    assert_eq!(again.load(Ordering::SeqCst), 0, "not run blindly again");
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt"),
        "held, whatever the disposition said"
    );
}

/// The body itself drops its step (a timeout around it) and fails with a
/// release. The step's outcome is unknown, so its failure holds the claim
/// in doubt at once, whatever it asked for: the next run is refused, and
/// never runs the step blindly again.
#[tokio::test]
async fn a_step_the_body_dropped_itself_is_never_run_blindly_again() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_timeout").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let body = |ran: Arc<AtomicUsize>| async move {
        let charge = idem::step("charge", async move {
            ran.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<u64, Rejected>(1)
        });
        match tokio::time::timeout(Duration::from_millis(100), charge.into_future()).await {
            Ok(done) => done,
            // The provider timed out: the body gives up and releases.
            Err(_) => Err(Rejected::InFlight),
        }
    };
    let first = gate.guard(&id).run(body(Arc::clone(&ran))).await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let held = state_of(&gate, &id).await.map(|(state, _)| state);
    assert_eq!(held.as_deref(), Some("in_doubt"), "held by the first run");
    let second = gate.guard(&id).run(body(Arc::clone(&ran))).await;
    assert!(matches!(&second, Err(Rejected::InDoubt)), "{second:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the charge ran once");
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt")
    );
}

/// "A step whose value could not be recorded (the store failed after it
/// ran) is treated the same way": the connection is cut while the step
/// runs, so its record fails; after the outage, the next holder is told
/// `StepInDoubt` and the step does not run again.
#[tokio::test]
async fn a_step_whose_record_the_store_lost_is_in_doubt_after_the_outage() {
    let mut proxy = Proxy::start().await;
    let gate = testing::gate_on(pool_through(&proxy).await).await;
    let id = Identity::new("rs_cut").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let first: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(LEASE)
        .run({
            let (ran, proxy) = (Arc::clone(&ran), &proxy);
            async move {
                let charged = idem::step("charge", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    proxy.cut().await;
                    Ok::<u64, Rejected>(7)
                })
                .await?;
                idem::step("ship", async { Ok::<u64, Rejected>(charged) }).await
            }
        })
        .await;
    assert!(first.is_err(), "the store is down: {first:?}");
    proxy.resume().await;
    past_the_lease().await;
    let again = Arc::new(AtomicUsize::new(0));
    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(LEASE)
        .run({
            let again = Arc::clone(&again);
            async move {
                idem::step("charge", async move {
                    again.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(8)
                })
                .await
            }
        })
        .await;
    assert!(
        matches!(&retry, Err(Rejected::StepInDoubt { .. })),
        "{retry:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(again.load(Ordering::SeqCst), 0);
}

/// "A holder whose lease was taken over ... never records over the new
/// holder's": a stale holder inside a repeatable step and the new holder
/// that retook it finish it at the same instant (a barrier). The record
/// that stands is the new holder's; the stale holder is told it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_and_the_new_one_finishing_one_step_at_once_leave_the_new_one_s_record() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_stale_race").part(1);
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let (stale_in, stale_inside) = tokio::sync::oneshot::channel::<()>();
    let stale = tokio::spawn({
        let (gate, id, barrier) = (gate.clone(), id.clone(), Arc::clone(&barrier));
        async move {
            gate.guard(&id)
                .lease(LEASE)
                .run(async move {
                    idem::step("charge", async move {
                        let _ = stale_in.send(());
                        barrier.wait().await;
                        Ok::<String, Rejected>("stale".into())
                    })
                    .repeatable()
                    .await
                })
                .await
        }
    });
    stale_inside.await.expect("the stale holder is inside");
    let (_, stale_fence) = state_of(&gate, &id).await.expect("the stale claim");
    past_the_lease().await;
    let newer = gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .run({
            let barrier = Arc::clone(&barrier);
            async move {
                idem::step("charge", async move {
                    barrier.wait().await;
                    Ok::<String, Rejected>("newer".into())
                })
                .repeatable()
                .await
            }
        })
        .await;
    let stale = stale.await.expect("the stale task");
    // The stale holder's step record failed (the marker is the new
    // holder's); its body went on with its value and its late success may
    // settle the claim over the new holder's pending row, as the gate's
    // contract says of a stale holder's late success: the new holder is
    // then told `NotRecorded`, the stale one `LeaseLost`.
    assert!(
        matches!(
            (&newer, &stale),
            (Ok(_), Err(Rejected::LeaseLost { .. }))
                | (
                    Err(Rejected::NotRecorded { .. }),
                    Err(Rejected::LeaseLost { .. })
                )
        ),
        "newer {newer:?}, stale {stale:?}"
    );
    let (state, _) = state_of(&gate, &id).await.expect("the claim");
    assert_eq!(state, "success");
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_ne!(
        steps[0].fence, stale_fence,
        "the stale holder never records over the new holder's step"
    );
}

// ---------------------------------------------------------------------
// Misuse
// ---------------------------------------------------------------------

/// A step begun and waiting: its future boxed, to be polled on elsewhere.
type Waiting = std::pin::Pin<Box<dyn Future<Output = Result<u64, Rejected>> + Send>>;

/// In the body being polled, begins the step `name`, whose future counts
/// into `ran` once `gone` fires, and polls it until its marker is in and its
/// future waits.
async fn begin_waiting(
    name: &'static str,
    ran: &Arc<AtomicUsize>,
    gone: tokio::sync::oneshot::Receiver<()>,
) -> Waiting {
    let ran = Arc::clone(ran);
    let mut step = idem::step(name, async move {
        let _ = gone.await;
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<u64, Rejected>(1)
    })
    .into_future();
    let _ = tokio::time::timeout(Duration::from_millis(300), &mut step).await;
    step
}

/// [`begin_waiting`], then spawns the step: it escapes its body.
async fn escape(
    name: &'static str,
    ran: &Arc<AtomicUsize>,
    gone: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<Result<u64, Rejected>> {
    tokio::spawn(begin_waiting(name, ran, gone).await)
}

/// "Outside a guarded body, or in a task the body spawned, a step is
/// NotGuarded and its future does not run." A step first polled in the
/// body, then handed to a task the body spawned, stops at its next poll
/// there: its future does not go on after the body returned and its claim
/// settled.
#[tokio::test]
async fn a_step_that_escapes_into_a_spawned_task_does_not_run_there() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_escape").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let (go, gone) = tokio::sync::oneshot::channel::<()>();
    let task = gate
        .guard(&id)
        .run(async { Ok::<_, Rejected>(escape("late", &ran, gone).await) })
        .await
        .expect("the body settles");
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("success")
    );
    let _ = go.send(());
    let outcome = task.await.expect("the task");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the step ran in a spawned task, after its claim settled: {outcome:?}"
    );
    assert!(
        matches!(
            outcome,
            Err(Rejected::NotGuarded {
                called: "idem::step",
                ..
            })
        ),
        "the escaped step says it is not guarded: {outcome:?}"
    );
}

/// A step that escaped its body after its future began, while the body
/// failed and released its claim: nobody knows how far the step got, so a
/// retry finds it in doubt and never runs it again (the claim is then held
/// in doubt), and the escaped future does not go on either.
#[tokio::test]
async fn a_step_that_escapes_a_body_that_releases_is_in_doubt_for_the_retry() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_escape_released").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let (go, gone) = tokio::sync::oneshot::channel::<()>();
    let escaped = Mutex::new(None);
    let first: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            *escaped.lock().unwrap() = Some(escape("charge", &ran, gone).await);
            // A failure released by default.
            Err(Rejected::InFlight)
        })
        .await;
    assert!(first.is_err(), "the body failed: {first:?}");
    let _ = go.send(());
    let task = escaped.lock().unwrap().take().expect("the spawned step");
    let outcome = task.await.expect("the task");
    assert!(
        matches!(outcome, Err(Rejected::NotGuarded { .. })),
        "the escaped step stops: {outcome:?}"
    );

    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .run({
            let ran = Arc::clone(&ran);
            async move {
                idem::step("charge", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(2)
                })
                .await
            }
        })
        .await;
    assert!(
        matches!(&retry, Err(Rejected::StepInDoubt { step, .. }) if step == "charge"),
        "the retry finds the escaped step in doubt: {retry:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the step never ran to its effect"
    );
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt"),
        "the retry's failure holds the claim in doubt"
    );
}

/// A step begun in one body and polled inside another guarded body (of
/// another identity) stops there, and, since it had started, its own
/// body's failure holds its claim in doubt instead of releasing it.
#[tokio::test]
async fn a_step_polled_inside_another_guarded_body_stops_and_holds_its_own_claim() {
    let gate = testing::gate().await;
    let outer = Identity::new("rs_escape_nested").part(1);
    let inner = Identity::new("rs_escape_nested_inner").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let (_go, gone) = tokio::sync::oneshot::channel::<()>();
    let outcome: Result<(), Rejected> = gate
        .guard(&outer)
        .run(async {
            let step = begin_waiting("charge", &ran, gone).await;
            let nested: Result<u64, Rejected> = gate.guard(&inner).run(step).await;
            assert!(
                matches!(nested, Err(Rejected::NotGuarded { .. })),
                "polled inside another body, the step stops: {nested:?}"
            );
            // A failure released by default.
            Err(Rejected::InFlight)
        })
        .await;
    assert!(outcome.is_err(), "{outcome:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the step never went on");
    assert_eq!(
        state_of(&gate, &outer)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt"),
        "a step whose outcome is unknown holds its body's claim"
    );
}

/// `tokio::join!` of two steps of the same name: one runs, the other is
/// refused and does not run; a retry replays the one that ran.
#[tokio::test]
async fn join_of_two_steps_of_one_name_runs_one_of_them() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_join_same").part(1);
    let ran = AtomicUsize::new(0);
    type Both = (Result<u64, Rejected>, Result<u64, Rejected>);
    let both: Result<Both, Rejected> = gate
        .guard(&id)
        .run(async {
            let one = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(1)
            });
            let two = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            });
            let (one, two) = tokio::join!(one.into_future(), two.into_future());
            Ok((one, two))
        })
        .await;
    let (one, two) = both.expect("the body");
    let refused = [&one, &two]
        .iter()
        .filter(|r| matches!(r, Err(Rejected::NotGuarded { .. })))
        .count();
    assert_eq!(refused, 1, "{one:?} {two:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// `tokio::join!` of two steps of different names: both run concurrently,
/// both are recorded, and a retry (after the body's failure released the
/// claim) replays both without running either.
#[tokio::test]
async fn join_of_two_different_steps_records_and_replays_both() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_join_two").part(1);
    let ran = AtomicUsize::new(0);
    let body = |fail: bool| {
        let ran = &ran;
        async move {
            let a = idem::step("a", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(10)
            });
            let b = idem::step("b", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(20)
            });
            let (a, b) = tokio::join!(a.into_future(), b.into_future());
            let sum = a? + b?;
            if fail {
                return Err(Rejected::InFlight);
            }
            Ok(sum)
        }
    };
    let first = gate.guard(&id).run(body(true)).await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let second = gate.guard(&id).run(body(false)).await;
    assert_eq!(second.ok(), Some(30));
    assert_eq!(ran.load(Ordering::SeqCst), 2, "each step ran once");
}

/// "In a body that runs ungated (an absent identity ...), future runs and
/// nothing is recorded"; `downstream_key` is `NotGuarded` there.
#[tokio::test]
async fn an_absent_identity_runs_its_steps_every_time_and_has_no_downstream_key() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_absent").part(None::<&str>);
    let ran = AtomicUsize::new(0);
    for _ in 0..2 {
        let outcome: Result<u64, Rejected> = gate
            .guard(&id)
            .run(async {
                let key = idem::downstream_key("charge");
                assert!(matches!(key, Err(Rejected::NotGuarded { .. })), "{key:?}");
                idem::step("charge", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(1)
                })
                .await
            })
            .await;
        assert_eq!(outcome.ok(), Some(1));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 2, "ungated: nothing recorded");
}

/// `on_unavailable = "run"` with the store down: the step runs, nothing is
/// recorded, and the downstream key is the one a gated run of the same
/// identity gets ("the same on every run of the identity").
#[tokio::test]
async fn a_fail_open_run_with_the_store_down_runs_its_steps_with_the_same_downstream_key() {
    let mut proxy = Proxy::start().await;
    let gate = testing::gate_on(pool_through(&proxy).await).await;
    let id = Identity::new("rs_fail_open").part(1);
    let key_seen = Mutex::new(Vec::new());
    let ran = AtomicUsize::new(0);
    let body = || async {
        key_seen
            .lock()
            .expect("keys")
            .push(idem::downstream_key("charge")?);
        idem::step("charge", async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(1)
        })
        .await
    };
    proxy.cut().await;
    let open = gate
        .guard(&id)
        .on_unavailable(OnUnavailable::Run)
        .run(body())
        .await;
    assert_eq!(open.ok(), Some(1));
    proxy.resume().await;
    let gated = gate.guard(&id).run(body()).await;
    assert_eq!(gated.ok(), Some(1), "nothing recorded: it runs again");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    let keys = key_seen.into_inner().expect("keys");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the downstream key is stable");
}

/// `.on()` with the wrong connection: a claim inside a transaction, a step
/// given another connection of the pool. The step must not run, and the
/// refusal must say it is the code's mistake, not that a lease was lost.
#[tokio::test]
async fn a_step_on_a_connection_other_than_the_claim_s_transaction_is_refused() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_wrong_conn").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let mut other = gate.pool().acquire().await.expect("another connection");
    let ran = AtomicUsize::new(0);
    let outcome: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |_| {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(1)
            })
            .on(&mut other)
            .await
        })
        .await;
    assert_eq!(ran.load(Ordering::SeqCst), 0, "{outcome:?}");
    assert!(
        matches!(
            outcome,
            Err(Rejected::NotGuarded { .. } | Rejected::WrongConnection { .. })
        ),
        "a mistake of the code, said as one: {outcome:?}"
    );
    drop(tx);
}

/// A step whose value does not serialize (a map with non-string keys):
/// it ran, its value cannot be recorded, so a failure of the body holds the
/// claim (never releases it) and the next run does not run it again.
#[tokio::test]
async fn a_step_whose_value_does_not_serialize_holds_the_claim_when_the_body_fails() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_unserializable").part(1);
    let ran = AtomicUsize::new(0);
    let outcome: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            let map: HashMap<(u8, u8), u8> = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(HashMap::from([((1, 2), 3)]))
            })
            .await?;
            assert_eq!(map.len(), 1, "the body still gets the value");
            Err(Rejected::InFlight)
        })
        .await;
    assert!(matches!(outcome, Err(Rejected::InFlight)), "{outcome:?}");
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt"),
        "held, never released"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// A stored value that no longer reads back as the step's type (a deploy
/// changed it): refused `StepInDoubt`, saying why, the step not run again;
/// nothing is in doubt (it happened), so the claim follows the body's
/// failure instead of being held where no verdict could free it (the red
/// team's first reading found exactly that); code that reads the record
/// goes on from it.
#[tokio::test]
async fn a_value_that_no_longer_reads_back_is_refused_without_holding_the_claim() {
    let gate = testing::gate().await;
    let id = Identity::new(testing::unique_name("rs_readback")).part(1);
    // The old deploy: the charge returned a number; the body then failed.
    let old: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(5) }).await?;
            Err(Rejected::InFlight)
        })
        .await;
    assert!(matches!(old, Err(Rejected::InFlight)), "{old:?}");
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Receipt {
        id: String,
    }
    let ran = AtomicUsize::new(0);
    let new: Result<String, Rejected> = gate
        .guard(&id)
        .run(async {
            let receipt: Receipt = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(Receipt { id: "new".into() })
            })
            .await?;
            Ok(receipt.id)
        })
        .await;
    match &new {
        Err(Rejected::StepInDoubt { step, why }) => {
            assert_eq!(step, "charge");
            assert!(why.contains("no longer reads back"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "it happened: not run again");
    assert_eq!(
        state_of(&gate, &id).await,
        None,
        "not held: released, as the body's failure says"
    );
    // Code that reads what was recorded goes on from it.
    let fixed: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async { idem::step("charge", async { Ok::<u64, Rejected>(9) }).await })
        .await;
    assert_eq!(fixed.ok(), Some(5));
}

// ---------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------

/// "Names are any text": NUL, 10 kB, unicode; names that differ only by a
/// NUL, or by where one ends, are different steps; each is recorded and
/// replayed; and a name cut off is read back exactly for the reconciler.
#[tokio::test]
async fn hostile_step_names_are_recorded_replayed_and_read_back_exactly() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_names").part(1);
    let long = "x".repeat(10 * 1024);
    let names: Vec<String> = vec![
        "a".into(),
        "a\0".into(),
        "\0a".into(),
        "a\0b".into(),
        long.clone(),
        format!("{long}y"),
        "café ☕ 🧾 שלום".into(),
        String::new(),
        "p".into(),
    ];
    let ran = AtomicUsize::new(0);
    let body = |fail: bool| {
        let (names, ran) = (&names, &ran);
        async move {
            let mut seen = Vec::new();
            for (n, name) in names.iter().enumerate() {
                let v: u64 = idem::step(name.clone(), async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(n as u64)
                })
                .await?;
                seen.push(v);
            }
            if fail {
                return Err(Rejected::InFlight);
            }
            Ok(seen)
        }
    };
    let _ = gate.guard(&id).run(body(true)).await;
    let replayed = gate.guard(&id).run(body(false)).await;
    assert_eq!(
        replayed.ok(),
        Some((0..names.len() as u64).collect::<Vec<_>>())
    );
    assert_eq!(ran.load(Ordering::SeqCst), names.len(), "each ran once");
    assert_eq!(steps_of(&gate, &id).await.len(), names.len());

    // Cut off inside hostile names: the reconciler's list has them exactly.
    for name in ["a\0b", long.as_str(), "café ☕ 🧾 שלום"] {
        let id = Identity::new("rs_names_cut").part(name);
        cut_off_inside(&gate, &id, name, LEASE, &Arc::new(AtomicUsize::new(0))).await;
        let pending = pending_of(&gate, &id).await;
        let names: Vec<&str> = pending.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, [name]);
    }
}

/// Step names chosen to collide with another step's encoding: identity
/// `("ab")` step `"c"` against `("a")` step `"bc"`, an identity whose last
/// part is the name against the name, etc. Their records never meet, and
/// their downstream keys differ.
#[tokio::test]
async fn step_names_built_to_collide_with_another_s_encoding_never_meet() {
    let gate = testing::gate().await;
    let cases: Vec<(Identity, &str)> = vec![
        (Identity::new("rs_coll").part("ab"), "c"),
        (Identity::new("rs_coll").part("a"), "bc"),
        (Identity::new("rs_coll").part("a").part("bc"), ""),
        (Identity::new("rs_coll").part("a"), "\0\0\0\0\0\0\0\x02bc"),
        (Identity::new("rs_coll").part("a"), "s\0\0\0\0\0\0\0\x02bc"),
        (Identity::new("rs_coll").part("a").part(""), "bc"),
        (Identity::new("rs_col").part("l"), "a"),
    ];
    // Each body records its step, then fails, so that every identity runs
    // again (some cases share one); the second round must replay each
    // case's own value.
    let mut keys = Vec::new();
    for round in 0..2 {
        for (n, (id, name)) in cases.iter().enumerate() {
            let seen = Mutex::new(None);
            let _: Result<(), Rejected> = gate
                .guard(id)
                .run(async {
                    let key = idem::downstream_key(name)?;
                    let v = idem::step(*name, async { Ok::<u64, Rejected>(n as u64) }).await?;
                    *seen.lock().expect("seen") = Some((v, key));
                    Err(Rejected::InFlight)
                })
                .await;
            let (v, key) = seen
                .into_inner()
                .expect("seen")
                .unwrap_or_else(|| panic!("case {n} round {round}: no value"));
            assert_eq!(v, n as u64, "case {n} round {round} got another's record");
            if round == 0 {
                keys.push(key);
            }
        }
    }
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "{keys:?}");
}

/// The same identity and step in two accounts, and in no namespace, a
/// namespace, and the empty namespace: each records its own, none replays
/// another's, listings never show another's, keys differ.
#[tokio::test]
async fn the_same_step_in_two_accounts_or_namespaces_never_meets() {
    let base = testing::gate().await;
    let other_account = testing::unique_name("rs_acct");
    let scopes = [
        base.clone(),
        base.account(other_account.as_str()),
        base.namespace("live"),
        base.namespace(""),
        base.account(other_account.as_str()).namespace("live"),
    ];
    let id = Identity::new("rs_scopes").part(1);
    let ran = AtomicUsize::new(0);
    let mut keys = Vec::new();
    for (n, gate) in scopes.iter().enumerate() {
        let outcome: Result<(u64, String), Rejected> = gate
            .guard(&id)
            .run(async {
                let key = idem::downstream_key("charge")?;
                let v = idem::step("charge", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(n as u64)
                })
                .await?;
                Ok((v, key))
            })
            .await;
        let (v, key) = outcome.unwrap_or_else(|e| panic!("scope {n}: {e:?}"));
        assert_eq!(v, n as u64, "scope {n} replayed another scope's step");
        keys.push(key);
    }
    assert_eq!(ran.load(Ordering::SeqCst), scopes.len());
    for gate in &scopes {
        assert_eq!(steps_of(gate, &id).await.len(), 1, "each sees only its own");
    }
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "{keys:?}");
}

// ---------------------------------------------------------------------
// The reconciler's step verdicts
// ---------------------------------------------------------------------

/// Holds `id` in doubt with its step `ship` cut off (a first holder dropped
/// inside it, a second failing for it).
async fn ship_in_doubt(gate: &Gate, id: &Identity, ran: &Arc<AtomicUsize>) {
    cut_off_inside(gate, id, "ship", LEASE, ran).await;
    past_the_lease().await;
    let second: Result<u64, Rejected> = gate
        .guard(id)
        .lease(LEASE)
        .run(async { idem::step("ship", async { Ok::<u64, Rejected>(0) }).await })
        .await;
    assert!(
        matches!(second, Err(Rejected::StepInDoubt { .. })),
        "{second:?}"
    );
}

/// The retry after a resolution: runs `ship`, counting into `ran`.
async fn retry_ship(gate: &Gate, id: &Identity, ran: &Arc<AtomicUsize>) -> Result<u64, Rejected> {
    let ran = Arc::clone(ran);
    gate.guard(id)
        .run(async move {
            idem::step("ship", async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(200)
            })
            .await
        })
        .await
}

/// A verdict for a step that is not in doubt: nothing is recorded for it,
/// the claim stays held, and the real step in doubt is still in doubt.
#[tokio::test]
async fn a_verdict_for_a_step_not_in_doubt_changes_nothing() {
    let gate = testing::gate().await;
    let action = testing::unique_name("rs_ghost");
    let id = Identity::new(&action).part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    ship_in_doubt(&gate, &id, &ran).await;
    let reconciler = Reconciler::new(gate.pool().clone()).probe(action.clone(), |_| async {
        Verdict::step_succeeded_with("ghost", &1_u64).expect("a value")
    });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 0, "{pass:?}");
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt")
    );
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "no ghost step recorded: {steps:?}");
    assert_eq!(pending_of(&gate, &id).await.len(), 1);
}

/// Two reconcilers at once, each answering for the step (one says it
/// happened, with a value): the claim is resolved once, the step recorded
/// once, and the retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_at_once_resolve_a_step_once() {
    let gate = testing::gate_on(testing::pool_with(8).await).await;
    let action = testing::unique_name("rs_two_rec");
    let id = Identity::new(&action).part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    ship_in_doubt(&gate, &id, &ran).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let reconciler = |value: u64| {
        let barrier = Arc::clone(&barrier);
        Reconciler::new(gate.pool().clone()).probe(action.clone(), move |_| {
            let barrier = Arc::clone(&barrier);
            async move {
                barrier.wait().await;
                Verdict::step_succeeded_with("ship", &value).expect("a value")
            }
        })
    };
    let (one, two) = (reconciler(777), reconciler(888));
    let (a, b) = tokio::join!(one.reconcile_once(), two.reconcile_once());
    let (a, b) = (a.expect("a pass"), b.expect("a pass"));
    assert_eq!(a.resolved + b.resolved, 1, "{a:?} {b:?}");
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    let retry = retry_ship(&gate, &id, &ran).await;
    let value = retry.expect("the retry replays");
    assert!(value == 777 || value == 888, "{value}");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "ship never ran again");
}

/// The holder comes back and records the step while the reconciler is
/// asking its probe, which then says "not happened": the record that
/// happened stands (it is never lost), the claim is released, and the retry
/// replays it instead of running the step a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_recording_its_step_while_the_reconciler_resolves_it_is_never_lost() {
    let gate = testing::gate().await;
    let action = testing::unique_name("rs_late_holder");
    let id = Identity::new(&action).part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let (inside_tx, inside) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn({
        let (gate, id, ran) = (gate.clone(), id.clone(), Arc::clone(&ran));
        async move {
            gate.guard(&id)
                .lease(LEASE)
                .run(async move {
                    idem::step("ship", async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        let _ = inside_tx.send(());
                        let _ = finished.await;
                        Ok::<u64, Rejected>(555)
                    })
                    .await
                })
                .await
        }
    });
    inside.await.expect("the holder is inside its step");
    past_the_lease().await;
    let finish = Mutex::new(Some(finish));
    let (recorded_tx, recorded_rx) = tokio::sync::oneshot::channel::<()>();
    let recorded_tx = Mutex::new(Some(recorded_tx));
    let recorded_rx = Arc::new(tokio::sync::Mutex::new(Some(recorded_rx)));
    let pool = gate.pool().clone();
    let watched = (gate.clone(), id.clone());
    // Wait, in the test, for the step's record, then let the probe answer.
    let watcher = tokio::spawn(async move {
        for _ in 0..200 {
            if steps_of(&watched.0, &watched.1)
                .await
                .iter()
                .any(|s| s.state == operations::StepState::Success)
            {
                if let Some(tx) = recorded_tx.lock().expect("tx").take() {
                    let _ = tx.send(());
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let reconciler = Reconciler::new(pool).probe(action.clone(), move |doubt| {
        assert_eq!(doubt.steps_in_doubt, ["ship"]);
        if let Some(finish) = finish.lock().expect("finish").take() {
            let _ = finish.send(());
        }
        let recorded_rx = Arc::clone(&recorded_rx);
        async move {
            if let Some(rx) = recorded_rx.lock().await.take() {
                let _ = rx.await;
            }
            Verdict::NotHappened
        }
    });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    watcher.await.expect("the watcher");
    let holder = holder.await.expect("the holder");
    // The holder's own settle may have won the claim, or the reconciler
    // released it; either way the step's record is the truth.
    let steps = steps_of(&gate, &id).await;
    assert!(
        steps
            .iter()
            .any(|s| s.state == operations::StepState::Success),
        "{steps:?} {pass:?} {holder:?}"
    );
    match state_of(&gate, &id)
        .await
        .map(|(state, _)| state)
        .as_deref()
    {
        Some("success") => {}
        None => {
            let retry = retry_ship(&gate, &id, &ran).await;
            assert_eq!(retry.ok(), Some(555), "replayed");
        }
        other => panic!("{other:?} {pass:?} {holder:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "ship ran once");
}

/// `forget_step` and `resolve_step` by hand, with a stale `PendingStep`:
/// after a retry begins the step anew (a new marker, a new fence), the old
/// answer changes nothing.
#[tokio::test]
async fn an_operator_s_stale_answer_for_a_step_changes_nothing() {
    let gate = testing::gate().await;
    let id = Identity::new("rs_stale_op").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    ship_in_doubt(&gate, &id, &ran).await;
    let stale = pending_of(&gate, &id).await;
    assert_eq!(stale.len(), 1);
    let address = id.address();
    let slot = Slot::new(gate.account_name(), gate.namespace_name(), &address);
    assert!(
        operations::forget_step(gate.pool(), slot, &stale[0])
            .await
            .expect("forget")
    );
    operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Release))
        .await
        .expect("release");
    // A retry begins the step again and is cut off inside it.
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    // The operator's stale answers: neither may touch the new marker.
    assert!(
        !operations::resolve_step(gate.pool(), slot, &stale[0], "1")
            .await
            .expect("resolve")
    );
    assert!(
        !operations::forget_step(gate.pool(), slot, &stale[0])
            .await
            .expect("forget")
    );
    let now = pending_of(&gate, &id).await;
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].fence, stale[0].fence);
}
