//! Steps inside one claim (`idem::step`, `idem::downstream_key`), against a
//! real PostgreSQL:
//!
//! - a retry of the identity replays every step that finished and resumes
//!   at the first that did not, whatever released the claim;
//! - a step whose holder was cut off inside it is not run blindly again:
//!   the body is told, and the claim is held in doubt, unless the step is
//!   repeatable, which then runs again;
//! - a stale holder (its lease taken over) cannot begin a step, and finds
//!   what the new holder recorded;
//! - racers at the same instant run each step once;
//! - outside a guarded body, in a task the body spawned, in a transaction
//!   or a batch, and for a name used twice, a clear error and nothing runs;
//! - downstream keys are stable per identity and step, and differ between
//!   identities, steps, accounts and namespaces.

// The proof of steps: a three-step checkout against a fake provider, many
// clients per key, faults at every point, the provider's ledgers checked;
// and the same workload without steps, which repeats effects.
mod under_faults;
// Each promise of the steps' docs attacked: races at a barrier, faults,
// misuse, hostile names, scopes, the reconciler's verdicts.
mod documented_promises;
// A body that drops its own step then fails, listing order in a
// transaction, operators' release and list against step markers, fences
// across a release, prune, hostile names and values, downstream keys.
mod markers_operators_and_values;
// Repeatable steps, which write no marker: stale holders, wrong
// connections, declarations that change between runs, joined steps.
mod repeatable;
// What a body's steps do once one finds the claim lost: a stale or
// released holder's later steps, one value per step, a success that went
// on without its steps, wrong connections in a transaction.
mod claim_lost;
// Steps whose claim a reconciler or an operator resolved, or released,
// while the body ran: what each step and the holder are told.
mod claim_resolved;
// What steps cost: a step's record rides with the run's next statement
// (N steps, N + 2 statements), and lands on its own when the body stalls,
// is dropped, fails or holds a lease near its end.
mod carried_records;
// The red team's attacks on carried records: the 20 ms window, leases near
// their end, joined and nested steps, batches, detached runs, faults.
mod carried_records_at_the_edges;

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::batch::Batch;
use idem::testing;
use idem::{Disposition, Gate, Identity, Outcome, Rejected};
use idem_test_support::fault_proxy::Proxy;

use crate::support::doubt::state_of;
use crate::support::steps::{counting_gate, cut_off_inside, statements_of, steps_of};

/// Effects, counted per step: what a fake provider would have done.
#[derive(Default)]
struct Ledger {
    charged: AtomicUsize,
    shipped: AtomicUsize,
    emailed: AtomicUsize,
}

impl Ledger {
    fn counts(&self) -> (usize, usize, usize) {
        (
            self.charged.load(Ordering::SeqCst),
            self.shipped.load(Ordering::SeqCst),
            self.emailed.load(Ordering::SeqCst),
        )
    }
}

/// A body's error: a refusal, or the shipment failing (nothing shipped).
#[derive(Debug)]
enum CheckoutError {
    Rejected(Rejected),
    ShipmentFailed,
}

impl From<Rejected> for CheckoutError {
    fn from(rejected: Rejected) -> Self {
        CheckoutError::Rejected(rejected)
    }
}

/// Charges, ships (failing when `ship_fails`), emails: three steps, each
/// counting its effect in `ledger`.
async fn checkout(ledger: &Ledger, ship_fails: bool) -> Result<u64, CheckoutError> {
    let receipt: u64 = idem::step("charge", async {
        Ok::<_, CheckoutError>(ledger.charged.fetch_add(1, Ordering::SeqCst) as u64 + 100)
    })
    .await?;
    let parcel: u64 = idem::step("ship", async {
        if ship_fails {
            return Err(CheckoutError::ShipmentFailed);
        }
        Ok(ledger.shipped.fetch_add(1, Ordering::SeqCst) as u64 + 200)
    })
    .await?;
    idem::step("email", async {
        ledger.emailed.fetch_add(1, Ordering::SeqCst);
        Ok::<_, CheckoutError>(())
    })
    .await?;
    Ok(receipt * 1000 + parcel)
}

fn rejected(outcome: &Result<u64, CheckoutError>) -> Option<&Rejected> {
    match outcome {
        Err(CheckoutError::Rejected(rejected)) => Some(rejected),
        _ => None,
    }
}

#[tokio::test]
async fn a_retry_after_a_release_replays_the_finished_steps_and_resumes_at_the_first_that_did_not()
{
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_1");
    let ledger = Ledger::default();

    // The shipment fails: the claim is released, the charge stays recorded.
    let first = gate.guard(&id).run(checkout(&ledger, true)).await;
    assert!(
        matches!(first, Err(CheckoutError::ShipmentFailed)),
        "{first:?}"
    );
    assert_eq!(ledger.counts(), (1, 0, 0));
    assert_eq!(state_of(&gate, &id).await, None, "released");

    // The retry is not charged again, and hands the body the first receipt.
    let second = gate.guard(&id).run(checkout(&ledger, false)).await;
    assert_eq!(second.ok(), Some(100 * 1000 + 200));
    assert_eq!(ledger.counts(), (1, 1, 1));

    // Settled: a third call runs nothing at all.
    let third = gate.guard(&id).run(checkout(&ledger, false)).await;
    assert!(
        matches!(rejected(&third), Some(Rejected::AlreadyDone)),
        "{third:?}"
    );
    assert_eq!(ledger.counts(), (1, 1, 1));
}

#[tokio::test]
async fn the_attribute_s_body_runs_its_steps_under_its_claim() {
    #[idem::idempotent(key = "order")]
    async fn checkout_once(
        gate: &Gate,
        order: &str,
        ledger: &Ledger,
        ship_fails: bool,
    ) -> Result<u64, CheckoutError> {
        checkout(ledger, ship_fails).await
    }
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    let first = checkout_once(&gate, "ord_2", &ledger, true).await;
    assert!(
        matches!(first, Err(CheckoutError::ShipmentFailed)),
        "{first:?}"
    );
    let second = checkout_once(&gate, "ord_2", &ledger, false).await;
    assert_eq!(second.ok(), Some(100 * 1000 + 200));
    assert_eq!(ledger.counts(), (1, 1, 1));
}

#[tokio::test]
async fn a_failed_step_is_not_recorded_and_runs_again() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_3");
    let ledger = Ledger::default();
    let _ = gate.guard(&id).run(checkout(&ledger, true)).await;
    let _ = gate.guard(&id).run(checkout(&ledger, true)).await;
    // Charged once; the failing shipment was attempted twice and recorded
    // nothing either time, so the third run ships.
    let third = gate.guard(&id).run(checkout(&ledger, false)).await;
    assert_eq!(third.ok(), Some(100 * 1000 + 200));
    assert_eq!(ledger.counts(), (1, 1, 1));
}

#[tokio::test]
async fn a_step_cut_off_inside_is_in_doubt_for_the_next_holder_and_holds_the_claim() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_4");
    let lease = Duration::from_millis(200);
    cut_off_inside(&gate, &id, "charge", lease, &Arc::default()).await;
    tokio::time::sleep(lease + Duration::from_millis(100)).await;

    let ran = AtomicUsize::new(0);
    let outcome: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(lease)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .await
        })
        .await;
    assert!(
        matches!(&outcome, Err(Rejected::StepInDoubt { step, .. }) if step == "charge"),
        "{outcome:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a step in doubt is not run blindly again"
    );
    let (state, _) = state_of(&gate, &id).await.expect("the claim is kept");
    assert_eq!(
        state, "in_doubt",
        "the failure holds the claim, never releases it"
    );
}

#[tokio::test]
async fn a_step_cut_off_inside_holds_the_claim_even_when_the_body_classifies_its_failure_as_a_release()
 {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_5");
    let lease = Duration::from_millis(200);
    cut_off_inside(&gate, &id, "charge", lease, &Arc::default()).await;
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let outcome: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(lease)
        .disposition(|_: &Rejected| Disposition::Release)
        .run(async { idem::step("charge", async { Ok::<u64, Rejected>(2) }).await })
        .await;
    assert!(
        matches!(outcome, Err(Rejected::StepInDoubt { .. })),
        "{outcome:?}"
    );
    let (state, _) = state_of(&gate, &id).await.expect("the claim is kept");
    assert_eq!(state, "in_doubt");
}

#[tokio::test]
async fn a_repeatable_step_cut_off_inside_runs_again_under_the_next_holder() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_6");
    let lease = Duration::from_millis(200);
    cut_off_inside(&gate, &id, "charge", lease, &Arc::default()).await;
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let outcome: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(lease)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(2) })
                .repeatable()
                .await
        })
        .await;
    assert_eq!(outcome.ok(), Some(2));
    assert_eq!(
        state_of(&gate, &id)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("success")
    );
}

#[tokio::test]
async fn a_stale_holder_cannot_begin_a_step_and_finds_what_the_new_holder_recorded() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_7");
    let lease = Duration::from_millis(200);
    let shipped = AtomicUsize::new(0);
    let stale_saw = std::sync::Mutex::new(None);
    let (stale_may_go_on, go_on) = tokio::sync::oneshot::channel::<()>();
    let (charged_tx, charged_rx) = tokio::sync::oneshot::channel::<()>();

    // The stale holder charges, then stalls past its lease.
    let stale = gate.guard(&id).lease(lease).run(async {
        let receipt = idem::step("charge", async { Ok::<u64, Rejected>(1) }).await?;
        let _ = charged_tx.send(());
        let _ = go_on.await;
        let after = idem::step("ship", async {
            shipped.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Rejected>(10)
        })
        .await;
        let again = idem::step("charge-again", async { Ok::<u64, Rejected>(0) }).await;
        *stale_saw.lock().expect("what the stale holder saw") = Some((receipt, after, again));
        Ok::<_, Rejected>(())
    });
    let newer = async {
        let _ = charged_rx.await;
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        // Takes the claim over: the charge is replayed, the shipment runs.
        let taken: Result<(u64, u64), Rejected> = gate
            .guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                let receipt = idem::step("charge", async { Ok::<u64, Rejected>(2) }).await?;
                let parcel = idem::step("ship", async {
                    shipped.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(20)
                })
                .await?;
                Ok((receipt, parcel))
            })
            .await;
        let _ = stale_may_go_on.send(());
        taken
    };
    let (stale, newer) = tokio::join!(stale, newer);
    assert_eq!(
        newer.ok(),
        Some((1, 20)),
        "the charge is replayed, the shipment runs once"
    );
    // Its own success is not its to record: the claim was taken over.
    assert!(
        matches!(stale, Err(Rejected::LeaseLost { .. })),
        "{stale:?}"
    );
    let (receipt, after, again) = stale_saw
        .into_inner()
        .expect("what the stale holder saw")
        .expect("the stale body ran to its end");
    assert_eq!(receipt, 1);
    // It asks for the shipment the new holder recorded: it finds it.
    assert_eq!(after.ok(), Some(20));
    // A step nobody began: it cannot begin it under a claim it lost.
    assert!(
        matches!(again, Err(Rejected::LeaseLost { .. })),
        "{again:?}"
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racers_retrying_one_key_at_the_same_instant_run_each_step_once() {
    const RACERS: usize = 8;
    let gate = testing::gate_on(testing::pool_with(RACERS as u32 + 2).await).await;
    let id = Identity::new("checkout").part("ord_8");
    let ledger = Arc::new(Ledger::default());
    // The first shipment anybody attempts fails: its claim is released
    // after the charge, and whoever wins next must resume, not re-charge.
    let shipment_fails = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let report = testing::race(RACERS, || {
        let (gate, id) = (gate.clone(), id.clone());
        let (ledger, shipment_fails) = (Arc::clone(&ledger), Arc::clone(&shipment_fails));
        async move {
            for _ in 0..200 {
                let fails = shipment_fails.swap(false, Ordering::SeqCst);
                let outcome = gate.guard(&id).run(checkout(&ledger, fails)).await;
                match &outcome {
                    Ok(_) | Err(CheckoutError::Rejected(Rejected::AlreadyDone)) => return outcome,
                    _ => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
            panic!("the key never completed");
        }
    })
    .await;
    let completed = report
        .invocations
        .iter()
        .filter(|invocation| matches!(invocation.outcome, Ok(Ok(_))))
        .count();
    assert_eq!(completed, 1, "{report:?}");
    assert_eq!(ledger.counts(), (1, 1, 1), "each step ran once");
}

#[tokio::test]
async fn outside_a_guarded_body_a_step_is_refused_and_does_not_run() {
    let ran = AtomicUsize::new(0);
    let outcome: Result<(), Rejected> = idem::step("charge", async {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .await;
    assert!(
        matches!(
            outcome,
            Err(Rejected::NotGuarded {
                called: "idem::step",
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let key = idem::downstream_key("charge");
    assert!(matches!(key, Err(Rejected::NotGuarded { .. })), "{key:?}");
}

#[tokio::test]
async fn in_a_task_the_body_spawned_a_step_is_refused() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_9");
    let outcome: Result<Result<(), Rejected>, Rejected> = gate
        .guard(&id)
        .run(async {
            let spawned =
                tokio::spawn(idem::step("charge", async { Ok::<(), Rejected>(()) }).into_future());
            Ok(spawned.await.expect("the task"))
        })
        .await;
    let inner = outcome.expect("the body succeeds");
    assert!(
        matches!(inner, Err(Rejected::NotGuarded { .. })),
        "{inner:?}"
    );
}

#[tokio::test]
async fn a_step_name_used_twice_in_one_run_is_refused() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_10");
    let ran = AtomicUsize::new(0);
    let outcome: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("ship", async { Ok::<(), Rejected>(()) }).await?;
            idem::step("ship", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<(), Rejected>(())
            })
            .await
        })
        .await;
    assert!(
        matches!(outcome, Err(Rejected::NotGuarded { .. })),
        "{outcome:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// A checkout inside the caller's transaction: charges (a step recorded
/// on the transaction), then ships, failing when `ship_fails`.
async fn checkout_in(
    gate: &Gate,
    id: &Identity,
    connection: &mut idem::sqlx::PgConnection,
    ledger: &Ledger,
    ship_fails: bool,
) -> Result<u64, CheckoutError> {
    gate.guard(id)
        .tx(&mut *connection)
        .run(async |connection| {
            let receipt: u64 = idem::step("charge", async {
                Ok::<_, CheckoutError>(ledger.charged.fetch_add(1, Ordering::SeqCst) as u64)
            })
            .on(&mut *connection)
            .await?;
            if ship_fails {
                return Err(CheckoutError::ShipmentFailed);
            }
            Ok(receipt)
        })
        .await
}

#[tokio::test]
async fn in_a_transaction_a_step_commits_or_rolls_back_with_it() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_11");
    let ledger = Ledger::default();

    // Rolled back: the claim and the step's record are forgotten together,
    // so the next run charges again (what its downstream key is for).
    let mut tx = gate.pool().begin().await.expect("begin");
    let first = checkout_in(&gate, &id, &mut tx, &ledger, false).await;
    assert_eq!(first.ok(), Some(0));
    tx.rollback().await.expect("rollback");
    assert_eq!(state_of(&gate, &id).await, None);

    // Committed after a failure that releases the claim: the charge's
    // record commits, so the retry resumes without charging.
    let mut tx = gate.pool().begin().await.expect("begin");
    let second = checkout_in(&gate, &id, &mut tx, &ledger, true).await;
    assert!(
        matches!(second, Err(CheckoutError::ShipmentFailed)),
        "{second:?}"
    );
    tx.commit().await.expect("commit");
    let mut tx = gate.pool().begin().await.expect("begin");
    let third = checkout_in(&gate, &id, &mut tx, &ledger, false).await;
    assert_eq!(third.ok(), Some(1), "the second run's charge, replayed");
    tx.commit().await.expect("commit");
    assert_eq!(ledger.charged.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_step_on_the_wrong_connection_discipline_is_refused_with_what_to_do() {
    let gate = testing::gate().await;
    // A claim inside a transaction, a step without it.
    let id = Identity::new("checkout").part("ord_12");
    let mut tx = gate.pool().begin().await.expect("begin");
    let in_tx: Result<(), Rejected> = gate
        .guard(&id)
        .tx(&mut tx)
        .run(async |_| idem::step("charge", async { Ok::<(), Rejected>(()) }).await)
        .await;
    match in_tx {
        Err(Rejected::NotGuarded { why, .. }) => assert!(why.contains(".on(&mut *tx)"), "{why}"),
        other => panic!("{other:?}"),
    }
    drop(tx);

    // A claim on the pool, a step on a connection.
    let mut connection = gate.pool().acquire().await.expect("a connection");
    let on_pool: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<(), Rejected>(()) })
                .on(&mut connection)
                .await
        })
        .await;
    match on_pool {
        Err(Rejected::NotGuarded { why, .. }) => assert!(why.contains("on the pool"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_batch_s_bodies_run_their_steps_each_under_its_own_claim() {
    let gate = testing::gate().await;
    let ledger = Arc::new(Ledger::default());
    let batch = || -> Batch<u64> {
        (1..=3)
            .map(|n| (n, Identity::new("checkout").part(n + 100)))
            .collect()
    };
    // Item 2's shipment fails the first time: its claim is released, its
    // charge recorded.
    let run = |ship_fails_for: u64| {
        let ledger = Arc::clone(&ledger);
        gate.guard_batch(batch()).run(move |n: u64| {
            let ledger = Arc::clone(&ledger);
            async move { checkout(&ledger, n == ship_fails_for).await }
        })
    };
    let first = run(2).await;
    assert!(
        matches!(first[1], Err(CheckoutError::ShipmentFailed)),
        "{first:?}"
    );
    assert_eq!(ledger.counts(), (3, 2, 2));
    let second = run(0).await;
    assert!(second[1].is_ok(), "{second:?}");
    assert_eq!(
        ledger.counts(),
        (3, 3, 3),
        "item 2 resumed after its charge"
    );
}

#[tokio::test]
async fn downstream_keys_are_stable_per_identity_and_step_and_never_shared() {
    let gate = testing::gate().await;
    // The key a body of `id` under `gate` is given for `step`; the body
    // then fails, so the identity runs again next time.
    let key_of = |gate: Gate, id: Identity, step: &'static str| async move {
        let seen = std::sync::Mutex::new(None);
        let _: Result<(), Rejected> = gate
            .guard(&id)
            .run(async {
                *seen.lock().expect("the key") = Some(idem::downstream_key(step)?);
                Err(Rejected::InFlight)
            })
            .await;
        seen.into_inner().expect("the key").expect("a key")
    };
    let id = Identity::new("checkout").part("ord_13");
    let first = key_of(gate.clone(), id.clone(), "charge").await;
    assert!(first.starts_with("idem_") && first.len() == 45, "{first}");
    assert!(
        first
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    );
    assert_eq!(
        key_of(gate.clone(), id.clone(), "charge").await,
        first,
        "stable"
    );
    let others = [
        key_of(gate.clone(), id.clone(), "ship").await,
        key_of(
            gate.clone(),
            Identity::new("checkout").part("ord_14"),
            "charge",
        )
        .await,
        key_of(gate.account("another"), id.clone(), "charge").await,
        key_of(gate.namespace("live"), id.clone(), "charge").await,
    ];
    for other in &others {
        assert_ne!(&first, other);
    }
}

#[tokio::test]
async fn a_detached_body_runs_its_steps_under_its_claim() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_15");
    let detached = idem::Detached::with_bound(Duration::from_secs(30));
    let ledger = Arc::new(Ledger::default());
    let run = |ship_fails: bool| {
        let ledger = Arc::clone(&ledger);
        gate.guard(&id).run_detached(
            &detached,
            async move { checkout(&ledger, ship_fails).await },
        )
    };
    let first = run(true).await;
    assert!(
        matches!(first, Err(CheckoutError::ShipmentFailed)),
        "{first:?}"
    );
    let second = run(false).await;
    assert_eq!(second.ok(), Some(100 * 1000 + 200));
    assert_eq!(ledger.counts(), (1, 1, 1));
    detached.shutdown(Duration::from_secs(1)).await;
}

/// Holds `id` in doubt with its step "ship" cut off: a first holder is
/// dropped inside it, a second finds it in doubt and fails for it.
async fn ship_in_doubt(gate: &Gate, id: &Identity, ledger: &Ledger) {
    let lease = Duration::from_millis(200);
    let began = Arc::new(tokio::sync::Notify::new());
    let first = gate.guard(id).lease(lease).run({
        let began = Arc::clone(&began);
        async move {
            idem::step("charge", async { Ok::<u64, Rejected>(100) }).await?;
            idem::step("ship", async move {
                began.notify_one();
                std::future::pending::<()>().await;
                Ok::<u64, Rejected>(0)
            })
            .await
        }
    });
    tokio::select! {
        _ = first => panic!("the shipment never finishes"),
        () = began.notified() => {}
    }
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let second = gate
        .guard(id)
        .lease(lease)
        .run(checkout(ledger, false))
        .await;
    assert!(
        matches!(rejected(&second), Some(Rejected::StepInDoubt { .. })),
        "{second:?}"
    );
}

#[tokio::test]
async fn the_reconciler_is_told_the_step_in_doubt_and_its_answer_lets_the_retry_resume() {
    use idem::reconcile::{Reconciler, Verdict};
    for happened in [true, false] {
        let gate = testing::gate().await;
        let action = testing::unique_name("checkout");
        let id = Identity::new(&action).part("ord_16");
        let ledger = Ledger::default();
        ship_in_doubt(&gate, &id, &ledger).await;
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let reconciler = Reconciler::new(gate.pool().clone()).probe(action.clone(), {
            let told = Arc::clone(&told);
            move |doubt| {
                told.lock()
                    .expect("told")
                    .push(doubt.steps_in_doubt.clone());
                async move {
                    if happened {
                        Verdict::step_succeeded_with("ship", &777_u64).expect("a value")
                    } else {
                        Verdict::NotHappened
                    }
                }
            }
        });
        let pass = reconciler.reconcile_once().await.expect("a pass");
        assert_eq!(pass.resolved, 1, "{pass:?}");
        assert_eq!(*told.lock().expect("told"), [vec!["ship".to_owned()]]);
        assert_eq!(state_of(&gate, &id).await, None, "released for the retry");
        // The retry: the charge replayed; the shipment replayed as the probe
        // said, or run now that it did not happen.
        let retry = gate.guard(&id).run(checkout(&ledger, false)).await;
        let parcel = if happened { 777 } else { 200 };
        assert_eq!(
            retry.ok(),
            Some(100 * 1000 + parcel),
            "happened: {happened}"
        );
        assert_eq!(ledger.counts(), (0, u64::from(!happened) as usize, 1));
    }
}

/// Ages every row of `gate`'s account by `days`: its claims and steps were
/// recorded, settled and released that long before they were. (In UTC:
/// `timestamptz - interval` depends on the time zone, and Citus refuses
/// such a function of a column in an `UPDATE`.)
async fn age_by_days(gate: &Gate, days: i32) {
    idem::sqlx::query(
        "UPDATE idem_records \
         SET created_at = (created_at AT TIME ZONE 'UTC' - make_interval(days => $2)) \
                          AT TIME ZONE 'UTC', \
             settled_at = (settled_at AT TIME ZONE 'UTC' - make_interval(days => $2)) \
                          AT TIME ZONE 'UTC', \
             released_at = (released_at AT TIME ZONE 'UTC' - make_interval(days => $2)) \
                           AT TIME ZONE 'UTC' \
         WHERE account = $1",
    )
    .bind(gate.account_name())
    .bind(days)
    .execute(gate.pool())
    .await
    .expect("age the account's rows");
}

/// Prunes `gate`'s account with a horizon of `days`: what was settled (or,
/// for a step whose claim is gone, released) before then.
async fn prune_older_than_days(gate: &Gate, days: u64) {
    let horizon = std::time::SystemTime::now() - Duration::from_secs(days * 86_400);
    let filter = idem::operations::PruneFilter::new(horizon).account(gate.account_name());
    idem::operations::prune(gate.pool(), &filter)
        .await
        .expect("prune");
}

/// A claim released long after its steps were recorded keeps them for its
/// retry: prune measures an orphaned step's age from its claim's last
/// release, so a step recorded 60 days ago under a claim released today is
/// not past a 30-day horizon. Without that, the prune deletes the charge's
/// record and the retry charges again. On each path that releases: a
/// body's release, an operator's (or reconciler's) release of a claim held
/// in doubt, and a batch's release.
#[tokio::test]
async fn a_claim_released_after_the_prune_horizon_keeps_its_steps_for_its_retry() {
    let gate = testing::gate().await;

    // A body's release. The first run charged, then failed to ship; 60
    // days later a retry failed before its first step (released again);
    // a prune with a 30-day horizon runs; then the retry that completes.
    let id = Identity::new("checkout").part("body");
    let ledger = Ledger::default();
    let first = gate.guard(&id).run(checkout(&ledger, true)).await;
    assert!(matches!(first, Err(CheckoutError::ShipmentFailed)));
    age_by_days(&gate, 60).await;
    let second = gate
        .guard(&id)
        .run(async { Err::<u64, _>(CheckoutError::ShipmentFailed) })
        .await;
    assert!(matches!(second, Err(CheckoutError::ShipmentFailed)));
    prune_older_than_days(&gate, 30).await;
    let third = gate.guard(&id).run(checkout(&ledger, false)).await;
    assert_eq!(third.ok(), Some(100 * 1000 + 200));
    assert_eq!(ledger.counts(), (1, 1, 1), "a body's release: charged once");

    // An operator's release of a claim held in doubt for 60 days.
    let id = Identity::new("checkout").part("held");
    let ledger = Ledger::default();
    let held = gate
        .guard(&id)
        .disposition(|_: &CheckoutError| Disposition::InDoubt)
        .run(checkout(&ledger, true))
        .await;
    assert!(matches!(held, Err(CheckoutError::ShipmentFailed)));
    let state = state_of(&gate, &id).await.map(|(state, _)| state);
    assert_eq!(state.as_deref(), Some("in_doubt"));
    age_by_days(&gate, 60).await;
    let address = id.address();
    let slot = idem::operations::Slot::new(gate.account_name(), gate.namespace_name(), &address);
    idem::operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Release))
        .await
        .expect("release the claim in doubt");
    // `claims show` says when: the release, not the record 60 days ago.
    let steps = idem::operations::steps(gate.pool(), slot)
        .await
        .expect("list the steps");
    let (recorded, released) = (steps[0].settled_micros, steps[0].released_micros);
    assert!(
        recorded
            .zip(released)
            .is_some_and(|(recorded, released)| { released - recorded > 59 * 86_400 * 1_000_000 }),
        "{steps:?}"
    );
    prune_older_than_days(&gate, 30).await;
    let retry = gate.guard(&id).run(checkout(&ledger, false)).await;
    assert_eq!(retry.ok(), Some(100 * 1000 + 200));
    assert_eq!(
        ledger.counts(),
        (1, 1, 1),
        "an operator's release: charged once"
    );

    // A batch's release, 60 days after the item's charge.
    let ledger = Arc::new(Ledger::default());
    let batch = || -> Batch<u64> {
        [(1, Identity::new("checkout").part("batch"))]
            .into_iter()
            .collect()
    };
    let run = |fails: Option<bool>| {
        let ledger = Arc::clone(&ledger);
        gate.guard_batch(batch()).run(move |_: u64| {
            let ledger = Arc::clone(&ledger);
            async move {
                match fails {
                    // Fails before its first step.
                    None => Err(CheckoutError::ShipmentFailed),
                    Some(ship_fails) => checkout(&ledger, ship_fails).await,
                }
            }
        })
    };
    assert!(matches!(
        run(Some(true)).await[0],
        Err(CheckoutError::ShipmentFailed)
    ));
    age_by_days(&gate, 60).await;
    assert!(matches!(
        run(None).await[0],
        Err(CheckoutError::ShipmentFailed)
    ));
    prune_older_than_days(&gate, 30).await;
    let done = run(Some(false)).await;
    assert_eq!(done[0].as_ref().ok(), Some(&(100 * 1000 + 200)));
    assert_eq!(
        ledger.counts(),
        (1, 1, 1),
        "a batch's release: charged once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_step_costs_its_record_and_a_run_reads_its_claim_s_steps_once() {
    let proxy = Proxy::start().await;
    let gate = counting_gate(&proxy).await;
    let id = Identity::new("checkout").part("ord_cost");
    let steps = |fail: bool| async move {
        let a: u64 = idem::step("a", async { Ok::<u64, CheckoutError>(1) })
            .repeatable()
            .await?;
        let b: u64 = idem::step("b", async { Ok::<u64, CheckoutError>(2) })
            .repeatable()
            .await?;
        if fail {
            return Err(CheckoutError::ShipmentFailed);
        }
        let c: u64 = idem::step("c", async { Ok::<u64, CheckoutError>(3) })
            .repeatable()
            .await?;
        // A step that is not repeatable still writes its marker first.
        let d: u64 = idem::step("d", async { Ok::<u64, CheckoutError>(4) }).await?;
        Ok(a + b + c + d)
    };

    // The claim, one read of its steps (none), a record per step, the release.
    let (first, statements) = statements_of(&proxy, gate.guard(&id).run(steps(true))).await;
    assert!(
        matches!(first, Err(CheckoutError::ShipmentFailed)),
        "{first:?}"
    );
    assert_eq!(statements, 1 + 1 + 2 + 1, "claim, read, a, b, release");

    // The retry: a and b replayed from the one read, c recorded, d's
    // marker, and the settle carrying d's record (on Citus, d's record on
    // its own).
    let carried = crate::support::steps::records_are_carried(&gate).await;
    let (second, statements) = statements_of(&proxy, gate.guard(&id).run(steps(false))).await;
    assert_eq!(second.ok(), Some(10));
    assert_eq!(
        statements,
        1 + 1 + 1 + 1 + 1 + u64::from(!carried),
        "claim, read, c, d's marker, the settle with d's record"
    );
}

/// The address of step `name` of `id`, and its canonical encoding: read
/// off a run of it in an account of its own (both depend on the identity
/// and the name alone).
async fn step_of(gate: &Gate, id: &Identity, name: &str) -> (String, Vec<u8>) {
    let elsewhere = gate.account(format!("{}_elsewhere", gate.account_name()));
    let ran: Result<(), Rejected> = elsewhere
        .guard(id)
        .run(idem::step(name.to_owned(), async { Ok::<(), Rejected>(()) }).into_future())
        .await;
    assert!(ran.is_ok(), "{ran:?}");
    let address = steps_of(&elsewhere, id).await[0].address.clone();
    let identity: Vec<u8> = idem::sqlx::query_scalar(
        "SELECT identity FROM idem_records WHERE account = $1 AND kind = 'step' AND address = $2",
    )
    .bind(elsewhere.account_name())
    .bind(&address)
    .fetch_one(gate.pool())
    .await
    .expect("the step's identity");
    (address, identity)
}

/// The blocker's transaction, as the lock views name it: its backend's
/// pid on one PostgreSQL; on Citus, where the rows live on a worker, its
/// global pid (`citus_lock_waits` lists waits across the cluster).
async fn blocker_of(gate: &Gate, blocker: &mut idem::sqlx::PgConnection) -> (bool, i64) {
    let citus: bool = idem::sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')",
    )
    .fetch_one(gate.pool())
    .await
    .expect("is this Citus");
    let pid = if citus {
        "SELECT citus_backend_gpid()::int8"
    } else {
        "SELECT pg_backend_pid()::int8"
    };
    let pid: i64 = idem::sqlx::query_scalar(pid)
        .fetch_one(blocker)
        .await
        .expect("the blocker's pid");
    (citus, pid)
}

/// Until some backend waits on the transaction of the blocker `(citus, pid)`.
async fn until_a_backend_waits_on(gate: &Gate, (citus, pid): (bool, i64)) {
    let waits = if citus {
        "SELECT count(*) FROM citus_lock_waits WHERE blocking_gpid = $1"
    } else {
        "SELECT count(*) FROM pg_locks w JOIN pg_locks h \
           ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid \
         WHERE w.locktype = 'transactionid' AND NOT w.granted AND h.granted \
           AND h.pid = $1::int4"
    };
    for _ in 0..1000 {
        let waiting: i64 = idem::sqlx::query_scalar(waits)
            .bind(pid)
            .fetch_one(gate.pool())
            .await
            .expect("read the locks");
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing waited on the blocker's transaction");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeatable_step_a_stale_holder_recorded_after_the_new_one_read_hands_the_new_one_that_value()
 {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_theirs");
    let lease = Duration::from_millis(300);
    let (address, _) = step_of(&gate, &id, "charge").await;

    // A transaction of the test's own holds an uncommitted row at the
    // charge step's address: the stale holder's record, its claim read as
    // still its own, waits on it.
    let mut blocker = gate.pool().begin().await.expect("begin the blocker");
    idem::sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity, claim_address) \
         VALUES ($1, 'step', $2, 'pending', '\\x00', $3)",
    )
    .bind(gate.account_name())
    .bind(&address)
    .bind(id.address())
    .execute(&mut *blocker)
    .await
    .expect("the blocker's row");
    let blocker_pid = blocker_of(&gate, &mut blocker).await;

    let (stale_recorded, recorded) = tokio::sync::oneshot::channel::<u64>();
    let (new_running, running) = tokio::sync::oneshot::channel::<()>();
    let (new_may_finish, may_finish) = tokio::sync::oneshot::channel::<()>();
    let (end_stale, stale_may_end) = tokio::sync::oneshot::channel::<()>();
    let stale = gate.guard(&id).lease(lease).run(async {
        let charged = idem::step("charge", async { Ok::<u64, Rejected>(1) })
            .repeatable()
            .await?;
        let _ = stale_recorded.send(charged);
        // Its late success would settle the claim over the new holder's
        // pending row: it ends after the new holder settled.
        let _ = stale_may_end.await;
        Ok::<u64, Rejected>(charged)
    });
    let newer = async {
        until_a_backend_waits_on(&gate, blocker_pid).await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let taken = gate.guard(&id).lease(Duration::from_secs(30)).run(async {
            idem::step("charge", async {
                let _ = new_running.send(());
                let _ = may_finish.await;
                Ok::<u64, Rejected>(2)
            })
            .repeatable()
            .await
        });
        let release = async {
            // The new holder read the claim's steps (none yet) and runs
            // the charge; now the stale holder's record goes in.
            let _ = running.await;
            blocker.rollback().await.expect("roll the blocker back");
            let stale_value = recorded
                .await
                .expect("the stale holder recorded its charge");
            let _ = new_may_finish.send(());
            stale_value
        };
        let ended = tokio::join!(taken, release);
        let _ = end_stale.send(());
        ended
    };
    let (stale, (newer, stale_value)) = tokio::join!(stale, newer);
    assert_eq!(stale_value, 1, "the stale holder's record went in");
    assert!(
        matches!(stale, Err(Rejected::LeaseLost { .. })),
        "{stale:?}"
    );
    assert_eq!(
        newer.as_ref().ok(),
        Some(&1),
        "the new holder goes on with the value the record holds, not its own: {newer:?}"
    );
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].state.as_str(), "success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_s_repeatable_step_never_records_over_the_new_holder_s() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_stale_repeat");
    let lease = Duration::from_millis(300);
    let (stale_running, running) = tokio::sync::oneshot::channel::<()>();
    let (stale_may_finish, may_finish) = tokio::sync::oneshot::channel::<()>();
    // The stale holder reads its claim's steps (none), starts the charge,
    // and stalls inside it past its lease.
    let stale = gate.guard(&id).lease(lease).run(async {
        idem::step("charge", async {
            let _ = stale_running.send(());
            let _ = may_finish.await;
            Ok::<u64, Rejected>(1)
        })
        .repeatable()
        .await
    });
    let newer = async {
        let _ = running.await;
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let taken = gate
            .guard(&id)
            .lease(Duration::from_secs(30))
            .run(async {
                idem::step("charge", async { Ok::<u64, Rejected>(2) })
                    .repeatable()
                    .await
            })
            .await;
        let _ = stale_may_finish.send(());
        taken
    };
    let (stale, newer) = tokio::join!(stale, newer);
    assert_eq!(newer.ok(), Some(2));
    assert!(
        matches!(stale, Err(Rejected::LeaseLost { .. })),
        "{stale:?}"
    );
    // The stale holder's charge went nowhere: a retry replays the new one's.
    let replayed: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(3) })
                .repeatable()
                .await
        })
        .await;
    assert!(
        matches!(replayed, Err(Rejected::AlreadyDone)),
        "{replayed:?}"
    );
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].state.as_str(), "success");
    let recorded: String = idem::sqlx::query_scalar(
        "SELECT output_json FROM idem_records WHERE account = $1 AND address = $2",
    )
    .bind(gate.account_name())
    .bind(&steps[0].address)
    .fetch_one(gate.pool())
    .await
    .expect("the charge's record");
    assert_eq!(recorded, "2");
}

#[tokio::test]
async fn a_repeatable_step_never_records_over_a_marker_of_a_newer_fence() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ord_newer_marker");
    let (address, identity) = step_of(&gate, &id, "charge").await;
    // A marker of a fence above every fence drawn so far: what a holder
    // that took the claim over since this one read it would have begun.
    const NEWER: i64 = 1 << 60;
    idem::sqlx::query(
        "INSERT INTO idem_records \
           (account, kind, address, state, identity, claim_address, fence) \
         VALUES ($1, 'step', $2, 'pending', $3, $4, $5)",
    )
    .bind(gate.account_name())
    .bind(&address)
    .bind(identity)
    .bind(id.address())
    .bind(NEWER)
    .execute(gate.pool())
    .await
    .expect("the newer marker");
    let outcome: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<u64, Rejected>(1) })
                .repeatable()
                .await
        })
        .await;
    // The step ran; its value is nobody's record, and the body is told its
    // claim is no longer its own (it had no lease to run out: ClaimLost).
    assert!(
        matches!(outcome, Err(Rejected::ClaimLost { .. })),
        "{outcome:?}"
    );
    let steps = steps_of(&gate, &id).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].state.as_str(), "pending", "not recorded over");
    assert_eq!(steps[0].fence, NEWER);
}

/// `Rejected`'s table: a body told `StepInDoubt` "ran up to that step,
/// which did not run again". A retry that took the claim over runs its
/// body up to the step in doubt, effects before it included, and is then
/// told `StepInDoubt`; the step itself does not run.
#[tokio::test]
async fn a_step_in_doubt_is_told_to_a_body_that_ran_up_to_it() {
    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("ran before the step");
    let lease = Duration::from_millis(200);
    cut_off_inside(&gate, &id, "charge", lease, &Arc::default()).await;
    tokio::time::sleep(lease + Duration::from_millis(100)).await;

    let before_the_step = AtomicUsize::new(0);
    let stepped = AtomicUsize::new(0);
    let outcome: Result<u64, Rejected> = gate
        .guard(&id)
        .lease(lease)
        .run(async {
            // An effect of the body before its first step: an email sent.
            before_the_step.fetch_add(1, Ordering::SeqCst);
            idem::step("charge", async {
                stepped.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(2)
            })
            .await
        })
        .await;
    assert!(
        matches!(&outcome, Err(Rejected::StepInDoubt { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        before_the_step.load(Ordering::SeqCst),
        1,
        "ran up to the step"
    );
    assert_eq!(
        stepped.load(Ordering::SeqCst),
        0,
        "the step did not run again"
    );
}
