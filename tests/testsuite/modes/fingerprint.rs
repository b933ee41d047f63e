//! Fingerprint: a key reused with another payload is refused and never sees
//! the first payload's value.

use super::*;

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
