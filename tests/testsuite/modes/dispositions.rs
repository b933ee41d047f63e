//! What an `Err` means for its slot, as its author says: released (a retry
//! runs), kept as a definite failure, or held in doubt; and a lease that
//! runs out under `on_expiry = "in_doubt"`. Every duplicate is fired at
//! the same instant, against a real PostgreSQL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::testing::{self, RaceReport, race};
use idem::{Disposition, Gate, Identity, Outcome, Rejected, idempotent};
use idem_test_support::{ChargeError, rows};

/// Counts the bodies that ran, and answers as told.
struct Provider {
    runs: AtomicUsize,
    answer: fn() -> Result<(), ChargeError>,
}

impl Provider {
    fn new(answer: fn() -> Result<(), ChargeError>) -> Provider {
        Provider {
            runs: AtomicUsize::new(0),
            answer,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn charge(&self) -> Result<(), ChargeError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        (self.answer)()
    }
}

#[idempotent(key = "order", disposition = ChargeError::disposition)]
async fn charge(gate: &Gate, order: &str, provider: &Provider) -> Result<(), ChargeError> {
    provider.charge().await
}

fn address(order: &str) -> String {
    Identity::new("charge").part(order).address()
}

/// After a first charge of `order` failed: checks its slot is held in
/// `state`, fires 16 duplicates at once, checks none ran the body again,
/// and returns how they ended.
async fn race_the_held_slot(
    gate: &Gate,
    order: &str,
    provider: &Provider,
    state: &str,
) -> RaceReport<(), ChargeError> {
    assert_eq!(
        rows::row_state(gate, &address(order)).await.as_deref(),
        Some(state)
    );
    let report = race(16, || charge(gate, order, provider)).await;
    assert_eq!(provider.runs(), 1, "a slot {state} ran again: {report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_failure_is_never_run_again_and_duplicates_are_told_it_failed() {
    let gate = testing::gate().await;
    let provider = Provider::new(|| Err(ChargeError::Declined));
    let first = charge(&gate, "ord_1", &provider).await;
    assert!(matches!(first, Err(ChargeError::Declined)), "{first:?}");
    race_the_held_slot(&gate, "ord_1", &provider, "failed")
        .await
        .assert_all_refused(&Rejected::AlreadyFailed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outcome_in_doubt_holds_the_slot_and_no_duplicate_runs() {
    let gate = testing::gate().await;
    let provider = Provider::new(|| Err(ChargeError::Timeout));
    let first = charge(&gate, "ord_2", &provider).await;
    assert!(matches!(first, Err(ChargeError::Timeout)), "{first:?}");
    let report = race_the_held_slot(&gate, "ord_2", &provider, "in_doubt").await;
    report.assert_all_refused(&Rejected::InDoubt);
    assert!(report.refusals().all(Rejected::is_retryable), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_that_changed_nothing_is_released_and_retried_once() {
    let gate = testing::gate().await;
    let provider = Provider::new(|| Err(ChargeError::Invalid));
    assert!(charge(&gate, "ord_3", &provider).await.is_err());
    assert_eq!(rows::row_state(&gate, &address("ord_3")).await, None);
    // Retries run again (each fails and releases): never refused as done.
    let report = race(8, || charge(&gate, "ord_3", &provider)).await;
    assert!(report.claimed() >= 1, "{report}");
    assert!(
        report.invocations.iter().all(|invocation| !matches!(
            invocation.refusal(),
            Some(Rejected::AlreadyFailed | Rejected::InDoubt)
        )),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_runtime_api_records_failures_as_the_error_type_says() {
    let gate = testing::gate().await;
    let provider = Provider::new(|| Err(ChargeError::Timeout));
    let id = Identity::new("charge_by_hand").part("ord_4");
    // The error type's own classifier.
    let classify = ChargeError::disposition;
    let first = gate
        .guard(&id)
        .disposition(classify)
        .run(provider.charge())
        .await;
    assert!(matches!(first, Err(ChargeError::Timeout)), "{first:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("in_doubt")
    );
    let again = gate
        .guard(&id)
        .disposition(classify)
        .run(provider.charge())
        .await;
    assert!(
        matches!(again, Err(ChargeError::Rejected(Rejected::InDoubt))),
        "{again:?}"
    );
    assert_eq!(provider.runs(), 1);

    // By hand: a claim disposed of as kept.
    let kept = Identity::new("charge_by_hand").part("ord_5");
    let claim = gate.claim(&kept).await.expect("won");
    claim.dispose(Disposition::Keep).await.expect("kept");
    assert!(matches!(
        gate.claim(&kept).await,
        Err(Rejected::AlreadyFailed)
    ));
}

/// Claims `id` with a 200 ms lease under `on_expiry`, lets the holder vanish
/// and the lease run out, then fires 16 duplicates under `retries` at the
/// same instant: none may run, each is refused `InDoubt`, and the row is
/// left `in_doubt`. `why` names the case in the failure.
async fn an_abandoned_claim_is_held_in_doubt(
    gate: &Gate,
    id: &Identity,
    on_expiry: idem::OnExpiry,
    retries: idem::OnExpiry,
    why: &str,
) {
    let lease = Duration::from_millis(200);
    let abandoned = gate
        .guard(id)
        .lease(lease)
        .on_expiry(on_expiry)
        .claim()
        .await
        .expect("won");
    crate::support::holders::vanish(abandoned);
    tokio::time::sleep(Duration::from_millis(400)).await;

    let runs = AtomicUsize::new(0);
    let report = race(16, || {
        gate.guard(id).lease(lease).on_expiry(retries).run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "{why}: {report}");
    for invocation in &report.invocations {
        assert!(
            matches!(invocation.refusal(), Some(Rejected::InDoubt)),
            "{report}"
        );
    }
    assert_eq!(
        rows::row_state(gate, &id.address()).await.as_deref(),
        Some("in_doubt")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_lease_under_on_expiry_in_doubt_is_held_never_run_again() {
    let gate = testing::gate().await;
    let id = Identity::new("charge_leased").part("ord_6");
    an_abandoned_claim_is_held_in_doubt(
        &gate,
        &id,
        idem::OnExpiry::InDoubt,
        idem::OnExpiry::InDoubt,
        "an expired claim was run again",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_lease_is_still_taken_over_by_default() {
    let gate = testing::gate().await;
    let id = Identity::new("charge_leased").part("ord_7");
    let abandoned = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .claim()
        .await
        .expect("won");
    crate::support::holders::vanish(abandoned);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ran = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .run(async { Ok::<_, Rejected>("taken over") })
        .await;
    assert_eq!(ran.expect("taken over"), "taken over");
}

/// What a claim's lease turns into is the claim's own policy, recorded with
/// it: a deploy whose new code says `take_over` where the old said
/// `in_doubt` (or a caller that forgot the option) must not run again an
/// action whose holder may have done it. Either side saying `in_doubt`
/// holds the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_made_in_doubt_on_expiry_is_held_when_a_take_over_retry_finds_it_run_out() {
    let gate = testing::gate().await;
    let id = Identity::new("charge_leased").part("ord_mixed_policies");
    an_abandoned_claim_is_held_in_doubt(
        &gate,
        &id,
        idem::OnExpiry::InDoubt,
        idem::OnExpiry::TakeOver,
        "a take_over retry ran again a claim made with on_expiry = in_doubt",
    )
    .await;
    // A retry with no lease at all is refused the same way.
    let unleased = gate.guard(&id).run(async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(unleased, Err(Rejected::InDoubt)), "{unleased:?}");
}

/// The converse: a claim made with `take_over` is held in doubt by a retry
/// that says `in_doubt` (the retry's caution is enough), and one taken over
/// by a `take_over` retry records the taker's policy, not the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn either_the_claim_or_the_retry_saying_in_doubt_holds_the_slot() {
    let gate = testing::gate().await;
    let lease = Duration::from_millis(150);
    let cautious = Identity::new("charge_leased").part("ord_cautious_retry");
    crate::support::holders::vanish(
        gate.guard(&cautious)
            .lease(lease)
            .claim()
            .await
            .expect("won"),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = gate
        .guard(&cautious)
        .lease(lease)
        .on_expiry(idem::OnExpiry::InDoubt)
        .claim()
        .await;
    assert!(matches!(held, Err(Rejected::InDoubt)), "{held:?}");

    // Taken over by a take_over retry, then abandoned again: the next
    // take_over retry takes it over once more (nothing says in_doubt).
    let relay = Identity::new("charge_leased").part("ord_relay");
    crate::support::holders::vanish(gate.guard(&relay).lease(lease).claim().await.expect("won"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = gate
        .guard(&relay)
        .lease(lease)
        .claim()
        .await
        .expect("taken over");
    crate::support::holders::vanish(taken);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = gate
        .guard(&relay)
        .lease(lease)
        .run(async { Ok::<_, Rejected>("ran") })
        .await;
    assert_eq!(again.expect("taken over again"), "ran");
}

#[idempotent(key = "order", tx = tx, disposition = ChargeError::disposition)]
async fn charge_in(
    gate: &Gate,
    tx: &mut idem::sqlx::Transaction<'_, idem::sqlx::Postgres>,
    order: &str,
    provider: &Provider,
) -> Result<(), ChargeError> {
    let _ = &mut **tx;
    provider.charge().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_callers_transaction_a_kept_failure_commits_with_it() {
    let gate = testing::gate().await;
    let provider = Provider::new(|| Err(ChargeError::Declined));
    let mut tx = gate.pool().begin().await.expect("a transaction");
    let first = charge_in(&gate, &mut tx, "ord_8", &provider).await;
    assert!(matches!(first, Err(ChargeError::Declined)), "{first:?}");
    tx.commit().await.expect("commit");
    let address = Identity::new("charge_in").part("ord_8").address();
    assert_eq!(
        rows::row_state(&gate, &address).await.as_deref(),
        Some("failed")
    );
    let mut tx = gate.pool().begin().await.expect("a transaction");
    let again = charge_in(&gate, &mut tx, "ord_8", &provider).await;
    assert!(
        matches!(again, Err(ChargeError::Rejected(Rejected::AlreadyFailed))),
        "{again:?}"
    );
    assert_eq!(provider.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_settles_a_claim_its_expiry_turned_in_doubt() {
    let gate = testing::gate().await;
    let id = Identity::new("charge_leased").part("ord_9");
    let slow = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .on_expiry(idem::OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A duplicate finds the lease run out: the claim turns in doubt.
    assert!(matches!(
        gate.guard(&id)
            .lease(Duration::from_millis(150))
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await,
        Err(Rejected::InDoubt)
    ));
    // The slow holder finishes after all: its success is the outcome nobody
    // knew, and is kept. Nobody took the claim over (in doubt, nobody ran
    // it), so the recorded outcome is this holder's own: it is told `Ok`,
    // and every duplicate hears the same success.
    let late = slow.settle().await;
    assert!(late.is_ok(), "{late:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
    assert!(matches!(
        gate.guard(&id)
            .lease(Duration::from_millis(150))
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await,
        Err(Rejected::AlreadyDone)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_over_its_own_hold_whose_reply_was_lost_is_still_its_own() {
    // The settle over the hold its own expiry made commits, and its reply is
    // lost: the repeat finds the row settled under its fence and must read
    // it as its own success, not as somebody else's (`NotRecorded`).
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(2).await).await;
    let id = Identity::new("charge_leased_lost").part("ord_9");
    let slow = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .on_expiry(idem::OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        gate.guard(&id)
            .lease(Duration::from_millis(150))
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await,
        Err(Rejected::InDoubt)
    ));
    assert!(proxy.lose_next_reply_to("state_reason = 'lease_expired' AND fence"));
    let late = slow.settle().await;
    assert_eq!(
        proxy.take_lost_fragment_replies().len(),
        1,
        "the settle over the hold lost its reply"
    );
    assert!(late.is_ok(), "the holder's own success, repeated: {late:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
    assert!(matches!(
        gate.guard(&id)
            .lease(Duration::from_millis(150))
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await,
        Err(Rejected::AlreadyDone)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_leaves_a_failure_resolved_meanwhile_as_it_is() {
    use idem::operations::{self, Resolved, Slot};

    let gate = testing::gate().await;
    let id = Identity::new("charge_resolved").part("ord_10");
    let slow = gate.claim(&id).await.expect("won");
    let address = id.address();
    let slot = Slot::new(gate.account_name(), None, &address);
    let resolved = operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Keep))
        .await
        .expect("resolved");
    assert!(matches!(resolved, Resolved::Changed { .. }), "{resolved:?}");
    // The resolution stands; the holder is told its success was not
    // recorded, and what the slot records instead.
    let late = slow.settle().await;
    assert!(
        matches!(&late, Err(Rejected::NotRecorded { recorded, .. }) if recorded.contains("failed")),
        "{late:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &address).await.as_deref(),
        Some("failed")
    );
}
