//! Repeatable steps (`idem::step(name, fut).repeatable()`), attacked
//! since they write no marker: a run reads its claim's steps once, at its
//! first repeatable step, replays every later recorded step from that read,
//! and records a repeatable step with one fenced statement.
//!
//! Each test names the doc sentence it holds the library to. A test that
//! fails shows a promise that does not hold; its assertion says which.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::batch::Batch;
use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::fault_proxy::Proxy;

use crate::support::doubt::state_of;
use crate::support::steps::{
    LEASE, counting_gate, cut_off_inside, cut_off_inside_repeatable, past_the_lease, pending_of,
    statements_of, steps_of,
};

/// A gate on a pool of 4 connections, in an account of its own.
async fn small_gate() -> Gate {
    testing::gate_on(testing::pool_with(4).await).await
}

/// The recorded value (JSON) of `id`'s step at `address`.
async fn recorded_value(gate: &Gate, address: &str) -> Option<String> {
    idem::sqlx::query_scalar(
        "SELECT output_json FROM idem_records WHERE account = $1 AND kind = 'step' AND address = $2",
    )
    .bind(gate.account_name())
    .bind(address)
    .fetch_one(gate.pool())
    .await
    .expect("the step's record")
}

// ---------------------------------------------------------------------
// Fenced: a holder whose claim was taken over
// ---------------------------------------------------------------------

/// What a stale holder saw: its value of step "a", and what its step "b"
/// returned.
#[derive(Default)]
struct StaleSaw {
    a: Option<Result<u64, String>>,
    b: Option<Result<u64, Rejected>>,
}

/// A stale holder runs repeatable "a", stalls inside it past its lease; a
/// new holder takes the claim over and runs "a" (2) and "b" (20) to the
/// end; then the stale holder's "a" finishes (1) and it goes on to "b"
/// (repeatable or not, as `b_repeatable` says), counting into `b_ran`.
async fn stale_holder_goes_on_to_b(
    gate: &Gate,
    id: &Identity,
    b_repeatable: bool,
    b_ran: &AtomicUsize,
) -> (StaleSaw, Result<u64, Rejected>, Result<(), Rejected>) {
    let lease = Duration::from_millis(300);
    let saw = Mutex::new(StaleSaw::default());
    let (stale_running, running) = tokio::sync::oneshot::channel::<()>();
    let (stale_may_finish, may_finish) = tokio::sync::oneshot::channel::<()>();
    let stale = gate.guard(id).lease(lease).run(async {
        let a = idem::step("a", async {
            let _ = stale_running.send(());
            let _ = may_finish.await;
            Ok::<u64, Rejected>(1)
        })
        .repeatable()
        .await;
        saw.lock().unwrap().a = Some(a.as_ref().map(|a| *a).map_err(|e| format!("{e:?}")));
        a?;
        let b = idem::step("b", async {
            b_ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(10)
        });
        let b = if b_repeatable {
            b.repeatable().await
        } else {
            b.await
        };
        let failed = b.is_err();
        saw.lock().unwrap().b = Some(b);
        if failed {
            return Err(Rejected::InFlight);
        }
        Ok::<(), Rejected>(())
    });
    let newer = async {
        let _ = running.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let taken = gate
            .guard(id)
            .lease(Duration::from_secs(30))
            .run(async {
                let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await?;
                let b: u64 = idem::step("b", async { Ok::<u64, Rejected>(20) })
                    .repeatable()
                    .await?;
                Ok::<u64, Rejected>(a + b)
            })
            .await;
        let _ = stale_may_finish.send(());
        taken
    };
    let (stale, newer) = tokio::join!(stale, newer);
    (saw.into_inner().unwrap(), newer, stale)
}

/// src/idempotent.md, "Fenced": "A repeatable step ... may still run in a
/// holder that does not know yet that it lost its claim ...; its record
/// never goes in over the new holder's, and the body is told `LeaseLost`
/// at its next step or its end." Here the stale holder's record of "a"
/// found the claim gone (so it knows), and its next step is repeatable:
/// it must be told `LeaseLost` there, and not run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_is_told_lease_lost_at_its_next_repeatable_step_and_does_not_run_it() {
    let gate = small_gate().await;
    let id = Identity::new("rb_next_repeatable").part(1);
    let b_ran = AtomicUsize::new(0);
    let (saw, newer, stale) = stale_holder_goes_on_to_b(&gate, &id, true, &b_ran).await;
    assert_eq!(newer.as_ref().ok(), Some(&22), "{newer:?}");
    let b_ran = b_ran.load(Ordering::SeqCst);
    assert!(
        matches!(saw.b, Some(Err(Rejected::LeaseLost { .. })) | Some(Ok(20))) && b_ran == 0,
        "promise broken (idempotent.md, Fenced: \"the body is told LeaseLost at its next step \
         or its end\", \"finds what the new holder recorded if it asks again\", \"every run \
         sees one value\"): the stale holder's record of \"a\" already found the claim taken \
         over, yet its next step, a repeatable \"b\" that the new holder recorded as 20, ran \
         {b_ran} time(s) in the stale holder and returned {:?} (neither LeaseLost nor the \
         record); the body ended with {stale:?}",
        saw.b
    );
}

/// The same, when "b" is not repeatable: its marker is fenced, so "b"
/// does not run in the stale holder, which finds the new holder's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_is_told_lease_lost_at_its_next_step_that_is_not_repeatable() {
    let gate = small_gate().await;
    let id = Identity::new("rb_next_plain").part(1);
    let b_ran = AtomicUsize::new(0);
    let (saw, newer, stale) = stale_holder_goes_on_to_b(&gate, &id, false, &b_ran).await;
    assert_eq!(newer.as_ref().ok(), Some(&22), "{newer:?}");
    // Told LeaseLost, or handed what the new holder recorded ("finds what
    // the new holder recorded if it asks again").
    assert!(
        matches!(saw.b, Some(Err(Rejected::LeaseLost { .. })) | Some(Ok(20))),
        "{:?} / {stale:?}",
        saw.b
    );
    assert_eq!(b_ran.load(Ordering::SeqCst), 0, "b ran in the stale holder");
}

/// src/idempotent.md, "Fenced": "every run sees one value"; the brief's
/// "two holders each going on with different values for one step". The
/// stale holder's record of "a" does not go in (the new holder's 2 is the
/// record), and its lookup finds 2; yet the stale body goes on with its own
/// 1 (and a value computed from it), where "finds what the new holder
/// recorded if it asks again" or a `LeaseLost` there would keep one value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_whose_repeatable_record_finds_the_new_holder_s_goes_on_with_one_value() {
    let gate = small_gate().await;
    let id = Identity::new("rb_stale_value").part(1);
    let b_ran = AtomicUsize::new(0);
    let (saw, newer, _stale) = stale_holder_goes_on_to_b(&gate, &id, false, &b_ran).await;
    assert_eq!(newer.as_ref().ok(), Some(&22), "{newer:?}");
    let a_address = steps_of(&gate, &id)
        .await
        .into_iter()
        .find(|step| step.name.as_deref() == Some("a"))
        .expect("step a")
        .address;
    let record = recorded_value(&gate, &a_address).await;
    assert_eq!(record.as_deref(), Some("2"), "the new holder's record");
    assert!(
        matches!(&saw.a, Some(Ok(2))),
        "two holders went on with different values for one step (idempotent.md, Fenced: \
         \"every run sees one value\"): step \"a\" is recorded as {record:?} by the new holder, \
         but the stale holder, whose record found it, was handed {:?} (its own value) and went \
         on with it",
        saw.a
    );
}

/// A stale holder that had read nothing yet (no repeatable step before the
/// takeover) reads at its first repeatable step, after the new holder
/// recorded it: it replays the new holder's value and does not run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_s_first_repeatable_step_replays_the_new_holder_s_record() {
    let gate = small_gate().await;
    let id = Identity::new("rb_stale_first").part(1);
    let lease = Duration::from_millis(300);
    let ran_in_stale = AtomicUsize::new(0);
    let (stale_waiting, waiting) = tokio::sync::oneshot::channel::<()>();
    let (stale_may_go, may_go) = tokio::sync::oneshot::channel::<()>();
    let stale = gate.guard(&id).lease(lease).run(async {
        let _ = stale_waiting.send(());
        let _ = may_go.await;
        idem::step("a", async {
            ran_in_stale.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(1)
        })
        .repeatable()
        .await
    });
    let newer = async {
        let _ = waiting.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let taken = gate
            .guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                idem::step("a", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await
            })
            .await;
        let _ = stale_may_go.send(());
        taken
    };
    let (stale, newer) = tokio::join!(stale, newer);
    assert_eq!(newer.ok(), Some(2));
    assert_eq!(ran_in_stale.load(Ordering::SeqCst), 0, "{stale:?}");
    assert!(
        matches!(stale, Err(Rejected::LeaseLost { .. })),
        "{stale:?}"
    );
}

// ---------------------------------------------------------------------
// Races at a barrier
// ---------------------------------------------------------------------

/// Racers at one instant taking over a holder cut off inside a repeatable
/// step: one takes the claim over and runs it again; the others are
/// refused; one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racers_taking_over_a_holder_cut_off_inside_a_repeatable_step_run_it_once_more() {
    let gate = testing::gate().await;
    let id = Identity::new("rb_race").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside_repeatable(&gate, &id, "charge", LEASE, &ran).await;
    assert!(pending_of(&gate, &id).await.is_empty(), "no marker");
    past_the_lease().await;
    let report = testing::race(6, || {
        let ran = Arc::clone(&ran);
        let gate = &gate;
        let id = &id;
        async move {
            gate.guard(id)
                .lease(Duration::from_secs(30))
                .run(async move {
                    idem::step("charge", async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Rejected>(5)
                    })
                    .repeatable()
                    .await
                })
                .await
        }
    })
    .await;
    assert_eq!(report.wins(), 1, "{report:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        2,
        "cut off once, run again once"
    );
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].state.as_str(), "success");
}

// ---------------------------------------------------------------------
// A step declared one way in one run and the other way in the next
// ---------------------------------------------------------------------

/// A step cut off while it was not repeatable (its marker left), declared
/// repeatable by the next deploy: it runs again and records over the
/// marker; a run after that, back to not repeatable, replays that record.
#[tokio::test]
async fn a_step_cut_off_unrepeatable_runs_again_when_declared_repeatable_and_is_then_replayed() {
    let gate = small_gate().await;
    let id = Identity::new("rb_plain_then_repeatable").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "charge", LEASE, &ran).await;
    assert_eq!(pending_of(&gate, &id).await.len(), 1, "the marker");
    past_the_lease().await;
    let second: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(LEASE)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(7)
            })
            .repeatable()
            .await?;
            Err(Rejected::InFlight) // released: the next run resumes
        })
        .await;
    assert!(matches!(second, Err(Rejected::InFlight)), "{second:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert!(pending_of(&gate, &id).await.is_empty(), "recorded over");
    let third: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(8)
            })
            .await
        })
        .await;
    assert_eq!(third.ok(), Some(7), "replayed, not run");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// A step cut off while it was repeatable (no marker), declared not
/// repeatable by the next deploy: nothing says it began, so it runs (once),
/// and a later run replays it.
#[tokio::test]
async fn a_step_cut_off_repeatable_runs_once_more_when_declared_unrepeatable_next() {
    let gate = small_gate().await;
    let id = Identity::new("rb_repeatable_then_plain").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside_repeatable(&gate, &id, "charge", LEASE, &ran).await;
    past_the_lease().await;
    let plain = |value: u64| {
        let ran = Arc::clone(&ran);
        async move {
            let got = idem::step("charge", async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(value)
            })
            .await?;
            if value == 7 {
                return Err(Rejected::InFlight);
            }
            Ok(got)
        }
    };
    let second = gate.guard(&id).lease(LEASE).run(plain(7)).await;
    assert!(matches!(second, Err(Rejected::InFlight)), "{second:?}");
    let third = gate.guard(&id).run(plain(8)).await;
    assert_eq!(third.ok(), Some(7));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// A marker read at the run's first repeatable step (a step cut off while
/// not repeatable) still refuses a later step of that name that is not
/// repeatable: the read does not turn it into a step to run, and the
/// claim is held in doubt.
#[tokio::test]
async fn a_marker_read_at_the_first_repeatable_step_still_refuses_a_later_unrepeatable_step() {
    let gate = small_gate().await;
    let id = Identity::new("rb_marker_read").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    past_the_lease().await;
    let second: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(LEASE)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .await?;
            idem::step("ship", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .await
        })
        .await;
    assert!(
        matches!(second, Err(Rejected::StepInDoubt { .. })),
        "{second:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1, "ship ran only when cut off");
    let state = state_of(&gate, &id).await.map(|(state, _)| state);
    assert_eq!(state.as_deref(), Some("in_doubt"));
}

/// "a name used twice in one run is refused": a repeatable step and a
/// step of the same name, in either order.
#[tokio::test]
async fn a_name_used_twice_in_one_run_is_refused_whichever_is_repeatable() {
    let gate = small_gate().await;
    for repeatable_first in [true, false] {
        let id = Identity::new("rb_twice").part(u64::from(repeatable_first));
        let ran = AtomicUsize::new(0);
        let out: Result<(), Rejected> = gate
            .guard(&id)
            .run(async {
                let first = idem::step("x", async { Ok::<u64, Rejected>(1) });
                if repeatable_first {
                    first.repeatable().await?;
                } else {
                    first.await?;
                }
                let second = idem::step("x", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(2)
                });
                if repeatable_first {
                    second.await?;
                } else {
                    second.repeatable().await?;
                }
                Ok(())
            })
            .await;
        assert!(matches!(out, Err(Rejected::NotGuarded { .. })), "{out:?}");
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}

// ---------------------------------------------------------------------
// Concurrent steps in one body; cost
// ---------------------------------------------------------------------

/// src/idempotent.md, "Cost": "A run reads its claim's steps once, at its
/// first repeatable step". Two repeatable steps joined in one body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_repeatable_steps_joined_in_one_body_read_the_claim_s_steps_once() {
    let proxy = Proxy::start().await;
    let gate = counting_gate(&proxy).await;
    let id = Identity::new("rb_join_cost").part(1);
    let body = async {
        let (a, b) = tokio::join!(
            idem::step("a", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .into_future(),
            idem::step("b", async { Ok::<u64, Rejected>(2) })
                .repeatable()
                .into_future(),
        );
        Ok::<u64, Rejected>(a? + b?)
    };
    let (out, statements) = statements_of(&proxy, gate.guard(&id).run(body)).await;
    assert_eq!(out.ok(), Some(3));
    assert_eq!(
        statements,
        1 + 1 + 2 + 1,
        "promise broken (idempotent.md, Cost: \"A run reads its claim's steps once\"): two \
         repeatable steps joined in one body cost {statements} statements, not claim, one read, \
         a, b, settle (5): each read the claim's steps"
    );
}

/// Two repeatable steps joined: a retry replays both, runs neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_repeatable_steps_joined_in_one_body_are_replayed_on_the_retry() {
    let gate = small_gate().await;
    let id = Identity::new("rb_join_replay").part(1);
    let ran = AtomicUsize::new(0);
    let body = |value: u64, fail: bool| {
        let ran = &ran;
        async move {
            let (a, b) = tokio::join!(
                idem::step("a", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(value)
                })
                .repeatable()
                .into_future(),
                idem::step("b", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(value * 10)
                })
                .repeatable()
                .into_future(),
            );
            let sum = a? + b?;
            if fail {
                return Err(Rejected::InFlight);
            }
            Ok::<u64, Rejected>(sum)
        }
    };
    let first = gate.guard(&id).run(body(1, true)).await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let second = gate.guard(&id).run(body(2, false)).await;
    assert_eq!(second.ok(), Some(11), "both replayed");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// src/idempotent.md, "Cost": "a step replayed before it costs the look
/// that finds it"; after the read, every recorded step is replayed free.
/// A retry whose first step (not repeatable) is recorded, then a
/// repeatable one and another that is not, both recorded: claim, the
/// first step's look (its begin and lookup), the read, the settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_replayed_before_the_read_costs_its_look_and_the_rest_are_free() {
    let proxy = Proxy::start().await;
    let gate = counting_gate(&proxy).await;
    let id = Identity::new("rb_cost_mixed").part(1);
    let body = |fail: bool| async move {
        let x: u64 = idem::step("x", async { Ok::<u64, Rejected>(1) }).await?;
        let y: u64 = idem::step("y", async { Ok::<u64, Rejected>(2) })
            .repeatable()
            .await?;
        let z: u64 = idem::step("z", async { Ok::<u64, Rejected>(3) }).await?;
        if fail {
            return Err(Rejected::InFlight);
        }
        Ok::<u64, Rejected>(x + y + z)
    };
    let (first, statements) = statements_of(&proxy, gate.guard(&id).run(body(true))).await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    // x's record rides with z's marker, z's is written before the release
    // (on Citus, x's record is a statement of its own).
    let carried = crate::support::steps::records_are_carried(&gate).await;
    assert_eq!(
        statements,
        1 + 1 + 1 + 1 + 1 + 1 + 1 + u64::from(!carried),
        "claim, x's marker, read, y, z's marker with x's record, z's record, release"
    );
    let (second, statements) = statements_of(&proxy, gate.guard(&id).run(body(false))).await;
    assert_eq!(second.ok(), Some(6));
    assert_eq!(statements, 1 + 2 + 1 + 1, "claim, x's look, read, settle");
}

// ---------------------------------------------------------------------
// A value that cannot be recorded
// ---------------------------------------------------------------------

/// A writer into a shared buffer, for a tracing subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A repeatable step whose value JSON cannot say (a NaN): the body gets
/// it, nothing is recorded, a failure of the body releases the claim (it
/// is not held in doubt: the step may run again), and the retry runs it
/// again and records it. What the gate logs must say so: not that a later
/// run will find the step in doubt.
#[tokio::test]
async fn an_unrecordable_repeatable_step_releases_runs_again_and_its_log_says_so() {
    use tracing::instrument::WithSubscriber;
    let gate = small_gate().await;
    let id = Identity::new("rb_nan").part(1);
    let ran = AtomicUsize::new(0);
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let captured = captured.clone();
            move || captured.clone()
        })
        .with_ansi(false)
        .finish();
    let first: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            let value: f64 = idem::step("measure", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<f64, Rejected>(f64::NAN)
            })
            .repeatable()
            .await?;
            assert!(value.is_nan(), "the body gets the value");
            Err(Rejected::InFlight)
        })
        .with_subscriber(subscriber)
        .await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    assert_eq!(state_of(&gate, &id).await, None, "released, not held");
    assert!(steps_of(&gate, &id).await.is_empty(), "nothing recorded");
    let second: Result<f64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("measure", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<f64, Rejected>(1.5)
            })
            .repeatable()
            .await
        })
        .await;
    assert_eq!(second.ok(), Some(1.5));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("not recorded"),
        "the gate logged nothing of it: {log:?}"
    );
    assert!(
        !log.contains("find the step in doubt"),
        "misleading error: for a repeatable step whose value JSON cannot say, the gate logs \
         that \"a later run will find the step in doubt\", but a repeatable step leaves no \
         marker and the retry simply runs it again (it just did, and the claim was released, \
         not held). Logged: {log}"
    );
}

/// The same value from a repeatable step run over a marker a holder cut
/// off inside it left (declared not repeatable then): the marker stays,
/// and the claim is not stranded: the next repeatable run records it.
#[tokio::test]
async fn an_unrecordable_repeatable_step_over_a_marker_leaves_a_way_out() {
    let gate = small_gate().await;
    let id = Identity::new("rb_nan_marker").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "measure", LEASE, &ran).await;
    past_the_lease().await;
    let run = |value: f64| {
        let ran = Arc::clone(&ran);
        gate.guard(&id).lease(LEASE).run(async move {
            idem::step("measure", async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<f64, Rejected>(value)
            })
            .repeatable()
            .await?;
            if value.is_nan() {
                return Err(Rejected::InFlight);
            }
            Ok::<f64, Rejected>(value)
        })
    };
    let second = run(f64::NAN).await;
    assert!(matches!(second, Err(Rejected::InFlight)), "{second:?}");
    assert_eq!(state_of(&gate, &id).await, None, "released");
    let third = run(2.5).await;
    assert_eq!(third.ok(), Some(2.5));
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].state.as_str(), "success");
}

// ---------------------------------------------------------------------
// The caller's transaction
// ---------------------------------------------------------------------

/// A repeatable step in the caller's transaction: recorded there, replayed
/// by the retry once the transaction committed its release; forgotten
/// (and run again) when it rolled back.
#[tokio::test]
async fn a_repeatable_step_in_the_caller_s_transaction_commits_and_rolls_back_with_it() {
    let gate = small_gate().await;
    let ran = AtomicUsize::new(0);
    for commit in [true, false] {
        let id = Identity::new("rb_tx").part(u64::from(commit));
        let mut tx = gate.pool().begin().await.expect("begin");
        let first: Result<u64, Rejected> = gate
            .guard(&id)
            .tx(&mut tx)
            .run(async |connection: &mut idem::sqlx::PgConnection| {
                idem::step("charge", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(5)
                })
                .repeatable()
                .on(&mut *connection)
                .await?;
                Err(Rejected::InFlight)
            })
            .await;
        assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("roll back");
        }
        let before = ran.load(Ordering::SeqCst);
        let mut tx = gate.pool().begin().await.expect("begin");
        let second: Result<u64, Rejected> = gate
            .guard(&id)
            .tx(&mut tx)
            .run(async |connection: &mut idem::sqlx::PgConnection| {
                idem::step("charge", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(6)
                })
                .repeatable()
                .on(&mut *connection)
                .await
            })
            .await;
        tx.commit().await.expect("commit");
        let expected = if commit { (5, 0) } else { (6, 1) };
        assert_eq!(
            (second.ok(), ran.load(Ordering::SeqCst) - before),
            (Some(expected.0), expected.1),
            "commit: {commit}"
        );
    }
}

/// `Step::on`: "A step of a claim made inside a transaction must be given
/// it"; a step given another connection is refused `WrongConnection`
/// ("the step did not run") when it is not repeatable. A repeatable one,
/// given the same wrong connection, must be refused too, not run with its
/// value silently unrecorded.
#[tokio::test]
async fn a_repeatable_step_given_a_connection_other_than_its_claim_s_transaction_is_refused() {
    let gate = small_gate().await;
    for repeatable in [false, true] {
        let id = Identity::new("rb_wrong_connection").part(u64::from(repeatable));
        let ran = AtomicUsize::new(0);
        let mut other = gate.pool().acquire().await.expect("another connection");
        let mut tx = gate.pool().begin().await.expect("begin");
        let out: Result<u64, Rejected> = gate
            .guard(&id)
            .tx(&mut tx)
            .run(async |_connection: &mut idem::sqlx::PgConnection| {
                let step = idem::step("charge", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(5)
                });
                let step = if repeatable { step.repeatable() } else { step };
                step.on(&mut other).await
            })
            .await;
        tx.commit().await.expect("commit");
        let ran = ran.load(Ordering::SeqCst);
        let steps = steps_of(&gate, &id).await;
        assert!(
            matches!(out, Err(Rejected::WrongConnection { .. })) && ran == 0,
            "wrong or misleading error (Step::on: a step of a claim made inside a transaction \
             must be given it; the same mistake on a step that is not repeatable is refused \
             WrongConnection, \"the step did not run\"): repeatable = {repeatable}, the step \
             given a connection other than its claim's transaction ran {ran} time(s) and the \
             body got {out:?}, with nothing recorded ({} step rows), and the claim settled as a \
             success",
            steps.len()
        );
    }
}

// ---------------------------------------------------------------------
// Batches, detached bodies
// ---------------------------------------------------------------------

/// A batch item's repeatable step: recorded with its item's claim, and
/// replayed by the item's retry after its release.
#[tokio::test]
async fn a_batch_item_s_repeatable_step_is_replayed_by_its_retry() {
    let gate = small_gate().await;
    let ran = Arc::new(AtomicUsize::new(0));
    let batch = || -> Batch<u64> {
        (1..=3)
            .map(|n| (n, Identity::new("rb_batch").part(n)))
            .collect()
    };
    let run = |fail: bool| {
        let ran = Arc::clone(&ran);
        gate.guard_batch(batch()).run(move |n: u64| {
            let ran = Arc::clone(&ran);
            async move {
                let got = idem::step("charge", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(n * 100 + u64::from(fail))
                })
                .repeatable()
                .await?;
                if fail {
                    return Err(Rejected::InFlight);
                }
                Ok::<u64, Rejected>(got)
            }
        })
    };
    let first = run(true).await;
    assert!(
        first.iter().all(|r| matches!(r, Err(Rejected::InFlight))),
        "{first:?}"
    );
    let second = run(false).await;
    let values: Vec<Option<u64>> = second.iter().map(|r| r.as_ref().ok().copied()).collect();
    assert_eq!(
        values,
        [Some(101), Some(201), Some(301)],
        "replayed: {second:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 3);
}

/// A detached body's repeatable step, the same.
#[tokio::test]
async fn a_detached_body_s_repeatable_step_is_replayed_by_its_retry() {
    let gate = small_gate().await;
    let id = Identity::new("rb_detached").part(1);
    let detached = idem::Detached::with_bound(Duration::from_secs(30));
    let ran = Arc::new(AtomicUsize::new(0));
    let run = |fail: bool| {
        let ran = Arc::clone(&ran);
        gate.guard(&id).run_detached(&detached, async move {
            let got = idem::step("charge", async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(if fail { 1 } else { 2 })
            })
            .repeatable()
            .await?;
            if fail {
                return Err(Rejected::InFlight);
            }
            Ok::<u64, Rejected>(got)
        })
    };
    let first = run(true).await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let second = run(false).await;
    assert_eq!(second.ok(), Some(1));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    detached.shutdown(Duration::from_secs(1)).await;
}

// ---------------------------------------------------------------------
// The reconciler, an operator's release
// ---------------------------------------------------------------------

/// "a reconciler is never asked about it": a holder cut off inside a
/// repeatable step leaves no step in doubt; the reconciler's probe of the
/// expired claim is told none, its "not happened" releases the claim, and
/// the retry runs the step again, once.
#[tokio::test]
async fn the_reconciler_is_not_asked_about_a_repeatable_step_and_its_release_lets_it_run_again() {
    use idem::reconcile::{Reconciler, Verdict};
    let gate = small_gate().await;
    let action = testing::unique_name("rb_reconcile");
    let id = Identity::new(&action).part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside_repeatable(&gate, &id, "charge", LEASE, &ran).await;
    past_the_lease().await;
    let told = Arc::new(Mutex::new(Vec::new()));
    let reconciler = Reconciler::new(gate.pool().clone()).probe(action.clone(), {
        let told = Arc::clone(&told);
        move |doubt| {
            told.lock().unwrap().push(doubt.steps_in_doubt.clone());
            async { Verdict::NotHappened }
        }
    });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 1, "{pass:?}");
    assert_eq!(*told.lock().unwrap(), [Vec::<String>::new()]);
    assert_eq!(state_of(&gate, &id).await, None, "released");
    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(9)
            })
            .repeatable()
            .await
        })
        .await;
    assert_eq!(retry.ok(), Some(9));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// An operator releases a pending claim (no lease) whose holder is inside a
/// repeatable step; a new holder claims it anew and records the step; the
/// old holder's record does not go over it, and the old holder is told it
/// lost its claim; a retry replays the new holder's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_release_under_a_repeatable_step_keeps_the_new_holder_s_record() {
    let gate = small_gate().await;
    let id = Identity::new("rb_operator").part(1);
    let (old_running, running) = tokio::sync::oneshot::channel::<()>();
    let (old_may_finish, may_finish) = tokio::sync::oneshot::channel::<()>();
    let old = gate.guard(&id).run(async {
        let got = idem::step("charge", async {
            let _ = old_running.send(());
            let _ = may_finish.await;
            Ok::<u64, Rejected>(1)
        })
        .repeatable()
        .await?;
        Ok::<u64, Rejected>(got)
    });
    let newer = async {
        let _ = running.await;
        let address = id.address();
        let slot =
            idem::operations::Slot::new(gate.account_name(), gate.namespace_name(), &address);
        let released = idem::operations::release_pending(gate.pool(), slot)
            .await
            .expect("release");
        assert!(released.is_some(), "the operator released it");
        let taken: Result<u64, Rejected> = gate
            .guard(&id)
            .run(async {
                idem::step("charge", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await?;
                Err(Rejected::InFlight) // released again, for the retry
            })
            .await;
        let _ = old_may_finish.send(());
        taken
    };
    let (old, newer) = tokio::join!(old, newer);
    assert!(matches!(newer, Err(Rejected::InFlight)), "{newer:?}");
    assert!(
        matches!(
            old,
            Err(Rejected::ClaimLost { .. } | Rejected::LeaseLost { .. })
        ),
        "the old holder is told: {old:?}"
    );
    // The old holder's late success is kept in the slot ("a success is
    // never lost"), so a retry is refused; the step's record is the new
    // holder's.
    let retry: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(3) })
                .repeatable()
                .await
        })
        .await;
    assert!(
        matches!(retry, Ok(2) | Err(Rejected::AlreadyDone)),
        "{retry:?}"
    );
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    let record = recorded_value(&gate, &steps[0].address).await;
    assert_eq!(record.as_deref(), Some("2"), "the new holder's record");
}

// ---------------------------------------------------------------------
// Namespaces, async commit, faults
// ---------------------------------------------------------------------

/// The record's other form (a namespace) with the async commit, over a
/// cut-off holder's marker: the conflict target is the namespace's index,
/// the record goes over the marker, and the retry replays it.
#[tokio::test]
async fn a_repeatable_step_records_over_a_marker_in_a_namespace_with_async_commit() {
    let gate = small_gate().await.namespace("rb_live");
    let id = Identity::new("rb_namespace").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "charge", LEASE, &ran).await;
    assert_eq!(pending_of(&gate, &id).await.len(), 1);
    past_the_lease().await;
    // The cut-off holder's claim released by an operator (its marker stays):
    // an async commit cannot be combined with a lease, so the next run
    // claims it anew rather than taking it over.
    let address = id.address();
    let slot = idem::operations::Slot::new(gate.account_name(), gate.namespace_name(), &address);
    let released = idem::operations::release_pending(gate.pool(), slot)
        .await
        .expect("release");
    assert!(released.is_some());
    assert_eq!(pending_of(&gate, &id).await.len(), 1, "the marker stays");
    let run = |value: u64, fail: bool| {
        let ran = Arc::clone(&ran);
        gate.guard(&id)
            .outcome_commit(idem::OutcomeCommit::Async)
            .run(async move {
                let got = idem::step("charge", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(value)
                })
                .repeatable()
                .await?;
                let other = idem::step("fresh", async { Ok::<u64, Rejected>(1) })
                    .repeatable()
                    .await?;
                if fail {
                    return Err(Rejected::InFlight);
                }
                Ok::<u64, Rejected>(got + other)
            })
    };
    let second = run(7, true).await;
    assert!(matches!(second, Err(Rejected::InFlight)), "{second:?}");
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(
        steps.iter().all(|s| s.state.as_str() == "success"),
        "{steps:?}"
    );
    let third = run(8, false).await;
    assert_eq!(third.ok(), Some(8), "replayed");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// `pg_terminate_backend` of every connection of the gate's pool while a
/// repeatable step runs: its record still goes in (once), and the retry
/// replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_step_records_after_its_pool_s_connections_were_terminated() {
    let pool = testing::pool_with(2).await;
    let gate = testing::gate_on(pool.clone()).await;
    let killer = testing::pool_with(1).await;
    let id = Identity::new("rb_terminated").part(1);
    let ran = AtomicUsize::new(0);
    let first: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("a", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .await?;
            let got = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                // Every connection the pool holds, terminated.
                let mut pids = Vec::new();
                let mut held = Vec::new();
                while let Ok(Some(mut connection)) =
                    tokio::time::timeout(Duration::from_millis(50), pool.acquire())
                        .await
                        .map(Result::ok)
                {
                    let pid: i32 = idem::sqlx::query_scalar("SELECT pg_backend_pid()")
                        .fetch_one(&mut *connection)
                        .await
                        .expect("pid");
                    pids.push(pid);
                    held.push(connection);
                    if held.len() == 2 {
                        break;
                    }
                }
                drop(held);
                for pid in pids {
                    let _: bool = idem::sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .fetch_one(&killer)
                        .await
                        .expect("terminate");
                }
                Ok::<u64, Rejected>(5)
            })
            .repeatable()
            .await?;
            let _ = got;
            Err(Rejected::InFlight)
        })
        .await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let second: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(6)
            })
            .repeatable()
            .await
        })
        .await;
    assert_eq!(
        second.ok(),
        Some(5),
        "the record went in through the terminations"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// A repeatable step the body dropped (a timeout around it) leaves no
/// doubt: the body's failure releases the claim, and the retry runs it.
#[tokio::test]
async fn a_repeatable_step_dropped_by_a_timeout_releases_and_runs_again() {
    let gate = small_gate().await;
    let id = Identity::new("rb_timeout").part(1);
    let ran = AtomicUsize::new(0);
    let first: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            let step = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok::<u64, Rejected>(1)
            })
            .repeatable()
            .into_future();
            match tokio::time::timeout(Duration::from_millis(100), step).await {
                Ok(done) => done,
                Err(_) => Err(Rejected::InFlight),
            }
        })
        .await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    assert_eq!(state_of(&gate, &id).await, None, "released, not in doubt");
    let second: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .repeatable()
            .await
        })
        .await;
    assert_eq!(second.ok(), Some(2));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// `Step::repeatable`: "A later run then runs a step its holder was cut off
/// inside, instead of holding the claim in doubt"; src/idempotent.md: a
/// step moved out of its body "stops at its next poll there, also
/// `NotGuarded`". A repeatable step begun in the body (its future polled)
/// and then moved into a task the body spawned is stopped there; the body
/// then fails (a release): a repeatable step must not hold the claim in
/// doubt, since a later run simply runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_step_moved_out_of_its_body_does_not_hold_the_claim_in_doubt() {
    let gate = small_gate().await;
    let id = Identity::new("rb_escaped").part(1);
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first: Result<u64, Rejected> = gate
        .guard(&id)
        .run({
            let started = Arc::clone(&started);
            async move {
                let mut step = idem::step("charge", {
                    let started = Arc::clone(&started);
                    async move {
                        started.store(true, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                        Ok::<u64, Rejected>(1)
                    }
                })
                .repeatable()
                .into_future();
                // Poll it in the body until its own future has begun.
                while !started.load(Ordering::SeqCst) {
                    std::future::poll_fn(|cx| {
                        let _ = step.as_mut().poll(cx);
                        std::task::Poll::Ready(())
                    })
                    .await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let outside = tokio::spawn(step).await.expect("the task");
                assert!(
                    matches!(outside, Err(Rejected::NotGuarded { .. })),
                    "{outside:?}"
                );
                Err(Rejected::InFlight) // a release
            }
        })
        .await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let state = state_of(&gate, &id).await.map(|(state, _)| state);
    assert_eq!(
        state,
        None,
        "promise broken (Step::repeatable: \"A later run then runs a step its holder was cut \
         off inside, instead of holding the claim in doubt\"): a repeatable step stopped outside \
         its body turned the body's release into a claim held {state:?}, with no step in doubt \
         for a reconciler to be told ({} pending steps)",
        pending_of(&gate, &id).await.len()
    );
}

/// A marker a cut-off holder left (declared not repeatable then), its
/// claim released by an operator; the next run, in the caller's
/// transaction, runs the step as repeatable on that transaction: its
/// record goes over the marker there, and commits with it.
#[tokio::test]
async fn a_repeatable_step_in_a_transaction_records_over_a_cut_off_holder_s_marker() {
    let gate = small_gate().await;
    let id = Identity::new("rb_tx_marker").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "charge", LEASE, &ran).await;
    past_the_lease().await;
    let address = id.address();
    let slot = idem::operations::Slot::new(gate.account_name(), gate.namespace_name(), &address);
    assert!(
        idem::operations::release_pending(gate.pool(), slot)
            .await
            .expect("release")
            .is_some()
    );
    let mut tx = gate.pool().begin().await.expect("begin");
    let second: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection: &mut idem::sqlx::PgConnection| {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(4)
            })
            .repeatable()
            .on(&mut *connection)
            .await?;
            Err(Rejected::InFlight)
        })
        .await;
    assert!(matches!(second, Err(Rejected::InFlight)), "{second:?}");
    tx.commit().await.expect("commit");
    assert!(
        pending_of(&gate, &id).await.is_empty(),
        "recorded over the marker"
    );
    let third: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(5)
            })
            .await
        })
        .await;
    assert_eq!(third.ok(), Some(4));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}
