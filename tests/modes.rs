//! The opt-in modes, each under concurrency against a real PostgreSQL:
//! replay, fingerprint, lease with fencing, in-transaction, wait, and
//! failing open.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::sqlx::{self, Postgres, Transaction};
use idem::testing::{self, race};
use idem::{Gate, Identity, Mode, Rejected, idempotent};
use idem_test_support::{Captured, JobError, rows};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    amount_cents: i64,
    serial: usize,
}

/// Counts the bodies that ran, and numbers each receipt.
#[derive(Default)]
struct Provider(AtomicUsize);

impl Provider {
    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    fn charge(&self, order: &str, amount_cents: i64) -> Receipt {
        let serial = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Receipt {
            order: order.to_owned(),
            amount_cents,
            serial,
        }
    }
}

fn rejected(result: &Result<Receipt, JobError>) -> Option<&Rejected> {
    match result {
        Err(JobError::Rejected(rejected)) => Some(rejected),
        _ => None,
    }
}

// ---------------------------------------------------------------- replay

/// How many invocations of a race have returned: the winner's body waits
/// for the others, so that each of them meets the claim in flight however
/// slowly its own claim arrives (on Citus, under load, a fixed pause was
/// not always long enough).
#[derive(Default)]
struct Returned(AtomicUsize);

impl Returned {
    /// Waits until `others` invocations have returned, at most 10 s.
    async fn wait_for(&self, others: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.0.load(Ordering::SeqCst) < others && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[idempotent(key = "order", replay)]
async fn pay_replayed(
    gate: &Gate,
    order: &str,
    amount_cents: i64,
    provider: &Provider,
    returned: &Returned,
    others: usize,
) -> Result<Receipt, JobError> {
    returned.wait_for(others).await;
    Ok(provider.charge(order, amount_cents))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_returns_the_stored_value_to_later_duplicates_and_refuses_in_flight_ones() {
    let gate = testing::gate().await;
    let provider = Provider::default();
    let returned = Returned::default();
    let report = race(12, || async {
        let result = pay_replayed(&gate, "ord_1", 500, &provider, &returned, 11).await;
        returned.0.fetch_add(1, Ordering::SeqCst);
        result
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(
        report.refused, 11,
        "in-flight duplicates are refused, not replayed: {report}"
    );
    assert!(
        report.refusals().all(|r| matches!(r, Rejected::InFlight)),
        "{report}"
    );
    let original = report
        .invocations
        .iter()
        .find(|i| i.won())
        .and_then(|i| i.outcome.as_ref().ok())
        .and_then(|o| o.as_ref().ok())
        .cloned()
        .expect("the winner's receipt");

    // Settled: every duplicate, even 12 at once, gets the same receipt back.
    let report = race(12, || {
        pay_replayed(&gate, "ord_1", 500, &provider, &returned, 0)
    })
    .await;
    assert_eq!(report.replayed, 12, "{report}");
    for invocation in &report.invocations {
        assert_eq!(
            invocation
                .outcome
                .as_ref()
                .ok()
                .and_then(|o| o.as_ref().ok()),
            Some(&original)
        );
    }
    assert_eq!(provider.runs(), 1);
}

/// A map with non-string keys: serde_json cannot write it.
#[derive(Debug, Serialize, Deserialize)]
struct Unwritable(BTreeMap<(u8, u8), u8>);

#[idempotent(key = "order", replay)]
async fn unwritable(gate: &Gate, order: &str, provider: &Provider) -> Result<Unwritable, JobError> {
    provider.charge(order, 0);
    Ok(Unwritable(BTreeMap::from([((1, 2), 3)])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_fails_to_serialize_never_loses_the_success() {
    let gate = testing::gate().await;
    let provider = Provider::default();
    let value = unwritable(&gate, "ord_2", &provider)
        .await
        .expect("the success is returned");
    assert_eq!(value.0.len(), 1);
    let address = Identity::new("unwritable").part("ord_2").address();
    assert_eq!(
        rows::row_state(&gate, &address).await.as_deref(),
        Some("success")
    );
    let duplicate = unwritable(&gate, "ord_2", &provider).await;
    assert!(
        matches!(duplicate, Err(JobError::Rejected(Rejected::AlreadyDone))),
        "{duplicate:?}"
    );
    assert_eq!(provider.runs(), 1);
}

// ----------------------------------------------------------- fingerprint

#[idempotent(key = "order", fingerprint = "amount_cents, currency", replay)]
async fn pay_fingerprinted(
    gate: &Gate,
    order: &str,
    amount_cents: i64,
    currency: &str,
    provider: &Provider,
) -> Result<Receipt, JobError> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(provider.charge(order, amount_cents))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_payload_is_refused_and_never_sees_its_value() {
    let gate = testing::gate().await;
    let provider = Provider::default();
    // Half the racers send one payload, half another, under one key.
    let next = AtomicUsize::new(0);
    let report = race(12, || {
        let amount = if next.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
            500
        } else {
            900
        };
        pay_fingerprinted(&gate, "ord_3", amount, "EUR", &provider)
    })
    .await;
    report.assert_exactly_once();
    let reused = report
        .refusals()
        .filter(|r| matches!(r, Rejected::KeyReused))
        .count();
    assert_eq!(
        reused, 6,
        "the other payload's racers are told the key was reused: {report}"
    );

    let winner = report
        .invocations
        .iter()
        .find_map(|i| i.outcome.as_ref().ok().and_then(|o| o.as_ref().ok()))
        .cloned()
        .expect("a winner");
    let other = if winner.amount_cents == 500 { 900 } else { 500 };
    // After the settle: the same payload replays, another is refused, with
    // another currency too.
    let same = pay_fingerprinted(&gate, "ord_3", winner.amount_cents, "EUR", &provider).await;
    assert_eq!(same.expect("replayed"), winner);
    for (amount, currency) in [(other, "EUR"), (winner.amount_cents, "USD")] {
        let reused = pay_fingerprinted(&gate, "ord_3", amount, currency, &provider).await;
        assert!(
            matches!(rejected(&reused), Some(Rejected::KeyReused)),
            "{reused:?}"
        );
    }
    assert_eq!(provider.runs(), 1);
}

// ----------------------------------------------------------------- lease

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_once_with_a_higher_fence_and_the_old_holder_is_fenced_off()
{
    let gate = testing::gate().await;
    let id = Identity::new("leased").part(1);
    let mode = Mode::new().lease(Duration::from_millis(800));
    let stale = gate.claim_with(&id, &mode).await.expect("first holder");
    let stale_fence = stale.fence().expect("gated");
    assert!(matches!(
        gate.claim_with(&id, &mode).await,
        Err(Rejected::InFlight)
    ));

    // The holder stalls past its lease; eight contenders race for the slot.
    // The one that takes it over holds it until the seven others have been
    // answered (however slow the server), so none can find it released.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let refused = std::sync::atomic::AtomicUsize::new(0);
    let report = race(8, || async {
        let claim = match gate.claim_with(&id, &mode).await {
            Ok(claim) => claim,
            Err(rejected) => {
                refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                return Err(rejected);
            }
        };
        let fence = claim.fence();
        for _ in 0..500 {
            if refused.load(std::sync::atomic::Ordering::SeqCst) >= 7 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        claim.release().await?;
        Ok::<_, Rejected>(fence)
    })
    .await;
    assert_eq!(
        report.claimed, 1,
        "exactly one takes the expired claim over: {report}"
    );
    let new_fence = report
        .invocations
        .iter()
        .find_map(|i| {
            i.outcome
                .as_ref()
                .ok()
                .and_then(|o| o.as_ref().ok())
                .copied()
                .flatten()
        })
        .expect("the new holder's fence");
    assert!(
        new_fence > stale_fence,
        "{new_fence} must outrank {stale_fence}"
    );

    // The old holder's late settle is told it lost its lease; its success
    // happened, so the slot keeps it (the new holder released): no retry
    // runs the action a third time.
    let late = stale.settle().await;
    assert!(matches!(late, Err(Rejected::LeaseLost { .. })), "{late:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
    assert!(matches!(
        gate.claim_with(&id, &mode).await,
        Err(Rejected::AlreadyDone)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_by_a_fenced_off_holder_changes_nothing() {
    let gate = testing::gate().await;
    let id = Identity::new("leased_release").part(1);
    let mode = Mode::new().lease(Duration::from_millis(200));
    let stale = gate.claim_with(&id, &mode).await.expect("first holder");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = gate.claim_with(&id, &mode).await.expect("taken over");
    let late = stale.release().await;
    assert!(matches!(late, Err(Rejected::LeaseLost { .. })), "{late:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("pending")
    );
    current.settle().await.expect("the new holder settles");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_a_long_body_s_lease() {
    let gate = testing::gate().await;
    let id = Identity::new("extended").part(1);
    let mode = Mode::new().lease(Duration::from_millis(600));
    let claim = gate.claim_with(&id, &mode).await.expect("holder");
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        claim
            .extend(Duration::from_millis(300))
            .await
            .expect("renewed");
    }
    // 800 ms after the claim, well past the first lease: still held.
    assert!(matches!(
        gate.claim_with(&id, &mode).await,
        Err(Rejected::InFlight)
    ));
    claim.settle().await.expect("settled");
}

#[idempotent(key = "job", lease = "1s")]
async fn leased_job(gate: &Gate, job: u32, provider: &Provider) -> Result<Receipt, JobError> {
    Ok(provider.charge("job", i64::from(job)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_option_takes_over_a_crashed_holder_s_claim() {
    let gate = testing::gate().await;
    let provider = Provider::default();
    // A holder that crashed: claimed with the same lease, never resolved.
    let crashed = gate
        .claim_with(
            &Identity::new("leased_job").part(7_u32),
            &Mode::new().lease(Duration::from_secs(1)),
        )
        .await
        .expect("claimed");
    std::mem::forget(crashed);
    let refused = leased_job(&gate, 7, &provider).await;
    assert!(
        matches!(rejected(&refused), Some(Rejected::InFlight)),
        "{refused:?}"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    race(8, || leased_job(&gate, 7, &provider))
        .await
        .assert_exactly_once();
    assert_eq!(provider.runs(), 1);
}

// ------------------------------------------------------------------ wait

#[idempotent(key = "order", replay, wait = "5s")]
async fn pay_waiting(gate: &Gate, order: &str, provider: &Provider) -> Result<Receipt, JobError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(provider.charge(order, 100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicates_get_the_outcome_instead_of_a_refusal() {
    let gate = testing::gate().await;
    let provider = Provider::default();
    let report = race(8, || pay_waiting(&gate, "ord_4", &provider)).await;
    report.assert_exactly_once();
    assert_eq!((report.wins, report.replayed), (1, 7), "{report}");
    let receipts: Vec<_> = report
        .invocations
        .iter()
        .filter_map(|i| i.outcome.as_ref().ok().and_then(|o| o.as_ref().ok()))
        .collect();
    assert!(receipts.windows(2).all(|w| w[0] == w[1]), "{receipts:?}");
    assert_eq!(provider.runs(), 1);
}

#[idempotent(key = "order", wait = "5s")]
async fn flaky_waiting(
    gate: &Gate,
    order: &str,
    fail: bool,
    provider: &Provider,
) -> Result<Receipt, JobError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    if fail {
        return Err(JobError::Failed);
    }
    Ok(provider.charge(order, 1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_runs_when_the_holder_fails_and_is_told_done_when_it_succeeds() {
    let gate = testing::gate().await;
    let provider = Provider::default();
    let (failed, waited) = tokio::join!(flaky_waiting(&gate, "ord_5", true, &provider), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        flaky_waiting(&gate, "ord_5", false, &provider).await
    });
    assert!(matches!(failed, Err(JobError::Failed)), "{failed:?}");
    assert_eq!(
        waited
            .expect("the waiter ran after the holder failed")
            .serial,
        1
    );

    let (first, second) = tokio::join!(flaky_waiting(&gate, "ord_6", false, &provider), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        flaky_waiting(&gate, "ord_6", false, &provider).await
    });
    first.expect("the holder succeeds");
    assert!(
        matches!(rejected(&second), Some(Rejected::AlreadyDone)),
        "{second:?}"
    );
    assert_eq!(provider.runs(), 2);
}

#[idempotent(key = "order", wait = "300ms")]
async fn short_wait(gate: &Gate, order: &str) -> Result<Receipt, JobError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(Receipt {
        order: order.into(),
        amount_cents: 0,
        serial: 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_is_refused_as_in_flight() {
    let gate = testing::gate().await;
    let holder = tokio::spawn({
        let gate = gate.clone();
        async move { short_wait(&gate, "ord_7").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = short_wait(&gate, "ord_7").await;
    assert!(
        matches!(rejected(&waited), Some(Rejected::InFlight)),
        "{waited:?}"
    );
    holder.await.expect("holder task").expect("holder");
}

// --------------------------------------------------------- on_unavailable

#[idempotent(key = "page", on_unavailable = "run")]
async fn warm_cache(gate: &Gate, page: &str, provider: &Provider) -> Result<Receipt, JobError> {
    Ok(provider.charge(page, 0))
}

#[idempotent(key = "page")]
async fn strict(gate: &Gate, page: &str, provider: &Provider) -> Result<Receipt, JobError> {
    Ok(provider.charge(page, 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_runs_the_body_when_the_store_is_down_and_the_default_does_not() {
    let captured = Captured::global();
    let gate = testing::gate().await;
    let provider = Provider::default();
    warm_cache(&gate, "/home", &provider)
        .await
        .expect("gated while the store is up");
    assert!(matches!(
        rejected(&warm_cache(&gate, "/home", &provider).await),
        Some(Rejected::AlreadyDone)
    ));
    gate.pool().close().await;
    let report = race(4, || warm_cache(&gate, "/home", &provider)).await;
    report.assert_all_succeeded();
    assert_eq!(
        report.ungated, 4,
        "each racer runs unguarded while the store is down: {report}"
    );
    let strict = strict(&gate, "/home", &provider).await;
    assert!(
        matches!(rejected(&strict), Some(Rejected::Unavailable { .. })),
        "{strict:?}"
    );
    assert_eq!(provider.runs(), 5);
    let log = captured.lines_with(gate.account_name());
    assert!(
        log.contains("failing open"),
        "every fail-open run is marked:\n{log}"
    );
}

// ----------------------------------------------------------- transaction

async fn charges_table(gate: &Gate) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_charges (account text NOT NULL, order_id bigint NOT NULL)",
    )
    .execute(gate.pool())
    .await
    .expect("create the charges table");
}

async fn charges(gate: &Gate, order_id: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM idem_test_charges WHERE account = $1 AND order_id = $2",
    )
    .bind(gate.account_name())
    .bind(order_id)
    .fetch_one(gate.pool())
    .await
    .expect("count charges")
}

/// Writes the charge in the caller's transaction: the charge and the claim
/// commit together or not at all.
#[idempotent(key = "order_id", tx = tx, replay)]
async fn charge_in(
    gate: &Gate,
    tx: &mut Transaction<'_, Postgres>,
    order_id: i64,
) -> Result<i64, JobError> {
    sqlx::query("INSERT INTO idem_test_charges (account, order_id) VALUES ($1, $2)")
        .bind(gate.account_name())
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(order_id * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_transaction_the_claim_commits_or_rolls_back_with_the_body_s_writes() {
    let gate = testing::gate().await;
    charges_table(&gate).await;

    // Rolled back: no charge, and no claim either, so a retry runs.
    let mut tx = gate.pool().begin().await.expect("begin");
    assert_eq!(charge_in(&gate, &mut tx, 1).await.expect("runs"), 10);
    tx.rollback().await.expect("rollback");
    assert_eq!(charges(&gate, 1).await, 0);
    assert_eq!(
        rows::row_state(&gate, &Identity::new("charge_in").part(1_i64).address()).await,
        None
    );

    // Committed: one charge, settled, and the duplicate is replayed.
    let mut tx = gate.pool().begin().await.expect("begin");
    assert_eq!(charge_in(&gate, &mut tx, 1).await.expect("runs"), 10);
    tx.commit().await.expect("commit");
    let mut tx = gate.pool().begin().await.expect("begin");
    assert_eq!(charge_in(&gate, &mut tx, 1).await.expect("replayed"), 10);
    tx.commit().await.expect("commit");
    assert_eq!(charges(&gate, 1).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_the_first_transaction_then_is_refused_or_runs() {
    let gate = testing::gate().await;
    charges_table(&gate).await;
    for commit in [true, false] {
        let order_id = if commit { 2 } else { 3 };
        let mut first = gate.pool().begin().await.expect("begin");
        charge_in(&gate, &mut first, order_id)
            .await
            .expect("first claims");

        let duplicate = tokio::spawn({
            let gate = gate.clone();
            async move {
                let mut tx = gate.pool().begin().await.expect("begin");
                let result = charge_in(&gate, &mut tx, order_id).await;
                tx.commit().await.expect("commit");
                result.map_err(|e| e.to_string())
            }
        });
        // The duplicate blocks on the first transaction's uncommitted claim.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !duplicate.is_finished(),
            "the duplicate must wait for the first transaction"
        );
        if commit {
            first.commit().await.expect("commit");
        } else {
            first.rollback().await.expect("rollback");
        }
        let result = duplicate.await.expect("duplicate task");
        // Committed: the duplicate gets the replay; rolled back: it runs.
        assert_eq!(result.expect("replayed or ran"), order_id * 10);
        assert_eq!(charges(&gate, order_id).await, 1, "commit = {commit}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_racing_one_key_charge_once() {
    let gate = testing::gate().await;
    charges_table(&gate).await;
    let report = race(8, || async {
        let mut tx = gate.pool().begin().await?;
        let result = charge_in(&gate, &mut tx, 4).await;
        tx.commit().await?;
        result
    })
    .await;
    assert_eq!(report.claimed, 1, "{report}");
    assert_eq!(report.wins + report.replayed, 8, "{report}");
    assert_eq!(charges(&gate, 4).await, 1);
}
