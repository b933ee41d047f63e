//! The tower layer's retention windows, through a real axum server against
//! a real PostgreSQL: `keep_slot_for` says when each kept response's key
//! expires (`Idempotency-Key-Expires`, an HTTP-date, the same on every
//! replay) and lets the key run again past it; `keep_value_for` refuses a
//! retry past its window with 409 `response-no-longer-kept`, never a second
//! run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use idem::Gate;
use idem::http::{IdempotencyLayer, Scoped};
use idem_test_support::answer::Answer;
use tokio::net::TcpListener;

/// The header, written out: a test that pins the protocol fails when
/// idem's constant changes.
const EXPIRES: &str = "idempotency-key-expires";

/// A gate in an account of its own.
async fn gate() -> Gate {
    Gate::connect(idem::testing::pool_with(4).await)
        .await
        .expect("idem's schema")
        .account(idem::testing::unique_name("retention"))
}

/// Counts the inner service's runs, numbering each one.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn happen(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// An axum router with the layer: `POST /charges` (a 201 numbering its
/// run), `POST /own-expiry` (a 201 with an `Idempotency-Key-Expires` of
/// the service's own), `POST /down` (a 503: the key is released).
async fn serve<P: 'static>(layer: IdempotencyLayer<Scoped, P>, runs: Runs) -> String {
    use axum::routing::post;

    let charge = {
        let runs = runs.clone();
        move || async move {
            let n = runs.happen();
            (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                format!(r#"{{"charge":{n}}}"#),
            )
        }
    };
    let own_expiry = {
        let runs = runs.clone();
        move || async move {
            let n = runs.happen();
            (
                StatusCode::CREATED,
                [(EXPIRES, "the service's own")],
                format!("own {n}"),
            )
        }
    };
    let down = move || async move {
        runs.happen();
        (StatusCode::SERVICE_UNAVAILABLE, "down")
    };
    let app = axum::Router::new()
        .route("/charges", post(charge))
        .route("/own-expiry", post(own_expiry))
        .route("/down", post(down))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// One POST of `url` under `key`.
async fn post(url: &str, key: &str) -> Answer {
    Answer::of(
        reqwest::Client::new()
            .post(url)
            .header("idempotency-key", key)
            .body("4999"),
    )
    .await
}

/// The answer's `Idempotency-Key-Expires` as a time; panics unless it is
/// an IMF-fixdate (RFC 9110 §5.6.7), not one of the obsolete forms a
/// recipient must also read.
#[track_caller]
fn expires_of(answer: &Answer) -> SystemTime {
    let value = answer
        .header(EXPIRES)
        .unwrap_or_else(|| panic!("no {EXPIRES}: {answer:?}"));
    let time = httpdate::parse_http_date(value)
        .unwrap_or_else(|e| panic!("{EXPIRES} is no HTTP-date ({e}): {value:?}"));
    assert_eq!(
        httpdate::fmt_http_date(time),
        value,
        "{EXPIRES} is an IMF-fixdate"
    );
    time
}

#[test]
fn the_constant_is_the_header() {
    assert_eq!(idem::http::IDEMPOTENCY_KEY_EXPIRES, EXPIRES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keep_slot_for_a_kept_response_says_when_its_key_expires_and_replays_say_the_same() {
    const WINDOW: Duration = Duration::from_secs(3600);
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .keep_slot_for(WINDOW);
    let base = serve(layer, runs.clone()).await;
    let url = format!("{base}/charges");

    let before = SystemTime::now();
    let first = post(&url, "expires-1").await;
    let after = SystemTime::now();
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let expires = expires_of(&first);
    // The response's time plus the window, rounded down to the second:
    // never later than the key is really held.
    assert!(
        expires >= before + WINDOW - Duration::from_secs(2),
        "{expires:?} is too early: the request began at {before:?}"
    );
    assert!(
        expires <= after + WINDOW,
        "{expires:?} is later than the window allows: the answer came at {after:?}"
    );

    // Past a second boundary, so a value computed anew would differ: the
    // replay's is the one stored with the response.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let replay = post(&url, "expires-1").await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header(EXPIRES), first.header(EXPIRES));
    assert_eq!(runs.count(), 1);

    // A released key (a 503) is not held: no expiry to state.
    let down = post(&format!("{base}/down"), "expires-2").await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "{down:?}");
    assert_eq!(down.header(EXPIRES), None, "{down:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_s_expiry_is_kept_whatever_keep_headers_says_and_replaces_the_service_s() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .keep_headers([
            http::header::CONTENT_TYPE,
            http::HeaderName::from_static(EXPIRES),
        ])
        .keep_slot_for(Duration::from_secs(3600));
    let base = serve(layer, runs.clone()).await;

    for path in ["/charges", "/own-expiry"] {
        let url = format!("{base}{path}");
        let first = post(&url, "kept-whatever").await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        let replay = post(&url, "kept-whatever").await;
        assert!(replay.replayed(), "{replay:?}");
        for answer in [&first, &replay] {
            let values: Vec<_> = answer.headers.get_all(EXPIRES).iter().collect();
            assert_eq!(values.len(), 1, "one {EXPIRES}, the layer's: {answer:?}");
            expires_of(answer);
        }
        assert_eq!(replay.header(EXPIRES), first.header(EXPIRES));
    }
    assert_eq!(runs.count(), 2);

    // With no kept headers at all, the expiry is still kept.
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .keep_headers([])
        .keep_slot_for(Duration::from_secs(60));
    let url = format!("{}/charges", serve(layer, runs.clone()).await);
    let first = post(&url, "kept-none").await;
    let replay = post(&url, "kept-none").await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header("content-type"), None, "not kept: {replay:?}");
    assert_eq!(replay.header(EXPIRES), first.header(EXPIRES));
    expires_of(&replay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keep_slot_for_keys_are_held_for_ever_and_no_expiry_is_sent() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .keep_value_for(Duration::from_secs(3600));
    let url = format!("{}/charges", serve(layer, runs.clone()).await);
    let first = post(&url, "for-ever-1").await;
    let replay = post(&url, "for-ever-1").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(replay.replayed(), "{replay:?}");
    for answer in [&first, &replay] {
        assert_eq!(answer.header(EXPIRES), None, "{answer:?}");
    }
    assert_eq!(runs.count(), 1);

    // Nor does a service's own header become the layer's: it passes as
    // the service sent it (and is not kept: not in the kept headers).
    let own = post(&url.replace("/charges", "/own-expiry"), "for-ever-2").await;
    assert_eq!(own.header(EXPIRES), Some("the service's own"), "{own:?}");
}

// The two below need the store's part of the retention windows (the
// windows written with the claim, judged on read); until it lands they
// fail: the value and the slot are kept for ever.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_keep_value_for_a_retry_is_409_response_no_longer_kept_and_never_runs_again() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .keep_value_for(Duration::from_secs(1));
    let url = format!("{}/charges", serve(layer, runs.clone()).await);

    let first = post(&url, "value-window").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let within = post(&url, "value-window").await;
    assert!(within.replayed(), "within the window, a replay: {within:?}");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let past = post(&url, "value-window").await;
    past.assert_problem(StatusCode::CONFLICT, "response-no-longer-kept");
    assert!(!past.replayed(), "{past:?}");
    assert_eq!(past.header("retry-after"), None, "not to retry: {past:?}");
    assert_eq!(runs.count(), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_keep_slot_for_a_request_with_the_same_key_runs_again() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(gate().await)
        .single_tenant()
        .keep_slot_for(Duration::from_secs(1));
    let url = format!("{}/charges", serve(layer, runs.clone()).await);

    let first = post(&url, "slot-window").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body, br#"{"charge":1}"#);
    let within = post(&url, "slot-window").await;
    assert!(within.replayed(), "within the window, a replay: {within:?}");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = post(&url, "slot-window").await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
    assert!(!again.replayed(), "a fresh response: {again:?}");
    assert_eq!(again.body, br#"{"charge":2}"#);
    assert!(
        expires_of(&again) > expires_of(&first),
        "the new response's key expires later"
    );
    assert_eq!(runs.count(), 2, "the handler ran again");
}
