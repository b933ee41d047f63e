//! A step after a reconciler or an operator resolved its claim.
//!
//! src/idempotent.md ("Fenced"): a later step "is otherwise refused:
//! `LeaseLost` once its lease ran out, `ClaimLost` when the claim was
//! released under it (an operator's release, say), and `NotRecorded` when
//! a reconciler or an operator resolved it as succeeded or failed, which
//! is what the same holder is told without steps [...] From then on no
//! step of that body runs (a recorded one is still replayed), and should
//! the body swallow the refusal and return `Ok`, its success is not
//! recorded [...] the caller is told the refusal instead."

use idem::{Disposition, Outcome};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::batch::Batch;
use idem::operations::{self, Slot};
use idem::reconcile::{Reconciler, Verdict};
use idem::testing;
use idem::{Detached, Gate, Identity, Rejected};

use crate::support::doubt::state_of;

#[derive(Clone, Copy, Debug, PartialEq)]
enum By {
    OperatorSucceeded,
    OperatorFailed,
    OperatorRelease,
    ReconcilerSucceeded,
    ReconcilerFailed,
    ReconcilerNotHappened,
}

impl By {
    fn decides(self) -> bool {
        !matches!(self, By::OperatorRelease | By::ReconcilerNotHappened)
    }
    fn state_after(self) -> Option<&'static str> {
        match self {
            By::OperatorSucceeded | By::ReconcilerSucceeded => Some("success"),
            By::OperatorFailed | By::ReconcilerFailed => Some("failed"),
            _ => None,
        }
    }
}

const ALL: [By; 6] = [
    By::OperatorSucceeded,
    By::OperatorFailed,
    By::OperatorRelease,
    By::ReconcilerSucceeded,
    By::ReconcilerFailed,
    By::ReconcilerNotHappened,
];

/// Resolves `id`'s pending claim (its holder still running) as `by` says.
async fn resolve(gate: &Gate, id: &Identity, by: By) {
    let address = id.address();
    let slot = Slot::new(gate.account_name(), gate.namespace_name(), &address);
    match by {
        By::OperatorSucceeded | By::OperatorFailed => {
            let resolution = if by == By::OperatorSucceeded {
                Outcome::Succeeded(None)
            } else {
                Outcome::Failed(Disposition::Keep)
            };
            let done = operations::resolve(gate.pool(), slot, resolution)
                .await
                .expect("resolve");
            assert!(
                matches!(done, operations::Resolved::Changed { .. }),
                "{by:?}: {done:?}"
            );
        }
        By::OperatorRelease => {
            let done = operations::release_pending(gate.pool(), slot)
                .await
                .expect("release");
            assert!(done.is_some(), "the operator released it");
        }
        By::ReconcilerSucceeded | By::ReconcilerFailed | By::ReconcilerNotHappened => {
            let verdict = match by {
                By::ReconcilerSucceeded => Verdict::succeeded(),
                By::ReconcilerFailed => Verdict::Failed,
                _ => Verdict::NotHappened,
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            let reconciler = Reconciler::new(gate.pool().clone())
                .account(gate.account_name())
                .pending_older_than(Duration::from_millis(1))
                .probe(id.action().to_owned(), move |_d| {
                    let verdict = verdict.clone();
                    async move { verdict }
                });
            let pass = reconciler.reconcile_once().await.expect("a pass");
            assert!(
                state_of(gate, id).await.map(|(s, _)| s) != Some("pending".into()),
                "{by:?}: the reconciler did not resolve the claim: {pass:?}"
            );
        }
    }
}

fn expected(by: By, told: &Result<u64, Rejected>) -> bool {
    if by.decides() {
        matches!(told, Err(Rejected::NotRecorded { .. }))
    } else {
        matches!(
            told,
            Err(Rejected::ClaimLost { .. } | Rejected::LeaseLost { .. })
        )
    }
}

/// The body: a first step, the resolution, a second step (told), a third
/// step after the body swallowed the refusal (must not run), then `Ok`.
async fn body(
    gate: &Gate,
    id: &Identity,
    by: By,
    repeatable: bool,
    resolve_first: bool,
    told: &Mutex<Vec<Result<u64, Rejected>>>,
    third_ran: &AtomicUsize,
) -> Result<u64, Rejected> {
    let step = |name: &'static str, value: u64| {
        let s = idem::step(name, async move { Ok::<u64, Rejected>(value) });
        if repeatable { s.repeatable() } else { s }
    };
    if !resolve_first {
        let _ = step("first", 1).await;
    }
    resolve(gate, id, by).await;
    let second = step("second", 2).await;
    told.lock().unwrap().push(second.clone());
    // The body swallows the refusal and goes on.
    let third = idem::step("third", async {
        third_ran.fetch_add(1, Ordering::SeqCst);
        Ok::<u64, Rejected>(3)
    });
    let third = if repeatable {
        third.repeatable().await
    } else {
        third.await
    };
    told.lock().unwrap().push(third.clone());
    Ok(7)
}

#[allow(
    clippy::too_many_arguments,
    reason = "one case's whole record, checked at once"
)]
async fn check(
    broken: &mut Vec<String>,
    gate: &Gate,
    id: &Identity,
    case: &str,
    by: By,
    repeatable: bool,
    outcome: Result<u64, Rejected>,
    told: Vec<Result<u64, Rejected>>,
    third_ran: usize,
) {
    if let Some(second) = told.first() {
        if !expected(by, second) {
            broken.push(format!(
                "{case}: the step after the resolution was told {second:?} (expected {})",
                if by.decides() {
                    "NotRecorded"
                } else {
                    "ClaimLost/LeaseLost"
                }
            ));
        }
    } else {
        broken.push(format!("{case}: the body never reached its second step"));
    }
    if !repeatable && third_ran != 0 {
        broken.push(format!(
            "{case}: a step ran after the refusal (\"From then on no step of that body runs\")"
        ));
    }
    if repeatable && third_ran != 0 && by.decides() {
        broken.push(format!(
            "{case}: a repeatable step ran after the claim was decided for good"
        ));
    }
    if let Some(third) = told.get(1).filter(|third| third.is_ok()) {
        broken.push(format!(
            "{case}: the third step, after the refusal, returned {third:?}"
        ));
    }
    if !expected(by, &outcome) {
        broken.push(format!(
            "{case}: the holder (whose body swallowed the refusal and returned Ok) was told {outcome:?}"
        ));
    }
    let state = state_of(gate, id).await.map(|(s, _)| s);
    if state.as_deref() != by.state_after() {
        broken.push(format!(
            "{case}: the claim is {state:?} after, not {:?} (\"the operator's resolution stands\")",
            by.state_after()
        ));
    }
}

/// Every resolver, both kinds of step, resolved before any step or after
/// one, through `Guard::run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_after_a_resolution_are_told_not_recorded_and_after_a_release_claim_lost() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let mut broken = Vec::new();
    for by in ALL {
        for repeatable in [false, true] {
            for resolve_first in [false, true] {
                let action = testing::unique_name("rv_st");
                let id = Identity::new(action.as_str()).part(1u8);
                let told = Mutex::new(Vec::new());
                let third_ran = AtomicUsize::new(0);
                let outcome = gate
                    .guard(&id)
                    .run(body(
                        &gate,
                        &id,
                        by,
                        repeatable,
                        resolve_first,
                        &told,
                        &third_ran,
                    ))
                    .await;
                let case = format!(
                    "guard.run, {by:?}, repeatable {repeatable}, before any step {resolve_first}"
                );
                check(
                    &mut broken,
                    &gate,
                    &id,
                    &case,
                    by,
                    repeatable,
                    outcome,
                    told.into_inner().unwrap(),
                    third_ran.load(Ordering::SeqCst),
                )
                .await;
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The same through `run_detached` and a batch: "Everywhere a gate runs a
/// body".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_after_a_resolution_in_a_detached_body_and_a_batch() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let mut broken = Vec::new();
    for by in [
        By::OperatorSucceeded,
        By::ReconcilerFailed,
        By::OperatorRelease,
    ] {
        for repeatable in [false, true] {
            // Detached.
            let action = testing::unique_name("rv_sd");
            let id = Identity::new(action.as_str()).part(1u8);
            let detached = Detached::with_bound(Duration::from_secs(15));
            let (g, i) = (gate.clone(), id.clone());
            let told = std::sync::Arc::new(Mutex::new(Vec::new()));
            let third = std::sync::Arc::new(AtomicUsize::new(0));
            let (t2, th2) = (told.clone(), third.clone());
            let outcome = gate
                .guard(&id)
                .run_detached(&detached, async move {
                    body(&g, &i, by, repeatable, false, &t2, &th2).await
                })
                .await;
            let told_v = told.lock().unwrap().clone();
            check(
                &mut broken,
                &gate,
                &id,
                &format!("run_detached, {by:?}, repeatable {repeatable}"),
                by,
                repeatable,
                outcome,
                told_v,
                third.load(Ordering::SeqCst),
            )
            .await;
            detached.shutdown(Duration::from_secs(1)).await;

            // A batch of one.
            let action = testing::unique_name("rv_sb");
            let id = Identity::new(action.as_str()).part(1u8);
            let mut batch = Batch::new();
            batch.push((), id.clone());
            let told = Mutex::new(Vec::new());
            let third_ran = AtomicUsize::new(0);
            let outs: Vec<Result<u64, Rejected>> = gate
                .guard_batch(batch)
                .run(|()| body(&gate, &id, by, repeatable, false, &told, &third_ran))
                .await;
            check(
                &mut broken,
                &gate,
                &id,
                &format!("batch, {by:?}, repeatable {repeatable}"),
                by,
                repeatable,
                outs.into_iter().next().expect("one outcome"),
                told.into_inner().unwrap(),
                third_ran.load(Ordering::SeqCst),
            )
            .await;
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The resolution lands while a step's own future runs (between its
/// marker and its record): the step's record must not go in, the holder
/// is told `NotRecorded`, and the resolution stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_inside_a_steps_future_is_not_overwritten_by_its_record() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let mut broken = Vec::new();
    for by in [
        By::OperatorSucceeded,
        By::OperatorFailed,
        By::ReconcilerSucceeded,
        By::OperatorRelease,
    ] {
        for repeatable in [false, true] {
            let action = testing::unique_name("rv_si");
            let id = Identity::new(action.as_str()).part(1u8);
            let step_said = Mutex::new(None);
            let outcome: Result<u64, Rejected> = gate
                .guard(&id)
                .run(async {
                    let s = idem::step("inside", async {
                        resolve(&gate, &id, by).await;
                        Ok::<u64, Rejected>(5)
                    });
                    let r = if repeatable {
                        s.repeatable().await
                    } else {
                        s.await
                    };
                    *step_said.lock().unwrap() = Some(r.clone());
                    Ok(r.unwrap_or(0))
                })
                .await;
            let case = format!("resolved inside the step, {by:?}, repeatable {repeatable}");
            let said = step_said.into_inner().unwrap();
            if matches!(&said, Some(Err(Rejected::ClaimLost { .. }))) && by.decides() {
                broken.push(format!(
                    "{case}: the step was told ClaimLost after a resolution: {said:?}"
                ));
            }
            if !expected(by, &outcome) {
                broken.push(format!("{case}: the holder was told {outcome:?}"));
            }
            let state = state_of(&gate, &id).await.map(|(s, _)| s);
            // Rejected::ClaimLost: "A success of this holder is still
            // recorded (the slot is settled unless it already records an
            // outcome)": a non-repeatable step whose future finished across
            // the release returns its value, the body succeeds, and its
            // success is recorded though the holder is told ClaimLost. A
            // repeatable step's record is refused (ClaimLost), so the body
            // fails and the release stands.
            let want = if by == By::OperatorRelease && !repeatable {
                Some("success")
            } else {
                by.state_after()
            };
            if state.as_deref() != want {
                let scope = idem::operations::ScopeFilter::new()
                    .account(gate.account_name())
                    .namespace(idem::operations::NamespaceFilter::Any);
                let rows = operations::find(gate.pool(), &id.address(), &scope)
                    .await
                    .expect("find");
                let rows: Vec<_> = rows
                    .iter()
                    .map(|r| (r.state.to_string(), r.fence, r.state_reason.clone()))
                    .collect();
                broken.push(format!(
                    "{case}: the claim is {state:?}, not {want:?} (\"the operator's resolution \
                     stands\"); the step said {said:?}, the holder was told {outcome:?}; the row: {rows:?}"
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// With a lease that ran out and a reconciler that resolved the claim as
/// succeeded: the holder without steps is told `NotRecorded` (src/
/// idempotent.md, `lease`: "a holder whose claim a reconciler or an
/// operator resolved while its body ran [...] get NotRecorded"); a step
/// must be told the same, "which is what the same holder is told without
/// steps".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_after_its_expired_lease_was_resolved_is_told_what_the_holder_without_steps_is() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let mut told = Vec::new();
    for with_step in [false, true] {
        for repeatable in [false, true] {
            if !with_step && repeatable {
                continue;
            }
            let action = testing::unique_name("rv_sl");
            let id = Identity::new(action.as_str()).part(1u8);
            let step_said = Mutex::new(None);
            let outcome: Result<u64, Rejected> = gate
                .guard(&id)
                .lease(Duration::from_millis(300))
                .run(async {
                    tokio::time::sleep(Duration::from_millis(450)).await;
                    let reconciler = Reconciler::new(gate.pool().clone())
                        .account(gate.account_name())
                        .probe(id.action().to_owned(), |_d| async { Verdict::succeeded() });
                    let pass = reconciler.reconcile_once().await.expect("pass");
                    assert_eq!(
                        state_of(&gate, &id).await.map(|(s, _)| s).as_deref(),
                        Some("success"),
                        "the reconciler resolved the expired claim: {pass:?}"
                    );
                    if with_step {
                        let s = idem::step("after", async { Ok::<u64, Rejected>(1) });
                        let r = if repeatable {
                            s.repeatable().await
                        } else {
                            s.await
                        };
                        *step_said.lock().unwrap() = Some(r.clone());
                        r
                    } else {
                        Ok(1)
                    }
                })
                .await;
            told.push((
                with_step,
                repeatable,
                step_said.into_inner().unwrap(),
                outcome,
            ));
        }
    }
    let without = told[0].3.clone();
    for (with_step, repeatable, step, outcome) in &told[1..] {
        let kind = |r: &Result<u64, Rejected>| match r {
            Err(e) => {
                std::mem::discriminant(e)
                    == std::mem::discriminant(
                        without.as_ref().err().unwrap_or(&Rejected::AlreadyDone),
                    )
            }
            Ok(_) => without.is_ok(),
        };
        assert!(
            step.as_ref().map(kind).unwrap_or(false) && kind(outcome),
            "with a step (repeatable {repeatable}, {with_step}): the step was told {step:?} and the \
             holder {outcome:?}, the holder without steps {without:?}: not the same story"
        );
    }
    assert!(
        matches!(without, Err(Rejected::NotRecorded { .. })),
        "the holder without steps, whose expired claim a reconciler resolved, was told {without:?}, \
         not NotRecorded"
    );
}

/// An operator's release while the body's effect runs, without a step and
/// with each kind of step around it: where the slot ends up, what the
/// holder is told, and what a retry gets (`Rejected::ClaimLost`: "A
/// success of this holder is still recorded").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_release_inside_a_step_is_told_claim_lost_and_the_success_recorded_as_without_steps()
 {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let mut seen = Vec::new();
    for kind in ["no step", "step", "repeatable step"] {
        let id = Identity::new(testing::unique_name("rv_sr").as_str()).part(1u8);
        let outcome: Result<u64, Rejected> = gate
            .guard(&id)
            .run(async {
                let effect = async {
                    resolve(&gate, &id, By::OperatorRelease).await;
                    Ok::<u64, Rejected>(5)
                };
                match kind {
                    "no step" => effect.await,
                    "step" => idem::step("inside", effect).await,
                    _ => idem::step("inside", effect).repeatable().await,
                }
            })
            .await;
        let state = state_of(&gate, &id).await.map(|(s, _)| s);
        let retry_ran = AtomicUsize::new(0);
        let retry: Result<u64, Rejected> = gate
            .guard(&id)
            .run(async {
                retry_ran.fetch_add(1, Ordering::SeqCst);
                Ok(6)
            })
            .await;
        seen.push(format!(
            "{kind}: holder told {outcome:?}; slot after {state:?}; a retry got {retry:?} (its body ran {} times)",
            retry_ran.load(Ordering::SeqCst)
        ));
    }
    let all = seen.join("\n");
    eprintln!("{all}");
    // Rejected::ClaimLost: "A success of this holder is still recorded";
    // a repeatable step's record is refused (src/idempotent.md, Fenced), so
    // its body fails and the release stands: the retry runs it again with
    // the same downstream key.
    assert!(
        seen[0].contains("ClaimLost")
            && seen[0].contains("slot after Some(\"success\")")
            && seen[0].contains("AlreadyDone"),
        "no step: {all}"
    );
    assert!(
        seen[1].contains("ClaimLost")
            && seen[1].contains("slot after Some(\"success\")")
            && seen[1].contains("AlreadyDone"),
        "a step: {all}"
    );
    assert!(
        seen[2].contains("ClaimLost")
            && seen[2].contains("slot after None")
            && seen[2].contains("Ok(6)"),
        "a repeatable step: {all}"
    );
}

/// An operator holds a claim in doubt (`Outcome::Failed(InDoubt)`) while
/// its holder's body is still at work (no lease, or one run out): from
/// then on "nobody runs the action until a reconciler or an operator finds
/// out", so no step of that body runs, whichever kind, and the holder is
/// told its outcome was not recorded (a recording that failed), never a
/// refusal that says its body did not run; the hold stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_after_an_operator_held_its_claim_in_doubt_does_not_run() {
    let gate = testing::gate().await;
    for (round, (lease, repeatable)) in [
        (None, false),
        (None, true),
        (Some(80), false),
        (Some(80), true),
    ]
    .into_iter()
    .enumerate()
    {
        let id = Identity::new("held_mid_body").part(round);
        let address = id.address();
        let ran = AtomicUsize::new(0);
        let step_said = Mutex::new(None);
        let body = async {
            // Long enough for a lease to run out; then the operator holds
            // the claim in doubt, as a stale one.
            tokio::time::sleep(Duration::from_millis(120)).await;
            let held = operations::resolve(
                gate.pool(),
                Slot::new(gate.account_name(), None, &address),
                Outcome::Failed(Disposition::InDoubt),
            )
            .await
            .expect("hold");
            assert!(
                matches!(held, operations::Resolved::Changed { .. }),
                "round {round}: {held:?}"
            );
            let step = idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(1)
            });
            let said = if repeatable {
                step.repeatable().await
            } else {
                step.await
            };
            *step_said.lock().unwrap_or_else(|e| e.into_inner()) = Some(said.clone());
            said
        };
        let outcome: Result<u64, Rejected> = match lease {
            None => gate.guard(&id).run(body).await,
            Some(ms) => {
                gate.guard(&id)
                    .lease(Duration::from_millis(ms))
                    .run(body)
                    .await
            }
        };
        let step_said = step_said.into_inner().unwrap_or_else(|e| e.into_inner());
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "round {round} (lease {lease:?}, repeatable {repeatable}): a step ran on a claim held \
             in doubt; it was told {step_said:?}, the holder {outcome:?}"
        );
        assert!(
            matches!(
                outcome,
                Err(Rejected::NotRecorded { .. }
                    | Rejected::LeaseLost { .. }
                    | Rejected::ClaimLost { .. })
            ),
            "round {round}: the holder was told {outcome:?} (the step {step_said:?})"
        );
        assert_eq!(
            state_of(&gate, &id).await.map(|(s, _)| s).as_deref(),
            Some("in_doubt"),
            "round {round}: the hold stands"
        );
    }
}
