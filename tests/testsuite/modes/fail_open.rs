//! `on_unavailable = "run"`: failing open runs the body, unguarded and
//! marked, when the store is down; the default does not.

use super::*;

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
