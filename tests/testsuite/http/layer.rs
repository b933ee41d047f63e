//! The tower layer (`idem::http::IdempotencyLayer`, feature `tower`)
//! around real servers on 127.0.0.1, hit by real clients, against a real
//! PostgreSQL: an axum router, a bare hyper service and a tonic gRPC
//! server. Each race fires its requests at one barrier; effects are
//! counted in the inner service.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use idem::Gate;
use idem::http::{IdempotencyLayer, RequestBody, Scoped};
use idem_test_support::answer::Answer;
use tokio::net::TcpListener;
use tokio::sync::Barrier;
use tower::Layer;

/// How long the inner service takes over an effect: long enough that the
/// racers arrive while the first request is in flight.
const EFFECT_TIME: Duration = Duration::from_millis(300);

/// A gate in an account of its own, on a small pool (the racers outnumber
/// its connections: the later ones queue).
async fn gate() -> Gate {
    Gate::connect(idem::testing::pool_with(8).await)
        .await
        .expect("idem's schema")
        .account(idem::testing::unique_name("layer"))
}

/// Counts the inner service's effects, numbering each one.
#[derive(Clone, Default)]
struct Effects(Arc<AtomicUsize>);

impl Effects {
    /// Records one effect; returns its number, from 1.
    fn happen(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

// ------------------------------------------------------------ the servers

/// An axum router with the layer: `POST /charges` and `POST /flaky` (a
/// 503, then 201s), `GET /charges`.
async fn serve_axum<P: 'static>(layer: IdempotencyLayer<Scoped, P>, effects: Effects) -> String {
    use axum::routing::post;

    let charge = {
        let effects = effects.clone();
        move |body: Bytes| async move {
            let n = effects.happen();
            tokio::time::sleep(EFFECT_TIME).await;
            let receipt = format!(
                r#"{{"charge":{n},"of":{}}}"#,
                String::from_utf8_lossy(&body)
            );
            (
                StatusCode::CREATED,
                [
                    ("content-type", "application/json".to_owned()),
                    ("location", format!("/charges/{n}")),
                    // Not kept: it reaches the first client only.
                    ("x-served-by", format!("effect-{n}")),
                ],
                receipt,
            )
        }
    };
    let flaky = {
        let effects = effects.clone();
        move || async move {
            match effects.happen() {
                1 => (StatusCode::SERVICE_UNAVAILABLE, "down".to_owned()),
                n => (StatusCode::CREATED, format!("created {n}")),
            }
        }
    };
    let declined = {
        let effects = effects.clone();
        move || async move {
            let n = effects.happen();
            (StatusCode::PAYMENT_REQUIRED, format!("declined {n}"))
        }
    };
    // Answers 201, then its body fails half-way.
    let broken = {
        let effects = effects.clone();
        move || async move {
            effects.happen();
            let chunks: [Result<Bytes, std::io::Error>; 2] = [
                Ok(Bytes::from_static(b"half a rece")),
                Err(std::io::Error::other("the database went away mid-answer")),
            ];
            let body = axum::body::Body::from_stream(futures_util::stream::iter(chunks));
            (StatusCode::CREATED, body)
        }
    };
    let count = move || async move { effects.count().to_string() };
    let app = axum::Router::new()
        .route("/charges", post(charge).get(count))
        .route("/flaky", post(flaky))
        .route("/declined", post(declined))
        .route("/broken", post(broken))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// The one endpoint of the hyper service: a bare service has no route
/// templates, so the layer is told its route.
fn jobs(parts: &http::request::Parts) -> String {
    format!("{} /jobs", parts.method)
}

/// A bare hyper service (a `tower::service_fn`, no framework) with the
/// layer, served by hyper-util's HTTP/1 and HTTP/2 server.
async fn serve_hyper(layer: IdempotencyLayer, effects: Effects) -> String {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;

    type Incoming = hyper::body::Incoming;
    let inner = tower::service_fn(move |request: Request<RequestBody<Incoming>>| {
        let effects = effects.clone();
        async move {
            let Ok(body) = request.into_body().collect().await else {
                let mut unread = Response::new(Full::new(Bytes::new()));
                *unread.status_mut() = StatusCode::BAD_REQUEST;
                return Ok(unread);
            };
            let body = body.to_bytes();
            let n = effects.happen();
            tokio::time::sleep(EFFECT_TIME).await;
            let mut response = Response::new(Full::new(Bytes::from(format!(
                "effect {n} of {} bytes",
                body.len()
            ))));
            *response.status_mut() = StatusCode::ACCEPTED;
            response
                .headers_mut()
                .insert("content-type", HeaderValue::from_static("text/plain"));
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let service = layer.layer(inner);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _closed = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{address}")
}

// ------------------------------------------------------------ the client

/// `n` identical POSTs, released together by a barrier.
async fn post_at_once(url: &str, n: usize, key: &str, body: &'static str) -> Vec<Answer> {
    let client = reqwest::Client::new();
    let requests = (0..n).map(|_| {
        client
            .post(url)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body)
    });
    Answer::all_at_once(requests.collect()).await
}

/// Asserts that one answer is the original (not a replay) and every other
/// a 409 in flight or a byte-identical replay of it; returns the original.
#[track_caller]
fn assert_one_original(answers: &[Answer], kept: &[&str]) -> usize {
    let originals: Vec<usize> = (0..answers.len())
        .filter(|&i| answers[i].status.is_success() && !answers[i].replayed())
        .collect();
    assert_eq!(originals.len(), 1, "exactly one original: {answers:#?}");
    let original = &answers[originals[0]];
    for (i, answer) in answers.iter().enumerate() {
        if i == originals[0] {
            continue;
        }
        if answer.status == StatusCode::CONFLICT {
            answer.assert_problem(StatusCode::CONFLICT, "in-flight");
            assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
        } else {
            assert_replay_of(answer, original, kept);
        }
    }
    originals[0]
}

/// Says how a race came out (visible with `--nocapture`).
fn report(server: &str, answers: &[Answer]) {
    let conflicts = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT)
        .count();
    let replays = answers.iter().filter(|a| a.replayed()).count();
    eprintln!(
        "{server}: {} requests at once: 1 ran, {conflicts} answered 409 in flight, {replays} replayed",
        answers.len()
    );
}

#[track_caller]
fn assert_replay_of(replay: &Answer, original: &Answer, kept: &[&str]) {
    assert!(replay.replayed(), "neither a 409 nor a replay: {replay:?}");
    assert_eq!(replay.status, original.status);
    assert_eq!(replay.body, original.body, "the replayed body differs");
    for name in kept {
        assert_eq!(replay.header(name), original.header(name), "{name}");
    }
}

// ------------------------------------------------------------ the races

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_fifty_concurrent_identical_posts_run_once_and_the_rest_are_409_or_replays() {
    let effects = Effects::default();
    let base = serve_axum(
        IdempotencyLayer::new(gate().await).single_tenant(),
        effects.clone(),
    )
    .await;
    let url = format!("{base}/charges");
    let answers = post_at_once(&url, 50, "race-axum", r#"{"cents":4999}"#).await;
    let original = &answers[assert_one_original(&answers, &["content-type", "location"])];
    assert_eq!(effects.count(), 1, "one effect for fifty requests");
    report("axum", &answers);
    assert_eq!(original.status, StatusCode::CREATED);
    assert_eq!(original.body, br#"{"charge":1,"of":{"cents":4999}}"#);
    assert_eq!(original.header("x-served-by"), Some("effect-1"));

    // Settled: every retry, all at once again, is the same answer.
    let retries = post_at_once(&url, 50, "race-axum", r#"{"cents":4999}"#).await;
    for retry in &retries {
        assert_replay_of(retry, original, &["content-type", "location"]);
        assert_eq!(retry.header("x-served-by"), None, "not a kept header");
    }
    assert_eq!(effects.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_wait_duplicates_in_flight_get_the_replay_instead_of_a_409() {
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .wait(Duration::from_secs(10));
    let base = serve_axum(layer, effects.clone()).await;
    let answers = post_at_once(&format!("{base}/charges"), 10, "wait-1", "a").await;
    let original = &answers[assert_one_original(&answers, &["content-type", "location"])];
    for answer in &answers {
        assert_ne!(
            answer.status,
            StatusCode::CONFLICT,
            "waited, not refused: {answer:?}"
        );
        if !std::ptr::eq(answer, original) {
            assert_replay_of(answer, original, &["content-type", "location"]);
        }
    }
    assert_eq!(effects.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_fifty_concurrent_identical_posts_run_once_and_the_rest_are_409_or_replays() {
    let effects = Effects::default();
    let base = serve_hyper(
        IdempotencyLayer::new(gate().await)
            .single_tenant()
            .route(jobs),
        effects.clone(),
    )
    .await;
    let url = format!("{base}/jobs");
    let answers = post_at_once(&url, 50, "race-hyper", "a job").await;
    let original = &answers[assert_one_original(&answers, &["content-type"])];
    assert_eq!(effects.count(), 1, "one effect for fifty requests");
    report("hyper", &answers);
    assert_eq!(original.status, StatusCode::ACCEPTED);
    assert_eq!(original.body, b"effect 1 of 5 bytes");

    let retry = &post_at_once(&url, 1, "race-hyper", "a job").await[0];
    assert_replay_of(retry, original, &["content-type"]);
    assert_eq!(effects.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hyper_service_without_a_route_refuses_keyed_requests_and_never_runs_them() {
    // No route templates in a bare service: without `.route(..)` the layer
    // has nothing to keep a key under. A keyed request is refused (404
    // no-route, naming the fix), never run unguarded: before, each retry
    // ran its effect again. A request without a key still passes.
    let effects = Effects::default();
    let base = serve_hyper(
        IdempotencyLayer::new(gate().await).single_tenant(),
        effects.clone(),
    )
    .await;
    let answers = [
        post_at_once(&format!("{base}/jobs"), 1, "unrouted", "a job").await,
        post_at_once(&format!("{base}/jobs"), 1, "unrouted", "a job").await,
    ];
    for answer in answers.iter().flatten() {
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{answer:?}");
        let body = String::from_utf8_lossy(&answer.body);
        assert!(
            body.contains("no-route") && body.contains("IdempotencyLayer::route"),
            "the refusal names the fix: {body}"
        );
        assert!(!answer.replayed(), "{answer:?}");
    }
    assert_eq!(
        effects.count(),
        0,
        "a keyed request without a route never runs"
    );
    let unkeyed = reqwest::Client::new()
        .post(format!("{base}/jobs"))
        .body("a job")
        .send()
        .await
        .expect("an answer");
    assert_eq!(unkeyed.status(), StatusCode::ACCEPTED);
    assert_eq!(effects.count(), 1, "a request without a key passes through");
}

// ------------------------------------------------- refusals and passes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_413_and_the_service_is_never_called() {
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .body_limit(16);
    let hyper = serve_hyper(layer.clone().route(jobs), effects.clone()).await;
    let axum = serve_axum(layer, effects.clone()).await;
    let client = reqwest::Client::new();
    for url in [format!("{hyper}/jobs"), format!("{axum}/charges")] {
        let big = Answer::of(
            client
                .post(&url)
                .header("idempotency-key", "big-1")
                .body(vec![b'x'; 17]),
        )
        .await;
        big.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large");
        // At the limit it runs.
        let fits = Answer::of(
            client
                .post(&url)
                .header("idempotency-key", "fits-1")
                .body(vec![b'x'; 16]),
        )
        .await;
        assert!(fits.status.is_success(), "{fits:?}");
    }
    assert_eq!(
        effects.count(),
        2,
        "only the two bodies within the limit ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_for_another_request_is_422_and_the_original_still_replays() {
    let effects = Effects::default();
    let base = serve_axum(
        IdempotencyLayer::new(gate().await).single_tenant(),
        effects.clone(),
    )
    .await;
    let client = reqwest::Client::new();
    let post = |url: String, body: &'static str| {
        Answer::of(
            client
                .post(url)
                .header("idempotency-key", "k-422")
                .body(body),
        )
    };
    let first = post(format!("{base}/charges"), "a").await;
    assert_eq!(first.status, StatusCode::CREATED);
    for reused in [
        post(format!("{base}/charges"), "b").await,
        post(format!("{base}/charges?currency=EUR"), "a").await,
    ] {
        reused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "key-reused");
    }
    let again = post(format!("{base}/charges"), "a").await;
    assert_replay_of(&again, &first, &["content-type", "location"]);
    assert_eq!(effects.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_key_or_of_other_methods_pass_through_unless_the_key_is_required() {
    let effects = Effects::default();
    let gate = gate().await;
    let base = serve_axum(
        IdempotencyLayer::new(gate.clone()).single_tenant(),
        effects.clone(),
    )
    .await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let unkeyed = Answer::of(client.post(format!("{base}/charges")).body("a")).await;
        assert_eq!(unkeyed.status, StatusCode::CREATED, "{unkeyed:?}");
    }
    assert_eq!(effects.count(), 2, "no key: both ran");
    let get = Answer::of(
        client
            .get(format!("{base}/charges"))
            .header("idempotency-key", "g"),
    )
    .await;
    assert_eq!(get.body, b"2", "a GET is not guarded");

    let malformed = Answer::of(
        client
            .post(format!("{base}/charges"))
            .header("idempotency-key", "two words"),
    )
    .await;
    malformed.assert_problem(StatusCode::BAD_REQUEST, "invalid-idempotency-key");

    let strict = serve_axum(
        IdempotencyLayer::new(gate).single_tenant().require_key(),
        effects.clone(),
    )
    .await;
    let missing = Answer::of(client.post(format!("{strict}/charges")).body("a")).await;
    missing.assert_problem(StatusCode::BAD_REQUEST, "missing-idempotency-key");
    assert_eq!(
        effects.count(),
        2,
        "refused requests never reach the service"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_releases_the_key_so_the_retry_runs() {
    let effects = Effects::default();
    let base = serve_axum(
        IdempotencyLayer::new(gate().await).single_tenant(),
        effects.clone(),
    )
    .await;
    let client = reqwest::Client::new();
    let post = || {
        Answer::of(
            client
                .post(format!("{base}/flaky"))
                .header("idempotency-key", "f"),
        )
    };
    assert_eq!(post().await.status, StatusCode::SERVICE_UNAVAILABLE);
    let retried = post().await;
    assert_eq!(
        retried.status,
        StatusCode::CREATED,
        "the 503 released the key"
    );
    assert_eq!(retried.body, b"created 2");
    let replayed = post().await;
    assert_replay_of(&replayed, &retried, &["content-type"]);
    assert_eq!(effects.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_policy_can_keep_a_failure_and_a_broken_response_is_held_in_doubt() {
    use idem::Disposition;
    use idem::Outcome;
    use idem::http::default_status_policy;

    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .status_policy(|status| match status {
            StatusCode::PAYMENT_REQUIRED => Outcome::Failed(Disposition::Keep),
            other => default_status_policy(other),
        });
    let base = serve_axum(layer, effects.clone()).await;
    let client = reqwest::Client::new();
    let post = |path: &str| {
        Answer::of(
            client
                .post(format!("{base}{path}"))
                .header("idempotency-key", "p-1"),
        )
    };

    // A declined payment, kept as a definite failure: its retries are
    // refused, not run, and not handed the 402 as if it were the answer.
    let declined = post("/declined").await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.body, b"declined 1");
    post("/declined")
        .await
        .assert_problem(StatusCode::CONFLICT, "already-failed");

    // A 201 whose body failed: the effect may have happened, so the key is
    // held in doubt; nothing partial is sent or kept.
    let broken = post("/broken").await;
    broken.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "response-failed");
    let retry = post("/broken").await;
    retry.assert_problem(StatusCode::CONFLICT, "outcome-in-doubt");
    assert_eq!(retry.header("retry-after"), Some("30"));
    assert_eq!(effects.count(), 2, "neither ran twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_callers_never_share_a_key() {
    let effects = Effects::default();
    let account = idem::testing::unique_name("caller");
    let layer = IdempotencyLayer::new(gate().await).scope(move |parts| {
        let caller = parts.headers.get("x-caller")?.to_str().ok()?;
        Some(format!("{account}-{caller}"))
    });
    let base = serve_axum(layer, effects.clone()).await;
    let client = reqwest::Client::new();
    let post = |caller: &'static str| {
        Answer::of(
            client
                .post(format!("{base}/charges"))
                .header("x-caller", caller)
                .header("idempotency-key", "shared")
                .body("a"),
        )
    };
    let (alice, bob) = (post("alice").await, post("bob").await);
    assert!(!alice.replayed() && !bob.replayed(), "{alice:?} {bob:?}");
    assert_ne!(alice.body, bob.body, "each caller's own effect");
    assert!(post("alice").await.replayed());
    assert_eq!(effects.count(), 2);
}

// ------------------------------------------- what a request's identity is

/// The caller, as an authentication middleware would name it: the Bearer
/// token, in an account of this test's own. No token: no caller.
fn bearer(
    account: &str,
) -> impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static {
    let account = account.to_owned();
    move |parts| {
        let header = parts.headers.get("authorization")?.to_str().ok()?;
        let token = header.strip_prefix("Bearer ")?;
        Some(format!("{account}-{token}"))
    }
}

/// Serves `app` on a port of its own.
async fn serve_router(app: axum::Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// A handler that counts one effect and answers 201 with what it was
/// asked: the method and the path as the client sent them, and the body.
fn echo(
    effects: &Effects,
    name: &'static str,
) -> impl Fn(
    axum::http::Method,
    axum::extract::OriginalUri,
    Bytes,
) -> std::future::Ready<(StatusCode, String)>
+ Clone
+ Send
+ Sync
+ 'static {
    let effects = effects.clone();
    move |method, uri: axum::extract::OriginalUri, body: Bytes| {
        let n = effects.happen();
        std::future::ready((
            StatusCode::CREATED,
            format!(
                "{name} {n}: {method} {} {}",
                uri.0.path(),
                String::from_utf8_lossy(&body)
            ),
        ))
    }
}

/// One POST (or another method) with a key and a Bearer token.
async fn send(
    method: reqwest::Method,
    url: String,
    token: &str,
    key: &str,
    body: &'static str,
) -> Answer {
    Answer::of(
        reqwest::Client::new()
            .request(method, url)
            .bearer_auth(token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body),
    )
    .await
}

/// The actions of the rows stored in `account`, decoded from their
/// canonical identities.
async fn stored_actions(account: &str) -> Vec<String> {
    let pool = idem::testing::pool_with(1).await;
    let rows: Vec<Vec<u8>> =
        idem::sqlx::query_scalar("SELECT identity FROM idem_records WHERE account = $1")
            .bind(account)
            .fetch_all(&pool)
            .await
            .expect("the rows");
    rows.iter()
        .map(|canonical| {
            idem::Identity::from_canonical(canonical)
                .expect("a canonical identity")
                .action()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bearer_callers_with_one_key_each_get_their_own_effect() {
    let effects = Effects::default();
    let account = idem::testing::unique_name("bearer");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let app = axum::Router::new()
        .route("/orders", axum::routing::post(echo(&effects, "order")))
        .layer(layer);
    let base = serve_router(app).await;
    let url = format!("{base}/orders");
    let alice = send(
        reqwest::Method::POST,
        url.clone(),
        "alice",
        "order-1001",
        "1",
    )
    .await;
    let bob = send(reqwest::Method::POST, url.clone(), "bob", "order-1001", "1").await;
    assert_eq!(alice.status, StatusCode::CREATED, "{alice:?}");
    assert_eq!(bob.status, StatusCode::CREATED, "{bob:?}");
    assert!(!bob.replayed(), "bob got alice's answer: {bob:?}");
    assert_eq!(bob.body, b"order 2: POST /orders 1");
    assert!(
        send(reqwest::Method::POST, url, "bob", "order-1001", "1")
            .await
            .replayed()
    );
    assert_eq!(effects.count(), 2, "one effect per caller");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_the_scope_cannot_name_is_refused_and_never_runs() {
    let effects = Effects::default();
    let account = idem::testing::unique_name("nobody");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let app = axum::Router::new()
        .route("/orders", axum::routing::post(echo(&effects, "order")))
        .layer(layer);
    let base = serve_router(app).await;
    let anonymous = || {
        Answer::of(
            reqwest::Client::new()
                .post(format!("{base}/orders"))
                .header("idempotency-key", "order-1001")
                .body("1"),
        )
    };
    let first = anonymous().await;
    first.assert_problem(StatusCode::UNAUTHORIZED, "unidentified-caller");
    anonymous()
        .await
        .assert_problem(StatusCode::UNAUTHORIZED, "unidentified-caller");
    assert_eq!(effects.count(), 0, "never run in a shared account");
    // Without a key it is not guarded, and passes (authentication is not
    // the layer's job).
    let unkeyed = Answer::of(
        reqwest::Client::new()
            .post(format!("{base}/orders"))
            .body("1"),
    )
    .await;
    assert_eq!(unkeyed.status, StatusCode::CREATED, "{unkeyed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_routers_are_separate_endpoints_with_one_layer() {
    use axum::routing::post;

    let effects = Effects::default();
    let account = idem::testing::unique_name("nested");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let payments = axum::Router::new()
        .route("/create", post(echo(&effects, "payment")))
        .layer(layer.clone());
    let refunds = axum::Router::new()
        .route("/create", post(echo(&effects, "refund")))
        .layer(layer);
    let app = axum::Router::new()
        .nest("/payments", payments)
        .nest("/refunds", refunds);
    let base = serve_router(app).await;
    let payment = send(
        reqwest::Method::POST,
        format!("{base}/payments/create"),
        "alice",
        "k-1",
        "9",
    )
    .await;
    let refund = send(
        reqwest::Method::POST,
        format!("{base}/refunds/create"),
        "alice",
        "k-1",
        "9",
    )
    .await;
    assert_eq!(
        payment.body, b"payment 1: POST /payments/create 9",
        "{payment:?}"
    );
    assert!(
        !refund.replayed(),
        "the refund got the payment's answer: {refund:?}"
    );
    assert_eq!(
        refund.body, b"refund 2: POST /refunds/create 9",
        "{refund:?}"
    );
    let again = send(
        reqwest::Method::POST,
        format!("{base}/refunds/create"),
        "alice",
        "k-1",
        "9",
    )
    .await;
    assert_replay_of(&again, &refund, &[]);
    let mut actions = stored_actions(&format!("{account}-alice")).await;
    actions.sort();
    assert_eq!(actions, ["POST /payments/create", "POST /refunds/create"]);
    assert_eq!(effects.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_on_other_requests_gets_what_the_docs_say_and_never_a_second_effect_of_one_endpoint()
 {
    use axum::routing::post;
    use reqwest::Method;

    let effects = Effects::default();
    let account = idem::testing::unique_name("reuse");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let app = axum::Router::new()
        .route(
            "/cards/{id}/charge",
            post(echo(&effects, "charge")).patch(echo(&effects, "amend")),
        )
        .route("/refunds", post(echo(&effects, "refund")))
        .layer(layer);
    let base = serve_router(app).await;
    let first = send(
        Method::POST,
        format!("{base}/cards/1/charge"),
        "alice",
        "k",
        "5",
    )
    .await;
    assert_eq!(first.body, b"charge 1: POST /cards/1/charge 5", "{first:?}");

    // The same endpoint (one route template), another path: another
    // request under the key, refused.
    send(
        Method::POST,
        format!("{base}/cards/2/charge"),
        "alice",
        "k",
        "5",
    )
    .await
    .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "key-reused");
    assert_eq!(effects.count(), 1, "the same endpoint ran once for one key");

    // Keys are per endpoint (method and route template): another method or
    // another template is another endpoint, where the key is new.
    let amend = send(
        Method::PATCH,
        format!("{base}/cards/1/charge"),
        "alice",
        "k",
        "5",
    )
    .await;
    assert_eq!(amend.body, b"amend 2: PATCH /cards/1/charge 5", "{amend:?}");
    let refund = send(Method::POST, format!("{base}/refunds"), "alice", "k", "5").await;
    assert_eq!(refund.body, b"refund 3: POST /refunds 5", "{refund:?}");
    let replay = send(
        Method::POST,
        format!("{base}/cards/1/charge"),
        "alice",
        "k",
        "5",
    )
    .await;
    assert_replay_of(&replay, &first, &[]);
    assert_eq!(effects.count(), 3);

    // One route for every request makes keys per caller only (Stripe's
    // way): the same key anywhere else is refused.
    let effects = Effects::default();
    let account = idem::testing::unique_name("per-key");
    let layer = IdempotencyLayer::new(gate().await)
        .scope(bearer(&account))
        .route(|_| "api".to_owned());
    let app = axum::Router::new()
        .route("/cards/{id}/charge", post(echo(&effects, "charge")))
        .route("/refunds", post(echo(&effects, "refund")))
        .layer(layer);
    let base = serve_router(app).await;
    let first = send(
        Method::POST,
        format!("{base}/cards/1/charge"),
        "alice",
        "k",
        "5",
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    send(Method::POST, format!("{base}/refunds"), "alice", "k", "5")
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "key-reused");
    assert_eq!(effects.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_action_is_the_route_template_and_unmatched_paths_are_not_stored() {
    let effects = Effects::default();
    let account = idem::testing::unique_name("template");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let app = axum::Router::new()
        .route(
            "/cards/{id}/charge",
            axum::routing::post(echo(&effects, "charge")),
        )
        .layer(layer);
    let base = serve_router(app).await;
    let client = reqwest::Client::new();
    let charges = (0..100).map(|id| {
        client
            .post(format!("{base}/cards/{id}/charge"))
            .bearer_auth("alice")
            .header("idempotency-key", format!("charge-{id}"))
            .body("1")
    });
    let answers = Answer::all_at_once(charges.collect()).await;
    assert!(
        answers.iter().all(|a| a.status == StatusCode::CREATED),
        "{answers:#?}"
    );
    assert_eq!(effects.count(), 100);

    let actions = stored_actions(&format!("{account}-alice")).await;
    let distinct: std::collections::BTreeSet<&String> = actions.iter().collect();
    assert_eq!(
        distinct.into_iter().collect::<Vec<_>>(),
        ["POST /cards/{id}/charge"],
        "one action (one metric series, one probe) for a hundred ids"
    );

    // A made-up path, twice: the router's 404 both times, nothing kept.
    for _ in 0..2 {
        let lost = send(
            reqwest::Method::POST,
            format!("{base}/made/up/1"),
            "alice",
            "lost-1",
            "1",
        )
        .await;
        assert_eq!(lost.status, StatusCode::NOT_FOUND, "{lost:?}");
        assert!(!lost.replayed(), "{lost:?}");
    }
    let actions = stored_actions(&format!("{account}-alice")).await;
    assert_eq!(actions.len(), 100, "one row per charge, none for the 404s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_failed_validation_releases_its_key_so_the_fixed_request_runs() {
    #[derive(serde::Deserialize)]
    struct Order {
        cents: i64,
    }

    let effects = Effects::default();
    let account = idem::testing::unique_name("invalid");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let order = {
        let effects = effects.clone();
        move |axum::Json(order): axum::Json<Order>| {
            let n = effects.happen();
            std::future::ready((
                StatusCode::CREATED,
                format!("order {n}: {} cents", order.cents),
            ))
        }
    };
    let app = axum::Router::new()
        .route("/orders", axum::routing::post(order))
        .layer(layer);
    let base = serve_router(app).await;
    let client = reqwest::Client::new();
    let post = |content_type: Option<&'static str>, body: &'static str| {
        let mut request = client
            .post(format!("{base}/orders"))
            .bearer_auth("alice")
            .header("idempotency-key", "order-7")
            .body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        Answer::of(request)
    };
    let json = Some("application/json");
    // axum's three rejections, each under the same key: none is kept.
    assert_eq!(
        post(None, r#"{"cents":5}"#).await.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_eq!(
        post(json, r#"{"cents":"#).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        post(json, r#"{"cents":"five"}"#).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(effects.count(), 0);
    // The fixed request, same key: it runs, once.
    let fixed = post(json, r#"{"cents":5}"#).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{fixed:?}");
    assert_eq!(fixed.body, b"order 1: 5 cents");
    assert!(post(json, r#"{"cents":5}"#).await.replayed());
    assert_eq!(effects.count(), 1);
}

// ------------------------------------------------------------ gRPC

/// A unary gRPC service written by hand (no protoc): `/test.Charges/Charge`
/// takes and returns raw bytes, through a codec that copies them.
mod grpc {
    use std::convert::Infallible;
    use std::task::{Context, Poll};

    use bytes::{Buf, BufMut};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::{Status, body::Body, server::NamedService};

    use super::{EFFECT_TIME, Effects};

    /// Messages as their bytes.
    #[derive(Clone, Copy, Default)]
    pub struct Raw;

    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;

        fn encoder(&mut self) -> Raw {
            Raw
        }

        fn decoder(&mut self) -> Raw {
            Raw
        }
    }

    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = Status;

        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Raw {
        type Item = Vec<u8>;
        type Error = Status;

        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
        }
    }

    /// The server side: one effect per call that reaches it.
    #[derive(Clone)]
    pub struct Charges(pub Effects);

    impl NamedService for Charges {
        const NAME: &'static str = "test.Charges";
    }

    impl tower::Service<http::Request<Body>> for Charges {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            let effects = self.0.clone();
            // `Flaky` fails its first call UNAVAILABLE, as a service whose
            // database is down would.
            let flaky = request.uri().path().ends_with("/Flaky");
            Box::pin(async move {
                let charge = tower::service_fn(move |call: tonic::Request<Vec<u8>>| {
                    let effects = effects.clone();
                    async move {
                        let n = effects.happen();
                        if flaky && n == 1 {
                            return Err(Status::unavailable("the ledger is down"));
                        }
                        tokio::time::sleep(EFFECT_TIME).await;
                        let mut reply = format!("charge {n}: ").into_bytes();
                        reply.extend_from_slice(call.get_ref());
                        Ok::<_, Status>(tonic::Response::new(reply))
                    }
                });
                Ok(tonic::server::Grpc::new(Raw)
                    .unary(UnaryFn(charge), request)
                    .await)
            })
        }
    }

    /// A tower service as tonic's `UnaryService`.
    struct UnaryFn<S>(S);

    impl<S> tonic::server::UnaryService<Vec<u8>> for UnaryFn<S>
    where
        S: tower::Service<
                tonic::Request<Vec<u8>>,
                Response = tonic::Response<Vec<u8>>,
                Error = Status,
            >,
    {
        type Response = Vec<u8>;
        type Future = S::Future;

        fn call(&mut self, request: tonic::Request<Vec<u8>>) -> S::Future {
            self.0.call(request)
        }
    }

    /// The client side: one unary `Charge` call, with the key as metadata.
    pub async fn charge(
        channel: tonic::transport::Channel,
        key: Option<&str>,
        payload: &[u8],
    ) -> Result<tonic::Response<Vec<u8>>, Status> {
        call(channel, "/test.Charges/Charge", key, payload).await
    }

    /// One unary call of `method`, with the key as metadata.
    pub async fn call(
        channel: tonic::transport::Channel,
        method: &'static str,
        key: Option<&str>,
        payload: &[u8],
    ) -> Result<tonic::Response<Vec<u8>>, Status> {
        let mut client = tonic::client::Grpc::new(channel);
        client
            .ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(payload.to_vec());
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("idempotency-key", key.parse().expect("a valid key"));
        }
        let path = http::uri::PathAndQuery::from_static(method);
        client.unary(request, path, Raw).await
    }
}

async fn serve_grpc(layer: IdempotencyLayer, effects: Effects) -> tonic::transport::Channel {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(grpc::Charges(effects))
            .serve_with_incoming(incoming),
    );
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("the server accepts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_duplicates_of_a_unary_call_are_refused_or_replayed_as_grpc_statuses() {
    let effects = Effects::default();
    let channel = serve_grpc(
        IdempotencyLayer::new(gate().await).single_tenant(),
        effects.clone(),
    )
    .await;
    let racers = 20;
    let barrier = Arc::new(Barrier::new(racers));
    let calls: Vec<_> = (0..racers)
        .map(|_| {
            let (channel, barrier) = (channel.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                grpc::charge(channel, Some("grpc-1"), b"4999 EUR").await
            })
        })
        .collect();
    let (mut originals, mut aborted, mut replayed) = (Vec::new(), 0, 0);
    for call in calls {
        match call.await.expect("a caller panicked") {
            Ok(response) if response.metadata().get("idempotent-replayed").is_some() => {
                assert_eq!(response.get_ref(), b"charge 1: 4999 EUR");
                replayed += 1;
            }
            Ok(response) => originals.push(response.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
                assert!(
                    status.message().contains("still being processed"),
                    "{status:?}"
                );
                aborted += 1;
            }
        }
    }
    assert_eq!(originals, [b"charge 1: 4999 EUR".to_vec()], "one original");
    assert_eq!(aborted + replayed, racers - 1);
    assert_eq!(effects.count(), 1, "one effect for {racers} calls");

    // Settled: a retry gets the kept answer, trailers and all (tonic reads
    // grpc-status 0 from them), marked as a replay.
    let retry = grpc::charge(channel.clone(), Some("grpc-1"), b"4999 EUR")
        .await
        .expect("a replay");
    assert_eq!(
        retry
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert_eq!(retry.get_ref(), b"charge 1: 4999 EUR");

    let reused = grpc::charge(channel.clone(), Some("grpc-1"), b"5000 EUR").await;
    let status = reused.expect_err("another payload under the key");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    let malformed = grpc::charge(channel.clone(), Some("two words"), b"1").await;
    assert_eq!(
        malformed.expect_err("a bad key").code(),
        tonic::Code::InvalidArgument
    );

    let unkeyed = grpc::charge(channel, None, b"1")
        .await
        .expect("passes through");
    assert_eq!(unkeyed.get_ref(), b"charge 2: 1");
    assert_eq!(effects.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_a_call_whose_caller_the_scope_cannot_name_is_unauthenticated_and_never_runs() {
    let effects = Effects::default();
    let account = idem::testing::unique_name("grpc-caller");
    let layer = IdempotencyLayer::new(gate().await).scope(bearer(&account));
    let channel = serve_grpc(layer, effects.clone()).await;
    let status = grpc::charge(channel.clone(), Some("anon-1"), b"1")
        .await
        .expect_err("no caller");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert_eq!(effects.count(), 0);
    let unkeyed = grpc::charge(channel, None, b"1")
        .await
        .expect("passes through");
    assert_eq!(unkeyed.get_ref(), b"charge 1: 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_an_unavailable_status_releases_the_key_so_the_retry_runs() {
    let effects = Effects::default();
    let channel = serve_grpc(
        IdempotencyLayer::new(gate().await).single_tenant(),
        effects.clone(),
    )
    .await;
    let flaky = |channel| grpc::call(channel, "/test.Charges/Flaky", Some("flaky-1"), b"x");
    let down = flaky(channel.clone())
        .await
        .expect_err("the first call fails");
    assert_eq!(down.code(), tonic::Code::Unavailable, "{down:?}");
    assert_eq!(
        down.message(),
        "the ledger is down",
        "the service's own status"
    );
    let retried = flaky(channel.clone()).await.expect("the retry runs");
    assert_eq!(retried.get_ref(), b"charge 2: x");
    assert!(retried.metadata().get("idempotent-replayed").is_none());
    let replayed = flaky(channel).await.expect("a replay");
    assert_eq!(replayed.get_ref(), b"charge 2: x");
    assert!(replayed.metadata().get("idempotent-replayed").is_some());
    assert_eq!(effects.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_503_or_unavailable_and_the_service_is_never_called() {
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let gate = Gate::connect(proxy.pool(2).await)
        .await
        .expect("idem's schema")
        .account(idem::testing::unique_name("outage"));
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate).single_tenant();
    let base = serve_axum(layer.clone(), effects.clone()).await;
    let channel = serve_grpc(layer, effects.clone()).await;
    proxy.cut().await;

    let down = Answer::of(
        reqwest::Client::new()
            .post(format!("{base}/charges"))
            .header("idempotency-key", "down-1")
            .body("a"),
    )
    .await;
    down.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable");
    assert_eq!(down.header("retry-after"), Some("5"));
    let status = grpc::charge(channel, Some("down-2"), b"a")
        .await
        .expect_err("the store is down");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(effects.count(), 0, "nothing ran unguarded");
}

// ------------------------------ red team: what each outcome of a policy leads to

/// Serves `/charges` (a 201 after a little effect) behind a single-tenant
/// layer with `policy`; sends the same keyed request twice and returns
/// both answers (the first `None` if it got none), the effects and the
/// claim's row.
async fn twice_under_policy(
    prefix: &str,
    policy: impl Fn(StatusCode) -> idem::Outcome + Send + Sync + 'static,
) -> (
    Option<crate::support::http::Read>,
    crate::support::http::Read,
    crate::support::http::Effects,
    Vec<(String, Option<String>)>,
) {
    use crate::support::http::{Effects, charges, gate, rows, send, serve, try_send};

    let (gate, account) = gate(prefix).await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate.clone())
        .single_tenant()
        .status_policy(policy);
    let (address, _server) = serve(charges(&effects, Duration::from_millis(20)).layer(layer)).await;
    let request = || {
        Request::post("/charges")
            .header("host", "127.0.0.1")
            .header("idempotency-key", "policy-1")
            .body(Full::new(Bytes::from_static(b"x")))
            .expect("a request")
    };
    let first = try_send(address, request()).await;
    // Whatever the first was told, its call has ended before the retry.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let retry = send(address, request()).await;
    let rows = rows(gate.pool(), &account).await;
    (first, retry, effects, rows)
}

/// `Failed(InDoubt)` from the policy: the first client gets the service's
/// response, the key is held in doubt, and the retry is a 409
/// `outcome-in-doubt` that does not run the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_s_in_doubt_holds_the_key_and_refuses_the_retry_as_in_doubt() {
    use idem::{Disposition, Outcome};
    let (first, retry, effects, rows) =
        twice_under_policy("policy-doubt", |_| Outcome::Failed(Disposition::InDoubt)).await;
    let first = first.expect("the first client is answered");
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert!(
        retry.problem_type().contains("outcome-in-doubt"),
        "{retry:?}"
    );
    assert!(!retry.replayed());
    assert_eq!(effects.started(), 1, "the retry did not run");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "in_doubt", "{rows:?}");
}

/// `Failed(Keep)` from the policy: the key is kept failed, and the retry is
/// a 409 `already-failed`, never the kept response nor a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_s_keep_refuses_the_retry_as_already_failed() {
    use idem::{Disposition, Outcome};
    let (first, retry, effects, rows) =
        twice_under_policy("policy-keep", |_| Outcome::Failed(Disposition::Keep)).await;
    assert_eq!(first.expect("answered").status, StatusCode::CREATED);
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert!(retry.problem_type().contains("already-failed"), "{retry:?}");
    assert_eq!(effects.started(), 1);
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["failed"]
    );
}

/// A status policy that panics after the service took its effect: idem
/// fails closed, as for a panicking body: the key is never released, and
/// the retry does not run the service again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_policy_that_panics_never_releases_a_key_whose_service_ran() {
    let (_first, retry, effects, rows) =
        twice_under_policy("policy-panics", |status| panic!("no policy for {status}")).await;
    assert_eq!(
        effects.started(),
        1,
        "the retry ran the service again: {retry:?}"
    );
    assert!(!retry.status.is_success(), "{retry:?}");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_ne!(rows[0].0, "success", "{rows:?}");
}
