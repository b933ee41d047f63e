//! The `Idempotency-Key` layer (`idem::http`, feature `axum`): the payments
//! service started on 127.0.0.1 and hit by a real HTTP client,
//! against a real PostgreSQL; then the extractor and the refusal responses
//! on their own.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::service::{self as payments, LIMIT_CENTS, Payments};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use idem::http::{IDEMPOTENT_REPLAYED, IdempotencyKey, KeyRejection, StoredResponse};
use idem::metrics::{Gauges, names};
use idem::sqlx;
use idem::{Gate, Identity, Rejected};
use idem_test_support::answer::Answer;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// How long the test service's card network takes: long enough that the
/// racers arrive while the first charge is in flight.
const NETWORK_LATENCY: Duration = Duration::from_millis(300);

/// The payments service, listening on 127.0.0.1 on a port of its own.
struct Service {
    base: String,
    gate: Gate,
    payments: Arc<Payments>,
    client: reqwest::Client,
    /// Each test is its own caller: its account isolates its keys and rows.
    account: String,
}

impl Service {
    async fn start() -> Service {
        Service::start_with(NETWORK_LATENCY).await
    }

    async fn start_with(network_latency: Duration) -> Service {
        // The racers outnumber the connections: later ones queue in the pool.
        let gate = Gate::connect(idem::testing::pool_with(12).await)
            .await
            .expect("idem's schema");
        payments::create_charges_table(gate.pool())
            .await
            .expect("the charges table");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let payments = Arc::new(Payments::new(gate.clone(), network_latency));
        let app = payments::router(payments.clone(), recorder().clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Service {
            base: format!("http://{address}"),
            gate,
            payments,
            client: reqwest::Client::new(),
            account: idem::testing::unique_name("http"),
        }
    }

    /// `POST /charges`, as nobody yet.
    fn post(&self) -> reqwest::RequestBuilder {
        self.client.post(format!("{}/charges", self.base))
    }

    /// `POST /charges` as this test's caller; `key: None` sends no header.
    async fn charge(&self, key: Option<&str>, body: &Value) -> Answer {
        Answer::of(self.charge_request(key, body)).await
    }

    /// The request [`Service::charge`] sends.
    fn charge_request(&self, key: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
        let request = self.post().bearer_auth(&self.account).json(body);
        match key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    /// The charge rows written for `key` in this test's account.
    async fn charge_rows(&self, key: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM card_charges WHERE account = $1 AND idempotency_key = $2",
        )
        .bind(&self.account)
        .bind(key)
        .fetch_one(self.gate.pool())
        .await
        .expect("count the charges")
    }

    /// The states of this test's claims in `idem_records`.
    async fn claim_states(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT state FROM idem_records WHERE account = $1 AND kind = 'claim'")
            .bind(&self.account)
            .fetch_all(self.gate.pool())
            .await
            .expect("read the claims")
    }
}

/// The recorder of this test binary, installed by the first service
/// started: one per process. Each test counts under an account of its own,
/// and the service labels its metrics with it, so tests running at once
/// never read each other's counts.
fn recorder() -> &'static PrometheusHandle {
    static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();
    RECORDER.get_or_init(|| payments::install_metrics().expect("the only recorder of this binary"))
}

/// The payments service's own problem+json answers.
trait ServiceProblem {
    /// Asserts one of the service's problems, of this status and `slug`;
    /// returns its detail.
    fn assert_service_problem(&self, status: StatusCode, slug: &str) -> String;
}

impl ServiceProblem for Answer {
    #[track_caller]
    fn assert_service_problem(&self, status: StatusCode, slug: &str) -> String {
        self.assert_problem_of_type(status, &format!("https://payments.example/problems/{slug}"))
    }
}

fn payload(amount_cents: i64, currency: &str) -> Value {
    json!({ "amount_cents": amount_cents, "currency": currency })
}

// ------------------------------------------------------- over real HTTP

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_posts_charge_once_and_every_other_is_409_or_a_replay() {
    let service = Arc::new(Service::start().await);
    let key = "race-7f3a9c1e";
    let racers = 50;

    let started = Instant::now();
    let answers = post_at_once(&service, racers, key, payload(4_999, "EUR")).await;
    let elapsed = started.elapsed();
    let originals: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .collect();
    assert_eq!(
        originals.len(),
        1,
        "exactly one request runs the charge: {answers:#?}"
    );
    let original = originals[0];
    assert_eq!(original.json()["amount_cents"], 4_999);
    let (mut in_flight, mut replayed) = (0, 0);
    for answer in answers.iter().filter(|a| !std::ptr::eq(*a, original)) {
        if answer.status == StatusCode::CONFLICT {
            answer.assert_problem(StatusCode::CONFLICT, "in-flight");
            assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
            in_flight += 1;
        } else {
            assert!(answer.replayed(), "neither 409 nor a replay: {answer:?}");
            assert_byte_identical(answer, original);
            replayed += 1;
        }
    }
    assert_eq!(
        service.charge_rows(key).await,
        1,
        "one charge row for the key"
    );
    eprintln!(
        "{racers} concurrent POSTs in {elapsed:?}: 1 charged, {in_flight} answered 409 in flight, \
         {replayed} replayed"
    );

    // Once it settled, the retries get the same answer, all at once too.
    let started = Instant::now();
    let retries = post_at_once(&service, racers, key, payload(4_999, "EUR")).await;
    for retry in &retries {
        assert!(retry.replayed(), "{retry:?}");
        assert_byte_identical(retry, original);
    }
    assert_eq!(service.charge_rows(key).await, 1);
    assert_eq!(service.claim_states().await, ["success"]);
    eprintln!(
        "{racers} concurrent retries after it settled in {:?}: {racers} replayed",
        started.elapsed()
    );
}

/// `n` identical charges, released together by a barrier.
async fn post_at_once(service: &Service, n: usize, key: &str, body: Value) -> Vec<Answer> {
    let requests = (0..n).map(|_| service.charge_request(Some(key), &body));
    Answer::all_at_once(requests.collect()).await
}

#[track_caller]
fn assert_byte_identical(replay: &Answer, original: &Answer) {
    assert_eq!(replay.status, original.status);
    assert_eq!(replay.body, original.body, "the replayed body differs");
    for name in ["content-type", "location"] {
        assert_eq!(replay.header(name), original.header(name), "{name}");
    }
    assert!(
        !original.replayed(),
        "the original is not marked as a replay"
    );
}

// ------------------------------------------------------------- /metrics

/// A sample's name and labels.
type Series = (String, BTreeMap<String, String>);

/// One scrape of `GET /metrics`: each sample by its name and labels.
struct Scrape(BTreeMap<Series, f64>);

impl Scrape {
    async fn of(service: &Service) -> Scrape {
        let response = service
            .client
            .get(format!("{}/metrics", service.base))
            .send()
            .await
            .expect("the service answers");
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers().get("content-type").cloned();
        assert_eq!(
            content_type.as_ref().and_then(|value| value.to_str().ok()),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        let text = response.text().await.expect("the body");
        Scrape(text.lines().filter_map(Scrape::sample).collect())
    }

    /// `name{label="value",...} 1` (or without labels) as a sample; `None`
    /// for a comment. Label values here hold no quote, comma or brace.
    fn sample(line: &str) -> Option<(Series, f64)> {
        if line.starts_with('#') || line.trim().is_empty() {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.trim_matches('"').to_owned()))
            .collect();
        Some(((name.to_owned(), labels), value.parse().ok()?))
    }

    /// The sample `name` with exactly `labels`; `None` if not exported.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.0.get(&(name.to_owned(), labels)).copied()
    }

    /// `idem_outcomes_total` of `create_charge` in `account` for `outcome` (0
    /// when never counted).
    fn outcome(&self, account: &str, outcome: &str) -> f64 {
        self.get(
            names::OUTCOMES_TOTAL,
            &[
                (names::ACTION, "create_charge"),
                (names::ACCOUNT, account),
                (names::OUTCOME, outcome),
            ],
        )
        .unwrap_or(0.0)
    }

    /// How many durations the histogram `name` of `create_charge` in
    /// `account` holds.
    fn count(&self, name: &str, account: &str) -> Option<f64> {
        self.get(
            &format!("{name}_count"),
            &[(names::ACTION, "create_charge"), (names::ACCOUNT, account)],
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_a_race_and_a_charge_in_doubt_did() {
    const RACERS: usize = 16;
    let service = Arc::new(Service::start().await);
    let account = service.account.clone();

    let answers = post_at_once(&service, RACERS, "m-race", payload(1_999, "EUR")).await;
    let charged = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .count();
    let in_flight = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT)
        .count();
    let replayed = answers.iter().filter(|a| a.replayed()).count();
    assert_eq!(
        (charged, in_flight + replayed),
        (1, RACERS - 1),
        "{answers:#?}"
    );

    let scrape = Scrape::of(&service).await;
    assert_eq!(scrape.outcome(&account, "won"), 1.0);
    assert_eq!(scrape.outcome(&account, "in_flight"), in_flight as f64);
    assert_eq!(scrape.outcome(&account, "replayed"), replayed as f64);
    assert_eq!(scrape.outcome(&account, "settled"), 1.0);
    let durations = [
        (names::CLAIM_DURATION_SECONDS, RACERS),
        (names::BODY_DURATION_SECONDS, 1),
        (names::SETTLE_DURATION_SECONDS, 1),
    ];
    for (name, count) in durations {
        assert_eq!(scrape.count(name, &account), Some(count as f64), "{name}");
    }
    // The one body waited on the card network: its duration is in a bucket
    // at or above the network's latency, none below.
    let body_sum = scrape
        .get(
            &format!("{}_sum", names::BODY_DURATION_SECONDS),
            &[(names::ACTION, "create_charge"), (names::ACCOUNT, &account)],
        )
        .expect("the body's duration");
    assert!(body_sum >= NETWORK_LATENCY.as_secs_f64(), "{body_sum}");

    // A charge whose answer was lost is held in doubt: counted, refused to
    // its retry, and shown by the gauges until the reconciler settles it.
    service
        .payments
        .network
        .time_out_next(payments::Timeout::AfterCharging);
    let lost = service.charge(Some("m-lost"), &payload(4_999, "EUR")).await;
    lost.assert_service_problem(StatusCode::GATEWAY_TIMEOUT, "card-network-timeout");
    let retry = service.charge(Some("m-lost"), &payload(4_999, "EUR")).await;
    retry.assert_problem(StatusCode::CONFLICT, "outcome-in-doubt");
    let gauges =
        Gauges::new(service.gate.pool().clone(), Duration::from_secs(60)).account(&account);
    let sample = gauges.sample_once().await.expect("a sample");
    assert_eq!(
        (sample.in_doubt, sample.stale_pending),
        (1, 0),
        "{sample:?}"
    );

    let scrape = Scrape::of(&service).await;
    assert_eq!(scrape.outcome(&account, "won"), 2.0);
    assert_eq!(scrape.outcome(&account, "held_in_doubt"), 1.0);
    assert_eq!(scrape.outcome(&account, "in_doubt"), 1.0);
    let of_account = [(names::ACCOUNT, account.as_str())];
    assert_eq!(scrape.get(names::CLAIMS_IN_DOUBT, &of_account), Some(1.0));
    assert_eq!(
        scrape.get(names::STALE_PENDING_CLAIMS, &of_account),
        Some(0.0)
    );
    let oldest = scrape
        .get(names::OLDEST_IN_DOUBT_CLAIM_AGE_SECONDS, &of_account)
        .expect("the oldest claim in doubt");
    assert!(oldest > 0.0, "{oldest}");

    let reconciler = payments::reconciler(service.payments.clone()).account(&account);
    assert_eq!(
        reconciler.reconcile_once().await.expect("a pass").resolved,
        1
    );
    gauges.sample_once().await.expect("a sample");
    let scrape = Scrape::of(&service).await;
    assert_eq!(scrape.outcome(&account, "reconciled"), 1.0);
    assert_eq!(scrape.get(names::CLAIMS_IN_DOUBT, &of_account), Some(0.0));
    assert_eq!(
        scrape.get(names::OLDEST_IN_DOUBT_CLAIM_AGE_SECONDS, &of_account),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_the_first_request_runs_gets_409_with_retry_after() {
    let service = Arc::new(Service::start_with(Duration::from_secs(2)).await);
    let first = tokio::spawn({
        let service = service.clone();
        async move { service.charge(Some("slow-1"), &payload(100, "EUR")).await }
    });
    // Wait until the first request holds its claim, then retry it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while service.claim_states().await != ["pending"] {
        assert!(Instant::now() < deadline, "the first request never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = service.charge(Some("slow-1"), &payload(100, "EUR")).await;
    let detail = retry.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert_eq!(retry.header("retry-after"), Some("1"));
    assert!(detail.contains("Retry it unchanged"), "{detail}");
    let first = first.await.expect("the first request");
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(service.charge_rows("slow-1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_payload_under_a_used_key_gets_422_and_the_original_still_replays() {
    let service = Service::start_with(Duration::ZERO).await;
    let first = service.charge(Some("k-422"), &payload(2_500, "EUR")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    for other in [payload(2_600, "EUR"), payload(2_500, "USD")] {
        let reused = service.charge(Some("k-422"), &other).await;
        let detail = reused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "key-reused");
        assert!(detail.contains("new key"), "{detail}");
        assert_eq!(reused.header("retry-after"), None);
        assert!(!reused.replayed());
    }
    let again = service.charge(Some("k-422"), &payload(2_500, "EUR")).await;
    assert!(again.replayed(), "{again:?}");
    assert_byte_identical(&again, &first);
    assert_eq!(service.charge_rows("k-422").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_charge_releases_its_key_so_a_retry_can_succeed() {
    let service = Service::start_with(Duration::ZERO).await;
    let declined = payload(LIMIT_CENTS + 1, "EUR");

    // Declined: nothing charged, nothing kept, the claim released.
    let first = service.charge(Some("k-fail"), &declined).await;
    first.assert_service_problem(StatusCode::PAYMENT_REQUIRED, "card-declined");
    assert_eq!(service.charge_rows("k-fail").await, 0);
    assert!(
        service.claim_states().await.is_empty(),
        "the claim is released"
    );

    // The same request runs again (and is declined again): not a replay.
    let retried = service.charge(Some("k-fail"), &declined).await;
    retried.assert_service_problem(StatusCode::PAYMENT_REQUIRED, "card-declined");
    assert!(!retried.replayed());

    // A corrected request under the same key succeeds: the failure left no
    // fingerprint behind to call it a reuse.
    let fixed = service.charge(Some("k-fail"), &payload(9_900, "EUR")).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{fixed:?}");
    assert!(!fixed.replayed());
    let replay = service.charge(Some("k-fail"), &payload(9_900, "EUR")).await;
    assert_byte_identical(&replay, &fixed);
    assert!(replay.replayed());

    // The card network is down: the very same request, retried, succeeds.
    service.payments.network.failures.store(1, Ordering::SeqCst);
    let down = service.charge(Some("k-down"), &payload(700, "EUR")).await;
    down.assert_service_problem(StatusCode::BAD_GATEWAY, "card-network-down");
    let after_outage = service.charge(Some("k-down"), &payload(700, "EUR")).await;
    assert_eq!(after_outage.status, StatusCode::CREATED, "{after_outage:?}");
    assert!(!after_outage.replayed());

    // An invalid request fails the same way, and its key stays usable.
    let invalid = service.charge(Some("k-zero"), &payload(0, "EUR")).await;
    invalid.assert_service_problem(StatusCode::BAD_REQUEST, "invalid-charge");
    let valid = service.charge(Some("k-zero"), &payload(1, "EUR")).await;
    assert_eq!(valid.status, StatusCode::CREATED, "{valid:?}");
    assert_eq!(service.charge_rows("k-fail").await, 1);
    assert_eq!(service.charge_rows("k-zero").await, 1);
    assert_eq!(service.charge_rows("k-down").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_the_charge_is_held_in_doubt_then_replayed_once_reconciled() {
    let service = Arc::new(Service::start_with(Duration::ZERO).await);
    let body = payload(4_999, "EUR");
    service
        .payments
        .network
        .time_out_next(payments::Timeout::AfterCharging);

    // The card network charged, and its answer was lost.
    let first = service.charge(Some("k-lost"), &body).await;
    first.assert_service_problem(StatusCode::GATEWAY_TIMEOUT, "card-network-timeout");
    // Retries are held, never charged again, however many arrive at once.
    let retries = post_at_once(&service, 16, "k-lost", body.clone()).await;
    for retry in &retries {
        retry.assert_problem(StatusCode::CONFLICT, "outcome-in-doubt");
        assert_eq!(retry.header("retry-after"), Some("30"), "{retry:?}");
    }
    assert_eq!(service.charge_rows("k-lost").await, 0);
    assert_eq!(service.claim_states().await, vec!["in_doubt".to_owned()]);

    // The reconciler asks the network: it charged. The charge is booked
    // once and the claim settled with the response the request owed.
    let reconciler = payments::reconciler(service.payments.clone()).account(&service.account);
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 1, "{pass:?}");
    let replayed = service.charge(Some("k-lost"), &body).await;
    assert_eq!(replayed.status, StatusCode::CREATED, "{replayed:?}");
    assert!(replayed.replayed(), "{replayed:?}");
    assert_eq!(service.charge_rows("k-lost").await, 1);
    assert_eq!(service.claim_states().await, vec!["success".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_before_the_charge_is_released_by_the_reconciler_and_charged_once() {
    let service = Service::start_with(Duration::ZERO).await;
    let body = payload(1_250, "EUR");
    service
        .payments
        .network
        .time_out_next(payments::Timeout::BeforeCharging);
    let first = service.charge(Some("k-unsent"), &body).await;
    first.assert_service_problem(StatusCode::GATEWAY_TIMEOUT, "card-network-timeout");
    let held = service.charge(Some("k-unsent"), &body).await;
    held.assert_problem(StatusCode::CONFLICT, "outcome-in-doubt");

    // Nothing was charged: the reconciler releases the key, and the retry
    // charges, once.
    let reconciler = payments::reconciler(service.payments.clone()).account(&service.account);
    assert_eq!(
        reconciler.reconcile_once().await.expect("a pass").resolved,
        1
    );
    let charged = service.charge(Some("k-unsent"), &body).await;
    assert_eq!(charged.status, StatusCode::CREATED, "{charged:?}");
    assert!(!charged.replayed());
    assert_eq!(service.charge_rows("k-unsent").await, 1);
}

/// The session the repository's README shows against this example (its
/// `text` block that starts `$ cargo run --example payments`): the request
/// its `charge` shell function sends, and each answer as shown.
struct ReadmeSession {
    /// The curl line's `-H` headers, as written.
    headers: Vec<(String, String)>,
    /// The curl line's `-d` body, as written.
    body: String,
    /// Each answer, as shown.
    answers: Vec<ShownAnswer>,
}

/// An answer as the README shows it.
struct ShownAnswer {
    status: StatusCode,
    /// The headers shown (not every one the service sends).
    headers: Vec<(String, String)>,
    body: Value,
}

impl ReadmeSession {
    fn read() -> ReadmeSession {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("$ cargo run --example payments")
            .expect("the README shows a session against the payments example");
        let block = &readme[start..];
        let block = &block[..block.find("```").expect("the end of the session")];
        // What follows each `flag '` up to the closing quote.
        let quoted = |flag: &str| -> Vec<&str> {
            block
                .split(flag)
                .skip(1)
                .map(|rest| rest.split('\'').next().unwrap_or_default())
                .collect()
        };
        let headers = quoted("-H '")
            .into_iter()
            .map(|header| {
                let (name, value) = header.split_once(": ").expect("a header `name: value`");
                (name.to_owned(), value.to_owned())
            })
            .collect();
        let [body] = quoted("-d '")[..] else {
            panic!("one `-d` in the README's session:\n{block}");
        };
        let mut answers = Vec::new();
        let mut lines = block.lines();
        while let Some(line) = lines.next() {
            let Some(status) = line.strip_prefix("HTTP/1.1 ") else {
                continue;
            };
            let status = status.split(' ').next().and_then(|code| code.parse().ok());
            let status = StatusCode::from_u16(status.expect("a status code")).expect("a status");
            let headers = lines
                .by_ref()
                .take_while(|line| !line.is_empty())
                .map(|line| {
                    let (name, value) = line.split_once(": ").expect("a header `name: value`");
                    (name.to_owned(), value.to_owned())
                })
                .collect();
            let body = lines.next().expect("a body after the headers");
            let body = serde_json::from_str(body).expect("a JSON body");
            answers.push(ShownAnswer {
                status,
                headers,
                body,
            });
        }
        ReadmeSession {
            headers,
            body: body.to_owned(),
            answers,
        }
    }
}

/// The README's session, literally (but in an account of this test's own,
/// since the rows persist): a card network set up as the example binary's
/// times out its first charge after charging (504, `Retry-After: 30`), the
/// same request at once is held (409 `outcome-in-doubt`), and after the
/// reconciler's pass the same request gets the first charge, replayed (201,
/// `Idempotent-Replayed: true`). Statuses, every header shown and every
/// body are as the README shows them; only the charge's id is this run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_session_goes_as_shown_504_then_409_then_the_first_charge_replayed() {
    let session = ReadmeSession::read();
    assert_eq!(session.answers.len(), 3, "three answers in the README");
    let service = Service::start().await;
    // As `main` sets the example binary's network up.
    service
        .payments
        .network
        .time_out_every(payments::TIME_OUT_EVERY);
    let send = || {
        let mut request = service.post().body(session.body.clone());
        for (name, value) in &session.headers {
            request = match name.as_str() {
                "Authorization" => request.bearer_auth(&service.account),
                _ => request.header(name, value),
            };
        }
        Answer::of(request)
    };
    let key = session
        .headers
        .iter()
        .find_map(|(name, value)| (name == "Idempotency-Key").then_some(value.as_str()))
        .expect("the README's curl sends a key");

    let timed_out = send().await;
    let held = send().await;
    assert_eq!(service.charge_rows(key).await, 0, "not booked yet");
    // The README's `sleep`: the reconciler's pass, which books the charge
    // the network made and settles the claim with its response.
    let reconciler = payments::reconciler(service.payments.clone()).account(&service.account);
    assert_eq!(
        reconciler.reconcile_once().await.expect("a pass").resolved,
        1
    );
    let replayed = send().await;
    assert_eq!(service.charge_rows(key).await, 1, "charged once");

    let id: i64 = sqlx::query_scalar(
        "SELECT id FROM card_charges WHERE account = $1 AND idempotency_key = $2",
    )
    .bind(&service.account)
    .bind(key)
    .fetch_one(service.gate.pool())
    .await
    .expect("the charge");
    let (id, shown_id) = (format!("ch_{id}"), &session.answers[2].body["id"]);
    let shown_id = shown_id.as_str().expect("the README shows the charge's id");
    for (answer, shown) in [timed_out, held, replayed].iter().zip(&session.answers) {
        assert_eq!(answer.status, shown.status, "{answer:?}");
        for (name, value) in &shown.headers {
            let value = value.replace(shown_id, &id);
            assert_eq!(
                answer.header(name),
                Some(value.as_str()),
                "{name}: {answer:?}"
            );
        }
        let mut body = shown.body.clone();
        if body.get("id").is_some() {
            body["id"] = json!(id);
        }
        assert_eq!(answer.json(), body, "{answer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_malformed_key_is_a_400_that_says_what_is_wrong_and_runs_nothing() {
    let service = Service::start_with(Duration::ZERO).await;
    let body = payload(100, "EUR");

    let missing = service.charge(None, &body).await;
    let detail = missing.assert_problem(StatusCode::BAD_REQUEST, "missing-idempotency-key");
    assert!(detail.contains("no Idempotency-Key header"), "{detail}");

    let long = "k".repeat(256);
    for (key, says) in [
        ("", "is empty"),
        (long.as_str(), "256 bytes long; at most 255"),
        ("two words", "byte 0x20 at offset 3"),
    ] {
        let refused = service.charge(Some(key), &body).await;
        let detail = refused.assert_problem(StatusCode::BAD_REQUEST, "invalid-idempotency-key");
        assert!(detail.contains(says), "{key:?}: {detail}");
    }
    // Bytes a client can put on the wire that are not visible ASCII.
    let non_ascii = Answer::of(
        service
            .post()
            .bearer_auth(&service.account)
            .header(
                "Idempotency-Key",
                reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").expect("obs-text"),
            )
            .json(&body),
    )
    .await;
    let detail = non_ascii.assert_problem(StatusCode::BAD_REQUEST, "invalid-idempotency-key");
    assert!(detail.contains("byte 0xc3 at offset 3"), "{detail}");
    let twice = Answer::of(
        service
            .post()
            .bearer_auth(&service.account)
            .header("Idempotency-Key", "a")
            .header("Idempotency-Key", "b")
            .json(&body),
    )
    .await;
    let detail = twice.assert_problem(StatusCode::BAD_REQUEST, "invalid-idempotency-key");
    assert!(detail.contains("2 Idempotency-Key headers"), "{detail}");

    // A 255-byte key is fine.
    let longest = "k".repeat(255);
    let accepted = service.charge(Some(&longest), &body).await;
    assert_eq!(accepted.status, StatusCode::CREATED, "{accepted:?}");
    assert_eq!(
        service.claim_states().await,
        ["success"],
        "only that one ran"
    );

    let anonymous = Answer::of(service.post().header("Idempotency-Key", "anon").json(&body)).await;
    anonymous.assert_service_problem(StatusCode::UNAUTHORIZED, "unauthenticated");
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_answers_503_with_retry_after_and_charges_nothing() {
    let service = Service::start_with(Duration::ZERO).await;
    service.gate.pool().close().await;
    let answer = service.charge(Some("k-down"), &payload(100, "EUR")).await;
    let detail = answer.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable");
    assert_eq!(answer.header("retry-after"), Some("5"));
    assert!(
        !detail.to_lowercase().contains("pool"),
        "the store's own error stays on the server: {detail}"
    );
    let pool = idem::testing::pool_with(1).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM card_charges WHERE account = $1")
        .bind(&service.account)
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(rows, 0);
}

// ------------------------------------------------- a replay through the store

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_body_is_replayed_byte_for_byte_through_postgresql() {
    let gate = idem::testing::gate().await;
    // NUL, invalid UTF-8, and text: jsonb holds none of the first two as text.
    for (n, body) in [
        b"\x00\xff\xfe binary\x00".to_vec(),
        "caf\u{e9} \u{1f600} \"quoted\"\n".as_bytes().to_vec(),
        Vec::new(),
    ]
    .into_iter()
    .enumerate()
    {
        let id = Identity::new("stored_body").part(n);
        let respond = || async {
            Ok::<_, Rejected>(
                StoredResponse::new(StatusCode::ACCEPTED)
                    .with_header(
                        axum::http::header::CONTENT_TYPE,
                        axum::http::HeaderValue::from_static("application/octet-stream"),
                    )
                    .with_body(body.clone()),
            )
        };
        let first = gate.guard(&id).replay().run(respond()).await.expect("runs");
        let again = gate
            .guard(&id)
            .replay()
            .run(respond())
            .await
            .expect("replayed");
        assert!(!first.is_replay() && again.is_replay());
        assert_eq!(again.body(), body.as_slice());
        assert_eq!(again.headers(), first.headers());
        let response = again.into_response();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert_eq!(response.headers()[IDEMPOTENT_REPLAYED], "true");
    }
}

// --------------------------------------------------- the extractor alone

fn parts_with_keys(keys: &[&[u8]]) -> Parts {
    let mut request = Request::builder().method("POST").uri("/charges");
    for key in keys {
        request = request.header(
            "idempotency-key",
            axum::http::HeaderValue::from_bytes(key).expect("a header value"),
        );
    }
    request.body(()).expect("a request").into_parts().0
}

async fn required(keys: &[&[u8]]) -> Result<IdempotencyKey, KeyRejection> {
    IdempotencyKey::from_request_parts(&mut parts_with_keys(keys), &()).await
}

async fn optional(keys: &[&[u8]]) -> Result<Option<IdempotencyKey>, KeyRejection> {
    <Option<IdempotencyKey>>::from_request_parts(&mut parts_with_keys(keys), &()).await
}

#[tokio::test]
async fn the_extractor_takes_one_to_255_visible_ascii_characters() {
    let uuid = b"8e03978e-40d5-43e8-bc93-6894a57f9324";
    assert_eq!(
        required(&[uuid]).await.expect("a UUID").as_str(),
        "8e03978e-40d5-43e8-bc93-6894a57f9324"
    );
    let quoted = b"\"sf-string\"";
    assert_eq!(
        required(&[quoted])
            .await
            .expect("quotes are visible")
            .as_str(),
        "\"sf-string\""
    );
    assert!(required(&[&[b'x'; 255]]).await.is_ok());

    let long = [b'x'; 256];
    for (keys, expected) in [
        (&[][..], KeyRejection::Missing),
        (&[&b""[..]][..], KeyRejection::Empty),
        (&[&long[..]][..], KeyRejection::TooLong { length: 256 }),
        (
            &[&b"a b"[..]][..],
            KeyRejection::NotVisibleAscii {
                offset: 1,
                byte: b' ',
            },
        ),
        (
            &[&b"\xc3\xa9"[..]][..],
            KeyRejection::NotVisibleAscii {
                offset: 0,
                byte: 0xc3,
            },
        ),
        (
            &[&b"a"[..], &b"a"[..]][..],
            KeyRejection::Repeated { count: 2 },
        ),
    ] {
        assert_eq!(required(keys).await, Err(expected), "{keys:?}");
    }
}

#[tokio::test]
async fn the_optional_extractor_accepts_no_header_but_not_a_bad_one() {
    assert_eq!(optional(&[]).await, Ok(None));
    assert_eq!(
        optional(&[b"k1"])
            .await
            .map(|key| key.map(|k| k.to_string())),
        Ok(Some("k1".to_owned()))
    );
    assert_eq!(optional(&[b""]).await, Err(KeyRejection::Empty));
}

#[tokio::test]
async fn each_key_rejection_is_a_400_problem_with_its_own_detail() {
    let mut details = Vec::new();
    for rejection in [
        KeyRejection::Missing,
        KeyRejection::Repeated { count: 2 },
        KeyRejection::Empty,
        KeyRejection::TooLong { length: 256 },
        KeyRejection::NotVisibleAscii {
            offset: 0,
            byte: 0x7f,
        },
    ] {
        let slug = if rejection == KeyRejection::Missing {
            "missing-idempotency-key"
        } else {
            "invalid-idempotency-key"
        };
        let answer = answer_of(rejection.clone().into_response()).await;
        let detail = answer.assert_problem(StatusCode::BAD_REQUEST, slug);
        assert_eq!(detail, rejection.to_string());
        details.push(detail);
    }
    details.sort();
    details.dedup();
    assert_eq!(details.len(), 5, "every failure says something different");
}

// -------------------------------------------- refusals as responses alone

async fn answer_of(response: axum::response::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("the body")
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

#[tokio::test]
async fn each_refusal_maps_to_its_status_retry_after_and_problem_type() {
    let unavailable = Rejected::Unavailable {
        source: Arc::new(sqlx::Error::PoolTimedOut),
    };
    let address = "claim_0123456789abcdef01234567".to_owned();
    let cases = [
        (
            Rejected::InFlight,
            StatusCode::CONFLICT,
            Some("1"),
            "in-flight",
        ),
        (
            Rejected::KeyReused,
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            "key-reused",
        ),
        (
            unavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("5"),
            "store-unavailable",
        ),
        (
            Rejected::AlreadyDone,
            StatusCode::CONFLICT,
            None,
            "already-succeeded",
        ),
        (
            Rejected::InDoubt,
            StatusCode::CONFLICT,
            Some("30"),
            "outcome-in-doubt",
        ),
        (
            Rejected::AlreadyFailed,
            StatusCode::CONFLICT,
            None,
            "already-failed",
        ),
        (
            Rejected::Collision {
                address: address.clone(),
            },
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            "key-collision",
        ),
        (
            Rejected::ClaimLost {
                address: address.clone(),
            },
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "outcome-unknown",
        ),
        (
            Rejected::LeaseLost {
                address: address.clone(),
            },
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "outcome-unknown",
        ),
        (
            Rejected::InvalidScope {
                scope: "account",
                name: "a\0b".into(),
                reason: "it contains a NUL character",
            },
            StatusCode::BAD_REQUEST,
            None,
            "invalid-scope",
        ),
        (
            Rejected::StoreRefused {
                fix: "grant the role a privilege",
                source: Arc::new(sqlx::Error::PoolTimedOut),
            },
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "store-refused",
        ),
        (
            Rejected::InvalidOption {
                option: "lease",
                value: "0ns".into(),
                reason: "a lease of zero expires at once",
            },
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "invalid-option",
        ),
    ];
    for (rejected, status, retry_after, slug) in cases {
        let answer = answer_of(rejected.clone().into_response()).await;
        let detail = answer.assert_problem(status, slug);
        assert_eq!(answer.header("retry-after"), retry_after, "{rejected:?}");
        for secret in ["pool", &address, "a\0b"] {
            assert!(
                !detail.contains(secret),
                "{rejected:?} leaks {secret:?}: {detail}"
            );
        }
        assert!(!answer.replayed());
    }
}

/// The 400 for an invalid scope says which rule the name broke, as the
/// gate found it: a NUL character, or a name too long to index.
#[tokio::test]
async fn an_invalid_scope_s_400_names_the_real_cause() {
    let gate = idem::testing::gate().await;
    let id = Identity::new("scoped").part(1);
    for (name, cause, not_the_cause) in [
        (
            "x".repeat(Gate::MAX_SCOPE_NAME_BYTES + 1),
            "longer than 1024 bytes",
            "NUL",
        ),
        ("a\0b".to_owned(), "NUL character", "longer than"),
    ] {
        let refused = gate
            .account(&name)
            .run(&id, async { Ok::<_, Rejected>(()) })
            .await
            .expect_err("an unstorable account is refused");
        let answer = answer_of(refused.into_response()).await;
        let detail = answer.assert_problem(StatusCode::BAD_REQUEST, "invalid-scope");
        assert!(detail.contains(cause), "{detail}");
        assert!(!detail.contains(not_the_cause), "{detail}");
        assert!(!detail.contains(&name), "the name is not echoed: {detail}");
    }
}
