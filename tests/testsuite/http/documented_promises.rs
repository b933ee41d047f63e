//! The tower layer (`IdempotencyLayer`) and detached guarded
//! calls: each test is named after the promise of the docs it attacks
//! (src/http.md, the layer's and `Detached`'s docs, docs/operations.md
//! "The tower layer"), through real servers on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::Full;
use idem::Gate;
use idem::http::IdempotencyLayer;
use idem::sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::support;
use crate::support::http::{
    Effects, Read, SETTLE_WAIT, charges, post_and_hold, rows, send, try_send,
};

async fn gate() -> (Gate, String) {
    support::http::gate("redteam").await
}

async fn serve(router: Router) -> SocketAddr {
    support::http::serve(router).await.0
}

fn post_to(path: &str, key: Option<&str>, _: ()) -> http::request::Builder {
    let mut builder = Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "text/plain");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
}

fn charge(key: &str, body: &str) -> Request<Full<Bytes>> {
    post_to("/charges", Some(key), ())
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a request")
}

/// Waits until no claim of `account` is pending (or the wait is over).
async fn settled_rows(pool: &PgPool, account: &str) -> Vec<(String, Option<String>)> {
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    loop {
        let rows = rows(pool, account).await;
        if rows.iter().all(|row| row.0 != "pending") || tokio::time::Instant::now() >= deadline {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ------------------------------------------------------------ panics

/// "A body that panics holds its claim in doubt (`body_panicked`)": through
/// the layer, an axum handler that panics after its effect.
#[tokio::test]
async fn a_panicking_handler_holds_its_key_in_doubt_and_never_runs_again() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move || {
                let effects = handler_effects.clone();
                async move {
                    effects.start();
                    if effects.started() > 0 {
                        panic!("the provider's reply did not parse");
                    }
                    StatusCode::CREATED
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;

    let first = try_send(address, charge("panic-1", "a")).await;
    assert!(
        first
            .as_ref()
            .is_none_or(|read| read.status.is_server_error()),
        "{first:?}"
    );
    let pool = idem::testing::pool().await;
    assert_eq!(
        settled_rows(&pool, &account).await,
        [(
            "in_doubt".to_owned(),
            Some(idem::detach::PANICKED.to_owned())
        )]
    );
    let retry = send(address, charge("panic-1", "a")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert_eq!(effects.started(), 1, "a key in doubt never runs again");
    // The server survived the panic.
    let _ = try_send(address, charge("panic-2", "b")).await;
    assert_eq!(
        effects.started(),
        2,
        "the server still serves after a panic"
    );
}

// ------------------------------------------------------ kept headers

/// "never a `Set-Cookie` meant for one client", "never those about one
/// delivery (`Date`, `Set-Cookie`, ...)"; the replay is marked, the first
/// is not.
#[tokio::test]
async fn set_cookie_and_date_reach_the_first_client_only_and_the_replay_is_marked() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move || {
                let effects = handler_effects.clone();
                async move {
                    let n = effects.start();
                    (
                        StatusCode::CREATED,
                        [
                            ("content-type", "application/json"),
                            ("location", "/charges/ch_1"),
                            ("set-cookie", "session=alice-secret"),
                            ("date", "Tue, 01 Dec 2026 00:00:00 GMT"),
                            ("x-request-id", "req-first"),
                        ],
                        format!("{{\"n\":{n}}}"),
                    )
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let first = send(address, charge("cookie-1", "a")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed(), "the first answer is not a replay");
    assert_eq!(first.headers["set-cookie"], "session=alice-secret");
    let replay = send(address, charge("cookie-1", "a")).await;
    assert!(replay.replayed());
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.headers["content-type"], "application/json");
    assert_eq!(replay.headers["location"], "/charges/ch_1");
    assert!(
        replay.headers.get("set-cookie").is_none(),
        "Set-Cookie replayed: {:?}",
        replay.headers
    );
    assert!(replay.headers.get("x-request-id").is_none());
    assert_ne!(
        replay.headers.get("date").map(HeaderValue::as_bytes),
        Some(&b"Tue, 01 Dec 2026 00:00:00 GMT"[..]),
        "the first delivery's Date replayed"
    );
    assert_eq!(effects.started(), 1);
}

// -------------------------------------------------------- body limit

/// "2 MiB at most by default: a larger one is a 413, and the service is
/// never called": exactly at the limit runs; one more byte, with a
/// Content-Length or chunked, is 413.
#[tokio::test]
async fn a_body_exactly_at_the_limit_runs_and_one_byte_more_is_413_never_run() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let app = charges(&effects, Duration::ZERO)
        .layer(IdempotencyLayer::new(gate).single_tenant().body_limit(16));
    let address = serve(app).await;

    let at = send(address, charge("limit-at", &"x".repeat(16))).await;
    assert_eq!(at.status, StatusCode::CREATED, "{at:?}");
    let over = send(address, charge("limit-over", &"x".repeat(17))).await;
    assert_eq!(over.status, StatusCode::PAYLOAD_TOO_LARGE, "{over:?}");

    // Chunked, no Content-Length: 10 + 7 bytes.
    let mut stream = TcpStream::connect(address).await.expect("the server");
    stream
        .write_all(
            b"POST /charges HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: limit-chunked\r\n\
              content-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
              a\r\nxxxxxxxxxx\r\n7\r\nxxxxxxx\r\n0\r\n\r\n",
        )
        .await
        .expect("written");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(effects.started(), 1, "only the body at the limit ran");
}

// ------------------------------------------------------- hostile keys

/// "a malformed or repeated key | 400 `invalid-idempotency-key`; the
/// service is not called".
#[tokio::test]
async fn hostile_keys_are_400_and_the_service_is_never_called() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let app = charges(&effects, Duration::ZERO).layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;

    let long = "k".repeat(8 * 1024);
    let keys: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b" ".to_vec(),
        long.into_bytes(),
        "k".repeat(256).into_bytes(),
        b"tab\there".to_vec(),
        b"space here".to_vec(),
        "caf\u{e9}".as_bytes().to_vec(),
        vec![0xff, 0xfe],
    ];
    for key in keys {
        let request = Request::post("/charges")
            .header("host", "127.0.0.1")
            .header(
                "idempotency-key",
                HeaderValue::from_bytes(&key).expect("a header value"),
            )
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request");
        let read = send(address, request).await;
        assert_eq!(
            read.status,
            StatusCode::BAD_REQUEST,
            "key {:?}: {read:?}",
            String::from_utf8_lossy(&key)
        );
        assert!(
            read.problem_type().contains("invalid-idempotency-key"),
            "{read:?}"
        );
    }
    let repeated = Request::post("/charges")
        .header("host", "127.0.0.1")
        .header("idempotency-key", "one")
        .header("idempotency-key", "two")
        .body(Full::new(Bytes::from_static(b"a")))
        .expect("a request");
    let read = send(address, repeated).await;
    assert_eq!(read.status, StatusCode::BAD_REQUEST, "{read:?}");
    assert_eq!(effects.started(), 0);
    let pool = idem::testing::pool().await;
    assert!(rows(&pool, &account).await.is_empty());
    // The longest accepted key (255) runs.
    let ok = send(address, charge(&"k".repeat(255), "a")).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{ok:?}");
}

// ---------------------------------------------------------- scope

/// "An account name that cannot be stored is refused with 400
/// `invalid-scope`"; "two callers never share a key"; never an outage.
#[tokio::test]
async fn odd_account_names_are_400_invalid_scope_or_their_own_never_an_outage() {
    let base = idem::testing::unique_name("odd");
    let effects = Effects::default();
    let prefix = base.clone();
    let layer = IdempotencyLayer::new(
        Gate::connect(idem::testing::pool_with(8).await)
            .await
            .expect("schema"),
    )
    .scope(move |parts| {
        let caller = parts.headers.get("x-caller")?.to_str().ok()?;
        Some(match caller {
            "nul" => format!("{prefix}\0nul"),
            "long" => format!("{prefix}{}", "x".repeat(2000)),
            "long-unicode" => format!("{prefix}{}", "\u{1f980}".repeat(300)),
            "ctrl" => format!("{prefix}\u{1}\u{7f}\n"),
            "empty" => String::new(),
            "zoe-umlaut" => format!("{prefix}Zo\u{eb}"),
            other => format!("{prefix}{other}"),
        })
    });
    let app = charges(&effects, Duration::ZERO).layer(layer);
    let address = serve(app).await;
    let as_caller = |caller: &str| {
        post_to("/charges", Some("odd-1"), ())
            .header("x-caller", caller)
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request")
    };
    for caller in ["nul", "long", "long-unicode"] {
        let read = send(address, as_caller(caller)).await;
        assert_eq!(read.status, StatusCode::BAD_REQUEST, "{caller}: {read:?}");
        assert!(read.problem_type().contains("invalid-scope"), "{read:?}");
    }
    assert_eq!(effects.started(), 0, "refused scopes never ran");
    let mut created = 0;
    for caller in ["ctrl", "zoe-umlaut", "Zoe", "zoe"] {
        let read = send(address, as_caller(caller)).await;
        assert_eq!(read.status, StatusCode::CREATED, "{caller}: {read:?}");
        assert!(!read.replayed(), "{caller} got another caller's response");
        created += 1;
    }
    assert_eq!(effects.started(), created);
    let empty = send(address, as_caller("empty")).await;
    assert!(
        empty.status == StatusCode::CREATED || empty.status.is_client_error(),
        "an empty account name is an error of the request at worst: {empty:?}"
    );
}

/// "two callers never share a key": fired at the same instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_callers_with_one_key_at_the_same_instant_each_run_once() {
    let base = idem::testing::unique_name("twins");
    let effects = Effects::default();
    let prefix = base.clone();
    let layer = IdempotencyLayer::new(
        Gate::connect(idem::testing::pool_with(8).await)
            .await
            .expect("schema"),
    )
    .scope(move |parts| {
        let caller = parts.headers.get("x-caller")?.to_str().ok()?;
        Some(format!("{prefix}-{caller}"))
    });
    let address = serve(charges(&effects, Duration::from_millis(50)).layer(layer)).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut calls = JoinSet::new();
    for i in 0..8 {
        let barrier = Arc::clone(&barrier);
        let caller = if i % 2 == 0 { "alice" } else { "bob" };
        calls.spawn(async move {
            let request = post_to("/charges", Some("order-1001"), ())
                .header("x-caller", caller)
                .body(Full::new(Bytes::from_static(b"a")))
                .expect("a request");
            barrier.wait().await;
            (caller, send(address, request).await)
        });
    }
    let answers = calls.join_all().await;
    for caller in ["alice", "bob"] {
        let originals = answers
            .iter()
            .filter(|(who, read)| {
                *who == caller && read.status == StatusCode::CREATED && !read.replayed()
            })
            .count();
        assert_eq!(originals, 1, "{caller}: {answers:?}");
    }
    assert_eq!(effects.started(), 2, "one effect per caller");
}

/// "Requests without a key pass through as ever"; only a request *with a
/// key* of a guarded method is refused 401; a GET with a key passes.
#[tokio::test]
async fn no_caller_is_401_only_for_a_guarded_request_with_a_key() {
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(
        Gate::connect(idem::testing::pool_with(4).await)
            .await
            .expect("schema"),
    )
    .scope(|_| None);
    let app = charges(&effects, Duration::ZERO)
        .route("/charges", axum::routing::get(|| async { "list" }))
        .layer(layer);
    let address = serve(app).await;
    let with_key = send(address, charge("anon-1", "a")).await;
    assert_eq!(with_key.status, StatusCode::UNAUTHORIZED);
    let without = send(
        address,
        post_to("/charges", None, ())
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request"),
    )
    .await;
    assert_eq!(without.status, StatusCode::CREATED);
    let get = send(
        address,
        Request::get("/charges")
            .header("host", "127.0.0.1")
            .header("idempotency-key", "anon-2")
            .body(Full::new(Bytes::new()))
            .expect("a request"),
    )
    .await;
    assert_eq!(get.status, StatusCode::OK, "{get:?}");
    assert_eq!(effects.started(), 1);
}

// ------------------------------------------------- detached calls

/// "the layer reads the body ..., claims the key ..., calls the service
/// only if the claim is won": a client that disconnects during its upload
/// claims nothing and never runs; its full retry runs.
#[tokio::test]
async fn a_client_that_disconnects_during_upload_claims_nothing_and_its_retry_runs() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let address =
        serve(charges(&effects, Duration::ZERO).layer(IdempotencyLayer::new(gate).single_tenant()))
            .await;
    let mut stream = TcpStream::connect(address).await.expect("the server");
    stream
        .write_all(
            b"POST /charges HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: upload-1\r\n\
              content-type: text/plain\r\ncontent-length: 100\r\n\r\namount=5",
        )
        .await
        .expect("written");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pool = idem::testing::pool().await;
    assert!(
        rows(&pool, &account).await.is_empty(),
        "a half upload claimed"
    );
    assert_eq!(effects.started(), 0);
    let retry = send(address, charge("upload-1", "amount=500")).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(effects.started(), 1);
}

/// "A run that begins after this [shutdown] was called claims nothing and
/// is refused `InFlight` (retry later, at another instance)": through the
/// layer, while an older call still runs in its grace.
#[tokio::test]
async fn a_request_that_arrives_during_shutdown_claims_nothing_and_never_runs() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate).single_tenant();
    let address = serve(charges(&effects, Duration::from_millis(800)).layer(layer.clone())).await;
    let first = tokio::spawn(send(address, charge("shut-1", "a")));
    effects.began().await;
    let calls = layer.detached_calls();
    let shutdown = tokio::spawn(async move { calls.shutdown(SETTLE_WAIT).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late = send(address, charge("shut-2", "b")).await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");
    assert!(late.headers.contains_key("retry-after"), "{late:?}");
    let stopped = shutdown.await.expect("the shutdown");
    assert_eq!(stopped.held_in_doubt, 0);
    let first = first.await.expect("the first client");
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "the running call finished in its grace"
    );
    assert_eq!(effects.started(), 1, "the late request never ran");
    let pool = idem::testing::pool().await;
    assert_eq!(rows(&pool, &account).await, [("success".to_owned(), None)]);
    // After the shutdown, still nothing is claimed.
    let after = send(address, charge("shut-3", "c")).await;
    assert_eq!(after.status, StatusCode::CONFLICT, "{after:?}");
    assert_eq!(effects.started(), 1);
}

/// "It may run on for a bound *after its client left*": a body slower
/// than the bound whose client waits is never stopped.
#[tokio::test]
async fn the_bound_never_stops_a_body_whose_client_is_still_waiting() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .detached(idem::Detached::with_bound(Duration::from_millis(100)));
    let address = serve(charges(&effects, Duration::from_millis(600)).layer(layer)).await;
    let read = send(address, charge("bound-wait", "a")).await;
    assert_eq!(read.status, StatusCode::CREATED, "{read:?}");
    let pool = idem::testing::pool().await;
    assert_eq!(rows(&pool, &account).await, [("success".to_owned(), None)]);
    assert_eq!((effects.started(), effects.finished()), (1, 1));
}

/// "From the moment the caller left, the body has `detached`'s bound to
/// finish": a body that already ran past the bound when its client left
/// still gets the bound from then.
#[tokio::test]
async fn the_bound_counts_from_when_the_client_left_not_from_the_start() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .detached(idem::Detached::with_bound(Duration::from_millis(700)));
    let address = serve(charges(&effects, Duration::from_millis(1000)).layer(layer)).await;
    let stream = post_and_hold(address, "bound-late", "a").await;
    effects.began().await;
    tokio::time::sleep(Duration::from_millis(750)).await;
    drop(stream);
    let pool = idem::testing::pool().await;
    assert_eq!(
        settled_rows(&pool, &account).await,
        [("success".to_owned(), None)]
    );
    assert_eq!((effects.started(), effects.finished()), (1, 1));
}

/// "a duplicate, the first still running | 409 `in-flight`, `Retry-After:
/// 1`", while the first runs detached (its client gone); then the replay.
#[tokio::test]
async fn a_duplicate_of_a_detached_call_is_409_retry_after_then_the_replay() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let address = serve(
        charges(&effects, Duration::from_millis(600))
            .layer(IdempotencyLayer::new(gate).single_tenant()),
    )
    .await;
    let stream = post_and_hold(address, "dup-1", "a").await;
    effects.began().await;
    drop(stream);
    let duplicate = send(address, charge("dup-1", "a")).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    assert_eq!(duplicate.headers["retry-after"], "1");
    assert!(
        duplicate.problem_type().contains("in-flight"),
        "{duplicate:?}"
    );
    let pool = idem::testing::pool().await;
    assert_eq!(
        settled_rows(&pool, &account).await,
        [("success".to_owned(), None)]
    );
    let replay = send(address, charge("dup-1", "a")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, "charge 1 of a");
    assert_eq!(effects.started(), 1);
}

/// "a wait (so that a duplicate in flight waits for the answer instead of
/// a 409)": the first's client gone, the duplicate waits and is answered.
#[tokio::test]
async fn with_a_wait_a_duplicate_of_a_detached_call_gets_the_replay() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_secs(10));
    let address = serve(charges(&effects, Duration::from_millis(600)).layer(layer)).await;
    let stream = post_and_hold(address, "dupw-1", "a").await;
    effects.began().await;
    drop(stream);
    let duplicate = send(address, charge("dupw-1", "a")).await;
    assert_eq!(duplicate.status, StatusCode::CREATED, "{duplicate:?}");
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, "charge 1 of a");
    assert_eq!(effects.started(), 1);
}

/// "A duplicate in flight waits up to `wait` for the first call's answer
/// (and gets it) instead of a 409": bounded. Past its wait, a duplicate of
/// a call still running is the default's answer, a 409 `in-flight` with
/// `Retry-After`, and the call it waited on is untouched.
#[tokio::test]
async fn past_its_wait_a_duplicate_in_flight_is_still_a_409_with_retry_after() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let wait = Duration::from_millis(300);
    let layer = IdempotencyLayer::new(gate).single_tenant().wait(wait);
    let address = serve(charges(&effects, Duration::from_secs(3)).layer(layer)).await;
    let stream = post_and_hold(address, "waited-1", "a").await;
    effects.began().await;
    let asked = std::time::Instant::now();
    let duplicate = send(address, charge("waited-1", "a")).await;
    assert!(asked.elapsed() >= wait, "it waited: {:?}", asked.elapsed());
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    assert_eq!(duplicate.headers["retry-after"], "1");
    assert!(
        duplicate.problem_type().contains("in-flight"),
        "{duplicate:?}"
    );
    drop(stream);
    assert_eq!(effects.started(), 1);
}

/// "returns once every claim is recorded. Never releases a claim whose
/// body started": many calls in flight, clients gone, a short grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_with_many_calls_in_flight_leaves_none_pending_and_releases_none() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate).single_tenant();
    let address = serve(charges(&effects, Duration::from_secs(30)).layer(layer.clone())).await;
    let mut streams = Vec::new();
    for i in 0..6 {
        streams.push(post_and_hold(address, &format!("many-{i}"), "a").await);
    }
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    while effects.started() < 6 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Half the clients leave, half still wait.
    streams.truncate(3);
    let stopped = layer
        .detached_calls()
        .shutdown(Duration::from_millis(200))
        .await;
    assert_eq!(stopped.held_in_doubt, 6, "{stopped:?}");
    assert_eq!(layer.detached_calls().running(), 0);
    let pool = idem::testing::pool().await;
    let rows = rows(&pool, &account).await;
    assert_eq!(rows.len(), 6, "{rows:?}");
    for row in rows {
        assert_eq!(
            row,
            (
                "in_doubt".to_owned(),
                Some(idem::detach::AT_SHUTDOWN.to_owned())
            )
        );
    }
    drop(streams);
}

// ---------------------------------------------------------- statuses

/// "every other answer is kept and replayed": a matched route's own 404.
#[tokio::test]
async fn a_handlers_own_404_on_a_matched_route_is_kept_and_replayed() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let app = Router::new()
        .route(
            "/charges/{id}",
            post(move || {
                let effects = handler_effects.clone();
                async move {
                    effects.start();
                    (StatusCode::NOT_FOUND, "no such card")
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let request = || {
        post_to("/charges/c1", Some("nf-1"), ())
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request")
    };
    let first = send(address, request()).await;
    assert_eq!(first.status, StatusCode::NOT_FOUND);
    let replay = send(address, request()).await;
    assert_eq!(replay.status, StatusCode::NOT_FOUND);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(effects.started(), 1);
}

/// "The inner service returning an error instead of a response releases
/// the key": a bare tower service whose first call fails.
#[tokio::test]
async fn an_inner_service_error_releases_the_key_so_the_retry_runs() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;

    let (gate, account) = gate().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let inner = tower::service_fn(
        move |_request: Request<idem::http::RequestBody<hyper::body::Incoming>>| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 1 {
                    Err::<http::Response<Full<Bytes>>, std::io::Error>(std::io::Error::other(
                        "the inner service broke",
                    ))
                } else {
                    Ok(http::Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from(format!("call {n}"))))
                        .expect("a response"))
                }
            }
        },
    );
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .route(|parts| format!("{} /charges", parts.method));
    let service = tower::Layer::layer(&layer, inner);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let first = try_send(address, charge("err-1", "a")).await;
    assert!(first.is_none(), "{first:?}");
    let pool = idem::testing::pool().await;
    let after_error = settled_rows(&pool, &account).await;
    assert!(
        after_error
            .iter()
            .all(|row| row.0 != "pending" && row.0 != "in_doubt"),
        "{after_error:?}"
    );
    let retry = send(address, charge("err-1", "a")).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// ------------------------------------------------------------- routes

/// A keyed request that matched no axum route is refused 404 `no-route`
/// and not stored: a nested router's fallback (which may have effects) is
/// never called with it.
#[tokio::test]
async fn a_nested_routers_fallback_never_runs_a_keyed_request_nor_stores_it() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let fallback_hits = Arc::new(AtomicUsize::new(0));
    let hits = Arc::clone(&fallback_hits);
    let api = charges(&effects, Duration::ZERO).fallback(move || {
        let hits = Arc::clone(&hits);
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            (StatusCode::NOT_FOUND, "nothing here")
        }
    });
    let app = Router::new()
        .nest("/api", api)
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    for path in ["/api/made-up-1", "/api/made-up-2/x", "/nowhere"] {
        let read = send(
            address,
            post_to(path, Some("fb-1"), ())
                .body(Full::new(Bytes::from_static(b"a")))
                .expect("a request"),
        )
        .await;
        assert_eq!(read.status, StatusCode::NOT_FOUND, "{path}: {read:?}");
        assert!(!read.replayed(), "{path}: {read:?}");
    }
    let pool = idem::testing::pool().await;
    let stored: Vec<String> = idem::sqlx::query_scalar::<_, Vec<u8>>(
        "SELECT identity FROM idem_records WHERE account = $1",
    )
    .bind(&account)
    .fetch_all(&pool)
    .await
    .expect("the rows")
    .iter()
    .map(|canonical| {
        idem::Identity::from_canonical(canonical)
            .expect("a canonical identity")
            .action()
            .to_owned()
    })
    .collect();
    assert!(stored.is_empty(), "made-up paths were stored: {stored:?}");
    assert_eq!(
        fallback_hits.load(Ordering::SeqCst),
        0,
        "the layer answered the keyed requests; the fallback never ran"
    );
    // The real route is guarded.
    let real = send(
        address,
        post_to("/api/charges", Some("fb-2"), ())
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request"),
    )
    .await;
    assert_eq!(real.status, StatusCode::CREATED);
    assert_eq!(rows(&pool, &account).await.len(), 1);
}

// --------------------------------------------------------------- gRPC

/// An axum route answering as a gRPC server would: HTTP 200, the status in
/// the headers (trailers-only) or the trailers.
fn grpc_route(effects: &Effects, status: &'static str, in_trailers: bool) -> Router {
    use http_body_util::StreamBody;
    let effects = effects.clone();
    Router::new().route(
        "/pkg.Payments/Charge",
        post(move || {
            let effects = effects.clone();
            async move {
                effects.start();
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static(status));
                let mut builder = http::Response::builder()
                    .status(200)
                    .header("content-type", "application/grpc");
                let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> =
                    if in_trailers {
                        vec![
                            Ok(hyper::body::Frame::data(Bytes::from_static(
                                b"\0\0\0\0\x01z",
                            ))),
                            Ok(hyper::body::Frame::trailers(trailers)),
                        ]
                    } else {
                        builder = builder.header("grpc-status", status);
                        vec![]
                    };
                builder
                    .body(axum::body::Body::new(StreamBody::new(
                        futures_util::stream::iter(frames),
                    )))
                    .expect("a response")
            }
        }),
    )
}

fn grpc_call(key: &str, content_type: &str) -> Request<Full<Bytes>> {
    Request::post("/pkg.Payments/Charge")
        .header("host", "127.0.0.1")
        .header("content-type", content_type)
        .header("te", "trailers")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x01a")))
        .expect("a request")
}

/// "`INVALID_ARGUMENT` ... (400: the request was refused) ... release the
/// key": in a trailers-only response (the status in the headers).
#[tokio::test]
async fn grpc_a_trailers_only_invalid_argument_releases_the_key() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let address =
        serve(grpc_route(&effects, "3", false).layer(IdempotencyLayer::new(gate).single_tenant()))
            .await;
    let first = send(address, grpc_call("g-1", "application/grpc")).await;
    assert_eq!(first.headers["grpc-status"], "3", "{first:?}");
    let retry = send(address, grpc_call("g-1", "application/grpc")).await;
    assert!(!retry.replayed(), "{retry:?}");
    assert_eq!(effects.started(), 2, "the key was released, the retry ran");
}

/// "A gRPC response is judged by its `grpc-status`": with the media type
/// written in capitals (media types are case-insensitive, RFC 9110 8.3.1),
/// an `INTERNAL` in the trailers must release the key, not be replayed.
#[tokio::test]
async fn grpc_a_content_type_in_capitals_is_still_judged_by_its_grpc_status() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let address =
        serve(grpc_route(&effects, "13", true).layer(IdempotencyLayer::new(gate).single_tenant()))
            .await;
    let first = send(address, grpc_call("gc-1", "Application/gRPC")).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let retry = send(address, grpc_call("gc-1", "Application/gRPC")).await;
    assert!(
        !retry.replayed(),
        "an INTERNAL gRPC answer was kept and replayed: {retry:?}"
    );
    assert_eq!(effects.started(), 2);
}

// ------------------------------------------------------------ trailers

/// "the kept ones (those named by `keep_headers`) [reach] the replays":
/// and only those.
#[tokio::test]
async fn a_trailer_not_kept_reaches_the_first_client_only() {
    use http_body_util::StreamBody;
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let app =
        Router::new()
            .route(
                "/charges",
                post(move || {
                    let effects = handler_effects.clone();
                    async move {
                        effects.start();
                        let mut trailers = HeaderMap::new();
                        trailers.insert("etag", HeaderValue::from_static("\"v1\""));
                        trailers
                            .insert("x-session-token", HeaderValue::from_static("alice-secret"));
                        let frames: Vec<
                            Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
                        > = vec![
                            Ok(hyper::body::Frame::data(Bytes::from_static(b"done"))),
                            Ok(hyper::body::Frame::trailers(trailers)),
                        ];
                        http::Response::builder()
                            .status(201)
                            .header("trailer", "etag, x-session-token")
                            .body(axum::body::Body::new(StreamBody::new(
                                futures_util::stream::iter(frames),
                            )))
                            .expect("a response")
                    }
                }),
            )
            .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let with_te = |key: &str| {
        post_to("/charges", Some(key), ())
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request")
    };
    let first = send(address, with_te("tr-1")).await;
    let first_trailers = first.trailers.clone().unwrap_or_default();
    assert_eq!(
        first_trailers["x-session-token"], "alice-secret",
        "{first:?}"
    );
    let replay = send(address, with_te("tr-1")).await;
    assert!(replay.replayed());
    let trailers = replay.trailers.clone().unwrap_or_default();
    assert_eq!(
        trailers.get("etag").map(HeaderValue::as_bytes),
        Some(&b"\"v1\""[..]),
        "{replay:?}"
    );
    assert!(trailers.get("x-session-token").is_none(), "{replay:?}");
    assert!(
        replay.headers.get("trailer").is_none_or(|value| !value
            .to_str()
            .unwrap_or_default()
            .contains("x-session-token")),
        "the replay announces a trailer it does not send: {replay:?}"
    );
    assert_eq!(effects.started(), 1);
}

// ------------------------------------------------- shutdown and waits

/// "`shutdown(grace)` waits for the guarded calls still running, up to
/// `grace`, and holds the rest in doubt": a duplicate that waits (`Mode::
/// wait`) for a call running at another instance is no call of this one
/// to wait for past the grace. (A liveness bound, far from the grace and
/// far below the wait: not a speed assertion.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_is_not_held_past_its_grace_by_a_duplicate_waiting_for_another_instance() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    // Instance A runs the original, for long.
    let a = IdempotencyLayer::new(gate.clone()).single_tenant();
    let a_address = serve(charges(&effects, Duration::from_secs(30)).layer(a.clone())).await;
    // Instance B's duplicates wait up to 60 s for it.
    let b = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_secs(60));
    let b_address = serve(charges(&effects, Duration::from_secs(30)).layer(b.clone())).await;

    let _original = post_and_hold(a_address, "wait-shut", "a").await;
    effects.began().await;
    let waiting = tokio::spawn(try_send(b_address, charge("wait-shut", "a")));
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    while b.detached_calls().running() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.detached_calls().running(), 1, "B's duplicate is waiting");
    let shutdown = tokio::time::timeout(
        Duration::from_secs(3),
        b.detached_calls().shutdown(Duration::from_millis(200)),
    )
    .await;
    assert!(
        shutdown.is_ok(),
        "B's shutdown(200 ms) was still waiting after 3 s, for a duplicate that waits 60 s \
         for A's call"
    );
    waiting.abort();
    let _ = a
        .detached_calls()
        .shutdown(Duration::from_millis(100))
        .await;
    let pool = idem::testing::pool().await;
    assert_eq!(effects.started(), 1, "{:?}", rows(&pool, &account).await);
}

// ------------------------------------------------------------- HTTP/2

/// "A guarded call runs to completion when its client disconnects": over
/// HTTP/2, a client that cancels its stream (RST_STREAM) on a connection
/// that stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_reset_mid_body_does_not_cancel_the_call() {
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let (gate, account) = gate().await;
    let effects = Effects::default();
    let address = serve(
        charges(&effects, Duration::from_millis(600))
            .layer(IdempotencyLayer::new(gate).single_tenant()),
    )
    .await;
    let stream = TcpStream::connect(address).await.expect("the server");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("an HTTP/2 handshake");
    tokio::spawn(connection);
    let h2 = |key: &str| {
        Request::post(format!("http://{address}/charges"))
            .header("idempotency-key", key)
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"amount=2")))
            .expect("a request")
    };
    let pending = sender.send_request(h2("h2-1"));
    let cancelled = tokio::time::timeout(Duration::from_millis(200), pending).await;
    assert!(cancelled.is_err(), "the call answered before the reset");
    // The reset stream: its future dropped, the connection kept.
    let pool = idem::testing::pool().await;
    assert_eq!(
        settled_rows(&pool, &account).await,
        [("success".to_owned(), None)]
    );
    assert_eq!((effects.started(), effects.finished()), (1, 1));
    let retry = sender.send_request(h2("h2-1")).await.expect("a response");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(effects.started(), 1);
}

// ----------------------------------------------------- kept bodies

/// "the kept response back byte for byte": bodies PostgreSQL's text and
/// jsonb cannot hold as they are (a NUL, which is valid UTF-8; bytes that
/// are no UTF-8; an escape-looking text), and one large body the client
/// stops reading half-way.
#[tokio::test]
async fn bodies_with_nul_and_non_utf8_bytes_are_replayed_byte_for_byte() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move |body: Bytes| {
                let effects = handler_effects.clone();
                async move {
                    effects.start();
                    let answer: Vec<u8> = match &body[..] {
                        b"nul" => b"a\0b".to_vec(),
                        b"bytes" => vec![0xff, 0x00, 0xfe, 0x80],
                        b"escape" => br#"\u0000 "\" \\ \n"#.to_vec(),
                        _ => vec![b'z'; 1024 * 1024],
                    };
                    (StatusCode::CREATED, answer)
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    for body in ["nul", "bytes", "escape"] {
        let key = format!("bytes-{body}");
        let first = send(address, charge(&key, body)).await;
        assert_eq!(first.status, StatusCode::CREATED, "{body}: {first:?}");
        let replay = send(address, charge(&key, body)).await;
        assert!(replay.replayed(), "{body}: {replay:?}");
        assert_eq!(replay.status, StatusCode::CREATED);
        assert_eq!(replay.body, first.body, "{body}");
    }
    // A large answer whose client reads its head and leaves.
    let mut stream = post_and_hold(address, "big-1", "big").await;
    let mut head = [0u8; 64];
    let _ = stream.read(&mut head).await;
    drop(stream);
    let pool = idem::testing::pool().await;
    let settled = settled_rows(&pool, &account).await;
    assert!(settled.iter().all(|row| row.0 == "success"), "{settled:?}");
    let replay = send(address, charge("big-1", "big")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body.len(), 1024 * 1024);
    assert_eq!(effects.started(), 4);
}

/// A weakness more than a written promise: "Won during shutdown, the body
/// not begun: nothing happened, so the slot is free again" has no
/// counterpart for the bound. A duplicate whose client left while it
/// waited (`Mode::wait`) wins the key after its bound ran out, and its
/// body is begun only to be stopped at its first `.await` and held in
/// doubt: an effect started for a client long gone, for nothing.
#[tokio::test]
async fn a_body_whose_bound_ran_out_before_it_began_is_never_begun() {
    let (gate, account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_secs(10))
        .detached(idem::Detached::with_bound(Duration::from_millis(100)));
    let app = Router::new()
        .route(
            "/charges",
            post(move || {
                let effects = handler_effects.clone();
                async move {
                    let n = effects.start();
                    if n == 1 {
                        tokio::time::sleep(Duration::from_millis(800)).await;
                        return (StatusCode::SERVICE_UNAVAILABLE, "try again");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    effects.finish();
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .layer(layer.clone());
    let address = serve(app).await;
    let first = tokio::spawn(send(address, charge("late-1", "a")));
    effects.began().await;
    // The duplicate waits for the first, then its client leaves.
    let duplicate = post_and_hold(address, "late-1", "a").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(duplicate);
    assert_eq!(
        first.await.expect("the first").status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    while layer.detached_calls().running() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pool = idem::testing::pool().await;
    let settled = settled_rows(&pool, &account).await;
    assert!(
        effects.started() == 1 || effects.finished() == 1,
        "a body begun past its bound and stopped at once: started {}, finished {}, {settled:?}",
        effects.started(),
        effects.finished()
    );
}

/// "Trailers the service sends reach the first client, and the kept ones
/// ... the replays, announced in a `Trailer` header": a service that sends
/// trailers without announcing them (as gRPC servers and most bodies do),
/// to an HTTP/1.1 client that asked for them (`TE: trailers`).
#[tokio::test]
async fn unannounced_trailers_reach_the_first_http1_client_too() {
    use http_body_util::StreamBody;
    let (gate, _account) = gate().await;
    let app = Router::new()
        .route(
            "/charges",
            post(|| async {
                let mut trailers = HeaderMap::new();
                trailers.insert("etag", HeaderValue::from_static("\"v2\""));
                let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = vec![
                    Ok(hyper::body::Frame::data(Bytes::from_static(b"done"))),
                    Ok(hyper::body::Frame::trailers(trailers)),
                ];
                http::Response::builder()
                    .status(201)
                    .body(axum::body::Body::new(StreamBody::new(
                        futures_util::stream::iter(frames),
                    )))
                    .expect("a response")
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let with_te = || {
        post_to("/charges", Some("unannounced-1"), ())
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request")
    };
    let first = send(address, with_te()).await;
    let replay = send(address, with_te()).await;
    assert!(replay.replayed());
    assert_eq!(
        replay
            .trailers
            .as_ref()
            .and_then(|t| t.get("etag"))
            .map(HeaderValue::as_bytes),
        Some(&b"\"v2\""[..]),
        "the replay: {replay:?}"
    );
    assert_eq!(
        first
            .trailers
            .as_ref()
            .and_then(|t| t.get("etag"))
            .map(HeaderValue::as_bytes),
        Some(&b"\"v2\""[..]),
        "the first client lost the trailers the replays get: {first:?}"
    );
}

/// "A request whose content type is `application/grpc*` is refused with a
/// gRPC status in a trailers-only response (... `INVALID_ARGUMENT` for a
/// bad key or one reused, `RESOURCE_EXHAUSTED` over the limit, `ABORTED` in
/// flight ...)", never problem+json.
#[tokio::test]
async fn grpc_refusals_are_grpc_statuses_in_trailers_only_responses() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let slow = effects.clone();
    let app = Router::new()
        .route(
            "/pkg.Payments/Charge",
            post(move || {
                let effects = slow.clone();
                async move {
                    effects.start();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc")
                        .header("grpc-status", "0")
                        .body(axum::body::Body::empty())
                        .expect("a response")
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant().body_limit(8));
    let address = serve(app).await;
    let call = |key: &[u8], body: &'static [u8]| {
        Request::post("/pkg.Payments/Charge")
            .header("host", "127.0.0.1")
            .header("content-type", "application/grpc+proto")
            .header(
                "idempotency-key",
                HeaderValue::from_bytes(key).expect("a value"),
            )
            .body(Full::new(Bytes::from_static(body)))
            .expect("a request")
    };
    let status_of = |read: &Read| {
        read.headers
            .get("grpc-status")
            .or_else(|| read.trailers.as_ref().and_then(|t| t.get("grpc-status")))
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let bad_key = send(address, call(b"a key", b"x")).await;
    assert_eq!(status_of(&bad_key).as_deref(), Some("3"), "{bad_key:?}");
    let too_large = send(address, call(b"big", b"123456789")).await;
    assert_eq!(status_of(&too_large).as_deref(), Some("8"), "{too_large:?}");
    let first = tokio::spawn(send(address, call(b"g-inflight", b"x")));
    effects.began().await;
    let in_flight = send(address, call(b"g-inflight", b"x")).await;
    assert_eq!(
        status_of(&in_flight).as_deref(),
        Some("10"),
        "{in_flight:?}"
    );
    let reused = send(address, call(b"g-inflight", b"y")).await;
    assert!(
        matches!(status_of(&reused).as_deref(), Some("3" | "10")),
        "{reused:?}"
    );
    assert_eq!(
        status_of(&first.await.expect("the first")).as_deref(),
        Some("0")
    );
    let reused = send(address, call(b"g-inflight", b"y")).await;
    assert_eq!(status_of(&reused).as_deref(), Some("3"), "{reused:?}");
    for read in [&bad_key, &too_large, &in_flight, &reused] {
        assert_eq!(
            read.status,
            StatusCode::OK,
            "gRPC refusals are HTTP 200: {read:?}"
        );
        assert!(
            read.headers["content-type"]
                .to_str()
                .is_ok_and(|value| value.starts_with("application/grpc")),
            "{read:?}"
        );
    }
    assert_eq!(effects.started(), 1);
}

/// "2 MiB at most by default ... a router behind the layer is refused
/// nothing it would have accepted": exactly 2 MiB runs, one byte more is
/// 413.
#[tokio::test]
async fn the_default_limit_is_exactly_two_mebibytes() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let app = charges(&effects, Duration::ZERO).layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let limit = IdempotencyLayer::DEFAULT_BODY_LIMIT;
    assert_eq!(limit, 2 * 1024 * 1024);
    let at = send(address, charge("two-mib", &"x".repeat(limit))).await;
    assert_eq!(at.status, StatusCode::CREATED, "{:?}", at.status);
    let over = send(address, charge("two-mib-1", &"x".repeat(limit + 1))).await;
    assert_eq!(over.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(effects.started(), 1);
}

/// "It may run on for a bound after its client left, then it is stopped"
/// (a run is "claiming, running, or recording", `Detached::running`): a
/// duplicate that waits (`Mode::wait`) for another instance's call is not
/// stopped at its bound once its client left; it runs on for its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_whose_client_left_is_stopped_at_its_bound() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let a = IdempotencyLayer::new(gate.clone()).single_tenant();
    let a_address = serve(charges(&effects, Duration::from_secs(30)).layer(a.clone())).await;
    let b = IdempotencyLayer::new(gate)
        .single_tenant()
        .wait(Duration::from_secs(60))
        .detached(idem::Detached::with_bound(Duration::from_millis(100)));
    let b_address = serve(charges(&effects, Duration::from_secs(30)).layer(b.clone())).await;

    let _original = post_and_hold(a_address, "wait-bound", "a").await;
    effects.began().await;
    let duplicate = post_and_hold(b_address, "wait-bound", "a").await;
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    while b.detached_calls().running() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(duplicate);
    // Twenty bounds later (a liveness bound, not a speed assertion).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = b.detached_calls().running();
    let _ = a.detached_calls().shutdown(Duration::from_millis(50)).await;
    assert_eq!(
        still, 0,
        "B's duplicate ran on 2 s after its client left, past its 100 ms bound"
    );
}

// ------------------------------------------------------------- outages

/// "the store unreachable | 503 `store-unavailable`; the service is not
/// called": the store lost *after* the service ran (its settle cannot be
/// written). The client must not be told the service was not called, and
/// the retry must not run it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_lost_after_the_service_ran_is_not_answered_as_never_called() {
    use idem_test_support::fault_proxy::Proxy;

    let proxy = Arc::new(Proxy::start().await);
    let account = idem::testing::unique_name("lost-settle");
    let gate = Gate::connect(proxy.pool(4).await)
        .await
        .expect("schema")
        .account(account.clone());
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let cutter = Arc::clone(&proxy);
    let app = Router::new()
        .route(
            "/charges",
            post(move || {
                let effects = handler_effects.clone();
                let proxy = Arc::clone(&cutter);
                async move {
                    let n = effects.start();
                    if n == 1 {
                        proxy.cut().await;
                        let resumer = Arc::clone(&proxy);
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            resumer.cut_for(Duration::ZERO).await;
                        });
                    }
                    effects.finish();
                    (StatusCode::CREATED, format!("charge {n}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let first = send(address, charge("lost-1", "a")).await;
    assert_eq!(effects.started(), 1);
    assert!(
        !(first.status == StatusCode::SERVICE_UNAVAILABLE
            && first.problem_type().contains("store-unavailable")),
        "the service ran, yet its client was told the store was unavailable (\"the service is \
         not called\"): {first:?}"
    );
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let retry = send(address, charge("lost-1", "a")).await;
    assert_ne!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(
        effects.started(),
        1,
        "the retry ran the service again: {retry:?}"
    );
}

/// "A body that panics holds its claim in doubt ... and the panic is
/// resumed in its caller, *if still there*": a handler that panics after
/// an outer timeout gave up on it takes nothing else down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_after_its_client_gave_up_is_held_in_doubt_and_harms_nothing() {
    use axum::error_handling::HandleErrorLayer;
    use tower::ServiceBuilder;

    let (gate, account) = gate().await;
    let effects = Effects::default();
    let handler_effects = effects.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move |body: Bytes| {
                let effects = handler_effects.clone();
                async move {
                    effects.start();
                    if &body[..] == b"boom" {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        panic!("after the client left");
                    }
                    effects.finish();
                    (StatusCode::CREATED, "fine")
                }
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant())
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                    StatusCode::GATEWAY_TIMEOUT
                }))
                .timeout(Duration::from_millis(100)),
        );
    let address = serve(app).await;
    let first = send(address, charge("late-panic", "boom")).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    let pool = idem::testing::pool().await;
    assert_eq!(
        settled_rows(&pool, &account).await,
        [(
            "in_doubt".to_owned(),
            Some(idem::detach::PANICKED.to_owned())
        )]
    );
    let retry = send(address, charge("late-panic", "boom")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    let other = send(address, charge("after-panic", "ok")).await;
    assert_eq!(
        other.status,
        StatusCode::CREATED,
        "the server serves on: {other:?}"
    );
    assert_eq!(effects.started(), 2);
}

/// "Trailers the service sends reach the first client": an answer the
/// policy does not keep (a 503, released) too.
#[tokio::test]
async fn unannounced_trailers_of_an_answer_not_kept_reach_its_http1_client() {
    use http_body_util::StreamBody;
    let (gate, _account) = gate().await;
    let app = Router::new()
        .route(
            "/charges",
            post(|| async {
                let mut trailers = HeaderMap::new();
                trailers.insert("x-retry-reason", HeaderValue::from_static("provider-down"));
                let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = vec![
                    Ok(hyper::body::Frame::data(Bytes::from_static(b"later"))),
                    Ok(hyper::body::Frame::trailers(trailers)),
                ];
                http::Response::builder()
                    .status(503)
                    .body(axum::body::Body::new(StreamBody::new(
                        futures_util::stream::iter(frames),
                    )))
                    .expect("a response")
            }),
        )
        .layer(IdempotencyLayer::new(gate).single_tenant());
    let address = serve(app).await;
    let first = send(
        address,
        post_to("/charges", Some("unkept-trailers"), ())
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"a")))
            .expect("a request"),
    )
    .await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        first
            .trailers
            .as_ref()
            .and_then(|t| t.get("x-retry-reason"))
            .map(HeaderValue::as_bytes),
        Some(&b"provider-down"[..]),
        "{first:?}"
    );
}

/// "Never releases a claim whose body started", "returns once every claim
/// is recorded": twenty requests fired at the instant the shutdown begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_racing_the_shutdown_leave_no_claim_pending_and_none_begun_released() {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    let (gate, account) = gate().await;
    let begun = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let seen = Arc::clone(&begun);
    let layer = IdempotencyLayer::new(gate).single_tenant();
    let app = Router::new()
        .route(
            "/charges",
            post(move |body: Bytes| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock()
                        .expect("the set")
                        .insert(String::from_utf8_lossy(&body).into_owned());
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .layer(layer.clone());
    let address = serve(app).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(21));
    let mut calls = JoinSet::new();
    for i in 0..20 {
        let barrier = Arc::clone(&barrier);
        calls.spawn(async move {
            let key = format!("race-shut-{i}");
            let request = charge(&key, &key);
            barrier.wait().await;
            tokio::time::sleep(Duration::from_millis(i * 3)).await;
            try_send(address, request).await
        });
    }
    barrier.wait().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stopped = layer
        .detached_calls()
        .shutdown(Duration::from_millis(50))
        .await;
    assert_eq!(layer.detached_calls().running(), 0);
    let _answers = calls.join_all().await;
    let pool = idem::testing::pool().await;
    let rows: Vec<(Vec<u8>, String, Option<String>)> = idem::sqlx::query_as(
        "SELECT identity, state, state_reason FROM idem_records WHERE account = $1 AND kind = 'claim'",
    )
    .bind(&account)
    .fetch_all(&pool)
    .await
    .expect("the claims");
    let begun = begun.lock().expect("the set").clone();
    for (_identity, state, reason) in &rows {
        assert_ne!(
            state, "pending",
            "a claim left pending after the shutdown returned: {rows:?}"
        );
        assert!(
            state == "success" || state == "in_doubt",
            "{state} {reason:?}"
        );
    }
    assert_eq!(
        rows.len(),
        begun.len(),
        "every begun body has its claim kept (success or in doubt), and only those: begun \
         {begun:?}, rows {rows:?}, stopped {stopped:?}"
    );
}

/// `IdempotencyLayer::lease`: "a lease (so that a claim whose process
/// died is taken over)". A detached call is alive (its process did not
/// die): its retry, after the lease and within the bound, must not take
/// the key over and run the service a second time.
#[tokio::test]
async fn a_lease_never_hands_a_live_detached_call_to_its_retry() {
    let (gate, _account) = gate().await;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(gate)
        .single_tenant()
        .lease(Duration::from_millis(300));
    let address = serve(charges(&effects, Duration::from_millis(900)).layer(layer)).await;
    let stream = post_and_hold(address, "lease-1", "a").await;
    effects.began().await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = send(address, charge("lease-1", "a")).await;
    assert_eq!(
        effects.started(),
        1,
        "the retry took the live call's key over and ran it again: {retry:?}"
    );
}
