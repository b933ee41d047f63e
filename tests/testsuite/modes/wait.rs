//! Wait: a duplicate waits for the holder's outcome instead of being refused,
//! and is refused in flight when the wait runs out.

use super::*;

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

/// Says so on `entered` once its body runs (it holds the claim), then works
/// 200 ms and fails or charges.
#[idempotent(key = "order", wait = "5s")]
async fn flaky_waiting(
    gate: &Gate,
    order: &str,
    fail: bool,
    provider: &Provider,
    entered: &tokio::sync::Notify,
) -> Result<Receipt, JobError> {
    entered.notify_one();
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
    // The duplicate calls once the holder's body runs: a sleep would not
    // say who claims first on a loaded machine.
    let (holds, unused) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
    let (failed, waited) = tokio::join!(
        flaky_waiting(&gate, "ord_5", true, &provider, &holds),
        async {
            holds.notified().await;
            flaky_waiting(&gate, "ord_5", false, &provider, &unused).await
        }
    );
    assert!(matches!(failed, Err(JobError::Failed)), "{failed:?}");
    assert_eq!(
        waited
            .expect("the waiter ran after the holder failed")
            .serial,
        1
    );

    let (first, second) = tokio::join!(
        flaky_waiting(&gate, "ord_6", false, &provider, &holds),
        async {
            holds.notified().await;
            flaky_waiting(&gate, "ord_6", false, &provider, &unused).await
        }
    );
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
