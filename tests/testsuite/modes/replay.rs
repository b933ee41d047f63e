//! Replay: a duplicate of a settled call gets the stored value, and a value that
//! cannot be stored never loses the success.

use super::*;

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
