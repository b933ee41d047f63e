//! The tower layer never lets a keyed request reach the handler
//! unguarded (src/http.md, "No route, no run": "A keyed request never
//! reaches the handler unguarded"), and refuses what it cannot route with
//! a problem response that names the fix.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::{any, post};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use idem::http::IdempotencyLayer;
use idem::testing;
use tower::{Layer, Service, ServiceExt};

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    content_type: String,
    body: String,
}

async fn call<S, B>(service: S, method: &str, path: &str, keys: &[&[u8]], body: &str) -> Answer
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body_util::BodyExt + axum::body::HttpBody<Data = bytes::Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut request = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("a method"))
        .uri(path)
        .header("host", "api.example");
    for key in keys {
        request = request.header(
            "idempotency-key",
            HeaderValue::from_bytes(key).expect("a value"),
        );
    }
    let request = request
        .body(Body::from(body.to_owned()))
        .expect("a request");
    let response = service.oneshot(request).await.expect("infallible");
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    let body = String::from_utf8_lossy(
        &http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("a body")
            .to_bytes(),
    )
    .into_owned();
    Answer {
        status,
        replayed,
        content_type,
        body,
    }
}

fn counting(
    calls: &Arc<AtomicUsize>,
) -> impl Fn() -> std::future::Ready<(StatusCode, String)> + Clone + use<> {
    let calls = calls.clone();
    move || {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready((StatusCode::CREATED, format!("effect {n}")))
    }
}

/// Either the request was refused (the handler never saw it), or it was
/// guarded: the same key again is replayed, and the handler ran once.
fn guarded_or_refused(case: &str, first: &Answer, second: &Answer, calls: usize) -> Option<String> {
    if calls == 0 {
        return None;
    }
    if calls == 1 && second.replayed && first.body == second.body {
        return None;
    }
    Some(format!(
        "{case}: a keyed request reached the handler unguarded ({calls} calls; first {first:?}, \
         retry {second:?}) (\"A keyed request never reaches the handler unguarded\")"
    ))
}

fn names_the_fix(case: &str, answer: &Answer) -> Option<String> {
    if answer.status == StatusCode::NOT_FOUND
        && answer.content_type.starts_with("application/problem+json")
        && answer.body.contains("no-route")
        && answer.body.contains("route")
    {
        None
    } else {
        Some(format!(
            "{case}: the refusal is not a problem response naming the fix: {answer:?}"
        ))
    }
}

/// Routers and services through which the layer finds no route template:
/// a layer around the whole router (`Layer::layer`), a fallback (before and
/// after the layer), `fallback_service`, `nest_service`, `merge`, a
/// `route_service`, and a bare `service_fn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_a_keyed_request_never_reaches_the_handler_unguarded() {
    let gate = testing::gate().await;
    let mut broken = Vec::new();
    let layer = || IdempotencyLayer::new(gate.clone()).single_tenant();

    type Build = Box<dyn Fn(&Arc<AtomicUsize>) -> Router>;
    let l1 = layer();
    let l2 = layer();
    let l3 = layer();
    let l4 = layer();
    let l5 = layer();
    let l6 = layer();
    let l7 = layer();
    let cases: Vec<(&str, &str, Build)> = vec![
        (
            "fallback (a handler), layer after it",
            "/nowhere",
            Box::new(move |c| {
                Router::new()
                    .route("/charges", post(|| async { "x" }))
                    .fallback(counting(c))
                    .layer(l1.clone())
            }),
        ),
        (
            "fallback_service",
            "/nowhere",
            Box::new(move |c| {
                let c = c.clone();
                Router::new()
                    .route("/charges", post(|| async { "x" }))
                    .fallback_service(tower::service_fn(move |_r: Request<Body>| {
                        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            Ok::<_, Infallible>(Response::new(Body::from(format!("effect {n}"))))
                        }
                    }))
                    .layer(l2.clone())
            }),
        ),
        (
            "nest_service",
            "/svc/deep/path",
            Box::new(move |c| {
                let c = c.clone();
                Router::new()
                    .nest_service(
                        "/svc",
                        tower::service_fn(move |_r: Request<Body>| {
                            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                            async move {
                                Ok::<_, Infallible>(Response::new(Body::from(format!(
                                    "effect {n}"
                                ))))
                            }
                        }),
                    )
                    .layer(l3.clone())
            }),
        ),
        (
            "route_service",
            "/rs",
            Box::new(move |c| {
                let c = c.clone();
                Router::new()
                    .route_service(
                        "/rs",
                        tower::service_fn(move |_r: Request<Body>| {
                            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                            async move {
                                Ok::<_, Infallible>(Response::new(Body::from(format!(
                                    "effect {n}"
                                ))))
                            }
                        }),
                    )
                    .layer(l4.clone())
            }),
        ),
        (
            "merge of a router with a fallback",
            "/nowhere",
            Box::new(move |c| {
                Router::new()
                    .route("/charges", post(|| async { "x" }))
                    .merge(Router::new().fallback(counting(c)))
                    .layer(l5.clone())
            }),
        ),
        (
            "any() on a wildcard",
            "/w/a/b/c",
            Box::new(move |c| {
                Router::new()
                    .route("/w/{*rest}", any(counting(c)))
                    .layer(l6.clone())
            }),
        ),
        (
            "nested router, its own fallback, layer outside",
            "/api/zzz",
            Box::new(move |c| {
                Router::new()
                    .nest(
                        "/api",
                        Router::new()
                            .route("/x", post(|| async { "x" }))
                            .fallback(counting(c)),
                    )
                    .layer(l7.clone())
            }),
        ),
    ];
    for (case, path, build) in cases {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = build(&calls);
        let key = testing::unique_name("k");
        let first = call(app.clone(), "POST", path, &[key.as_bytes()], "a").await;
        let second = call(app.clone(), "POST", path, &[key.as_bytes()], "a").await;
        let n = calls.load(Ordering::SeqCst);
        if let Some(b) = guarded_or_refused(case, &first, &second, n) {
            broken.push(b);
        }
        if n == 0 && first.status == StatusCode::NOT_FOUND {
            broken.extend(names_the_fix(case, &first));
        }
        eprintln!("layer: {case}: calls {n}, first {first:?}, retry {second:?}");
    }

    // A layer wrapped around a whole router, and a bare service_fn: no
    // templates at all.
    let calls = Arc::new(AtomicUsize::new(0));
    let router = Router::new().route("/charges", post(counting(&calls)));
    let wrapped = layer().layer(router);
    let key = testing::unique_name("k");
    let first = call(wrapped.clone(), "POST", "/charges", &[key.as_bytes()], "a").await;
    let second = call(wrapped.clone(), "POST", "/charges", &[key.as_bytes()], "a").await;
    let n = calls.load(Ordering::SeqCst);
    broken.extend(guarded_or_refused(
        "layer around a whole router",
        &first,
        &second,
        n,
    ));
    if n == 0 {
        broken.extend(names_the_fix("layer around a whole router", &first));
    }
    for method in ["POST", "PATCH"] {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let bare = layer().layer(tower::service_fn(
            move |_r: Request<idem::http::RequestBody<Body>>| {
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Ok::<_, Infallible>(Response::new(Body::from(format!("effect {n}")))) }
            },
        ));
        let key = testing::unique_name("k");
        let first = call(bare.clone(), method, "/jobs", &[key.as_bytes()], "a").await;
        let second = call(bare.clone(), method, "/jobs", &[key.as_bytes()], "a").await;
        let n = calls.load(Ordering::SeqCst);
        let case = format!("bare service_fn, {method}");
        broken.extend(guarded_or_refused(&case, &first, &second, n));
        if n == 0 {
            broken.extend(names_the_fix(&case, &first));
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// `.route(..)` returning what cannot be an action name (empty, NUL,
/// control characters, 100 kB): the request is guarded under it or
/// refused, never run unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_a_route_closure_returning_odd_names_never_runs_unguarded() {
    let gate = testing::gate().await;
    let mut broken = Vec::new();
    let odd: Vec<String> = vec![
        String::new(),
        "\0".into(),
        "POST /a\r\nx".into(),
        "x".repeat(100_000),
        "\u{202e}evil".into(),
    ];
    for route in odd {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let r = route.clone();
        let bare =
            IdempotencyLayer::new(gate.clone())
                .single_tenant()
                .route(move |_| r.clone())
                .layer(tower::service_fn(
                    move |_r: Request<idem::http::RequestBody<Body>>| {
                        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            Ok::<_, Infallible>(Response::new(Body::from(format!("effect {n}"))))
                        }
                    },
                ));
        let key = testing::unique_name("k");
        let first = call(bare.clone(), "POST", "/jobs", &[key.as_bytes()], "a").await;
        let second = call(bare.clone(), "POST", "/jobs", &[key.as_bytes()], "a").await;
        let case = format!("route {:?}", route.chars().take(12).collect::<String>());
        broken.extend(guarded_or_refused(
            &case,
            &first,
            &second,
            calls.load(Ordering::SeqCst),
        ));
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Keys the extractor refuses (src/http.md, Refusals: "a missing, repeated,
/// empty, over-long or non-visible-ASCII key is a 400 whose `detail` says
/// which") never reach the handler, routed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_hostile_keys_are_400_and_never_reach_the_handler() {
    let gate = testing::gate().await;
    let mut broken = Vec::new();
    let long = vec![b'a'; 256];
    let keys: Vec<(&str, Vec<&[u8]>)> = vec![
        ("empty", vec![b""]),
        ("obs-text byte 0x80", vec![b"ab\x80cd"]),
        ("byte 0xff", vec![b"\xff"]),
        ("a tab inside", vec![b"a\tb"]),
        ("a space inside", vec![b"a b"]),
        ("256 characters", vec![&long]),
        ("repeated, equal", vec![b"same", b"same"]),
        ("repeated, different", vec![b"one", b"two"]),
    ];
    for routed in [true, false] {
        for (what, key) in &keys {
            let calls = Arc::new(AtomicUsize::new(0));
            let app: Router = if routed {
                Router::new()
                    .route("/charges", post(counting(&calls)))
                    .layer(IdempotencyLayer::new(gate.clone()).single_tenant())
            } else {
                Router::new().route_service(
                    "/charges",
                    IdempotencyLayer::new(gate.clone())
                        .single_tenant()
                        .layer(Router::new().route("/charges", post(counting(&calls)))),
                )
            };
            let answer = call(app, "POST", "/charges", key, "a").await;
            let n = calls.load(Ordering::SeqCst);
            if n != 0 {
                broken.push(format!(
                    "routed {routed}, {what}: the handler ran ({answer:?})"
                ));
            }
            if routed && answer.status != StatusCode::BAD_REQUEST {
                broken.push(format!("routed {routed}, {what}: not a 400: {answer:?}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}
