//! Steps (`idem::step`, `idem::downstream_key`) attacked from the docs
//! alone, beyond what `steps/mod.rs` and `steps/documented_promises.rs`
//! cover. Each test names the doc sentence it holds the
//! library to.
//!
//! A test marked `//! is: the promise it names does not hold (run them with
//! `cargo test --test testsuite steps::markers_operators_and_values:: -- --ignored`). One marked
//! `weak: ...` fails on what no doc promises but a user would expect.
//! `claims_show_escapes_control_characters_in_step_names` runs the `idem`
//! command: `cargo build -p idem-cli` first (it looks in
//! `$CARGO_TARGET_DIR/debug/idem`, else `target/debug/idem`).

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idem::batch::Batch;
use idem::operations::{self, ClaimState, ListFilter, NamespaceFilter, ScopeFilter, Slot};
use idem::testing;
use idem::{Disposition, Gate, Identity, Outcome, Rejected};

use crate::support::doubt::state_of;
use crate::support::steps::{LEASE, cut_off_inside, past_the_lease, pending_of, steps_of};

/// A gate on a pool of 4 connections, in an account of its own.
async fn small_gate() -> Gate {
    testing::gate_on(testing::pool_with(4).await).await
}

/// Runs `id` with one step `name` returning `value`, counting into `ran`,
/// and then fails the body (a release), so that the next run resumes.
async fn record_then_release<T>(
    gate: &Gate,
    id: &Identity,
    name: &str,
    value: T,
    ran: &AtomicUsize,
) -> Result<T, Rejected>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + Clone + 'static,
{
    let seen = Mutex::new(None);
    let out: Result<(), Rejected> = gate
        .guard(id)
        .run(async {
            let got = idem::step(name.to_owned(), async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<T, Rejected>(value.clone())
            })
            .await;
            *seen.lock().unwrap() = Some(got);
            Err(Rejected::InFlight) // any failure: released
        })
        .await;
    assert!(matches!(out, Err(Rejected::InFlight)), "{out:?}");
    seen.into_inner().unwrap().expect("the step was reached")
}

// ---------------------------------------------------------------------
// claims show / operations::steps
// ---------------------------------------------------------------------

/// docs/operations.md: "`show` lists the claim's **steps** (`idem::step`),
/// in the order they were begun"; `operations::steps`: "in the order they
/// were begun". Steps begun one after the other inside the caller's
/// transaction (all share its `now()`).
#[tokio::test]
async fn steps_begun_in_one_transaction_are_listed_in_the_order_they_were_begun() {
    let gate = small_gate().await;
    let id = Identity::new("sb_tx_order").part(1);
    let names: Vec<String> = (0..12).map(|i| format!("step-{i:02}")).collect();
    let mut tx = gate.pool().begin().await.expect("begin");
    let out: Result<(), Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection| {
            for name in &names {
                idem::step(name.clone(), async { Ok::<u32, Rejected>(1) })
                    .on(&mut *connection)
                    .await?;
            }
            Ok(())
        })
        .await;
    out.expect("the body ran");
    tx.commit().await.expect("commit");
    let listed: Vec<String> = steps_of(&gate, &id)
        .await
        .into_iter()
        .map(|step| step.name.unwrap_or_default())
        .collect();
    assert_eq!(listed, names, "listed in the order they were begun");
}

/// The same on the pool, steps begun back to back.
#[tokio::test]
async fn steps_begun_on_the_pool_are_listed_in_the_order_they_were_begun() {
    let gate = small_gate().await;
    let id = Identity::new("sb_pool_order").part(1);
    let names: Vec<String> = (0..12).map(|i| format!("step-{i:02}")).collect();
    let out: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            for name in &names {
                idem::step(name.clone(), async { Ok::<u32, Rejected>(1) }).await?;
            }
            Ok(())
        })
        .await;
    out.expect("the body ran");
    let listed: Vec<String> = steps_of(&gate, &id)
        .await
        .into_iter()
        .map(|step| step.name.unwrap_or_default())
        .collect();
    assert_eq!(listed, names, "listed in the order they were begun");
}

/// `ClaimStep::fence`: "The fence of the claim holder that began it (or
/// last retook it)"; docs/operations.md: "the fence of the holder that ran
/// it". A repeatable step retaken by a new holder shows the new fence.
#[tokio::test]
async fn a_retaken_repeatable_step_shows_the_fence_of_the_holder_that_retook_it() {
    let gate = small_gate().await;
    let id = Identity::new("sb_retake_fence").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "charge", LEASE, &ran).await;
    let first_fence = pending_of(&gate, &id).await[0].fence;
    past_the_lease().await;
    let out: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(LEASE)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(7) })
                .repeatable()
                .await
        })
        .await;
    assert_eq!(out.ok(), Some(7));
    let (_, claim_fence) = state_of(&gate, &id).await.expect("the claim");
    assert_ne!(claim_fence, first_fence);
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].fence, claim_fence, "{steps:?}");
}

// ---------------------------------------------------------------------
// Operators: a step's marker is not a claim
// ---------------------------------------------------------------------

/// docs/operations.md: "`release` deletes only a **pending** claim" and
/// "a step left `pending` refuses to run again (`StepInDoubt`) unless it is
/// repeatable". An operator who passes a step's address (as `claims show`
/// prints it) to release must not delete the marker that refuses the step.
#[tokio::test]
async fn releasing_a_step_s_address_does_not_remove_its_marker() {
    let gate = small_gate().await;
    let id = Identity::new("sb_release_step").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    let pending = pending_of(&gate, &id).await;
    assert_eq!(pending.len(), 1);
    let step_address = pending[0].address.clone();
    let released = operations::release_pending(
        gate.pool(),
        Slot::new(gate.account_name(), gate.namespace_name(), &step_address),
    )
    .await
    .expect("release");
    assert!(
        released.is_none(),
        "a step's marker released as a claim: {released:?}"
    );
    assert_eq!(
        pending_of(&gate, &id).await.len(),
        1,
        "the marker is still there"
    );
}

/// docs/operations.md: `list` / `--state pending` lists **claims**; a step's
/// marker (kind step) is not one: `claims list --state pending
/// --older-than 10m` is what an operator releases from.
#[tokio::test]
async fn claims_list_does_not_list_step_markers_as_claims() {
    let gate = small_gate().await;
    let id = Identity::new("sb_list_step").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    let filter = ListFilter::new()
        .scope(
            ScopeFilter::new()
                .account(gate.account_name())
                .namespace(NamespaceFilter::Any),
        )
        .state(ClaimState::Pending);
    let rows = operations::list(gate.pool(), &filter).await.expect("list");
    let addresses: Vec<&str> = rows.iter().map(|row| row.address.as_str()).collect();
    assert_eq!(addresses, vec![id.address().as_str()], "only the claim");
    let count = operations::count(gate.pool(), &filter)
        .await
        .expect("count");
    assert_eq!(count, 1);
}

// ---------------------------------------------------------------------
// Fences across a release: a stale holder without a lease
// ---------------------------------------------------------------------

/// "Only the claim's holder begins a step; a holder whose lease was taken
/// over cannot begin one": an operator releases a claim whose holder they
/// believe gone (no lease), a retry claims anew, and the old holder, alive
/// after all, goes on to its next step. It must not begin it under the new
/// claim (whose fence must not be its own), and the step runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_claim_an_operator_released_cannot_begin_a_step_under_the_new_claim() {
    let gate = small_gate().await;
    let id = Identity::new("sb_release_aba").part(1);
    let shipped = AtomicUsize::new(0);
    let (charged_tx, charged_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let old_saw = Mutex::new(None);
    let old = gate.guard(&id).run(async {
        idem::step("charge", async { Ok::<u64, Rejected>(1) }).await?;
        let _ = charged_tx.send(());
        let _ = go_rx.await;
        let ship = idem::step("ship", async {
            shipped.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(10)
        })
        .await;
        *old_saw.lock().unwrap() = Some(ship.clone());
        ship.map(|_| ())
    });
    let newer = async {
        let _ = charged_rx.await;
        let (_, old_fence) = state_of(&gate, &id).await.expect("held");
        let address = id.address();
        operations::release_pending(
            gate.pool(),
            Slot::new(gate.account_name(), gate.namespace_name(), &address),
        )
        .await
        .expect("release")
        .expect("it was pending");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let (ship_tx, ship_rx) = tokio::sync::oneshot::channel::<()>();
        let run = gate.guard(&id).run(async {
            let _ = ready_tx.send(());
            let _ = ship_rx.await;
            let charge = idem::step("charge", async { Ok::<u64, Rejected>(2) }).await?;
            let ship = idem::step("ship", async {
                shipped.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(20)
            })
            .await;
            Ok::<_, Rejected>((charge, ship))
        });
        let drive = async {
            let _ = ready_rx.await;
            let (_, new_fence) = state_of(&gate, &id).await.expect("claimed anew");
            // Let the old holder go on first, then the new one.
            let _ = go_tx.send(());
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = ship_tx.send(());
            (old_fence, new_fence)
        };
        let (out, fences) = tokio::join!(run, drive);
        (out, fences)
    };
    let (old_out, (new_out, (old_fence, new_fence))) = tokio::join!(old, newer);
    assert_ne!(old_fence, new_fence, "a new claim, a new fence");
    let saw = old_saw.into_inner().unwrap();
    assert_eq!(
        shipped.load(Ordering::SeqCst),
        1,
        "shipped once; the old holder saw {saw:?} ({old_out:?}), the new {new_out:?}"
    );
}

/// A stale holder (lease taken over) finishes a non-repeatable step it was
/// inside while the new holder has not reached it yet; then the new holder
/// reaches it. "No step that is not declared repeatable runs twice for an
/// identity" (docs/reliability.md, rule 9): it is replayed or refused
/// `StepInDoubt`, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_finishing_a_step_before_the_new_holder_reaches_it_never_runs_it_twice() {
    let gate = small_gate().await;
    let id = Identity::new("sb_stale_finish").part(1);
    let shipped = Arc::new(AtomicUsize::new(0));
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let stale = tokio::spawn({
        let (gate, id, shipped) = (gate.clone(), id.clone(), Arc::clone(&shipped));
        async move {
            gate.guard(&id)
                .lease(LEASE)
                .run(async move {
                    idem::step("ship", async move {
                        shipped.fetch_add(1, Ordering::SeqCst);
                        let _ = inside_tx.send(());
                        let _ = finish_rx.await;
                        Ok::<u64, Rejected>(10)
                    })
                    .await
                })
                .await
        }
    });
    let _ = inside_rx.await;
    past_the_lease().await;
    let (reach_tx, reach_rx) = tokio::sync::oneshot::channel::<()>();
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
    let newer = tokio::spawn({
        let (gate, id, shipped) = (gate.clone(), id.clone(), Arc::clone(&shipped));
        async move {
            gate.guard(&id)
                .lease(Duration::from_secs(30))
                .disposition(|_: &Rejected| Disposition::Release)
                .run(async move {
                    let _ = claimed_tx.send(());
                    let _ = reach_rx.await;
                    idem::step("ship", async move {
                        shipped.fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Rejected>(20)
                    })
                    .await
                })
                .await
        }
    });
    let _ = claimed_rx.await;
    let _ = finish_tx.send(());
    let stale = stale.await.expect("the stale task");
    let _ = reach_tx.send(());
    let newer = newer.await.expect("the new task");
    assert_eq!(
        shipped.load(Ordering::SeqCst),
        1,
        "stale: {stale:?}, new: {newer:?}"
    );
    // The new holder replayed the stale holder's record (or was refused);
    // its claim was settled by the stale holder's documented late success,
    // so it may be told `NotRecorded` (docs/operations.md, metrics table).
    assert!(
        matches!(
            newer,
            Ok(10) | Err(Rejected::StepInDoubt { .. }) | Err(Rejected::NotRecorded { .. })
        ),
        "{newer:?}"
    );
}

/// Both holders at a barrier: the stale one's non-repeatable step returns
/// `Err` (its marker removed: "A step that fails records nothing") at the
/// instant the new holder reaches the same step. The step's effect ran
/// for neither (both bodies' futures count only on success), so this only
/// checks that nothing is recorded over the new holder's and the claim
/// stays coherent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_s_failing_step_and_the_new_holder_s_begin_at_one_instant() {
    for round in 0..5 {
        let gate = small_gate().await;
        let id = Identity::new("sb_stale_err").part(round);
        let ran_new = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
        let stale = tokio::spawn({
            let (gate, id, barrier) = (gate.clone(), id.clone(), Arc::clone(&barrier));
            async move {
                gate.guard(&id)
                    .lease(LEASE)
                    .run(async move {
                        idem::step("ship", async move {
                            let _ = inside_tx.send(());
                            barrier.wait().await;
                            Err::<u64, Rejected>(Rejected::InFlight)
                        })
                        .repeatable()
                        .await
                    })
                    .await
            }
        });
        let _ = inside_rx.await;
        past_the_lease().await;
        let newer = tokio::spawn({
            let (gate, id, barrier, ran_new) = (
                gate.clone(),
                id.clone(),
                Arc::clone(&barrier),
                Arc::clone(&ran_new),
            );
            async move {
                gate.guard(&id)
                    .lease(Duration::from_secs(30))
                    .run(async move {
                        barrier.wait().await;
                        idem::step("ship", async move {
                            ran_new.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok::<u64, Rejected>(20)
                        })
                        .repeatable()
                        .await
                    })
                    .await
            }
        });
        let stale = stale.await.expect("stale");
        let newer = newer.await.expect("newer");
        assert!(stale.is_err(), "{stale:?}");
        assert_eq!(newer.as_ref().ok(), Some(&20), "round {round}: {newer:?}");
        // The new holder's record stands and replays.
        let again: Result<u64, Rejected> = gate.guard(&id).run(async { Ok(0) }).await;
        assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
        let steps = steps_of(&gate, &id).await;
        assert_eq!(steps.len(), 1, "round {round}: {steps:?}");
        assert_eq!(
            steps[0].state.as_str(),
            "success",
            "round {round}: the new holder's record: {steps:?}"
        );
    }
}

// ---------------------------------------------------------------------
// Batches: "a body that fails for it holds the claim in doubt (whatever
// its disposition says)" -- "Everywhere a gate runs a body: ... each body
// of a batch"
// ---------------------------------------------------------------------

/// A batch body that meets a step in doubt (left by a holder cut off) and
/// fails for it, under the batch's default (release) disposition: the
/// claim must be held in doubt, and the step not run.
#[tokio::test]
async fn a_batch_body_failing_for_a_step_in_doubt_holds_its_claim() {
    let gate = small_gate().await;
    let id = Identity::new("sb_batch_doubt").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    past_the_lease().await;
    let again = Arc::new(AtomicUsize::new(0));
    let batch: Batch<u32> = [(1u32, id.clone())].into_iter().collect();
    let out = gate
        .guard_batch(batch)
        .lease(LEASE)
        .run(|_: u32| {
            let again = Arc::clone(&again);
            async move {
                idem::step("ship", async move {
                    again.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(2)
                })
                .await
            }
        })
        .await;
    assert!(
        matches!(&out[0], Err(Rejected::StepInDoubt { step, .. }) if step == "ship"),
        "{out:?}"
    );
    assert_eq!(again.load(Ordering::SeqCst), 0);
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt"),
        "held in doubt, not released"
    );
}

/// A batch body that drops its own step mid-flight (a timeout around it)
/// and fails: the step's outcome is unknown, so its claim is held in
/// doubt, whatever the batch's disposition (here: `Keep`).
#[tokio::test]
async fn a_batch_body_that_dropped_its_step_and_keeps_its_failure_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    let id = Identity::new("sb_batch_drop").part(1);
    let batch: Batch<u32> = [(1u32, id.clone())].into_iter().collect();
    let out = gate
        .guard_batch(batch)
        .disposition(|_: &Rejected| Disposition::Keep)
        .run(|_: u32| async move {
            let step = idem::step("ship", async {
                std::future::pending::<()>().await;
                Ok::<u64, Rejected>(2)
            });
            match tokio::time::timeout(Duration::from_millis(100), step).await {
                Ok(value) => value,
                Err(_) => Err(Rejected::InFlight),
            }
        })
        .await;
    assert!(matches!(&out[0], Err(Rejected::InFlight)), "{out:?}");
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt"),
        "held in doubt, not kept failed nor released"
    );
}

/// The attribute, `disposition` keeping every failure: a body failing for
/// a step in doubt holds the claim in doubt "whatever its disposition
/// says" (src/idempotent.md).
#[tokio::test]
async fn the_attribute_s_keep_disposition_does_not_keep_a_step_in_doubt_as_failed() {
    fn keep(_: &Rejected) -> Disposition {
        Disposition::Keep
    }
    #[idem::idempotent(key = "n", lease = "200ms", disposition = keep)]
    async fn ship(gate: &Gate, n: u32, ran: &AtomicUsize) -> Result<u64, Rejected> {
        idem::step("ship", async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(u64::from(n))
        })
        .await
    }
    let gate = small_gate().await;
    let id = Identity::new("ship").part(7u32);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    past_the_lease().await;
    let again = AtomicUsize::new(0);
    let out = ship(&gate, 7, &again).await;
    assert!(matches!(out, Err(Rejected::StepInDoubt { .. })), "{out:?}");
    assert_eq!(again.load(Ordering::SeqCst), 0);
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("in_doubt")
    );
}

// ---------------------------------------------------------------------
// Misuse
// ---------------------------------------------------------------------

type Boxed = Pin<Box<dyn Future<Output = Result<u64, Rejected>> + Send>>;

/// A step created in the body but never polled there, handed out as the
/// body's value and awaited after the body returned: "Outside a guarded
/// body ... a step is NotGuarded and its future does not run."
#[tokio::test]
async fn a_step_created_in_the_body_and_first_polled_after_it_is_refused() {
    let gate = small_gate().await;
    let id = Identity::new("sb_kept").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let kept: Result<Boxed, Rejected> = gate
        .guard(&id)
        .run({
            let ran = Arc::clone(&ran);
            async move {
                let step: Boxed = IntoFuture::into_future(idem::step("charge", async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(1)
                }));
                Ok(step)
            }
        })
        .await;
    let later = kept.expect("the body returned it").await;
    assert!(
        matches!(later, Err(Rejected::NotGuarded { .. })),
        "{later:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The same, but the step began inside the body (its future started), and
/// is finished after the body returned `Ok` (its claim settled): "A step
/// begun in the body and then moved out of it (... kept past the body's
/// end) stops at its next poll there, also NotGuarded".
#[tokio::test]
async fn a_step_begun_in_the_body_and_finished_after_it_stops() {
    let gate = small_gate().await;
    let id = Identity::new("sb_kept_begun").part(1);
    let went_on = Arc::new(AtomicUsize::new(0));
    let kept: Result<Boxed, Rejected> = gate
        .guard(&id)
        .run({
            let went_on = Arc::clone(&went_on);
            async move {
                let (began_tx, began_rx) = tokio::sync::oneshot::channel::<()>();
                let mut step: Boxed = IntoFuture::into_future(idem::step("charge", async move {
                    let _ = began_tx.send(());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    went_on.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(1)
                }));
                tokio::select! {
                    _ = &mut step => panic!("not yet"),
                    _ = began_rx => {}
                }
                Ok(step)
            }
        })
        .await;
    let later = kept.expect("the body returned it").await;
    assert!(
        matches!(later, Err(Rejected::NotGuarded { .. })),
        "{later:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        went_on.load(Ordering::SeqCst),
        0,
        "its future did not go on"
    );
}

/// Nested steps: a step inside a step's future. Not documented either way;
/// what a user would expect: both recorded, and a retry after the outer
/// one failed (nothing recorded for it) replays the inner one.
#[tokio::test]
async fn nested_steps_record_and_replay_the_inner_one() {
    let gate = small_gate().await;
    let id = Identity::new("sb_nested").part(1);
    let inner_ran = Arc::new(AtomicUsize::new(0));
    let run = |fail_outer: bool| {
        let inner_ran = Arc::clone(&inner_ran);
        gate.guard(&id).run(async move {
            idem::step("outer", async move {
                let inner = idem::step("inner", async move {
                    inner_ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(5)
                })
                .await?;
                if fail_outer {
                    return Err(Rejected::InFlight);
                }
                Ok::<u64, Rejected>(inner + 1)
            })
            .await
        })
    };
    let first = run(true).await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let second = run(false).await;
    assert_eq!(second.ok(), Some(6));
    assert_eq!(inner_ran.load(Ordering::SeqCst), 1, "inner replayed");
}

// ---------------------------------------------------------------------
// Hostile names
// ---------------------------------------------------------------------

fn incompressible(len: usize) -> String {
    // xorshift: printable ASCII noise no compressor shrinks much.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'!' + (state % 94) as u8)
        })
        .collect()
}

/// "Names are any text": the empty name, a 100 kB name no compressor
/// shrinks, SQL, names differing only in case or in Unicode normalization
/// (NFC vs NFD): each its own step, recorded, replayed, read back exactly,
/// with a 45-character downstream key.
#[tokio::test]
async fn hostile_names_each_record_replay_and_read_back() {
    let gate = small_gate().await;
    let names: Vec<String> = vec![
        String::new(),
        incompressible(100 * 1024),
        "'; DROP TABLE idem_records; --".to_owned(),
        "Charge".to_owned(),
        "charge".to_owned(),
        "caf\u{e9}".to_owned(),
        "cafe\u{301}".to_owned(),
        "\u{202e}evil\u{0}".to_owned(),
    ];
    for (i, name) in names.iter().enumerate() {
        let id = Identity::new("sb_hostile").part(i as u64);
        let ran = AtomicUsize::new(0);
        let key_seen = Mutex::new(None);
        let out: Result<u64, Rejected> = gate
            .guard(&id)
            .run(async {
                *key_seen.lock().unwrap() = Some(idem::downstream_key(name));
                idem::step(name.clone(), async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(i as u64)
                })
                .await?;
                Err(Rejected::InFlight)
            })
            .await;
        assert!(
            matches!(out, Err(Rejected::InFlight)),
            "name #{i} ({} bytes): {out:?}",
            name.len()
        );
        let key = key_seen
            .into_inner()
            .unwrap()
            .expect("asked")
            .expect("a key");
        assert_eq!(key.len(), 45, "{key}");
        let again: Result<u64, Rejected> = gate
            .guard(&id)
            .run(async {
                idem::step(name.clone(), async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(999)
                })
                .await
            })
            .await;
        assert_eq!(again.ok(), Some(i as u64), "name #{i} replayed");
        assert_eq!(ran.load(Ordering::SeqCst), 1, "name #{i}");
        let listed = steps_of(&gate, &id).await;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name.as_deref(), Some(name.as_str()), "name #{i}");
    }
    // Case and normalization: one body, four names, four steps.
    let id = Identity::new("sb_hostile_one_body").part(1);
    let out: Result<Vec<u64>, Rejected> = gate
        .guard(&id)
        .run(async {
            let mut got = Vec::new();
            for (i, name) in names[3..7].iter().enumerate() {
                got.push(
                    idem::step(name.clone(), async move { Ok::<u64, Rejected>(i as u64) }).await?,
                );
            }
            Ok(got)
        })
        .await;
    assert_eq!(out.ok(), Some(vec![0, 1, 2, 3]));
    let keys: Vec<String> = {
        let seen = Mutex::new(Vec::new());
        let _: Result<(), Rejected> = gate
            .guard(&Identity::new("sb_hostile_keys").part(1))
            .run(async {
                for name in &names {
                    seen.lock().unwrap().push(idem::downstream_key(name)?);
                }
                Ok(())
            })
            .await;
        seen.into_inner().unwrap()
    };
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{keys:?}");
}

// ---------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------

/// A step whose value is `()` or `None` (JSON `null`): recorded, and
/// replayed without running.
#[tokio::test]
async fn a_null_valued_step_is_replayed_not_run_again() {
    let gate = small_gate().await;
    let ran = AtomicUsize::new(0);
    let id = Identity::new("sb_null").part(1);
    record_then_release(&gate, &id, "email", (), &ran)
        .await
        .expect("ran");
    record_then_release(&gate, &id, "email", (), &ran)
        .await
        .expect("replayed");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "() replayed");
    let ran = AtomicUsize::new(0);
    let id = Identity::new("sb_null").part(2);
    record_then_release::<Option<u64>>(&gate, &id, "lookup", None, &ran)
        .await
        .expect("ran");
    let replayed = record_then_release::<Option<u64>>(&gate, &id, "lookup", Some(3), &ran).await;
    assert_eq!(replayed.ok(), Some(None));
    assert_eq!(ran.load(Ordering::SeqCst), 1, "None replayed");
}

/// "A step's value must be `Serialize + DeserializeOwned`": a `String`
/// holding a NUL character is both. Recorded and replayed as it was.
#[tokio::test]
async fn a_string_value_with_a_nul_is_recorded_and_replayed() {
    let gate = small_gate().await;
    let ran = AtomicUsize::new(0);
    let id = Identity::new("sb_nul_value").part(1);
    let first = record_then_release(&gate, &id, "charge", "ch_\u{0}1".to_owned(), &ran).await;
    assert_eq!(first.as_deref().ok(), Some("ch_\u{0}1"), "{first:?}");
    let again = record_then_release(&gate, &id, "charge", "other".to_owned(), &ran).await;
    assert_eq!(again.as_deref().ok(), Some("ch_\u{0}1"), "{again:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// An `f64` NaN serializes (serde_json writes `null`) but does not read
/// back as an `f64`. Recorded, every later run would find a value it cannot
/// read; so it is not recorded: the body gets its value, and its failure
/// holds the claim in doubt at once (the step did run), where a retry is
/// refused and never runs the step blindly.
#[tokio::test]
async fn a_step_value_that_does_not_read_back_is_not_recorded_and_holds_the_claim() {
    let gate = small_gate().await;
    let ran = AtomicUsize::new(0);
    let id = Identity::new("sb_nan").part(1);
    let first = record_then_release(&gate, &id, "rate", f64::NAN, &ran).await;
    assert!(first.is_ok_and(f64::is_nan), "the body had its value");
    let state = state_of(&gate, &id).await.map(|(state, _)| state);
    assert_eq!(state.as_deref(), Some("in_doubt"));
    let retry: Result<f64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("rate", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<f64, Rejected>(1.0)
            })
            .await
        })
        .await;
    assert!(matches!(retry, Err(Rejected::InDoubt)), "{retry:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------
// downstream_key: "the same on every run of the identity"
// ---------------------------------------------------------------------

/// The key of one identity's step, asked in a body run by the guard on the
/// pool, in the caller's transaction, in a batch, and by the attribute:
/// the same everywhere.
#[tokio::test]
async fn the_downstream_key_is_the_same_whatever_runs_the_body() {
    #[idem::idempotent(key = "n", action = "sb_keys")]
    async fn by_attribute(gate: &Gate, n: u32) -> Result<String, Rejected> {
        idem::downstream_key("charge")
    }
    let gate = small_gate().await;
    let id = |n: u32| Identity::new("sb_keys").part(n);
    let on_pool: String = gate
        .guard(&id(1))
        .run(async { idem::downstream_key("charge") })
        .await
        .expect("pool");
    let mut tx = gate.pool().begin().await.expect("begin");
    let in_tx: String = gate
        .guard(&id(2))
        .tx(&mut tx)
        .run(async |_| idem::downstream_key("charge"))
        .await
        .expect("tx");
    tx.rollback().await.expect("rollback");
    let batch: Batch<u32> = [(3u32, id(3))].into_iter().collect();
    let in_batch = gate
        .guard_batch(batch)
        .run(|_| async { idem::downstream_key("charge") })
        .await
        .pop()
        .expect("one")
        .expect("batch");
    let attr = by_attribute(&gate, 4).await.expect("attribute");
    // Each for its own identity first; then the same identity every way.
    let all = [on_pool, in_tx, in_batch, attr];
    let mut unique = all.to_vec();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 4, "four identities, four keys: {all:?}");

    let same = id(10);
    let seen = Mutex::new(Vec::new());
    let _: Result<(), Rejected> = gate
        .guard(&same)
        .run(async {
            seen.lock().unwrap().push(idem::downstream_key("charge")?);
            Err(Rejected::InFlight)
        })
        .await;
    let mut tx = gate.pool().begin().await.expect("begin");
    let _: Result<(), Rejected> = gate
        .guard(&same)
        .tx(&mut tx)
        .run(async |_| {
            seen.lock().unwrap().push(idem::downstream_key("charge")?);
            Ok(())
        })
        .await;
    tx.rollback().await.expect("rollback");
    let batch: Batch<u32> = [(0u32, same.clone())].into_iter().collect();
    let _ = gate
        .guard_batch(batch)
        .run(|_| async {
            seen.lock().unwrap().push(idem::downstream_key("charge")?);
            Err::<(), _>(Rejected::InFlight)
        })
        .await;
    let keys = seen.into_inner().unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
    let (k1, k2, k3) = (keys[0].clone(), keys[1].clone(), keys[2].clone());
    let k4 = by_attribute(&gate, 10).await;
    assert_eq!(k1, k2, "pool vs tx");
    assert_eq!(k1, k3, "pool vs batch");
    assert_eq!(Some(k1), k4.ok(), "pool vs attribute");
}

// ---------------------------------------------------------------------
// Prune
// ---------------------------------------------------------------------

fn in_the_future() -> SystemTime {
    SystemTime::now() + Duration::from_secs(3600)
}

async fn prune_account(gate: &Gate) -> u64 {
    let filter = operations::PruneFilter::new(in_the_future()).account(gate.account_name());
    operations::prune(gate.pool(), &filter)
        .await
        .expect("prune")
}

/// docs/operations.md: steps whose claim is gone go by the age rule; "a
/// `pending` step is never pruned"; a held claim is not gone. A prune whose
/// horizon is after the steps were recorded, run while the claim is held
/// (pending, then in doubt), takes none of them; a retry after the release
/// replays the recorded step and is refused the one in doubt.
#[tokio::test]
async fn a_prune_while_the_claim_is_held_takes_none_of_its_steps() {
    for namespace in [None, Some("live")] {
        let base = small_gate().await;
        let gate = match namespace {
            Some(ns) => base.namespace(ns),
            None => base,
        };
        let id = Identity::new("sb_prune_held").part(1);
        let charged = Arc::new(AtomicUsize::new(0));
        let shipped = Arc::new(AtomicUsize::new(0));
        // Charge recorded, then cut off inside ship.
        let began = Arc::new(tokio::sync::Notify::new());
        let run = gate.guard(&id).lease(LEASE).run({
            let (began, charged, shipped) = (
                Arc::clone(&began),
                Arc::clone(&charged),
                Arc::clone(&shipped),
            );
            async move {
                idem::step("charge", async move {
                    charged.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(1)
                })
                .await?;
                idem::step("ship", async move {
                    shipped.fetch_add(1, Ordering::SeqCst);
                    began.notify_one();
                    std::future::pending::<()>().await;
                    Ok::<u64, Rejected>(1)
                })
                .await
            }
        });
        tokio::select! {
            _ = run => panic!("never finishes"),
            () = began.notified() => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        prune_account(&gate).await;
        assert_eq!(
            steps_of(&gate, &id).await.len(),
            2,
            "{namespace:?}: held pending"
        );
        past_the_lease().await;
        // A retry: the charge replays, ship in doubt, the claim held in doubt.
        let retry = |gate: Gate| {
            let (charged, shipped) = (Arc::clone(&charged), Arc::clone(&shipped));
            let id = id.clone();
            async move {
                gate.guard(&id)
                    .lease(LEASE)
                    .run(async move {
                        idem::step("charge", async move {
                            charged.fetch_add(1, Ordering::SeqCst);
                            Ok::<u64, Rejected>(2)
                        })
                        .await?;
                        idem::step("ship", async move {
                            shipped.fetch_add(1, Ordering::SeqCst);
                            Ok::<u64, Rejected>(2)
                        })
                        .await
                    })
                    .await
            }
        };
        let second = retry(gate.clone()).await;
        assert!(
            matches!(second, Err(Rejected::StepInDoubt { .. })),
            "{second:?}"
        );
        prune_account(&gate).await;
        assert_eq!(
            steps_of(&gate, &id).await.len(),
            2,
            "{namespace:?}: held in doubt"
        );
        // An operator forgets nothing, releases the claim (resolve --release).
        let address = id.address();
        let resolved = operations::resolve(
            gate.pool(),
            Slot::new(gate.account_name(), gate.namespace_name(), &address),
            Outcome::Failed(Disposition::Release),
        )
        .await
        .expect("resolve");
        let _ = resolved;
        prune_account(&gate).await;
        // The pending marker stays ("never pruned"); the recorded charge
        // is documented to go (the claim is gone and past the horizon).
        let left = steps_of(&gate, &id).await;
        assert!(
            left.iter().any(|s| s.name.as_deref() == Some("ship")),
            "{namespace:?}: the pending marker is never pruned: {left:?}"
        );
        let third = retry(gate.clone()).await;
        assert!(
            matches!(third, Err(Rejected::StepInDoubt { .. })),
            "{third:?}"
        );
        assert_eq!(shipped.load(Ordering::SeqCst), 1, "{namespace:?}");
    }
}

/// A released claim's retry has claimed again (its body waits before its
/// first step) when a prune runs: the claim is no longer gone, so the
/// prune must leave its steps ("Steps whose claim is gone (released, and
/// never claimed again)"), and the retry replays the charge.
#[tokio::test]
async fn a_prune_after_the_retry_claimed_again_leaves_the_steps_it_replays() {
    for namespace in [None, Some("live")] {
        let base = small_gate().await;
        let gate = match namespace {
            Some(ns) => base.namespace(ns),
            None => base,
        };
        let id = Identity::new("sb_prune_reclaimed").part(1);
        let ran = AtomicUsize::new(0);
        record_then_release(&gate, &id, "charge", 1u64, &ran)
            .await
            .expect("ran");
        let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let retry = gate.guard(&id).run(async {
            let _ = claimed_tx.send(());
            let _ = go_rx.await;
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .await
        });
        let prune = async {
            let _ = claimed_rx.await;
            let pruned = prune_account(&gate).await;
            let _ = go_tx.send(());
            pruned
        };
        let (retry, _pruned) = tokio::join!(retry, prune);
        assert_eq!(retry.ok(), Some(1), "{namespace:?}: replayed");
        assert_eq!(ran.load(Ordering::SeqCst), 1, "{namespace:?}");
    }
}

/// `Pruning::steps_deleted` "says how many steps a prune deleted": a
/// settled claim with two steps, pruned in batches.
#[tokio::test]
async fn pruning_counts_the_steps_it_deleted() {
    let gate = small_gate().await;
    let id = Identity::new("sb_prune_count").part(1);
    let out: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("a", async { Ok::<u8, Rejected>(1) }).await?;
            idem::step("b", async { Ok::<u8, Rejected>(1) }).await?;
            Ok(())
        })
        .await;
    out.expect("ran");
    let filter = operations::PruneFilter::new(in_the_future()).account(gate.account_name());
    let mut pruning = operations::Pruning::new(&filter, std::num::NonZeroU32::new(100).unwrap());
    let mut claims = 0;
    while let Some(n) = pruning.next_batch(gate.pool()).await.expect("batch") {
        claims += n;
        if pruning.is_done() {
            break;
        }
    }
    assert_eq!(claims, 1);
    assert_eq!(pruning.steps_deleted(), 2);
    assert!(steps_of(&gate, &id).await.is_empty());
}

// ---------------------------------------------------------------------
// The body dropped its own step, then failed: every way a gate runs a body
// ---------------------------------------------------------------------

/// A body that begins a step, drops it (a timeout), and fails.
async fn drops_its_step() -> Result<u64, Rejected> {
    let step = idem::step("ship", async {
        std::future::pending::<()>().await;
        Ok::<u64, Rejected>(2)
    });
    match tokio::time::timeout(Duration::from_millis(100), step).await {
        Ok(value) => value,
        Err(_) => Err(Rejected::InFlight),
    }
}

async fn expect_in_doubt(gate: &Gate, id: &Identity, what: &str) {
    let state = state_of(gate, id).await.map(|(state, _)| state);
    // The step is never run blindly again, whatever the state says.
    let ran = AtomicUsize::new(0);
    let retry: Result<u64, Rejected> = gate
        .guard(id)
        .run(async {
            idem::step("ship", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(3)
            })
            .await
        })
        .await;
    assert_eq!(ran.load(Ordering::SeqCst), 0, "{what}: retry {retry:?}");
    assert_eq!(
        state.as_deref(),
        Some("in_doubt"),
        "{what}: a step cut off holds its claim in doubt, whatever the disposition \
         (the retry was told {retry:?})"
    );
}

/// The dispositions a body that dropped its step may ask for; each must
/// end in doubt.
const ASKED: [(&str, Disposition); 2] = [
    ("release", Disposition::Release),
    ("keep", Disposition::Keep),
];

/// The guard's `run`, each disposition.
#[tokio::test]
async fn run_a_body_that_dropped_its_step_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    for (what, asked) in ASKED {
        let id = Identity::new("sb_drop_run").part(what);
        let out = gate
            .guard(&id)
            .disposition(move |_: &Rejected| asked)
            .run(drops_its_step())
            .await;
        assert!(matches!(out, Err(Rejected::InFlight)), "{out:?}");
        expect_in_doubt(&gate, &id, &format!("run, {what}")).await;
    }
}

/// A batch, its default disposition (release).
#[tokio::test]
async fn batch_release_a_body_that_dropped_its_step_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    let id = Identity::new("sb_drop_batch_release").part(1);
    let batch: Batch<u32> = [(1u32, id.clone())].into_iter().collect();
    let out = gate.guard_batch(batch).run(|_| drops_its_step()).await;
    assert!(matches!(&out[0], Err(Rejected::InFlight)), "{out:?}");
    expect_in_doubt(&gate, &id, "batch, release").await;
}

/// A batch, disposition `Keep`, and a step in doubt met (not dropped).
#[tokio::test]
async fn batch_keep_a_body_failing_for_a_step_in_doubt_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    let id = Identity::new("sb_doubt_batch_keep").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    cut_off_inside(&gate, &id, "ship", LEASE, &ran).await;
    past_the_lease().await;
    let batch: Batch<u32> = [(1u32, id.clone())].into_iter().collect();
    let out = gate
        .guard_batch(batch)
        .lease(LEASE)
        .disposition(|_: &Rejected| Disposition::Keep)
        .run(|_| async { idem::step("ship", async { Ok::<u64, Rejected>(3) }).await })
        .await;
    assert!(
        matches!(&out[0], Err(Rejected::StepInDoubt { .. })),
        "{out:?}"
    );
    expect_in_doubt(&gate, &id, "batch, keep, step in doubt met").await;
}

/// The attribute, disposition `Keep`.
#[tokio::test]
async fn attribute_keep_a_body_that_dropped_its_step_holds_the_claim_in_doubt() {
    fn keep(_: &Rejected) -> Disposition {
        Disposition::Keep
    }
    #[idem::idempotent(key = "n", action = "sb_drop_attr_keep", disposition = keep)]
    async fn body(gate: &Gate, n: u32) -> Result<u64, Rejected> {
        drops_its_step().await
    }
    let gate = small_gate().await;
    let out = body(&gate, 1).await;
    assert!(matches!(out, Err(Rejected::InFlight)), "{out:?}");
    expect_in_doubt(
        &gate,
        &Identity::new("sb_drop_attr_keep").part(1u32),
        "attribute, keep",
    )
    .await;
}

/// A detached run, each disposition.
#[tokio::test]
async fn detached_a_body_that_dropped_its_step_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    let detached = idem::Detached::with_bound(Duration::from_secs(30));
    for (what, asked) in ASKED {
        let id = Identity::new("sb_drop_detached").part(what);
        let out = gate
            .guard(&id)
            .disposition(move |_: &Rejected| asked)
            .run_detached(&detached, drops_its_step())
            .await;
        assert!(matches!(out, Err(Rejected::InFlight)), "{out:?}");
        expect_in_doubt(&gate, &id, &format!("detached, {what}")).await;
    }
    detached.shutdown(Duration::from_secs(1)).await;
}

/// In the caller's transaction, committed, each disposition.
#[tokio::test]
async fn tx_a_body_that_dropped_its_step_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    for (what, asked) in ASKED {
        let id = Identity::new("sb_drop_tx").part(what);
        let mut tx = gate.pool().begin().await.expect("begin");
        let out: Result<u64, Rejected> = gate
            .guard(&id)
            .tx(&mut tx)
            .disposition(move |_: &Rejected| asked)
            .run(async |connection| {
                let step = idem::step("ship", async {
                    std::future::pending::<()>().await;
                    Ok::<u64, Rejected>(2)
                })
                .on(&mut *connection);
                match tokio::time::timeout(Duration::from_millis(100), step).await {
                    Ok(value) => value,
                    Err(_) => Err(Rejected::InFlight),
                }
            })
            .await;
        assert!(matches!(out, Err(Rejected::InFlight)), "{out:?}");
        tx.commit().await.expect("commit");
        expect_in_doubt(&gate, &id, &format!("tx, {what}")).await;
    }
}

// ---------------------------------------------------------------------
// More
// ---------------------------------------------------------------------

/// The step's doc: "In a body that runs ungated (an absent identity, ...),
/// `future` runs and nothing is recorded." In the caller's transaction.
#[tokio::test]
async fn an_absent_identity_in_a_transaction_runs_its_step_unrecorded() {
    let gate = small_gate().await;
    let id = Identity::new("sb_absent_tx").part(None::<&str>);
    let ran = AtomicUsize::new(0);
    let mut tx = gate.pool().begin().await.expect("begin");
    let out: Result<u64, Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |connection| {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(1)
            })
            .on(&mut *connection)
            .await
        })
        .await;
    tx.rollback().await.expect("rollback");
    assert!(matches!(out, Ok(1)), "ran ungated: {out:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// A guarded call of another identity inside a step's future: its body's
/// steps are its own, and the outer step goes on under the outer claim.
#[tokio::test]
async fn a_guarded_call_inside_a_step_keeps_each_claim_s_steps_apart() {
    let gate = small_gate().await;
    let outer = Identity::new("sb_outer").part(1);
    let inner = Identity::new("sb_inner").part(1);
    let out: Result<(String, String, u64), Rejected> = gate
        .guard(&outer)
        .run(async {
            let outer_key = idem::downstream_key("x")?;
            let (inner_key, value) = idem::step("x", async {
                gate.guard(&inner)
                    .run(async {
                        let key = idem::downstream_key("x")?;
                        let value = idem::step("x", async { Ok::<u64, Rejected>(5) }).await?;
                        Ok::<_, Rejected>((key, value))
                    })
                    .await
            })
            .await?;
            let after = idem::step("y", async { Ok::<u64, Rejected>(value + 1) }).await?;
            Ok((outer_key, inner_key, after))
        })
        .await;
    let (outer_key, inner_key, after) = out.expect("ran");
    assert_ne!(outer_key, inner_key);
    assert_eq!(after, 6);
    let outer_steps: Vec<_> = steps_of(&gate, &outer)
        .await
        .into_iter()
        .map(|s| s.name)
        .collect();
    let inner_steps: Vec<_> = steps_of(&gate, &inner)
        .await
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        outer_steps,
        vec![Some("x".to_owned()), Some("y".to_owned())]
    );
    assert_eq!(inner_steps, vec![Some("x".to_owned())]);
}

/// Two steps cut off at once (a `join!`), both in doubt. The reconciler is
/// told both; answering for one records it and releases the claim, and the
/// other stays in doubt (never run); `NotHappened` then lets it run, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_steps_in_doubt_are_each_answered_for_and_neither_runs_blindly() {
    let gate = small_gate().await;
    let id = Identity::new("sb_two_doubt").part(1);
    let began = Arc::new(AtomicUsize::new(0));
    let run = gate.guard(&id).lease(LEASE).run({
        let began = Arc::clone(&began);
        async move {
            let a = IntoFuture::into_future(idem::step("a", {
                let began = Arc::clone(&began);
                async move {
                    began.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    Ok::<u64, Rejected>(1)
                }
            }));
            let b = IntoFuture::into_future(idem::step("b", async move {
                began.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok::<u64, Rejected>(1)
            }));
            let (a, b) = tokio::join!(a, b);
            Ok::<u64, Rejected>(a? + b?)
        }
    });
    let wait = async {
        while began.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        _ = run => panic!("never finishes"),
        () = wait => {}
    }
    past_the_lease().await;
    let ran = Arc::new(AtomicUsize::new(0));
    let retry = |gate: Gate| {
        let (id, ran) = (id.clone(), Arc::clone(&ran));
        async move {
            gate.guard(&id)
                .lease(LEASE)
                .run(async move {
                    let a = idem::step("a", {
                        let ran = Arc::clone(&ran);
                        async move {
                            ran.fetch_add(1, Ordering::SeqCst);
                            Ok::<u64, Rejected>(100)
                        }
                    })
                    .await?;
                    let b = idem::step("b", async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Rejected>(200)
                    })
                    .await?;
                    Ok::<u64, Rejected>(a + b)
                })
                .await
        }
    };
    let second = retry(gate.clone()).await;
    assert!(
        matches!(second, Err(Rejected::StepInDoubt { .. })),
        "{second:?}"
    );
    let told = Arc::new(Mutex::new(Vec::new()));
    let answer = Arc::new(Mutex::new(
        idem::reconcile::Verdict::step_succeeded_with("a", &11u64).unwrap(),
    ));
    let reconciler = idem::reconcile::Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("sb_two_doubt", {
            let (told, answer) = (Arc::clone(&told), Arc::clone(&answer));
            move |doubt: idem::reconcile::Doubt| {
                told.lock().unwrap().push(doubt.steps_in_doubt.clone());
                let verdict = answer.lock().unwrap().clone();
                async move { verdict }
            }
        });
    reconciler.reconcile_once().await.expect("a pass");
    let mut first_told = told.lock().unwrap().clone();
    assert_eq!(first_told.len(), 1, "{first_told:?}");
    first_told[0].sort();
    assert_eq!(first_told[0], vec!["a".to_owned(), "b".to_owned()]);
    let third = retry(gate.clone()).await;
    assert!(
        matches!(&third, Err(Rejected::StepInDoubt { step, .. }) if step == "b"),
        "{third:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    *answer.lock().unwrap() = idem::reconcile::Verdict::NotHappened;
    reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(
        told.lock().unwrap().last().cloned(),
        Some(vec!["b".to_owned()])
    );
    let fourth = retry(gate.clone()).await;
    assert_eq!(fourth.ok(), Some(211), "a replayed (11), b run (200)");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// "A step whose value could not be recorded (the store failed after it
/// ran) is treated the same way": the gate's backends are terminated
/// (`pg_terminate_backend`) while the step's effect runs, then the effect
/// finishes. Whatever the first run is told, retries never run the
/// non-repeatable step again; a repeatable one may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_terminated_between_a_step_s_effect_and_its_record() {
    for repeatable in [false, true] {
        let name = testing::unique_name("sbterm");
        let gate =
            testing::gate_on(idem_test_support::connections::named_pool(&name, 3).await).await;
        let admin = testing::pool_with(1).await;
        let id = Identity::new("sb_term").part(u32::from(repeatable));
        let shipped = Arc::new(AtomicUsize::new(0));
        let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn({
            let (gate, id, shipped) = (gate.clone(), id.clone(), Arc::clone(&shipped));
            async move {
                gate.guard(&id)
                    .lease(LEASE)
                    .run(async move {
                        let step = idem::step("ship", async move {
                            shipped.fetch_add(1, Ordering::SeqCst);
                            let _ = inside_tx.send(());
                            let _ = go_rx.await;
                            Ok::<u64, Rejected>(10)
                        });
                        let step = if repeatable { step.repeatable() } else { step };
                        step.await
                    })
                    .await
            }
        });
        let _ = inside_rx.await;
        let killed = idem_test_support::connections::terminate_backends(&admin, &name).await;
        assert!(killed > 0);
        let _ = go_tx.send(());
        let first = first.await.expect("first");
        let mut outcomes = vec![format!("{first:?}")];
        for _ in 0..4 {
            past_the_lease().await;
            let shipped = Arc::clone(&shipped);
            let again: Result<u64, Rejected> = gate
                .guard(&id)
                .lease(LEASE)
                .run(async move {
                    let step = idem::step("ship", async move {
                        shipped.fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Rejected>(20)
                    });
                    let step = if repeatable { step.repeatable() } else { step };
                    step.await
                })
                .await;
            outcomes.push(format!("{again:?}"));
        }
        if !repeatable {
            assert_eq!(shipped.load(Ordering::SeqCst), 1, "{outcomes:#?}");
        }
        eprintln!(
            "repeatable={repeatable}: shipped {} {outcomes:#?}",
            shipped.load(Ordering::SeqCst)
        );
    }
}

/// "A step whose value could not be recorded ... is treated the same way"
/// (as a step cut off: a body that fails for it holds the claim in doubt,
/// whatever its disposition says). A value that does not serialize (a map
/// with non-string keys), under `Keep`.
#[tokio::test]
async fn keep_a_step_whose_value_could_not_be_recorded_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    let id = Identity::new("sb_unrecordable_keep").part(1);
    let ran = AtomicUsize::new(0);
    let out: Result<(), Rejected> = gate
        .guard(&id)
        .disposition(|_: &Rejected| Disposition::Keep)
        .run(async {
            let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
            idem::step("ship", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(map)
            })
            .await?;
            // Then the body fails (a definite failure, by its disposition).
            Err(Rejected::InFlight)
        })
        .await;
    assert!(out.is_err(), "{out:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    expect_in_doubt(&gate, &id, "unrecordable value, keep").await;
}

/// A step value of 8 MB: "A step's value must be `Serialize +
/// DeserializeOwned`" and nothing more; recorded and replayed.
#[tokio::test]
async fn a_large_step_value_is_recorded_and_replayed() {
    let gate = small_gate().await;
    let id = Identity::new("sb_large_value").part(1);
    let ran = AtomicUsize::new(0);
    let big = incompressible(8 * 1024 * 1024);
    let first = record_then_release(&gate, &id, "label", big.clone(), &ran).await;
    assert!(
        first.as_ref().is_ok_and(|v| v.len() == big.len()),
        "{:?}",
        first.as_ref().map(String::len)
    );
    let again = record_then_release(&gate, &id, "label", String::new(), &ran).await;
    assert!(
        again.as_ref().is_ok_and(|v| *v == big),
        "{:?}",
        again.as_ref().map(String::len)
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// `outcome_commit = "async"`: "its record, which commits asynchronously":
/// recorded steps still replay on the retry after a release.
#[tokio::test]
async fn async_outcome_commit_steps_replay_after_a_release() {
    let gate = small_gate().await;
    let id = Identity::new("sb_async_commit").part(1);
    let ran = AtomicUsize::new(0);
    for round in 0..2 {
        let out: Result<u64, Rejected> = gate
            .guard(&id)
            .outcome_commit(idem::OutcomeCommit::Async)
            .run(async {
                let v = idem::step("charge", async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(41)
                })
                .await?;
                if round == 0 {
                    return Err(Rejected::InFlight);
                }
                Ok(v + 1)
            })
            .await;
        if round == 1 {
            assert_eq!(out.ok(), Some(42));
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// A batch, disposition `Keep`, a step whose value could not be recorded,
/// then the body fails.
#[tokio::test]
async fn batch_keep_a_step_whose_value_could_not_be_recorded_holds_the_claim_in_doubt() {
    let gate = small_gate().await;
    let id = Identity::new("sb_unrecordable_batch_keep").part(1);
    let batch: Batch<u32> = [(1u32, id.clone())].into_iter().collect();
    let out = gate
        .guard_batch(batch)
        .disposition(|_: &Rejected| Disposition::Keep)
        .run(|_| async {
            let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
            idem::step("ship", async { Ok::<_, Rejected>(map) }).await?;
            Err::<(), _>(Rejected::InFlight)
        })
        .await;
    assert!(out[0].is_err(), "{out:?}");
    expect_in_doubt(&gate, &id, "batch, unrecordable value, keep").await;
}

/// A stale holder (its lease run out, taken over) and the new holder begin
/// the same non-repeatable step at one instant (a barrier), 10 rounds: the
/// step's effect runs at most once ("No step that is not declared
/// repeatable runs twice for an identity ... not after ... a takeover").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_and_a_new_holder_beginning_one_step_at_one_instant_run_it_at_most_once() {
    let gate = small_gate().await;
    for round in 0..10u32 {
        let id = Identity::new("sb_begin_race").part(round);
        let shipped = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
        let (taken_tx, taken_rx) = tokio::sync::oneshot::channel::<()>();
        let stale = tokio::spawn({
            let (gate, id, shipped, barrier) = (
                gate.clone(),
                id.clone(),
                Arc::clone(&shipped),
                Arc::clone(&barrier),
            );
            async move {
                gate.guard(&id)
                    .lease(LEASE)
                    .run(async move {
                        let _ = claimed_tx.send(());
                        let _ = taken_rx.await;
                        barrier.wait().await;
                        idem::step("ship", async move {
                            shipped.fetch_add(1, Ordering::SeqCst);
                            Ok::<u64, Rejected>(1)
                        })
                        .await
                    })
                    .await
            }
        });
        let _ = claimed_rx.await;
        past_the_lease().await;
        let newer = tokio::spawn({
            let (gate, id, shipped, barrier) = (
                gate.clone(),
                id.clone(),
                Arc::clone(&shipped),
                Arc::clone(&barrier),
            );
            async move {
                gate.guard(&id)
                    .lease(Duration::from_secs(30))
                    .run(async move {
                        let _ = taken_tx.send(());
                        barrier.wait().await;
                        idem::step("ship", async move {
                            shipped.fetch_add(1, Ordering::SeqCst);
                            Ok::<u64, Rejected>(2)
                        })
                        .await
                    })
                    .await
            }
        });
        let (stale, newer) = (stale.await.expect("stale"), newer.await.expect("newer"));
        assert!(
            shipped.load(Ordering::SeqCst) <= 1,
            "round {round}: stale {stale:?}, new {newer:?}"
        );
    }
}

/// Runs step "v" returning `value`, then fails the body (a release, asked);
/// an operator releases the claim should it be held; then a retry of step
/// "v". The claim's state after the first run, what the retry's step
/// returned, and how often the step ran.
async fn unreadable_round<T>(
    gate: &Gate,
    id: &Identity,
    value: T,
) -> (Option<String>, Result<T, Rejected>, usize)
where
    T: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    let ran = AtomicUsize::new(0);
    let step = || {
        idem::step("v", async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<T, Rejected>(value.clone())
        })
    };
    let first: Result<(), Rejected> = gate
        .guard(id)
        .run(async {
            step().await?;
            Err(Rejected::InFlight)
        })
        .await;
    assert!(matches!(first, Err(Rejected::InFlight)), "{first:?}");
    let held = state_of(gate, id).await.map(|(state, _)| state);
    if held.as_deref() == Some("in_doubt") {
        let address = id.address();
        let slot = Slot::new(gate.account_name(), gate.namespace_name(), &address);
        operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Release))
            .await
            .expect("release the claim held");
    }
    let retry = gate.guard(id).run(step().into_future()).await;
    (held, retry, ran.load(Ordering::SeqCst))
}

/// Values JSON cannot say, though they read back as their type: a NaN in
/// an `Option<f64>` (alone, or a struct's field) and `Some(())` are all
/// written `null` and read back `None`; an infinity two structs down. None
/// is recorded (a retry would be handed another value): the first run's
/// failure holds the claim, and after an operator's release the retry is
/// told the step is in doubt. The step runs once. (A red team found the
/// first three replayed as `None`.)
#[tokio::test]
async fn values_json_cannot_say_are_never_replayed_as_another_value() {
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct MaybeRate {
        amount: u64,
        rate: Option<f64>,
    }
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Rates {
        rates: Vec<f32>,
    }
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Outer {
        inner: Rates,
    }
    let gate = small_gate().await;
    let id = |what: &str| Identity::new("sb_lossy").part(what);
    let outcomes = [
        {
            let (held, retry, ran) = unreadable_round(&gate, &id("option"), Some(f64::NAN)).await;
            (held, retry.map(|v| format!("{v:?}")), ran)
        },
        {
            let value = MaybeRate {
                amount: 7,
                rate: Some(f64::NAN),
            };
            let (held, retry, ran) = unreadable_round(&gate, &id("field"), value).await;
            (held, retry.map(|v| format!("{v:?}")), ran)
        },
        {
            let (held, retry, ran) = unreadable_round(&gate, &id("unit"), Some(())).await;
            (held, retry.map(|v| format!("{v:?}")), ran)
        },
        {
            let value = Outer {
                inner: Rates {
                    rates: vec![1.0, f32::NEG_INFINITY],
                },
            };
            let (held, retry, ran) = unreadable_round(&gate, &id("nested"), value).await;
            (held, retry.map(|v| format!("{v:?}")), ran)
        },
    ];
    for (what, (held, retry, ran)) in ["option", "field", "unit", "nested"].iter().zip(outcomes) {
        assert_eq!(held.as_deref(), Some("in_doubt"), "{what}: retry {retry:?}");
        assert!(
            matches!(retry, Err(Rejected::StepInDoubt { .. })),
            "{what}: {retry:?}"
        );
        assert_eq!(ran, 1, "{what}");
    }
}
