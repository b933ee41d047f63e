//! Fail closed: when the store is down, a body panics, its future is
//! dropped or its outcome cannot be recorded, no retry runs it again.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::sqlx;
use idem::testing::{self, race};
use idem::{Gate, Identity, Rejected, idempotent};
use idem_test_support::{Captured, JobError, Proxy, connections, rows};

#[idempotent(key = "target")]
async fn apply(gate: &Gate, target: &str, runs: &AtomicUsize) -> Result<(), JobError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn unavailable(result: &Result<(), JobError>) -> bool {
    matches!(
        result,
        Err(JobError::Rejected(Rejected::Unavailable { .. }))
    )
}

/// Asserts the claim row of `id` is still pending: the slot stays held.
async fn assert_pending(gate: &Gate, id: &Identity) {
    assert_eq!(
        rows::row_state(gate, &id.address()).await.as_deref(),
        Some("pending")
    );
}

/// Asserts the slot of `id` stays held: its row is pending and a retry is
/// refused as in flight.
async fn assert_held(gate: &Gate, id: &Identity) {
    assert_pending(gate, id).await;
    let retry = gate.run(id, async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(retry, Err(Rejected::InFlight)), "{retry:?}");
}

/// Runs a body that returns `outcome` on a gate behind a proxy, cutting the
/// proxy while the body runs, so the outcome cannot be recorded. Returns
/// what the call returned, the same gate on a healthy pool to look at the
/// row with, and the identity.
async fn cut_while_the_body_runs<T, E>(
    name: &str,
    outcome: Result<T, E>,
) -> (Result<T, E>, Gate, Identity)
where
    E: From<Rejected>,
{
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(2).await).await;
    let id = Identity::new(name).part(1);
    let result = gate
        .run(&id, async {
            proxy.cut().await;
            outcome
        })
        .await;
    let healthy = gate.clone_with_pool(testing::pool_with(2).await);
    (result, healthy, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pool_fails_closed_and_the_body_never_runs() {
    let gate = testing::gate().await;
    gate.pool().close().await;
    let runs = AtomicUsize::new(0);

    let report = race(8, || apply(&gate, "t", &runs)).await;
    let closed = Rejected::Unavailable {
        source: std::sync::Arc::new(idem::sqlx::Error::PoolClosed),
    };
    report.assert_all_refused(&closed);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let id = Identity::new("any").part(1);
    let via_run = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(
        matches!(via_run, Err(Rejected::Unavailable { .. })),
        "{via_run:?}"
    );
    assert!(matches!(
        gate.claim(&id).await,
        Err(Rejected::Unavailable { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_closed_and_the_message_says_what_to_do() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(4).await).await;
    let runs = AtomicUsize::new(0);
    apply(&gate, "before", &runs)
        .await
        .expect("runs while the server answers");

    proxy.cut().await;
    let result = apply(&gate, "after", &runs).await;
    assert!(unavailable(&result), "{result:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body must not run while the store is down"
    );
    let message = result.expect_err("refused").to_string();
    assert!(
        message.contains("did not run") && message.contains("retry"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_future_keeps_the_slot_held() {
    let gate = testing::gate().await;
    let id = Identity::new("cancelled").part(1);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let call = gate.run(&id, async move {
        let _ = started_tx.send(());
        std::future::pending::<()>().await;
        Ok::<_, Rejected>(())
    });
    tokio::select! {
        _ = call => unreachable!("the body never finishes"),
        _ = started_rx => {} // the body runs: the claim is won. Drop the call.
    }
    assert_held(&gate, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_body_keeps_the_slot_held() {
    let gate = testing::gate().await;
    let id = Identity::new("panics").part(1);
    let task = tokio::spawn({
        let (gate, id) = (gate.clone(), id.clone());
        async move {
            gate.run(&id, async {
                if id.part_count() == 1 {
                    panic!("the body blew up");
                }
                Ok::<_, Rejected>(())
            })
            .await
        }
    });
    assert!(task.await.expect_err("the task panicked").is_panic());
    assert_held(&gate, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_settle_keeps_the_slot_held_and_returns_the_value() {
    // The store disappears while the body runs: the side effect happened,
    // but its success cannot be recorded.
    let (result, healthy, id) =
        cut_while_the_body_runs("settle_fails", Ok::<_, Rejected>("receipt")).await;
    assert_eq!(result.expect("the body's value is not lost"), "receipt");

    // Seen from a healthy connection: still pending, and retries are refused.
    assert_held(&healthy, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_keeps_the_slot_held() {
    let (result, healthy, id) =
        cut_while_the_body_runs("release_fails", Err::<(), _>(JobError::Failed)).await;
    assert!(matches!(result, Err(JobError::Failed)), "{result:?}");

    assert_pending(&healthy, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_by_hand_reports_an_unreachable_store() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(2).await).await;
    let claim = gate
        .claim(&Identity::new("by_hand").part(1))
        .await
        .expect("claim");
    proxy.cut().await;
    let settled = claim.settle().await;
    assert!(
        matches!(settled, Err(Rejected::Unavailable { .. })),
        "{settled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_removed_under_the_holder_is_reported_lost() {
    let gate = testing::gate().await;
    let id = Identity::new("lost").part(1);
    let claim = gate.claim(&id).await.expect("claim");
    rows::delete_row(&gate, &id.address()).await; // as an operator would
    let settled = claim.settle().await;
    assert!(
        matches!(settled, Err(Rejected::ClaimLost { .. })),
        "{settled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_collision_is_refused_never_merged() {
    let gate = testing::gate().await;
    let id = Identity::new("collide").part(1);
    // Plant a row at this address whose identity is something else, as a
    // sha1 prefix collision would.
    let colliding = Identity::new("other");
    rows::plant_row(&gate, &id.address(), "success", colliding.canonical()).await;
    let result = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(
        matches!(result, Err(Rejected::Collision { .. })),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_the_account_name_is_refused_with_a_reason() {
    let gate = testing::gate().await.account("bad\0name");
    let result = gate
        .run(&Identity::new("x").part(1), async { Ok::<_, Rejected>(()) })
        .await;
    let Err(rejected @ Rejected::InvalidScope { .. }) = result else {
        panic!("expected InvalidScope, got {result:?}");
    };
    assert!(rejected.to_string().contains("NUL"), "{rejected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_any_content_work_end_to_end() {
    let gate = testing::gate().await;
    let runs = AtomicUsize::new(0);
    let hostile = [
        "\0",
        "a\0b",
        "'; DROP TABLE idem_records; --",
        "🦀\u{202e}\r\n\t",
        "",
        &"x".repeat(1 << 20),
    ];
    for key in hostile {
        apply(&gate, key, &runs).await.expect("any key runs once");
        let retry = apply(&gate, key, &runs).await;
        assert!(
            matches!(retry, Err(JobError::Rejected(Rejected::AlreadyDone))),
            "{retry:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), hostile.len());
    let raw = Identity::new("bytes").part(&[0u8, 0xff, 0, 0x80][..]);
    gate.run(&raw, async { Ok::<_, Rejected>(()) })
        .await
        .expect("raw bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_a_tracing_event() {
    let captured = Captured::global();
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(2).await).await;
    let id = Identity::new("traced").part(1);
    gate.run(&id, async { Ok::<_, Rejected>(()) })
        .await
        .expect("won and settled");
    let _ = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    let failing = Identity::new("traced").part(2);
    let _ = gate
        .run(&failing, async { Err::<(), _>(JobError::Failed) })
        .await;
    let absent = Identity::new("traced").part(None::<i32>);
    let _ = gate.run(&absent, async { Ok::<_, Rejected>(()) }).await;
    proxy.cut().await;
    let _ = gate
        .run(&Identity::new("traced").part(3), async {
            Ok::<_, Rejected>(())
        })
        .await;

    let log = captured.lines_with(gate.account_name());
    for expected in [
        "claim won",
        "settled",
        "claim refused",
        "already_done",
        "released",
        "ungated",
        "store unavailable",
    ] {
        assert!(log.contains(expected), "no `{expected}` event in:\n{log}");
    }
}

/// A gate like `self`, in the same account and namespace, on another pool.
trait CloneWithPool {
    fn clone_with_pool(&self, pool: sqlx::PgPool) -> Gate;
}

impl CloneWithPool for Gate {
    fn clone_with_pool(&self, pool: sqlx::PgPool) -> Gate {
        let rt = tokio::runtime::Handle::current();
        let gate = tokio::task::block_in_place(|| rt.block_on(Gate::connect(pool)))
            .expect("connect a healthy gate");
        let gate = gate.account(self.account_name());
        match self.namespace_name() {
            Some(namespace) => gate.namespace(namespace),
            None => gate,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_recovers_after_its_connections_are_killed() {
    let name = testing::unique_name("killed");
    let gate = testing::gate_on(connections::named_pool(&name, 4).await).await;
    let runs = AtomicUsize::new(0);
    race(4, || apply(&gate, "warm", &runs))
        .await
        .assert_exactly_once();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_all(&testing::pool_with(1).await)
    .await
    .expect("terminate the gate's backends");
    assert!(!killed.is_empty(), "the gate's connections were not found");
    // Dead pooled connections are noticed and replaced; nothing runs twice.
    apply(&gate, "after-kill", &runs)
        .await
        .expect("the pool recovers");
    assert!(matches!(
        apply(&gate, "warm", &runs).await,
        Err(JobError::Rejected(Rejected::AlreadyDone))
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
