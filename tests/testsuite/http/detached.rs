//! The request the client gave up on, through the tower layer
//! (`idem::http::IdempotencyLayer`) and real servers on 127.0.0.1: a
//! client that disconnects mid-body, an outer `tower` timeout, a server
//! shut down mid-body, a body that runs past the bound after its caller
//! left; and `run_detached` whose caller's future is dropped. Then
//! what the layer must carry through: gRPC-web's status in its trailer
//! frame, and HTTP/1.1 trailers.
//!
//! Each test counts the handler's effects (started, finished) and reads
//! the claim's row in PostgreSQL.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::Full;
use idem::Gate;
use idem::http::{DEFAULT_KEPT_HEADERS, IdempotencyLayer};
use idem::sqlx::PgPool;

use crate::support;
use crate::support::http::{Effects, SETTLE_WAIT, charges, post_and_hold, rows, send, serve};

/// How long the guarded handler takes: long enough to drop its caller
/// in the middle.
const BODY_TIME: Duration = Duration::from_millis(600);

/// `POST /charges` with `key` and `body`.
fn charge(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/charges")
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("a request")
}

/// A gate in an account of its own, and that account's name.
async fn gate() -> (Gate, String) {
    support::http::gate("detached").await
}

/// The one claim of `account`, once it has left `pending` (or as it is
/// when [`SETTLE_WAIT`] has passed: then still `pending`, stranded).
async fn settled_row(pool: &PgPool, account: &str) -> (String, Option<String>) {
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    loop {
        let rows = rows(pool, account).await;
        assert_eq!(rows.len(), 1, "one claim in {account}: {rows:?}");
        let row = rows.into_iter().next().expect("one row");
        if row.0 != "pending" || tokio::time::Instant::now() >= deadline {
            return row;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ------------------------------------------------- the client gave up

#[tokio::test]
async fn a_client_that_disconnects_mid_body_gets_its_response_on_retry() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let (address, _server) =
        serve(charges(&effects, BODY_TIME).layer(IdempotencyLayer::new(gate).single_tenant()))
            .await;

    let stream = post_and_hold(address, "gone-1", "amount=500").await;
    effects.began().await;
    drop(stream);

    let pool = idem::testing::pool().await;
    let row = settled_row(&pool, &account).await;
    assert_eq!(
        row.0, "success",
        "the body whose client left must run to completion and settle, not strand the key \
         ({row:?})"
    );
    assert_eq!((effects.started(), effects.finished()), (1, 1));

    let retry = send(address, charge("gone-1", "amount=500")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the retry is the stored response");
    assert_eq!(retry.body, "charge 1 of amount=500");
    let again = send(address, charge("gone-1", "amount=500")).await;
    assert_eq!(
        again.as_stored(),
        retry.as_stored(),
        "every replay is byte-identical"
    );
    assert_eq!(effects.started(), 1, "the retries never ran the handler");
}

#[tokio::test]
async fn an_outer_timeout_does_not_cancel_the_guarded_body() {
    use axum::error_handling::HandleErrorLayer;
    use tower::ServiceBuilder;

    // The timeout must fall inside the body, after the claim: on a loaded
    // machine a claim has taken longer than 100 ms, the timeout then fell
    // before it, nothing was claimed, and the test failed though the layer
    // was right. A second of margin for the claim, three for the body.
    const OUTER_TIMEOUT: Duration = Duration::from_secs(1);
    const LONG_BODY: Duration = Duration::from_secs(3);
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let app = charges(&effects, LONG_BODY)
        .layer(IdempotencyLayer::new(gate).single_tenant())
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                    StatusCode::GATEWAY_TIMEOUT
                }))
                .timeout(OUTER_TIMEOUT),
        );
    let (address, _server) = serve(app).await;

    let first = send(address, charge("slow-1", "amount=700")).await;
    assert_eq!(
        first.status,
        StatusCode::GATEWAY_TIMEOUT,
        "the outer timeout answered"
    );
    assert_eq!(
        effects.started(),
        1,
        "the timeout fell inside the body (it began before the answer)"
    );

    let pool = idem::testing::pool().await;
    let row = settled_row(&pool, &account).await;
    assert_eq!(
        row.0, "success",
        "the timed-out body ran on and settled ({row:?})"
    );
    assert_eq!((effects.started(), effects.finished()), (1, 1));

    let retry = send(address, charge("slow-1", "amount=700")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, "charge 1 of amount=700");
    assert_eq!(send(address, charge("slow-1", "amount=700")).await, retry);
    assert_eq!(effects.started(), 1);
}

#[tokio::test]
async fn a_server_stopped_mid_body_lets_the_body_finish_and_settle() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate).single_tenant();
    let (address, server) = serve(charges(&effects, BODY_TIME).layer(layer.clone())).await;

    let client = tokio::spawn(send(address, charge("stop-1", "amount=900")));
    effects.began().await;
    // The process stops serving: every connection closes, every request
    // future is dropped.
    server.abort();
    let _ = server.await;
    assert!(client.await.is_err(), "the client lost its connection");
    // Graceful shutdown: the guarded calls still running get their grace.
    let stopped = layer.detached_calls().shutdown(SETTLE_WAIT).await;
    assert_eq!(stopped.held_in_doubt, 0);
    assert_eq!(layer.detached_calls().running(), 0);

    let pool = idem::testing::pool().await;
    let row = settled_row(&pool, &account).await;
    assert_eq!(
        row.0, "success",
        "the body ran to its end and settled ({row:?})"
    );
    assert_eq!((effects.started(), effects.finished()), (1, 1));
}

#[tokio::test]
async fn a_body_still_running_when_the_shutdown_grace_ends_is_held_in_doubt() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate).single_tenant();
    let (address, server) =
        serve(charges(&effects, Duration::from_secs(30)).layer(layer.clone())).await;

    let client = tokio::spawn(send(address, charge("stop-2", "amount=901")));
    effects.began().await;
    server.abort();
    let _ = server.await;
    assert!(client.await.is_err(), "the client lost its connection");
    let stopped = layer
        .detached_calls()
        .shutdown(Duration::from_millis(200))
        .await;
    assert_eq!(
        stopped.held_in_doubt, 1,
        "the one body past the grace was stopped"
    );

    let pool = idem::testing::pool().await;
    let row = rows(&pool, &account).await;
    assert_eq!(
        row,
        [(
            "in_doubt".to_owned(),
            Some(idem::detach::AT_SHUTDOWN.to_owned())
        )],
        "a body stopped at shutdown may have taken effect: held in doubt, never released, \
         never left pending"
    );
    assert_eq!((effects.started(), effects.finished()), (1, 0));
}

#[tokio::test]
async fn a_body_past_the_bound_after_its_client_left_is_held_in_doubt() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .detached(idem::Detached::with_bound(Duration::from_millis(200)));
    let (address, _server) =
        serve(charges(&effects, Duration::from_secs(30)).layer(layer.clone())).await;

    let stream = post_and_hold(address, "bound-1", "amount=300").await;
    effects.began().await;
    drop(stream);

    let pool = idem::testing::pool().await;
    let row = settled_row(&pool, &account).await;
    assert_eq!(
        row,
        (
            "in_doubt".to_owned(),
            Some(idem::detach::PAST_BOUND.to_owned())
        ),
        "stopped past its bound, the body may have taken effect: held in doubt"
    );
    assert_eq!((effects.started(), effects.finished()), (1, 0));
    let retry = send(address, charge("bound-1", "amount=300")).await;
    assert_eq!(
        retry.status,
        StatusCode::CONFLICT,
        "in doubt: retry later ({retry:?})"
    );
    assert_eq!(effects.started(), 1, "a key in doubt never runs again");
}

#[tokio::test]
async fn gate_run_detached_dropped_mid_body_runs_to_completion() {
    use idem::{Identity, Rejected};

    let (gate, account) = gate().await;
    let detached = idem::Detached::new();
    let effects = Effects::default();
    let id = Identity::new("charge").part("ord_1");
    let body = |effects: Effects| async move {
        let n = effects.start();
        tokio::time::sleep(BODY_TIME).await;
        effects.finish();
        Ok::<_, Rejected>(n)
    };

    let caller = {
        let (gate, id, detached, effects) =
            (gate.clone(), id.clone(), detached.clone(), effects.clone());
        tokio::spawn(async move { gate.guard(&id).run_detached(&detached, body(effects)).await })
    };
    effects.began().await;
    caller.abort();
    assert!(caller.await.is_err_and(|error| error.is_cancelled()));

    let pool = idem::testing::pool().await;
    let row = settled_row(&pool, &account).await;
    assert_eq!(
        row.0, "success",
        "the dropped caller's body ran on and settled ({row:?})"
    );
    assert_eq!((effects.started(), effects.finished()), (1, 1));
    let again = gate
        .guard(&id)
        .run_detached(&detached, body(effects.clone()))
        .await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
    assert_eq!(effects.started(), 1);
}

#[tokio::test]
async fn gate_run_detached_renews_its_lease_while_its_dropped_callers_body_runs() {
    // A lease shorter than the body: nothing but the detached run itself
    // keeps the claim alive once its caller left, and a retry after the
    // lease's first term (within the bound) must not take it over.
    use idem::{Identity, Rejected};

    let (gate, account) = gate().await;
    let detached = idem::Detached::new();
    let lease = Duration::from_millis(200);
    let effects = Effects::default();
    let id = Identity::new("charge").part("ord_lease");
    let body = |effects: Effects| async move {
        let n = effects.start();
        tokio::time::sleep(Duration::from_secs(1)).await;
        effects.finish();
        Ok::<_, Rejected>(n)
    };

    let caller = {
        let (gate, id, detached, effects) =
            (gate.clone(), id.clone(), detached.clone(), effects.clone());
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(lease)
                .run_detached(&detached, body(effects))
                .await
        })
    };
    effects.began().await;
    caller.abort();
    assert!(caller.await.is_err_and(|error| error.is_cancelled()));

    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = gate
        .guard(&id)
        .lease(lease)
        .run_detached(&detached, body(effects.clone()))
        .await;
    assert!(
        matches!(retry, Err(Rejected::InFlight)),
        "the retry took the live body's claim over: {retry:?}"
    );
    assert_eq!(effects.started(), 1, "the retry ran the body again");

    let pool = idem::testing::pool().await;
    let row = settled_row(&pool, &account).await;
    assert_eq!(row.0, "success", "the body settled its own claim ({row:?})");
    assert_eq!((effects.started(), effects.finished()), (1, 1));
}

#[tokio::test]
async fn gate_run_dropped_mid_body_strands_its_claim_as_documented() {
    // The contrast `run_detached` is for: the plain run's body is
    // cancelled with its caller's future and the claim stays pending.
    use idem::{Identity, Rejected};

    let (gate, account) = gate().await;
    let effects = Effects::default();
    let caller = {
        let (gate, effects) = (gate.clone(), effects.clone());
        tokio::spawn(async move {
            gate.run(&Identity::new("charge").part("ord_2"), async move {
                effects.start();
                tokio::time::sleep(BODY_TIME).await;
                effects.finish();
                Ok::<_, Rejected>(())
            })
            .await
        })
    };
    effects.began().await;
    caller.abort();
    let _ = caller.await;
    tokio::time::sleep(BODY_TIME * 2).await;
    let pool = idem::testing::pool().await;
    assert_eq!(rows(&pool, &account).await, [("pending".to_owned(), None)]);
    assert_eq!((effects.started(), effects.finished()), (1, 0));
}

#[tokio::test]
async fn a_panicking_detached_body_holds_its_claim_and_the_panic_reaches_the_caller() {
    use idem::{Identity, Rejected};

    let (gate, account) = gate().await;
    let detached = idem::Detached::new();
    let id = Identity::new("charge").part("ord_3");
    let caller = {
        let (gate, id, detached) = (gate.clone(), id.clone(), detached.clone());
        tokio::spawn(async move {
            let action = id.action().to_owned();
            gate.guard(&id)
                .run_detached(&detached, async move {
                    if action == "charge" {
                        panic!("the provider's reply did not parse");
                    }
                    Ok::<(), Rejected>(())
                })
                .await
        })
    };
    let joined = caller.await;
    assert!(
        joined.is_err_and(|error| error.is_panic()),
        "the panic is resumed in the caller"
    );
    let pool = idem::testing::pool().await;
    assert_eq!(
        rows(&pool, &account).await,
        [(
            "in_doubt".to_owned(),
            Some(idem::detach::PANICKED.to_owned())
        )]
    );
    let retry = gate
        .guard(&id)
        .run_detached(&detached, async { Ok::<(), Rejected>(()) })
        .await;
    assert!(matches!(retry, Err(Rejected::InDoubt)), "{retry:?}");
}

// --------------------------------------------------------- gRPC-web

/// A gRPC-web response body: one message frame, then the trailer frame
/// (flag 0x80) holding `grpc-status: status` HTTP/1-style.
fn grpc_web_body(message: &[u8], status: u16) -> Bytes {
    let trailers = format!("grpc-status: {status}\r\ngrpc-message: done\r\n");
    let mut body = Vec::new();
    for (flag, payload) in [(0x00u8, message), (0x80u8, trailers.as_bytes())] {
        body.push(flag);
        body.extend_from_slice(&u32::try_from(payload.len()).expect("short").to_be_bytes());
        body.extend_from_slice(payload);
    }
    Bytes::from(body)
}

/// `POST /pkg.Payments/Charge` as gRPC-web: answers status 200 with the
/// gRPC status `status` in its trailer frame, and counts.
fn grpc_web(effects: &Effects, status: u16) -> Router {
    let effects = effects.clone();
    Router::new().route(
        "/pkg.Payments/Charge",
        post(move || {
            let effects = effects.clone();
            async move {
                let n = effects.start();
                effects.finish();
                let message = format!("receipt {n}");
                (
                    StatusCode::OK,
                    [("content-type", "application/grpc-web+proto")],
                    grpc_web_body(message.as_bytes(), status),
                )
            }
        }),
    )
}

fn grpc_web_call(key: &str) -> Request<Full<Bytes>> {
    Request::post("/pkg.Payments/Charge")
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(Full::new(grpc_web_body(b"charge", 0).slice(..11)))
        .expect("a request")
}

#[tokio::test]
async fn a_grpc_web_success_in_its_trailer_frame_is_kept_and_replayed() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let (address, _server) =
        serve(grpc_web(&effects, 0).layer(IdempotencyLayer::new(gate).single_tenant())).await;

    let first = send(address, grpc_web_call("web-1")).await;
    assert_eq!(first.status, StatusCode::OK);
    let duplicate = send(address, grpc_web_call("web-1")).await;
    assert_eq!(
        effects.started(),
        1,
        "a gRPC-web success (grpc-status 0 in the trailer frame) keeps its key"
    );
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, first.body, "the replay is the same frames");
    let pool = idem::testing::pool().await;
    assert_eq!(settled_row(&pool, &account).await.0, "success");
}

#[tokio::test]
async fn a_grpc_web_unavailable_in_its_trailer_frame_releases_the_key() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let (address, _server) =
        serve(grpc_web(&effects, 14).layer(IdempotencyLayer::new(gate).single_tenant())).await;

    let first = send(address, grpc_web_call("web-14")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first
            .body
            .ends_with(b"grpc-status: 14\r\ngrpc-message: done\r\n")
    );
    let pool = idem::testing::pool().await;
    assert!(
        rows(&pool, &account).await.is_empty(),
        "UNAVAILABLE released the key"
    );
    let retry = send(address, grpc_web_call("web-14")).await;
    assert!(!retry.replayed());
    assert_eq!(effects.started(), 2, "a released key runs again");
}

// ------------------------------------------------- HTTP/1.1 trailers

#[tokio::test]
async fn http1_trailers_reach_the_first_client_and_the_replay() {
    use http_body_util::StreamBody;

    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let checksum = HeaderName::from_static("x-checksum");
    let app = {
        let effects = effects.clone();
        Router::new().route(
            "/charges",
            post(move || {
                let effects = effects.clone();
                async move {
                    let n = effects.start();
                    effects.finish();
                    let mut trailers = HeaderMap::new();
                    trailers.insert("x-checksum", HeaderValue::from(n + 1000));
                    let frames = [
                        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(
                            format!("charge {n}"),
                        ))),
                        Ok(hyper::body::Frame::trailers(trailers)),
                    ];
                    (
                        StatusCode::CREATED,
                        [("content-type", "text/plain"), ("trailer", "x-checksum")],
                        axum::body::Body::new(StreamBody::new(futures_util::stream::iter(frames))),
                    )
                }
            }),
        )
    };
    let kept = DEFAULT_KEPT_HEADERS.into_iter().chain([checksum.clone()]);
    let (address, _server) = serve(
        app.layer(
            IdempotencyLayer::new(gate)
                .single_tenant()
                .keep_headers(kept),
        ),
    )
    .await;

    // HTTP/1.1 sends trailers to a client that said it takes them.
    let with_te = || {
        let mut request = charge("tr-1", "x");
        request
            .headers_mut()
            .insert("te", HeaderValue::from_static("trailers"));
        request
    };
    let first = send(address, with_te()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.trailers.as_ref().and_then(|t| t.get(&checksum)),
        Some(&HeaderValue::from_static("1001")),
        "the first client gets the service's trailers over HTTP/1.1 ({first:?})"
    );
    let replay = send(address, with_te()).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, "charge 1");
    assert_eq!(
        replay.trailers.as_ref().and_then(|t| t.get(&checksum)),
        Some(&HeaderValue::from_static("1001")),
        "the replay carries the kept trailer ({replay:?})"
    );
    assert_eq!(effects.started(), 1);
}

#[tokio::test]
async fn a_detached_run_begun_after_shutdown_claims_nothing() {
    use idem::{Identity, Rejected};

    let (gate, account) = gate().await;
    let detached = idem::Detached::new();
    detached.shutdown(Duration::from_secs(1)).await;
    let effects = Effects::default();
    let late = {
        let effects = effects.clone();
        gate.guard(&Identity::new("charge").part("ord_4"))
            .run_detached(&detached, async move {
                effects.start();
                Ok::<(), Rejected>(())
            })
            .await
    };
    assert!(matches!(late, Err(Rejected::InFlight)), "{late:?}");
    assert_eq!(effects.started(), 0, "no body starts once shutdown began");
    let pool = idem::testing::pool().await;
    assert!(
        rows(&pool, &account).await.is_empty(),
        "and no claim is left behind"
    );
}

/// `Rejected`'s table: a caller still awaiting its `run_detached` when
/// `Detached::shutdown`'s grace ends and stops its body is told `InDoubt`,
/// the one case of that refusal whose body ran; its slot is held in doubt.
#[tokio::test]
async fn a_caller_whose_detached_body_was_stopped_at_shutdown_is_told_in_doubt() {
    use idem::{Identity, Rejected};

    let (gate, _account) = gate().await;
    let detached = idem::Detached::new();
    let effects = Effects::default();
    let began = std::sync::Arc::new(tokio::sync::Notify::new());
    let caller = {
        let (effects, began, gate, detached) = (
            effects.clone(),
            began.clone(),
            gate.clone(),
            detached.clone(),
        );
        tokio::spawn(async move {
            gate.guard(&Identity::new("charge").part("stopped under its caller"))
                .run_detached(&detached, async move {
                    effects.start();
                    began.notify_one();
                    std::future::pending::<()>().await;
                    Ok::<(), Rejected>(())
                })
                .await
        })
    };
    began.notified().await;
    let stopped = detached.shutdown(Duration::from_millis(100)).await;
    assert_eq!(stopped.held_in_doubt, 1, "{stopped:?}");
    let told = tokio::time::timeout(Duration::from_secs(10), caller)
        .await
        .expect("the caller hears back")
        .expect("no panic");
    assert_eq!(effects.started(), 1, "the body ran");
    assert!(matches!(told, Err(Rejected::InDoubt)), "{told:?}");
}
