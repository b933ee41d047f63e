//! The gate's semantics under real concurrency: every case fires its
//! invocations at the same instant (a barrier) against a real PostgreSQL.
//!
//! A failed race names its cause (see `RaceReport::assert_exactly_once`):
//! more than one winner means the unique constraint is missing or contains a
//! nullable column; no winner means the schema was never set up or the gate
//! points elsewhere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::testing::{self, race};
use idem::{Gate, Identity, Rejected, idempotent};
use idem_test_support::{JobError, rows};

/// Counts how often a body really ran.
#[derive(Default)]
struct Ledger(AtomicUsize);

impl Ledger {
    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Applies something to `target`, once. The pause keeps the winner's claim
/// pending while the others arrive.
#[idempotent(key = "target")]
async fn apply(gate: &Gate, target: &str, ledger: &Ledger) -> Result<String, JobError> {
    ledger.0.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(format!("applied to {target}"))
}

/// The same key, under another action.
#[idempotent(key = "target", action = "apply_elsewhere")]
async fn apply_elsewhere(gate: &Gate, target: &str, ledger: &Ledger) -> Result<(), JobError> {
    ledger.0.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Fails while `fail` says so.
#[idempotent(key = "target")]
async fn flaky(gate: &Gate, target: &str, fail: bool, ledger: &Ledger) -> Result<(), JobError> {
    ledger.0.fetch_add(1, Ordering::SeqCst);
    if fail { Err(JobError::Failed) } else { Ok(()) }
}

/// A key with an optional part: `None` means there is nothing to deduplicate on.
#[idempotent(key = "customer")]
async fn notify(gate: &Gate, customer: Option<&str>, ledger: &Ledger) -> Result<(), JobError> {
    ledger.0.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// (a) Two identical invocations at once: one runs, one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_identical_invocations_one_wins_one_is_refused() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    let report = race(2, || apply(&gate, "invoice-1", &ledger)).await;
    report.assert_exactly_once();
    assert_eq!(ledger.runs(), 1, "{report}");
    let refusal = report.refusals().next().expect("one refusal");
    assert!(
        matches!(refusal, Rejected::InFlight | Rejected::AlreadyDone),
        "refused for the wrong reason: {refusal}"
    );
}

/// (b) Another target's slot is another slot: neither blocks the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_a_different_target_is_not_blocked() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    let next = AtomicUsize::new(0);
    let targets = ["invoice-1", "invoice-2", "invoice-3", "invoice-4"];
    let report = race(targets.len(), || {
        let target = targets[next.fetch_add(1, Ordering::SeqCst)];
        apply(&gate, target, &ledger)
    })
    .await;
    report.assert_all_succeeded();
    assert_eq!(report.claimed(), targets.len(), "{report}");
    assert_eq!(ledger.runs(), targets.len());
}

/// (c) A `None` key part: no identity, so every invocation runs, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_an_absent_identity_runs_ungated_every_time() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    for round in 1..=3 {
        let report = race(8, || notify(&gate, None, &ledger)).await;
        report.assert_all_succeeded();
        assert_eq!(report.ungated(), 8, "{report}");
        assert_eq!(ledger.runs(), 8 * round);
    }
    assert_eq!(rows::count_rows(&gate, "pending").await, 0);
    assert_eq!(rows::count_rows(&gate, "success").await, 0);
    // Some(..) is gated as usual.
    race(8, || notify(&gate, Some("cus_1"), &ledger))
        .await
        .assert_exactly_once();
}

/// (d) The key narrows the slot: same action with different keys both run,
/// the same key under different actions both run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_an_explicit_key_scopes_a_narrower_slot_than_the_action() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    let (one, two) = tokio::join!(
        apply(&gate, "order-1", &ledger),
        apply(&gate, "order-2", &ledger)
    );
    assert!(one.is_ok() && two.is_ok(), "{one:?} {two:?}");
    let (apply_it, elsewhere) = tokio::join!(
        apply(&gate, "order-3", &ledger),
        apply_elsewhere(&gate, "order-3", &ledger)
    );
    assert!(
        apply_it.is_ok() && elsewhere.is_ok(),
        "{apply_it:?} {elsewhere:?}"
    );
    assert_eq!(ledger.runs(), 4);
    assert_ne!(
        Identity::new("apply").part("order-3").address(),
        Identity::new("apply_elsewhere").part("order-3").address()
    );
}

/// (e) A retry after success is refused, and its body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_a_sequential_retry_after_success_is_refused() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    assert_eq!(
        apply(&gate, "payout-9", &ledger).await.expect("first run"),
        "applied to payout-9"
    );
    for _ in 0..3 {
        let retry = apply(&gate, "payout-9", &ledger).await;
        assert!(
            matches!(retry, Err(JobError::Rejected(Rejected::AlreadyDone))),
            "a retry after success must be refused as already done: {retry:?}"
        );
    }
    assert_eq!(ledger.runs(), 1);
    let address = Identity::new("apply").part("payout-9").address();
    assert_eq!(
        rows::row_state(&gate, &address).await.as_deref(),
        Some("success")
    );
}

/// (f) A failure is released, so its retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_a_failure_is_released_and_its_retry_runs() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    let address = Identity::new("flaky").part("job-1").address();

    let failed = flaky(&gate, "job-1", true, &ledger).await;
    assert!(matches!(failed, Err(JobError::Failed)), "{failed:?}");
    assert_eq!(
        rows::row_state(&gate, &address).await,
        None,
        "a failure must delete its claim"
    );

    // The retries race; the released slot goes to exactly one of them.
    race(8, || flaky(&gate, "job-1", false, &ledger))
        .await
        .assert_exactly_once();
    assert_eq!(ledger.runs(), 2);
    assert_eq!(
        rows::row_state(&gate, &address).await.as_deref(),
        Some("success")
    );
}

/// (g) The NULL namespace is unique too. A unique index over the nullable
/// namespace column would let every one of these win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g_the_null_namespace_is_unique_too() {
    let gate = testing::gate().await;
    assert_eq!(gate.namespace_name(), None);
    let ledger = Ledger::default();
    race(16, || apply(&gate, "shared", &ledger))
        .await
        .assert_exactly_once();

    let live = gate.namespace("live");
    race(16, || apply(&live, "shared", &ledger))
        .await
        .assert_exactly_once();

    // Namespaces scope their slots: same identity, another namespace, runs.
    let test = gate.namespace("test");
    race(16, || apply(&test, "shared", &ledger))
        .await
        .assert_exactly_once();
    assert_eq!(ledger.runs(), 3);
}

/// 32 invocations at once, over many rounds, each round a new identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_way_races_have_one_winner_every_round() {
    let gate = testing::gate().await;
    let live = gate.namespace("live");
    for round in 0..12 {
        let target = format!("round-{round}");
        let ledger = Ledger::default();
        let scoped = if round % 2 == 0 { &gate } else { &live };
        let report = race(32, || apply(scoped, &target, &ledger)).await;
        report.assert_exactly_once();
        assert_eq!(ledger.runs(), 1, "round {round}: {report}");
    }
}

/// One account's claims neither block nor see another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_are_isolated() {
    let gate = testing::gate().await;
    let acme = gate.account(testing::unique_name("acme"));
    let globex = gate.account(testing::unique_name("globex"));
    let ledger = Ledger::default();

    let (a, b) = tokio::join!(
        race(8, || apply(&acme, "order-1", &ledger)),
        race(8, || apply(&globex, "order-1", &ledger)),
    );
    a.assert_exactly_once();
    b.assert_exactly_once();
    assert_eq!(ledger.runs(), 2);

    // Settled in acme; a third account still runs it.
    let initech = gate.account(testing::unique_name("initech"));
    apply(&initech, "order-1", &ledger)
        .await
        .expect("another account runs");
    assert!(matches!(
        apply(&acme, "order-1", &ledger).await,
        Err(JobError::Rejected(Rejected::AlreadyDone))
    ));
}

/// A loser is refused at once: it never waits for the winner to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loser_is_refused_at_once_while_the_winner_still_runs() {
    let gate = testing::gate().await;
    let id = Identity::new("long_job").part(1);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();

    let winner = {
        let (gate, id) = (gate.clone(), id.clone());
        tokio::spawn(async move {
            gate.run(&id, async move {
                let _ = started_tx.send(());
                // Holds the claim until the loser has been answered.
                let _ = finish_rx.await;
                Ok::<_, Rejected>("done")
            })
            .await
        })
    };
    started_rx.await.expect("the winner started");

    // If the loser waited on the winner, this would never return: the winner
    // only finishes after the loser has its answer.
    let loser = tokio::time::timeout(
        Duration::from_secs(30),
        gate.run(&id, async { Ok::<_, Rejected>("duplicate") }),
    )
    .await
    .expect("the loser must not wait for the winner");
    assert!(matches!(loser, Err(Rejected::InFlight)), "{loser:?}");

    finish_tx.send(()).expect("the winner is waiting");
    assert_eq!(winner.await.expect("winner task").expect("winner"), "done");
    assert!(matches!(
        gate.run(&id, async { Ok::<_, Rejected>("late") }).await,
        Err(Rejected::AlreadyDone)
    ));
}

/// The runtime API without the macro: claim, then settle or release by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_by_hand_settle_and_release() {
    let gate = testing::gate().await;
    let id = Identity::new("by_hand").part("x");

    let claim = gate.claim(&id).await.expect("first claim wins");
    assert_eq!(claim.address(), Some(id.address().as_str()));
    assert!(matches!(gate.claim(&id).await, Err(Rejected::InFlight)));
    claim.release().await.expect("release");

    let claim = gate.claim(&id).await.expect("released slot is free");
    claim.settle().await.expect("settle");
    assert!(matches!(gate.claim(&id).await, Err(Rejected::AlreadyDone)));

    let absent = Identity::new("by_hand").part(None::<u32>);
    let claim = gate
        .claim(&absent)
        .await
        .expect("absent identities are not claimed");
    assert!(!claim.is_gated());
    claim.settle().await.expect("settling nothing succeeds");
}
