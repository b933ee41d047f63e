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

/// A stored `Ok` value of `replay`'s tests of every path: `Some(None)` is
/// written `null`, which reads back `None`; `Some(Some(7))` and `None`
/// read back as themselves.
type Nested = Option<Option<u32>>;

#[idempotent(key = "key", action = "stored_value_paths", replay)]
async fn stored_by_the_attribute(
    gate: &Gate,
    key: &str,
    value: Nested,
) -> Result<Nested, JobError> {
    Ok(value)
}

/// Every way a success keeps its value for replay.
#[derive(Debug, Clone, Copy)]
enum Keeps {
    Attribute,
    Guard,
    ClaimSettleValue,
    Transaction,
    TxClaimSettleValue,
    Detached,
    Batch,
}

impl Keeps {
    const ALL: [Keeps; 7] = [
        Keeps::Attribute,
        Keeps::Guard,
        Keeps::ClaimSettleValue,
        Keeps::Transaction,
        Keeps::TxClaimSettleValue,
        Keeps::Detached,
        Keeps::Batch,
    ];

    /// Succeeds with `value` on `key` along this path; what the caller got.
    async fn succeed(self, gate: &Gate, key: &str, value: Nested) -> Result<Nested, JobError> {
        let id = Identity::new("stored_value_paths").part(key);
        let body = async move { Ok::<_, JobError>(value) };
        match self {
            Keeps::Attribute => stored_by_the_attribute(gate, key, value).await,
            Keeps::Guard => gate.guard(&id).replay().run(body).await,
            Keeps::ClaimSettleValue => {
                let claim = gate.guard(&id).claim().await?;
                claim.settle_value(&value).await?;
                Ok(value)
            }
            Keeps::Transaction => {
                let mut tx = gate.pool().begin().await.expect("begin");
                let result = gate
                    .guard(&id)
                    .tx(&mut tx)
                    .replay()
                    .run(async move |_: &mut idem::sqlx::PgConnection| Ok::<_, JobError>(value))
                    .await;
                tx.commit().await.expect("commit");
                result
            }
            Keeps::TxClaimSettleValue => {
                let mut tx = gate.pool().begin().await.expect("begin");
                let claim = gate.guard(&id).tx(&mut tx).claim().await?;
                claim.settle_value(&mut tx, &value).await?;
                tx.commit().await.expect("commit");
                Ok(value)
            }
            Keeps::Detached => {
                let detached = idem::Detached::new();
                let result = gate.guard(&id).replay().run_detached(&detached, body).await;
                detached.shutdown(Duration::from_secs(10)).await;
                result
            }
            Keeps::Batch => {
                let batch: idem::batch::Batch<Nested> = [(value, id.clone())].into_iter().collect();
                let mut results = gate
                    .guard_batch(batch)
                    .replay()
                    .run(async |value| Ok::<_, JobError>(value))
                    .await;
                results.pop().expect("one result")
            }
        }
    }
}

/// What a duplicate of `key` is told, asked for the stored value.
async fn duplicate(gate: &Gate, key: &str) -> Result<Nested, JobError> {
    let id = Identity::new("stored_value_paths").part(key);
    gate.guard(&id)
        .replay()
        .run(async { panic!("a duplicate of a settled call never runs") })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_replays_exactly_the_value_or_refuses_it() {
    let gate = testing::gate().await;
    for keeps in Keeps::ALL {
        for (n, value) in [Some(Some(7)), None, Some(None)].into_iter().enumerate() {
            let key = format!("{keeps:?}_{n}");
            let first = keeps.succeed(&gate, &key, value).await;
            assert_eq!(
                first.ok(),
                Some(value),
                "{keeps:?}: the first caller's value"
            );
            let address = Identity::new("stored_value_paths").part(&key).address();
            assert_eq!(
                rows::row_state(&gate, &address).await.as_deref(),
                Some("success"),
                "{keeps:?} {value:?}: a success is never lost to its value"
            );
            let again = duplicate(&gate, &key).await;
            if value == Some(None) {
                // JSON says `null`, which reads back `None`: not the value
                // the first caller got, so none is kept.
                assert!(
                    matches!(again, Err(JobError::Rejected(Rejected::AlreadyDone))),
                    "{keeps:?}: a duplicate of Some(None) must be refused, not handed \
                     {again:?}"
                );
            } else {
                assert_eq!(again.ok(), Some(value), "{keeps:?}: replayed as it was");
            }
        }
    }
}

#[test]
fn a_reconciler_s_verdict_keeps_only_a_value_that_reads_back() {
    use idem::reconcile::Verdict;
    for refused in [
        Verdict::succeeded_with(&Some(())).map(|_| ()),
        Verdict::succeeded_with(&Some(f64::NAN)).map(|_| ()),
        Verdict::step_succeeded_with("charge", &Some(None::<u8>)).map(|_| ()),
    ] {
        let why = refused.expect_err("JSON writes it as null, which reads back as None");
        assert!(
            why.to_string().contains("reads back as another value"),
            "{why}"
        );
    }
    assert!(Verdict::succeeded_with(&Some(Some(3u8))).is_ok());
}
