//! Carried step records at the edges of a run (`idem::step`, **Cost**),
//! attacked from their docs: bodies dropped, stalled, unpolled or
//! panicking around the statement that carries a record, cancelled writes,
//! leases near their end, joined and nested steps, batches, detached runs.
//! The promises:
//! a step's record rides with the run's next statement, waits 20 ms at
//! most, then is written on its own by a task that outlives the body; a
//! failure, a refused success, a batch item and a stopped detached body
//! write it before their outcome; it is carried only where nobody else can
//! record the step meanwhile (no lease, or a good margin of one left).
//!
//! The invariants every test holds the library to, whatever happens:
//!
//! - a step's effect runs at most once per identity and step name;
//! - every run of an identity sees one value for a recorded step;
//! - a finished step is never lost once the body's outcome is recorded
//!   (a claim settled, released or kept with a step still `pending` that
//!   had finished is a loss);
//! - nothing is left `pending` forever when the body finished normally.
//!
//! Each test says which promise it attacks. A test that fails shows a
//! promise that does not hold; its assertion says which.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::batch::Batch;
use idem::operations::StepState;
use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::fault_proxy::Proxy;

use crate::support::doubt::state_of;
use crate::support::steps::{recorded, records_are_carried, steps_of};

/// How long every test waits for a record that may still be on its way
/// (the docs promise 20 ms; this is generous on a loaded 2-core machine).
const SETTLE: Duration = Duration::from_millis(400);

/// The state of `id`'s step `name`: `None` if it has no row.
async fn state_of_step(gate: &Gate, id: &Identity, name: &str) -> Option<StepState> {
    steps_of(gate, id)
        .await
        .into_iter()
        .find(|step| step.name.as_deref() == Some(name))
        .map(|step| step.state)
}

/// Names and states of every step of `id`, sorted by name: for messages.
async fn all_steps(gate: &Gate, id: &Identity) -> Vec<(String, StepState)> {
    let mut steps: Vec<(String, StepState)> = steps_of(gate, id)
        .await
        .into_iter()
        .map(|step| (step.name.unwrap_or_default(), step.state))
        .collect();
    steps.sort_by(|a, b| a.0.cmp(&b.0));
    steps
}

/// The claim's state, `None` when released.
async fn claim_state(gate: &Gate, id: &Identity) -> Option<String> {
    state_of(gate, id).await.map(|(state, _)| state)
}

/// The invariant "a finished step is never lost once the body's outcome is
/// recorded": a claim whose outcome is recorded (settled, released) must
/// not have a finished step left `pending`. A claim still `pending` or
/// held `in_doubt` may (the docs allow a step in doubt there).
async fn assert_no_finished_step_lost(gate: &Gate, id: &Identity, finished: &[&str], case: &str) {
    let claim = claim_state(gate, id).await;
    let steps = all_steps(gate, id).await;
    let outcome_recorded = matches!(claim.as_deref(), None | Some("success" | "failed"));
    if outcome_recorded {
        for name in finished {
            assert_eq!(
                state_of_step(gate, id, name).await,
                Some(StepState::Success),
                "{case}: the claim's outcome is recorded ({claim:?}), yet finished step \
                 {name:?} is not: {steps:?}"
            );
        }
    }
}

/// A counter per step: how many times its effect ran.
#[derive(Default)]
struct Effects(Mutex<std::collections::BTreeMap<String, usize>>);

impl Effects {
    fn ran(&self, name: &str) {
        *self
            .0
            .lock()
            .expect("effects")
            .entry(name.to_owned())
            .or_default() += 1;
    }
    fn count(&self, name: &str) -> usize {
        self.0
            .lock()
            .expect("effects")
            .get(name)
            .copied()
            .unwrap_or(0)
    }
    fn at_most_once(&self, case: &str) {
        for (name, count) in self.0.lock().expect("effects").iter() {
            assert!(*count <= 1, "{case}: step {name:?} ran {count} times");
        }
    }
}

/// The step `name` worth `value`, counting its effect.
async fn counted(effects: &Effects, name: &str, value: u64) -> Result<u64, Rejected> {
    idem::step(name, async {
        effects.ran(name);
        Ok::<u64, Rejected>(value)
    })
    .await
}

// ---------------------------------------------------------------------
// 1. The 20 ms window.
// ---------------------------------------------------------------------

/// "A finished step's record waits for the run's next statement 20 ms at
/// most, then is written on its own." A body that stalls right around the
/// window (0–50 ms, 1 ms apart near 20 ms) between its steps races the
/// next step's marker (which carries the record) against the task that
/// writes it alone. Whoever wins, every run ends `Ok`, each step ran once,
/// every step is recorded, and a duplicate is refused. Every other run
/// fails after its steps: its release must come after the records, and the
/// retry replays all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_around_the_20_ms_window_record_every_step_once() {
    let gate = testing::gate().await;
    let stalls = [0_u64, 5, 15, 17, 18, 19, 20, 21, 22, 23, 25, 30, 50];
    for round in 0..3 {
        for stall in stalls {
            let fail = (stall + round) % 2 == 1;
            let case = format!("stall {stall} ms, round {round}, fail {fail}");
            let id = Identity::new("rt_window").part(&case);
            let effects = Effects::default();
            let body = || async {
                let a = counted(&effects, "a", 1).await?;
                tokio::time::sleep(Duration::from_millis(stall)).await;
                let b = counted(&effects, "b", 2).await?;
                tokio::time::sleep(Duration::from_millis(stall)).await;
                let c = counted(&effects, "c", 4).await?;
                Ok::<u64, Rejected>(a + b + c)
            };
            let first = gate
                .guard(&id)
                .run(async {
                    let sum = body().await?;
                    if fail {
                        return Err(Rejected::InFlight);
                    }
                    Ok(sum)
                })
                .await;
            if fail {
                assert!(
                    matches!(first, Err(Rejected::InFlight)),
                    "{case}: {first:?}"
                );
                assert_eq!(claim_state(&gate, &id).await, None, "{case}: released");
                assert_no_finished_step_lost(&gate, &id, &["a", "b", "c"], &case).await;
                let retry = gate.guard(&id).run(body()).await;
                assert_eq!(retry.ok(), Some(7), "{case}: the retry replays all");
            } else {
                assert_eq!(first.ok(), Some(7), "{case}");
                assert_no_finished_step_lost(&gate, &id, &["a", "b", "c"], &case).await;
                let again = gate.guard(&id).run(body()).await;
                assert!(
                    matches!(again, Err(Rejected::AlreadyDone)),
                    "{case}: {again:?}"
                );
            }
            for name in ["a", "b", "c"] {
                assert_eq!(effects.count(name), 1, "{case}: {name} ran once");
            }
            let steps = all_steps(&gate, &id).await;
            assert!(
                steps.iter().all(|(_, state)| *state == StepState::Success),
                "{case}: nothing left pending: {steps:?}"
            );
        }
    }
}

/// Runs `id` under `lease`: step `a`, then (when `next_step`) step `b` at
/// once, then waits forever. The caller drops the run as soon as `a` has
/// returned, after polling it `after` ms more (`None`: not at all). Then
/// waits for a record on its way and says what became of `a`, and what a
/// retry after the lease saw (it must replay `a`, never run it again).
async fn drop_right_after_a(
    gate: &Gate,
    id: &Identity,
    next_step: bool,
    after: Option<u64>,
) -> (Option<StepState>, Result<u64, Rejected>, Arc<Effects>) {
    let lease = Duration::from_millis(200);
    let effects = Arc::new(Effects::default());
    let a_done = Arc::new(tokio::sync::Notify::new());
    let run = gate.guard(id).lease(lease).run({
        let (effects, a_done) = (Arc::clone(&effects), Arc::clone(&a_done));
        async move {
            let a = counted(&effects, "a", 1).await?;
            a_done.notify_one();
            let b = if next_step {
                counted(&effects, "b", 2).await?
            } else {
                0
            };
            std::future::pending::<()>().await;
            Ok::<u64, Rejected>(a + b)
        }
    });
    let mut run = Box::pin(run);
    tokio::select! {
        out = &mut run => panic!("the body never ends: {out:?}"),
        () = a_done.notified() => {}
    }
    if let Some(ms) = after {
        let _ = tokio::time::timeout(Duration::from_millis(ms), &mut run).await;
    }
    drop(run);
    tokio::time::sleep(SETTLE).await;
    let a = state_of_step(gate, id, "a").await;
    let retry = gate
        .guard(id)
        .lease(lease)
        .run({
            let effects = Arc::clone(&effects);
            async move {
                let a = counted(&effects, "a", 10).await?;
                let b = counted(&effects, "b", 20).await?;
                Ok::<u64, Rejected>(a + b)
            }
        })
        .await;
    (a, retry, effects)
}

/// "... then is written on its own (by a task that outlives a body dropped
/// meanwhile)." The body is dropped the instant its step `a` returns, with
/// nothing after it but a wait (the record must go alone), or with the
/// next step `b` begun right away, so that the statement carrying `a`'s
/// record (b's marker) is dropped before it completes, 0 to 5 ms of
/// polling later. Each way, the finished step must end up recorded, not
/// left pending (in doubt), and the retry must replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dropped_right_after_a_step_keeps_the_record_even_inside_the_statement_carrying_it()
{
    let gate = testing::gate().await;
    let mut lost = Vec::new();
    let mut cases = 0;
    for next_step in [false, true] {
        for after in [None, Some(0_u64), Some(1), Some(2), Some(5)] {
            for round in 0..3 {
                cases += 1;
                let case =
                    format!("next step {next_step}, dropped {after:?} ms after a, round {round}");
                let id = Identity::new("rt_dropped").part(case.as_str());
                let (a, retry, effects) = drop_right_after_a(&gate, &id, next_step, after).await;
                effects.at_most_once(&case);
                match &retry {
                    Ok(sum) => assert!(*sum == 1 + 20 || *sum == 3, "{case}: {sum}"),
                    Err(Rejected::StepInDoubt { .. }) => {}
                    Err(other) => panic!("{case}: {other:?}"),
                }
                if a != Some(StepState::Success) {
                    lost.push(format!("{case}: a {a:?}, retry {retry:?}"));
                }
            }
        }
    }
    assert!(
        lost.is_empty(),
        "finished steps left in doubt after their body was dropped ({} of {cases} runs):\n{}",
        lost.len(),
        lost.join("\n")
    );
}

/// The sharpest case of the test above: the body goes from step `a`
/// straight into step `b`, whose marker carries `a`'s record, and the
/// caller drops the body the instant `a` has returned (a `select!` whose
/// other branch fired, a client that disconnected). `b` never began; `a`
/// finished. The docs: the record "waits for the run's next statement 20
/// ms at most, then is written on its own (by a task that outlives a body
/// dropped meanwhile)". `a` must be recorded, and its retry replay it
/// rather than be told `StepInDoubt` and hold the claim for an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dropped_as_the_next_step_s_marker_is_to_carry_the_record_keeps_it() {
    let gate = testing::gate().await;
    for round in 0..5 {
        let case = format!("round {round}");
        let id = Identity::new("rt_dropped_marker").part(round);
        let (a, retry, effects) = drop_right_after_a(&gate, &id, true, None).await;
        effects.at_most_once(&case);
        assert_eq!(
            a,
            Some(StepState::Success),
            "{case}: the finished step is recorded, not left in doubt; the retry got {retry:?}"
        );
        // b's marker, carrying a's record, may have gone in before the
        // drop (under load the statement is often already sent): then b
        // is in doubt, as any step cut off inside, and never runs twice.
        // Rarer, `select!` may poll the body once more before the drop,
        // far enough that b itself finishes: then b is replayed (2).
        match &retry {
            Ok(3) if effects.count("b") == 1 => {}
            Ok(sum) => assert_eq!(*sum, 21, "{case}: a replayed (1), b run (20)"),
            Err(Rejected::StepInDoubt { step, .. }) if step == "b" => {}
            Err(other) => panic!("{case}: a replayed, then b run or in doubt: {other:?}"),
        }
    }
}

/// "A finished step's record waits for the run's next statement 20 ms at
/// most, then is written on its own." The body goes from step `a` straight
/// into step `b` (whose marker is to carry `a`'s record), and its caller
/// then stops polling it for 300 ms without dropping it (a `select!` in a
/// loop over `&mut run` whose other branch is busy). The body is not
/// dropped, only not polled: `a`'s record must still be written within
/// the window, since the task that writes it alone is not the body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_not_polled_as_the_next_step_s_marker_is_to_carry_the_record_still_has_it_written() {
    let gate = testing::gate().await;
    for round in 0..3 {
        let case = format!("round {round}");
        let id = Identity::new("rt_unpolled").part(round);
        let effects = Arc::new(Effects::default());
        let a_done = Arc::new(tokio::sync::Notify::new());
        let run = gate.guard(&id).run({
            let (effects, a_done) = (Arc::clone(&effects), Arc::clone(&a_done));
            async move {
                let a = counted(&effects, "a", 1).await?;
                a_done.notify_one();
                let b = counted(&effects, "b", 2).await?;
                Ok::<u64, Rejected>(a + b)
            }
        });
        let mut run = Box::pin(run);
        tokio::select! {
            out = &mut run => panic!("{case}: ended before a_done: {out:?}"),
            () = a_done.notified() => {}
        }
        // Not polled for 300 ms: 15 times the promised wait.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let during = all_steps(&gate, &id).await;
        let out = run.await;
        assert_eq!(out.ok(), Some(3), "{case}");
        assert_eq!(
            during
                .iter()
                .find(|(name, _)| name == "a")
                .map(|(_, state)| *state),
            Some(StepState::Success),
            "{case}: a's record written within its wait while the body was not polled: {during:?}"
        );
        effects.at_most_once(&case);
    }
}

/// "A step cut off — its body ... panicking inside it" is in doubt; a step
/// that *finished* before the body panicked is not cut off, and its record
/// is written "by a task that outlives a body dropped meanwhile". The body
/// panics right after its step: the step must be recorded, and the retry
/// (after the lease) replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_panics_right_after_a_step_still_has_it_recorded() {
    let gate = testing::gate().await;
    let lease = Duration::from_millis(200);
    for round in 0..5 {
        let case = format!("round {round}");
        let id = Identity::new("rt_panic").part(round);
        let effects = Arc::new(Effects::default());
        let task = tokio::spawn({
            let (gate, id, effects) = (gate.clone(), id.clone(), Arc::clone(&effects));
            async move {
                gate.guard(&id)
                    .lease(lease)
                    .run(async {
                        let a = counted(&effects, "a", 1).await?;
                        if a == 1 {
                            panic!("the body panics right after its step");
                        }
                        Ok::<u64, Rejected>(a)
                    })
                    .await
            }
        });
        let joined = task.await;
        assert!(joined.expect_err("it panicked").is_panic(), "{case}");
        tokio::time::sleep(SETTLE).await;
        let steps = all_steps(&gate, &id).await;
        assert_eq!(
            state_of_step(&gate, &id, "a").await,
            Some(StepState::Success),
            "{case}: the finished step is recorded after the panic: {steps:?}"
        );
        let retry = gate
            .guard(&id)
            .lease(lease)
            .run(async { counted(&effects, "a", 10).await })
            .await;
        assert_eq!(retry.ok(), Some(1), "{case}: replayed, one value");
        effects.at_most_once(&case);
    }
}

/// The runtime the body ran on is shut down while its step's record waits
/// for the next statement (the body dropped with it, then the runtime,
/// whose timer and spawned tasks die with it). The docs liken that to "a
/// process killed in that wait", which "leaves the finished step in
/// doubt ... never run twice". What must hold: the step is never run a
/// second time, and a retry sees one value for it (its record) or is told
/// it is in doubt. (Whether the record made it is printed for the report.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_shut_down_while_a_record_waits_never_runs_the_step_twice() {
    let gate = testing::gate().await;
    let lease = Duration::from_millis(200);
    let account = gate.account_name().to_owned();
    let mut lost = 0;
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let case = format!("round {round}");
        let id = Identity::new("rt_runtime_drop").part(round);
        let effects = Arc::new(Effects::default());
        std::thread::spawn({
            let (account, id, effects) = (account.clone(), id.clone(), Arc::clone(&effects));
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async {
                    let gate = testing::gate_on(testing::pool_with(2).await)
                        .await
                        .account(account);
                    let a_done = tokio::sync::Notify::new();
                    let run = gate.guard(&id).lease(lease).run(async {
                        let a = counted(&effects, "a", 1).await?;
                        a_done.notify_one();
                        std::future::pending::<()>().await;
                        Ok::<u64, Rejected>(a)
                    });
                    tokio::select! {
                        _ = run => unreachable!(),
                        () = a_done.notified() => {}
                    }
                });
                // The runtime goes, with the task that was to write a's record.
                drop(runtime);
            }
        })
        .join()
        .expect("the thread");
        tokio::time::sleep(SETTLE).await;
        let a = state_of_step(&gate, &id, "a").await;
        if a == Some(StepState::Pending) {
            lost += 1;
        }
        let retry = gate
            .guard(&id)
            .lease(lease)
            .run(async { counted(&effects, "a", 10).await })
            .await;
        match (&a, &retry) {
            (Some(StepState::Success), Ok(1)) => {}
            (Some(StepState::Pending), Err(Rejected::StepInDoubt { .. })) => {}
            other => panic!("{case}: {other:?}"),
        }
        effects.at_most_once(&case);
    }
    eprintln!("runtime dropped while a record waited: {lost}/{ROUNDS} steps left in doubt");
}

// ---------------------------------------------------------------------
// 2. Leases near their end.
// ---------------------------------------------------------------------

/// "Carried only where nobody else can record the step in the meantime: a
/// claim ... with a good margin of [lease] left." The margin assumes the
/// record lands within its 20 ms wait. Here it cannot: the body, right
/// after its step, holds the gate pool's only connection (its own query in
/// a long transaction), so the task that is to write the record waits for
/// a connection past the lease's end. A second caller takes the claim
/// over meanwhile (`on_expiry` take over, the default) and reaches the
/// step; then the first body ends `Ok`.
///
/// Must hold: the step's effect ran once; every run that got a value for
/// it got the first one (7); and if the first body's late success is kept
/// in the slot (the guard's docs: "the success is still kept in the
/// slot"), the step it went on from is recorded, not left pending under a
/// settled claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_starved_of_a_connection_past_the_lease_end_is_never_run_twice_nor_lost() {
    for round in 0..3 {
        let case = format!("round {round}");
        let first_gate = testing::gate_on(testing::pool_with(1).await).await;
        let second_gate = testing::gate_on(testing::pool_with(2).await)
            .await
            .account(first_gate.account_name());
        let id = Identity::new("rt_starved").part(round);
        let lease = Duration::from_millis(300);
        let effects = Effects::default();
        let (holding_tx, holding) = tokio::sync::oneshot::channel::<()>();
        let (release_tx, release) = tokio::sync::oneshot::channel::<()>();
        let first = first_gate.guard(&id).lease(lease).run(async {
            let a = idem::step("a", async {
                effects.ran("a");
                Ok::<u64, Rejected>(7)
            })
            .await?;
            // The body's own work on the gate's pool, right away.
            let mut connection = first_gate.pool().acquire().await.expect("a connection");
            idem::sqlx::query("SELECT 1")
                .execute(&mut *connection)
                .await
                .expect("the body's query");
            let _ = holding_tx.send(());
            let _ = release.await;
            drop(connection);
            Ok::<u64, Rejected>(a)
        });
        let second = async {
            let _ = holding.await;
            tokio::time::sleep(lease + Duration::from_millis(100)).await;
            let taken = second_gate
                .guard(&id)
                .lease(Duration::from_secs(30))
                .run(async {
                    idem::step("a", async {
                        effects.ran("a");
                        Ok::<u64, Rejected>(8)
                    })
                    .await
                })
                .await;
            let _ = release_tx.send(());
            taken
        };
        let (first, second) = tokio::join!(first, second);
        tokio::time::sleep(SETTLE).await;
        let claim = claim_state(&second_gate, &id).await;
        let a_state = state_of_step(&second_gate, &id, "a").await;
        let a_value = recorded(&second_gate, &id, "a").await;
        eprintln!(
            "{case}: first {first:?}, second {second:?}, claim {claim:?}, a {a_state:?} = \
             {a_value:?}"
        );
        assert_eq!(effects.count("a"), 1, "{case}: a's effect ran once");
        match &second {
            Ok(value) => assert_eq!(*value, 7, "{case}: the second run sees the first value"),
            Err(Rejected::StepInDoubt { .. }) => {}
            Err(other) => panic!("{case}: second: {other:?}"),
        }
        if let Some(value) = &a_value {
            assert_eq!(value, "7", "{case}: one value for the step");
        }
        assert_no_finished_step_lost(&second_gate, &id, &["a"], &case).await;
        // A third run sees one value, or a claim held / done.
        let third = second_gate
            .guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                idem::step("a", async {
                    effects.ran("a");
                    Ok::<u64, Rejected>(9)
                })
                .await
            })
            .await;
        if let Ok(value) = &third {
            assert_eq!(*value, 7, "{case}: third sees the first value");
        }
        assert_eq!(
            effects.count("a"),
            1,
            "{case}: a's effect ran once: {third:?}"
        );
    }
}

/// The same race without starving anything: the step ends with its lease's
/// margin just about left (the docs: "four waits of it left"), 60 to 100
/// ms, then the body stalls past the lease's end and a second caller takes
/// the claim over and reaches the step. Whether the record was carried or
/// written at once, the second caller must replay the first value (the
/// record had 20 ms to land, and at least 60 ms were left), never run the
/// step again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_ending_right_at_the_lease_margin_is_replayed_by_the_taker_over() {
    let gate = testing::gate().await;
    let lease = Duration::from_millis(250);
    for left in [100_u64, 90, 85, 81, 80, 79, 75, 70, 60] {
        let case = format!("{left} ms of lease left");
        let id = Identity::new("rt_margin").part(left);
        let effects = Effects::default();
        let (stalled_tx, stalled) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
        let first = gate.guard(&id).lease(lease).run(async {
            let a = idem::step("a", async {
                effects.ran("a");
                tokio::time::sleep(lease - Duration::from_millis(left)).await;
                Ok::<u64, Rejected>(1)
            })
            .await?;
            let _ = stalled_tx.send(());
            let _ = go.await;
            let b = counted(&effects, "b", 2).await;
            Ok::<u64, Rejected>(a + b?)
        });
        let second = async {
            let _ = stalled.await;
            tokio::time::sleep(Duration::from_millis(left + 80)).await;
            let taken = gate
                .guard(&id)
                .lease(Duration::from_secs(30))
                .run(async {
                    let a = counted(&effects, "a", 10).await?;
                    let b = counted(&effects, "b", 20).await?;
                    Ok::<u64, Rejected>(a + b)
                })
                .await;
            let _ = go_tx.send(());
            taken
        };
        let (first, second) = tokio::join!(first, second);
        assert_eq!(
            second.as_ref().ok(),
            Some(&21),
            "{case}: the taker-over replays a (1) and runs b: first {first:?}"
        );
        effects.at_most_once(&case);
        assert_eq!(
            recorded(&gate, &id, "a").await.as_deref(),
            Some("1"),
            "{case}"
        );
        assert!(
            matches!(first, Err(Rejected::LeaseLost { .. })),
            "{case}: the stale holder is told it lost: {first:?}"
        );
    }
}

// ---------------------------------------------------------------------
// 3. Joined, nested and repeated steps.
// ---------------------------------------------------------------------

/// `join!` of a quick step and one that panics 30 ms later: the quick one
/// finished (its record waits, then is written on its own), the other is
/// cut off inside. The quick one must be recorded, the other in doubt; a
/// retry replays the first and is refused the second, running neither.
///
/// Where records are not carried (Citus), the quick step's record is a
/// statement of its own that its future awaits before it returns: a panic
/// beside it can cut that statement off, and the step is then in doubt as
/// one cut off inside it (`idem::step`, **Cost**). Either way nothing runs
/// twice, and a retry is refused at the first step in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_of_a_finished_step_and_a_panicking_one_records_the_finished_one() {
    let gate = testing::gate().await;
    let carried = records_are_carried(&gate).await;
    let lease = Duration::from_millis(200);
    for delay in [0_u64, 5, 19, 21, 30] {
        let case = format!("b panics {delay} ms in");
        let id = Identity::new("rt_join_panic").part(delay);
        let effects = Arc::new(Effects::default());
        let task = tokio::spawn({
            let (gate, id, effects) = (gate.clone(), id.clone(), Arc::clone(&effects));
            async move {
                gate.guard(&id)
                    .lease(lease)
                    .run(async {
                        let a = idem::step("a", async {
                            effects.ran("a");
                            Ok::<u64, Rejected>(1)
                        });
                        let b = idem::step("b", async {
                            effects.ran("b");
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                            if delay < 1000 {
                                panic!("b panics");
                            }
                            Ok::<u64, Rejected>(2)
                        });
                        let (a, b) = tokio::join!(a, b);
                        Ok::<u64, Rejected>(a? + b?)
                    })
                    .await
            }
        });
        assert!(task.await.expect_err("it panicked").is_panic(), "{case}");
        tokio::time::sleep(SETTLE).await;
        let steps = all_steps(&gate, &id).await;
        let a = state_of_step(&gate, &id, "a").await;
        assert!(
            a == Some(StepState::Success) || (!carried && a == Some(StepState::Pending)),
            "{case}: the finished step is recorded (or, where its record is not carried, \
             in doubt): {steps:?}"
        );
        assert_eq!(
            state_of_step(&gate, &id, "b").await,
            Some(StepState::Pending),
            "{case}: the one cut off is in doubt: {steps:?}"
        );
        let first_in_doubt = if a == Some(StepState::Success) {
            "b"
        } else {
            "a"
        };
        let retry = gate
            .guard(&id)
            .lease(lease)
            .run(async {
                let a = counted(&effects, "a", 10).await?;
                let b = counted(&effects, "b", 20).await?;
                Ok::<u64, Rejected>(a + b)
            })
            .await;
        assert!(
            matches!(&retry, Err(Rejected::StepInDoubt { step, .. }) if step == first_in_doubt),
            "{case}: {retry:?}"
        );
        effects.at_most_once(&case);
    }
}

/// `join!` of two steps, one quick, one failing (`Err`) 0–30 ms later,
/// and the body fails for it: "a failure ... writes the record before its
/// outcome". The claim is released with the quick step recorded and the
/// failed one forgotten; the retry replays the first and runs the second.
/// Also `join!` of two steps that both succeed, settled at once: both
/// recorded, a duplicate refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_steps_have_their_records_written_before_the_release_or_the_settle() {
    let gate = testing::gate().await;
    for (delay, fails) in [
        (0_u64, true),
        (5, true),
        (19, true),
        (25, true),
        (0, false),
        (25, false),
    ] {
        let case = format!("b ends {delay} ms in, fails {fails}");
        let id = Identity::new("rt_join_fail").part(&case);
        let effects = Effects::default();
        let first = gate
            .guard(&id)
            .run(async {
                let a = idem::step("a", async {
                    effects.ran("a");
                    Ok::<u64, Rejected>(1)
                });
                let b = idem::step("b", async {
                    effects.ran("b");
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    if fails {
                        return Err(Rejected::InFlight);
                    }
                    Ok::<u64, Rejected>(2)
                });
                let (a, b) = tokio::join!(a, b);
                Ok::<u64, Rejected>(a? + b?)
            })
            .await;
        if fails {
            assert!(
                matches!(first, Err(Rejected::InFlight)),
                "{case}: {first:?}"
            );
            assert_eq!(claim_state(&gate, &id).await, None, "{case}: released");
            assert_no_finished_step_lost(&gate, &id, &["a"], &case).await;
            let steps = all_steps(&gate, &id).await;
            assert!(
                !steps.iter().any(|(name, _)| name == "b"),
                "{case}: a failed step records nothing: {steps:?}"
            );
            let retry = gate
                .guard(&id)
                .run(async {
                    let a = counted(&effects, "a", 10).await?;
                    let b = counted(&effects, "b", 20).await?;
                    Ok::<u64, Rejected>(a + b)
                })
                .await;
            assert_eq!(retry.ok(), Some(21), "{case}: a replayed, b run");
            assert_eq!((effects.count("a"), effects.count("b")), (1, 2), "{case}");
        } else {
            assert_eq!(first.ok(), Some(3), "{case}");
            assert_no_finished_step_lost(&gate, &id, &["a", "b"], &case).await;
            assert_eq!((effects.count("a"), effects.count("b")), (1, 1), "{case}");
        }
    }
}

/// A step nested inside another's future: the inner one finishes first,
/// its record waiting; then the outer finishes, its own record waiting.
/// The body then fails (a release): both must be recorded before it, and
/// the retry replays the outer without running either. A second retry
/// shape reaches the inner step on its own: it replays the inner's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_nested_inside_another_is_recorded_with_it_before_the_release() {
    let gate = testing::gate().await;
    for stall in [0_u64, 25] {
        let case = format!("stall {stall} ms");
        let id = Identity::new("rt_nested").part(stall);
        let effects = Effects::default();
        let nested = || async {
            idem::step("outer", async {
                effects.ran("outer");
                let inner = counted(&effects, "inner", 5).await?;
                tokio::time::sleep(Duration::from_millis(stall)).await;
                Ok::<u64, Rejected>(inner * 10)
            })
            .await
        };
        let first = gate
            .guard(&id)
            .run(async {
                let outer = nested().await;
                match outer {
                    // A nested step may be refused outright; that is for the
                    // docs to say, and then nothing more is checked.
                    Err(rejected) => Ok::<Result<u64, Rejected>, Rejected>(Err(rejected)),
                    Ok(_) => Err(Rejected::InFlight),
                }
            })
            .await;
        if let Ok(Err(refused)) = &first {
            eprintln!("{case}: a nested step is refused: {refused:?}");
            assert_eq!(effects.count("inner"), 0, "{case}: refused, it did not run");
            continue;
        }
        assert!(
            matches!(first, Err(Rejected::InFlight)),
            "{case}: {first:?}"
        );
        assert_eq!(claim_state(&gate, &id).await, None, "{case}: released");
        assert_no_finished_step_lost(&gate, &id, &["inner", "outer"], &case).await;
        let retry = gate.guard(&id).run(nested()).await;
        assert_eq!(retry.ok(), Some(50), "{case}: the outer replayed");
        let _ = gate
            .guard(&id)
            .run(async { Err::<u64, _>(Rejected::InFlight) })
            .await;
        let inner_alone = gate
            .guard(&id)
            .run(async { counted(&effects, "inner", 6).await })
            .await;
        assert!(
            matches!(inner_alone, Ok(5) | Err(Rejected::AlreadyDone)),
            "{case}: {inner_alone:?}"
        );
        assert_eq!(
            (effects.count("outer"), effects.count("inner")),
            (1, 1),
            "{case}"
        );
    }
}

/// "So is a name used twice in one run": the second use of a name, right
/// after the first finished (its record still waiting for a statement to
/// ride), is refused `NotGuarded` and does not run, and the body fails for
/// it. The first one's record must not be lost with the refusal: it is
/// recorded before the release, and the retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_used_twice_in_a_row_keeps_the_first_s_record() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_twice").part(1);
    let effects = Effects::default();
    let first = gate
        .guard(&id)
        .run(async {
            let a = counted(&effects, "a", 1).await?;
            let again = idem::step("a", async {
                effects.ran("a again");
                Ok::<u64, Rejected>(2)
            })
            .await?;
            Ok::<u64, Rejected>(a + again)
        })
        .await;
    assert!(
        matches!(first, Err(Rejected::NotGuarded { .. })),
        "{first:?}"
    );
    assert_eq!(effects.count("a again"), 0, "the second use does not run");
    assert_no_finished_step_lost(&gate, &id, &["a"], "twice").await;
    let retry = gate
        .guard(&id)
        .run(async { counted(&effects, "a", 10).await })
        .await;
    assert_eq!(retry.ok(), Some(1));
    assert_eq!(effects.count("a"), 1);
}

// ---------------------------------------------------------------------
// 4. Batches and detached runs.
// ---------------------------------------------------------------------

/// "Each body of a batch" runs steps; "a batch item ... writes the record
/// before its outcome". Five items, two steps each, some stalling past the
/// 20 ms window, some failing after their steps (released), the rest
/// succeeding (settled together). Every finished step is recorded before
/// its item's outcome; the re-sent batch replays the failed items' steps
/// without running them and refuses the settled ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_s_items_have_their_carried_records_written_before_their_outcomes() {
    let gate = testing::gate().await;
    let ids: Vec<Identity> = (0..5_u64)
        .map(|n| Identity::new("rt_batch").part(n))
        .collect();
    let batch = || -> Batch<u64> { (0..5_u64).map(|n| (n, ids[n as usize].clone())).collect() };
    let effects = Arc::new(Effects::default());
    let run = |failing: bool| {
        let effects = Arc::clone(&effects);
        gate.guard_batch(batch()).concurrency(5).run(move |n: u64| {
            let effects = Arc::clone(&effects);
            async move {
                let a = idem::step("a", {
                    let effects = Arc::clone(&effects);
                    async move {
                        effects.ran(&format!("{n}/a"));
                        Ok::<u64, Rejected>(n * 10 + 1)
                    }
                })
                .await?;
                if n.is_multiple_of(2) {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                let b = idem::step("b", {
                    let effects = Arc::clone(&effects);
                    async move {
                        effects.ran(&format!("{n}/b"));
                        Ok::<u64, Rejected>(n * 10 + 2)
                    }
                })
                .await?;
                if failing && n % 3 == 1 {
                    return Err(Rejected::InFlight);
                }
                Ok::<u64, Rejected>(a + b)
            }
        })
    };
    let first = run(true).await;
    for (n, out) in first.iter().enumerate() {
        let case = format!("item {n}: {out:?}");
        if n % 3 == 1 {
            assert!(matches!(out, Err(Rejected::InFlight)), "{case}");
            assert_eq!(claim_state(&gate, &ids[n]).await, None, "{case}: released");
        } else {
            assert_eq!(out.as_ref().ok(), Some(&(n as u64 * 20 + 3)), "{case}");
        }
        assert_no_finished_step_lost(&gate, &ids[n], &["a", "b"], &case).await;
        let steps = all_steps(&gate, &ids[n]).await;
        assert!(
            steps.iter().all(|(_, state)| *state == StepState::Success) && steps.len() == 2,
            "{case}: {steps:?}"
        );
    }
    let second = run(false).await;
    for (n, out) in second.iter().enumerate() {
        if n % 3 == 1 {
            assert_eq!(
                out.as_ref().ok(),
                Some(&(n as u64 * 20 + 3)),
                "item {n}: replayed"
            );
        } else {
            assert!(
                matches!(out, Err(Rejected::AlreadyDone)),
                "item {n}: {out:?}"
            );
        }
    }
    effects.at_most_once("batch");
}

/// "A stopped detached body writes the record before its outcome": a
/// detached body takes a step, then runs past its bound after its caller
/// left (stopped, its claim held in doubt), or is stopped at shutdown
/// after a grace period. Its step had finished: it must be recorded, not
/// left pending with the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_body_stopped_right_after_a_step_has_it_recorded() {
    let gate = testing::gate().await;
    for how in ["past the bound", "at shutdown"] {
        for stall_before_stop in [false, true] {
            let case = format!("{how}, stall first {stall_before_stop}");
            let id = Identity::new("rt_detached").part(&case);
            let bound = if how == "past the bound" {
                Duration::from_millis(60)
            } else {
                Duration::from_secs(30)
            };
            let detached = idem::Detached::with_bound(bound);
            let effects = Arc::new(Effects::default());
            let a_done = Arc::new(tokio::sync::Notify::new());
            let run = gate.guard(&id).run_detached(&detached, {
                let (effects, a_done) = (Arc::clone(&effects), Arc::clone(&a_done));
                async move {
                    let a = idem::step("a", {
                        let effects = Arc::clone(&effects);
                        async move {
                            // Past the bound: the caller has left by now.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            effects.ran("a");
                            Ok::<u64, Rejected>(1)
                        }
                    })
                    .await?;
                    a_done.notify_one();
                    if !stall_before_stop {
                        // Yield a little, well inside the 20 ms wait.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<u64, Rejected>(a)
                }
            });
            // The caller leaves at once.
            let _ = tokio::time::timeout(Duration::from_millis(2), run).await;
            if how == "past the bound" {
                // a ends ~10 ms in; the bound stops the body at ~60 ms.
                a_done.notified().await;
                if stall_before_stop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                tokio::time::sleep(SETTLE).await;
            } else {
                a_done.notified().await;
                if stall_before_stop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let _ = detached.shutdown(Duration::from_millis(1)).await;
                tokio::time::sleep(SETTLE).await;
            }
            let claim = claim_state(&gate, &id).await;
            let steps = all_steps(&gate, &id).await;
            assert_eq!(
                claim.as_deref(),
                Some("in_doubt"),
                "{case}: held in doubt: {steps:?}"
            );
            assert_eq!(
                state_of_step(&gate, &id, "a").await,
                Some(StepState::Success),
                "{case}: the finished step is recorded with the stopped body's outcome: {steps:?}"
            );
            effects.at_most_once(&case);
        }
    }
}

// ---------------------------------------------------------------------
// 5. Faults on the statement that carries a record.
// ---------------------------------------------------------------------

/// Locks `id`'s step `name`'s row in a transaction of its own on `pool`:
/// the next statement that writes it waits. Returns the transaction and
/// its backend's pid.
async fn lock_step_row(
    gate: &Gate,
    pool: &idem::sqlx::PgPool,
    id: &Identity,
    name: &str,
) -> (idem::sqlx::Transaction<'static, idem::sqlx::Postgres>, i32) {
    let steps = steps_of(gate, id).await;
    let step = steps
        .iter()
        .find(|s| s.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("step {name} has a row: {steps:?}"));
    let mut tx = pool.begin().await.expect("a transaction");
    let pid: i32 = idem::sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .expect("the locker's pid");
    let locked: i64 = idem::sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE account = $1 AND kind = 'step' \
         AND address = $2 FOR UPDATE) AS locked",
    )
    .bind(gate.account_name())
    .bind(&step.address)
    .fetch_one(&mut *tx)
    .await
    .expect("lock the step's row");
    assert_eq!(locked, 1, "locked {name}'s row");
    (tx, pid)
}

/// Waits for a statement blocked by `locker`, cancels it (as a
/// `statement_timeout`, a deadlock's victim or an operator would), and
/// returns its SQL text.
async fn cancel_the_statement_blocked_by(pool: &idem::sqlx::PgPool, locker: i32) -> String {
    for _ in 0..500 {
        let blocked: Option<(i32, String)> = idem::sqlx::query_as(
            "SELECT pid, query FROM pg_stat_activity \
             WHERE $1 = ANY(pg_blocking_pids(pid)) LIMIT 1",
        )
        .bind(locker)
        .fetch_optional(pool)
        .await
        .expect("read pg_stat_activity");
        if let Some((pid, query)) = blocked {
            let cancelled: bool = idem::sqlx::query_scalar("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .fetch_one(pool)
                .await
                .expect("cancel it");
            assert!(cancelled, "cancelled {pid}");
            return query;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no statement ever waited for the locked row");
}

/// What the blocked statement was, in a word, for messages.
fn kind_of(sql: &str) -> &'static str {
    if sql.contains("begun AS (") {
        "the next step's marker, carrying the record"
    } else if sql.contains("settled AS (UPDATE") {
        "the settle, carrying the record"
    } else {
        "the record on its own (or another)"
    }
}

/// Cancels the statement that carries `id`'s step `a`'s record, at
/// `place`: "next marker" (step `b` right after `a`), "alone after a
/// stall" (the body stalls 200 ms after `a`, so the record goes on its
/// own, then runs `b`), "settle" (the body returns `Ok` right after `a`).
/// Cancelled while it waits for a lock on `a`'s row, as a
/// `statement_timeout`, a deadlock's victim or an operator would: its
/// whole transaction rolls back, the record with it. Then checks what
/// must hold whatever the body was told: no finished step is left pending
/// under a recorded outcome (settled or released), and a retry after the
/// lease never runs `a` again and sees one value for it.
async fn cancel_the_statement_carrying_a_s_record(place: &'static str) {
    let gate = testing::gate().await;
    if !records_are_carried(&gate).await {
        // Said, not skipped silently: where Citus distributes the table no
        // statement carries a record (each is its own, written before the
        // body goes on), and a row lock taken through the coordinator
        // holds no worker's statement for this harness to find and
        // cancel. steps::under_faults covers records cut off there.
        eprintln!("{place}: records are not carried on Citus; nothing to cancel here");
        return;
    }
    let admin = testing::pool_with(3).await;
    let lease = Duration::from_millis(300);
    let case = place.to_owned();
    let id = Identity::new("rt_cancelled").part(place);
    let effects = Arc::new(Effects::default());
    let (in_a_tx, in_a) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let body = gate.guard(&id).lease(lease).run({
        let effects = Arc::clone(&effects);
        async move {
            let a = idem::step("a", {
                let effects = Arc::clone(&effects);
                async move {
                    effects.ran("a");
                    let _ = in_a_tx.send(());
                    let _ = go.await;
                    Ok::<u64, Rejected>(1)
                }
            })
            .await?;
            if place == "settle" {
                return Ok::<u64, Rejected>(a);
            }
            if place == "alone after a stall" {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let b = counted(&effects, "b", 2).await?;
            Ok::<u64, Rejected>(a + b)
        }
    });
    let fault = async {
        let _ = in_a.await;
        let (tx, locker) = lock_step_row(&gate, &admin, &id, "a").await;
        let _ = go_tx.send(());
        let sql = cancel_the_statement_blocked_by(&admin, locker).await;
        tx.rollback().await.expect("unlock");
        sql
    };
    let (out, sql) = tokio::join!(body, fault);
    tokio::time::sleep(SETTLE).await;
    let claim = claim_state(&gate, &id).await;
    let steps = all_steps(&gate, &id).await;
    eprintln!(
        "{case}: cancelled {} -> body {out:?}, claim {claim:?}, steps {steps:?}",
        kind_of(&sql)
    );
    assert_no_finished_step_lost(&gate, &id, &["a"], &case).await;
    if out.is_ok() {
        let finished: &[&str] = if place == "settle" {
            &["a"]
        } else {
            &["a", "b"]
        };
        assert_no_finished_step_lost(&gate, &id, finished, &case).await;
    }
    // The retry, after the lease: one value for a, never run again.
    tokio::time::sleep(lease).await;
    let retry = gate
        .guard(&id)
        .lease(lease)
        .run({
            let effects = Arc::clone(&effects);
            async move { counted(&effects, "a", 10).await }
        })
        .await;
    if let Ok(value) = &retry {
        assert_eq!(*value, 1, "{case}: one value");
    }
    assert_eq!(effects.count("a"), 1, "{case}: a ran once: retry {retry:?}");
}

/// [`cancel_the_statement_carrying_a_s_record`] at the next step's marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_marker_carrying_a_record_never_loses_the_step_under_a_recorded_outcome() {
    cancel_the_statement_carrying_a_s_record("next marker").await;
}

/// [`cancel_the_statement_carrying_a_s_record`] at the record's write on its
/// own (the body stalled past the 20 ms wait), the body going on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lone_record_write_never_loses_the_step_under_a_recorded_outcome() {
    cancel_the_statement_carrying_a_s_record("alone after a stall").await;
}

/// [`cancel_the_statement_carrying_a_s_record`] at the settle that carries
/// the last step's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_settle_carrying_a_record_never_loses_the_step_under_a_recorded_outcome() {
    cancel_the_statement_carrying_a_s_record("settle").await;
}

/// A real connection fault in the 20 ms window: right after the step, the
/// proxy cuts every connection for 100 ms, so the record's write on its
/// own (due within 20 ms) meets a dead store; the body then goes on (a
/// second step, then `Ok`) once the store is back. The docs: "A step whose
/// value could not be recorded ... is treated the same way [in doubt]; the
/// body still gets the value." What must hold: a is never run twice, every
/// run sees one value, and a settled claim has a recorded, not left
/// pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_while_a_record_waits_never_loses_it_under_a_settled_claim() {
    for stall in [50_u64, 150] {
        let proxy = Proxy::start().await;
        let gate = testing::gate_on(proxy.pool(2).await).await;
        let direct = testing::gate_on(testing::pool_with(2).await)
            .await
            .account(gate.account_name());
        let case = format!("stall {stall} ms");
        let id = Identity::new("rt_cut").part(stall);
        let lease = Duration::from_millis(400);
        let effects = Arc::new(Effects::default());
        let (a_done_tx, a_done) = tokio::sync::oneshot::channel::<()>();
        let body = gate.guard(&id).lease(lease).run({
            let effects = Arc::clone(&effects);
            async move {
                let a = counted(&effects, "a", 1).await?;
                let _ = a_done_tx.send(());
                tokio::time::sleep(Duration::from_millis(stall)).await;
                let b = counted(&effects, "b", 2).await;
                Ok::<u64, Rejected>(a + b?)
            }
        });
        let fault = async {
            let _ = a_done.await;
            proxy.cut_for(Duration::from_millis(100)).await;
        };
        let (out, ()) = tokio::join!(body, fault);
        tokio::time::sleep(SETTLE).await;
        let claim = claim_state(&direct, &id).await;
        let steps = all_steps(&direct, &id).await;
        eprintln!("{case}: body {out:?}, claim {claim:?}, steps {steps:?}");
        assert_no_finished_step_lost(&direct, &id, &["a"], &case).await;
        tokio::time::sleep(lease).await;
        let retry = direct
            .guard(&id)
            .lease(lease)
            .run({
                let effects = Arc::clone(&effects);
                async move {
                    let a = counted(&effects, "a", 10).await?;
                    let b = counted(&effects, "b", 20).await?;
                    Ok::<u64, Rejected>(a + b)
                }
            })
            .await;
        if let Ok(sum) = &retry {
            assert!(*sum == 3 || *sum == 21, "{case}: one value for a: {sum}");
        }
        effects.at_most_once(&format!("{case}: retry {retry:?}"));
    }
}
