//! The tower layer's `.wait(d)` rides on the same attachment: duplicates
//! of a request this process is serving await its stored response with no
//! statement, and past their wait are still answered 409 with
//! `Retry-After`.

use std::time::Duration;

use axum::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::Full;
use idem::http::IdempotencyLayer;
use idem::testing;
use idem_test_support::fault_proxy::Proxy;

use super::{WAITERS, looked};
use crate::support::http::{Effects, charges, send, serve};

fn charge(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/charges")
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicates_get_the_stored_response_with_no_statement() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(WAITERS as u32 + 2).await).await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_secs(20));
    let (address, _server) = serve(charges(&effects, Duration::from_secs(2)).layer(layer)).await;

    let original = tokio::spawn(send(address, charge("attach-1", "amount=100")));
    effects.began().await;
    let before = proxy.executions();
    let duplicates: Vec<_> = (0..WAITERS)
        .map(|_| tokio::spawn(send(address, charge("attach-1", "amount=100"))))
        .collect();
    looked(&proxy, before, WAITERS as u64).await;
    let looked = proxy.executions();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        proxy.executions() - looked,
        0,
        "attached duplicates send no statement while they wait"
    );
    let original = original.await.expect("the original's client");
    assert_eq!(original.status, StatusCode::CREATED, "{original:?}");
    for duplicate in duplicates {
        let duplicate = duplicate.await.expect("a duplicate's client");
        assert!(duplicate.replayed(), "{duplicate:?}");
        assert_eq!(duplicate.status, original.status);
        assert_eq!(duplicate.body, original.body);
    }
    assert_eq!(effects.started(), 1, "one effect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_wait_a_duplicate_is_409_with_retry_after() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(4).await).await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_millis(300));
    let (address, _server) = serve(charges(&effects, Duration::from_secs(3)).layer(layer)).await;

    let original = tokio::spawn(send(address, charge("attach-2", "amount=200")));
    effects.began().await;
    let started = std::time::Instant::now();
    let duplicate = send(address, charge("attach-2", "amount=200")).await;
    let took = started.elapsed();
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    assert_eq!(duplicate.headers["retry-after"], "1", "{duplicate:?}");
    assert!(
        duplicate.problem_type().contains("in-flight"),
        "{duplicate:?}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "answered once its wait ran out, before the original's end: {took:?}"
    );
    let original = original.await.expect("the original's client");
    assert_eq!(original.status, StatusCode::CREATED, "{original:?}");
}
