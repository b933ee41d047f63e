//! Leases with fencing: an expired lease is taken over once with a higher
//! fence, the old holder is fenced off, and `extend` keeps a long body's
//! lease.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_once_with_a_higher_fence_and_the_old_holder_is_fenced_off()
{
    let gate = testing::gate().await;
    let id = Identity::new("leased").part(1);
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(800))
        .claim()
        .await
        .expect("first holder");
    let stale_fence = stale.fence().expect("gated");
    assert!(matches!(
        gate.guard(&id)
            .lease(Duration::from_millis(800))
            .claim()
            .await,
        Err(Rejected::InFlight)
    ));

    // The holder stalls past its lease; eight contenders race for the slot.
    // The one that takes it over holds it until the seven others have been
    // answered (however slow the server), so none can find it released.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let refused = std::sync::atomic::AtomicUsize::new(0);
    let report = race(8, || async {
        let claim = match gate
            .guard(&id)
            .lease(Duration::from_millis(800))
            .claim()
            .await
        {
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
        gate.guard(&id)
            .lease(Duration::from_millis(800))
            .claim()
            .await,
        Err(Rejected::AlreadyDone)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_by_a_fenced_off_holder_changes_nothing() {
    let gate = testing::gate().await;
    let id = Identity::new("leased_release").part(1);
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .claim()
        .await
        .expect("first holder");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .claim()
        .await
        .expect("taken over");
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
    let claim = gate
        .guard(&id)
        .lease(Duration::from_millis(600))
        .claim()
        .await
        .expect("holder");
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        claim
            .extend(Duration::from_millis(300))
            .await
            .expect("renewed");
    }
    // 800 ms after the claim, well past the first lease: still held.
    assert!(matches!(
        gate.guard(&id)
            .lease(Duration::from_millis(600))
            .claim()
            .await,
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
        .guard(&Identity::new("leased_job").part(7_u32))
        .lease(Duration::from_secs(1))
        .claim()
        .await
        .expect("claimed");
    crate::support::holders::vanish(crashed);
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
