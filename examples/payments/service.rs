//! The payments service: `POST /charges` with an `Idempotency-Key` header,
//! guarded by `#[idempotent]`, writing one row per charge into a real
//! `card_charges` table, and `GET /metrics`, what idem counted, in
//! Prometheus' text format. `tests.rs` starts it on 127.0.0.1 and sends it
//! real requests.
//!
//! Its card network sometimes times out, before or after it charged: the
//! charge is then in doubt, held so that no retry charges again, and
//! [`reconciler`] asks the network's lookup what happened.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::header::{
    AUTHORIZATION, CONTENT_TYPE, InvalidHeaderValue, LOCATION, WWW_AUTHENTICATE,
};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{IdempotencyKey, Problem, StoredResponse};
use idem::metrics::MetricsOptions;
use idem::reconcile::{Doubt, Reconciler, Verdict};
use idem::sqlx::{self, PgPool};
use idem::{Disposition, Gate, Rejected, idempotent};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};

/// The stand-in card network declines any charge above this (1,000.00).
pub const LIMIT_CENTS: i64 = 100_000;

/// The example binary's card network times out its first call (after
/// charging), then one call in this many after it, alternately before and
/// after charging ([`CardNetwork::time_out_every`]): the sixth call times
/// out before charging, the eleventh after, ...
pub const TIME_OUT_EVERY: u32 = 5;

/// The table the charges are written to. No unique constraint on
/// `(account, idempotency_key)`: idem alone keeps one charge per key here,
/// and the tests count the rows to prove it.
pub const CHARGES_TABLE: &str = "
    CREATE TABLE IF NOT EXISTS card_charges (
        id              bigserial PRIMARY KEY,
        account         text NOT NULL,
        idempotency_key text NOT NULL,
        -- The card network's authorization: booked once, whoever books it
        -- (the request, or the reconciler after a timeout).
        authorization_id text NOT NULL UNIQUE,
        amount_cents    bigint NOT NULL CHECK (amount_cents > 0),
        currency        text NOT NULL,
        created_at      timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS card_charges_by_key ON card_charges (account, idempotency_key);
";

/// Creates the `card_charges` table if it is missing. Under an advisory lock:
/// two concurrent `CREATE TABLE IF NOT EXISTS` can both try to create it,
/// and one then fails on PostgreSQL's catalog.
pub async fn create_charges_table(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem examples: card_charges table'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(CHARGES_TABLE).execute(&mut *tx).await?;
    tx.commit().await
}

/// What the handlers share.
pub struct Payments {
    /// The gate, in its default account: each request scopes it to its
    /// caller's account.
    pub gate: Gate,
    /// The stand-in card network.
    pub network: CardNetwork,
}

impl Payments {
    /// A service whose card network answers after `network_latency`.
    ///
    /// Its metrics carry the caller's account: the callers of this service
    /// are a handful of API clients. With a tenant per end user, leave the
    /// account out (the default): each account is a series of its own.
    pub fn new(gate: Gate, network_latency: Duration) -> Payments {
        Payments {
            gate: gate.with_metrics(MetricsOptions::new().label_account(true)),
            network: CardNetwork::new(network_latency),
        }
    }
}

/// The upper bounds of the duration histograms' buckets, in seconds: from a
/// claim's round trip on a local network to a card network that takes
/// seconds.
const DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the process's metrics recorder (at most one per process: the
/// `metrics` facade has one global recorder), which renders Prometheus'
/// text format, and describes idem's metrics to it. Its histograms
/// (`*_duration_seconds`) are rendered with [`DURATION_BUCKETS`]. Run
/// [`PrometheusHandle::run_upkeep`] now and then, as `main` does.
pub fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".to_owned()),
            &DURATION_BUCKETS,
        )?
        .install_recorder()?;
    idem::metrics::describe();
    Ok(handle)
}

/// How a call to the card network can time out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// The request never reached the network: nothing was charged.
    BeforeCharging,
    /// The network charged, and its answer was lost.
    AfterCharging,
}

/// What the card network keeps of a charge it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// Its id at the network.
    pub id: String,
    /// The amount, in cents.
    pub amount_cents: i64,
    /// The currency.
    pub currency: String,
}

/// The stand-in card network: slow, sometimes down, sometimes silent
/// before or after charging, and it declines charges above the limit. It
/// knows each charge by the reference the service gives it, and can be
/// asked about one later.
pub struct CardNetwork {
    latency: Duration,
    /// How many of the next calls fail before anything is sent, as in an
    /// outage: a failure that a retry of the very same request gets past.
    pub failures: AtomicU32,
    /// The timeouts of the next calls, in order.
    timeouts: Mutex<VecDeque<Timeout>>,
    /// 0: no call times out unless planned. Else the first call times out
    /// after charging, then one call in this many after it, alternately
    /// before and after charging: for the example binary.
    time_out_every: AtomicU32,
    calls: AtomicU64,
    timeout_calls: AtomicU64,
    charged: Mutex<HashMap<String, Authorization>>,
    /// When this network started, in nanoseconds since the epoch: its
    /// authorization ids are unique across networks (and test runs) that
    /// book into one table.
    started: u128,
}

impl CardNetwork {
    fn new(latency: Duration) -> CardNetwork {
        CardNetwork {
            latency,
            failures: AtomicU32::new(0),
            timeouts: Mutex::new(VecDeque::new()),
            time_out_every: AtomicU32::new(0),
            calls: AtomicU64::new(0),
            timeout_calls: AtomicU64::new(0),
            charged: Mutex::new(HashMap::new()),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos()),
        }
    }

    /// The next call times out as `timeout` says.
    #[cfg(test)]
    pub fn time_out_next(&self, timeout: Timeout) {
        self.lock_timeouts().push_back(timeout);
    }

    /// Times out the first call (after charging: the charge is made and its
    /// answer lost), then one call in `every` after it (calls `1 + every`,
    /// `1 + 2 * every`, ...), alternately before and after charging; 0: none.
    /// Deterministic, so that a session against the example binary goes as
    /// its README shows: every call counts, declined ones too, and a call
    /// planned with `time_out_next` does not.
    pub fn time_out_every(&self, every: u32) {
        self.time_out_every.store(every, Ordering::SeqCst);
    }

    /// Charges `charge` under `reference`, unless it declines, is down or
    /// times out.
    async fn authorize(
        &self,
        reference: &str,
        charge: &NewCharge,
    ) -> Result<Authorization, ChargeError> {
        tokio::time::sleep(self.latency).await;
        let down = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if down {
            return Err(ChargeError::NetworkDown);
        }
        let timeout = self.next_timeout();
        if timeout == Some(Timeout::BeforeCharging) {
            return Err(ChargeError::Timeout);
        }
        if charge.amount_cents > LIMIT_CENTS {
            return Err(ChargeError::Declined);
        }
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let authorization = Authorization {
            id: format!("auth_{:x}_{call}", self.started),
            amount_cents: charge.amount_cents,
            currency: charge.currency.clone(),
        };
        self.lock_charged()
            .entry(reference.to_owned())
            .or_insert_with(|| authorization.clone());
        match timeout {
            Some(_) => Err(ChargeError::Timeout),
            None => Ok(authorization),
        }
    }

    /// The network's lookup by reference: the charge made under it, if any.
    pub fn lookup(&self, reference: &str) -> Option<Authorization> {
        self.lock_charged().get(reference).cloned()
    }

    fn next_timeout(&self) -> Option<Timeout> {
        if let Some(planned) = self.lock_timeouts().pop_front() {
            return Some(planned);
        }
        let every = u64::from(self.time_out_every.load(Ordering::SeqCst));
        // Counted from 0: calls 0, every, 2 * every, ... time out.
        let call = self.timeout_calls.fetch_add(1, Ordering::SeqCst);
        match every {
            0 => None,
            _ if !call.is_multiple_of(every) => None,
            _ if (call / every).is_multiple_of(2) => Some(Timeout::AfterCharging),
            _ => Some(Timeout::BeforeCharging),
        }
    }

    fn lock_timeouts(&self) -> std::sync::MutexGuard<'_, VecDeque<Timeout>> {
        self.timeouts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_charged(&self) -> std::sync::MutexGuard<'_, HashMap<String, Authorization>> {
        self.charged.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The reference the card network knows a charge by: one per caller and
/// key, so a lookup after a timeout finds exactly that request's charge.
fn reference(account: &str, key: &str) -> String {
    format!("{account}/{key}")
}

/// Establishes the charges whose card network call timed out: asks the
/// network's lookup, books a charge it made (as the request would have)
/// and settles the claim with the response the request would have sent,
/// which retries then get, replayed; releases the claim of a charge it
/// never made, so a retry runs it.
pub fn reconciler(payments: Arc<Payments>) -> Reconciler {
    let metrics = payments.gate.metrics_options();
    Reconciler::new(payments.gate.pool().clone())
        .metrics(metrics)
        .probe("create_charge", move |doubt| {
            let payments = Arc::clone(&payments);
            async move { payments.probe(doubt).await }
        })
}

impl Payments {
    /// What became of the charge `doubt` holds.
    async fn probe(&self, doubt: Doubt) -> Verdict {
        let Some(key) = doubt
            .identity
            .parts()
            .next()
            .and_then(|part| part.as_text())
        else {
            return Verdict::Unknown;
        };
        let Some(authorization) = self.network.lookup(&reference(&doubt.account, key)) else {
            return Verdict::NotHappened;
        };
        let booked = book(self.gate.pool(), &doubt.account, key, &authorization).await;
        match booked.and_then(|response| Ok(Verdict::succeeded_with(&response)?)) {
            Ok(verdict) => verdict,
            Err(error) => {
                tracing::warn!(error = %error, "the charge could not be booked; asking again later");
                Verdict::Unknown
            }
        }
    }
}

/// Books the charge the card network made, once (its authorization is
/// unique), and returns the response the request answers with.
async fn book(
    pool: &PgPool,
    account: &str,
    key: &str,
    authorization: &Authorization,
) -> Result<StoredResponse, ChargeError> {
    sqlx::query(
        "INSERT INTO card_charges \
           (account, idempotency_key, authorization_id, amount_cents, currency) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (authorization_id) DO NOTHING",
    )
    .bind(account)
    .bind(key)
    .bind(&authorization.id)
    .bind(authorization.amount_cents)
    .bind(&authorization.currency)
    .execute(pool)
    .await?;
    let id: i64 = sqlx::query_scalar("SELECT id FROM card_charges WHERE authorization_id = $1")
        .bind(&authorization.id)
        .fetch_one(pool)
        .await?;
    let id = format!("ch_{id}");
    let location = HeaderValue::try_from(format!("/charges/{id}"))?;
    let made = Charge {
        id,
        amount_cents: authorization.amount_cents,
        currency: &authorization.currency,
        status: "succeeded",
    };
    Ok(StoredResponse::json(StatusCode::CREATED, &made)?.with_header(LOCATION, location))
}

/// The service: `POST /charges`, and `GET /metrics` rendered from
/// `metrics`, the handle of the recorder [`install_metrics`] installed.
pub fn router(payments: Arc<Payments>, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/charges", post(create_charge))
        .route(
            "/metrics",
            get(move || std::future::ready(render_metrics(&metrics))),
        )
        .with_state(payments)
}

/// `GET /metrics`: every metric, in the text format Prometheus scrapes.
fn render_metrics(metrics: &PrometheusHandle) -> Response {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        metrics.render(),
    )
        .into_response()
}

/// The request body.
#[derive(Debug, Deserialize)]
pub struct NewCharge {
    /// The amount, in cents: positive.
    pub amount_cents: i64,
    /// An ISO 4217 code, upper case.
    pub currency: String,
}

/// The response body of a charge made.
#[derive(Debug, Serialize)]
struct Charge<'a> {
    id: String,
    amount_cents: i64,
    currency: &'a str,
    status: &'static str,
}

/// Charges the caller once per `Idempotency-Key`.
///
/// - Same key, same payload, first request still running: 409, retry later.
/// - Same key, same payload, first request succeeded: its response again,
///   byte for byte, with `Idempotent-Replayed: true` (`replay`).
/// - Same key, another payload: 422 (`fingerprint`).
/// - The charge failed before the card network charged (invalid, declined,
///   network down): the claim is released and nothing is kept, so the key
///   can be used again, with this payload or a corrected one.
/// - The card network may have charged (it timed out, or booking its
///   charge failed): the claim is held in doubt (`disposition`), retries
///   get 409 with `Retry-After` and never charge again, and [`reconciler`]
///   establishes what happened from the network's lookup; a retry after
///   that gets the charge's response, replayed, or runs afresh if nothing
///   was charged.
#[idempotent(
    key = "key",
    action = "create_charge",
    gate = app.gate,
    account = caller.0,
    fingerprint = "charge.amount_cents, charge.currency",
    replay,
    disposition = ChargeError::disposition,
)]
async fn create_charge(
    State(app): State<Arc<Payments>>,
    caller: Caller,
    key: IdempotencyKey,
    Json(charge): Json<NewCharge>,
) -> Result<StoredResponse, ChargeError> {
    if charge.amount_cents <= 0 {
        return Err(ChargeError::InvalidAmount(charge.amount_cents));
    }
    if charge.currency.len() != 3 || !charge.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ChargeError::InvalidCurrency(charge.currency));
    }
    let reference = reference(&caller.0, key.as_str());
    let authorization = app.network.authorize(&reference, &charge).await?;
    book(app.gate.pool(), &caller.0, key.as_str(), &authorization).await
}

/// The caller's account, from `Authorization: Bearer <account>`.
///
/// A stand-in for real authentication: the token *is* the account name. A
/// real service verifies a token and looks the account up; what matters
/// here is that the account comes from the caller's credentials, never from
/// the body, so one client's keys cannot collide with another's.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        let account = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .filter(|account| {
                (1..=128).contains(&account.len()) && account.bytes().all(|b| b.is_ascii_graphic())
            });
        match account {
            Some(account) => Ok(Caller(account.to_owned())),
            None => Err((
                [(WWW_AUTHENTICATE, "Bearer")],
                problem(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "Unauthenticated",
                    "Send `Authorization: Bearer <account>`, the account to charge.".to_owned(),
                ),
            )
                .into_response()),
        }
    }
}

/// Why a charge was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    /// The gate refused it: a duplicate, or one in flight.
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// Not a positive number of cents.
    #[error("amount_cents must be a positive number of cents, not {0}")]
    InvalidAmount(i64),
    /// Not a currency code.
    #[error("currency must be a three-letter upper-case ISO 4217 code, not {0:?}")]
    InvalidCurrency(String),
    /// The card network declined it.
    #[error("the card was declined")]
    Declined,
    /// The card network could not be reached: nothing was sent.
    #[error("the card network could not be reached")]
    NetworkDown,
    /// The card network did not answer in time: it may have charged.
    #[error("the card network did not answer in time")]
    Timeout,
    /// Writing the charge failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The stored response could not be encoded.
    #[error(transparent)]
    Encoding(#[from] serde_json::Error),
    /// A response header could not be built.
    #[error(transparent)]
    Header(#[from] InvalidHeaderValue),
}

impl ChargeError {
    /// What the error means for the key: released when nothing was charged,
    /// in doubt when the card network may have charged (every error after
    /// the call to it).
    fn disposition(&self) -> Disposition {
        match self {
            ChargeError::Timeout
            | ChargeError::Database(_)
            | ChargeError::Encoding(_)
            | ChargeError::Header(_) => Disposition::InDoubt,
            _ => Disposition::Release,
        }
    }
}

impl IntoResponse for ChargeError {
    fn into_response(self) -> Response {
        let detail = self.to_string();
        match self {
            // 409 in flight, 422 key reused, 503 store down, ...
            ChargeError::Rejected(refused) => refused.into_response(),
            ChargeError::InvalidAmount(_) | ChargeError::InvalidCurrency(_) => problem(
                StatusCode::BAD_REQUEST,
                "invalid-charge",
                "Invalid charge",
                format!("{detail}. Correct the request; the same key may be used again."),
            )
            .into_response(),
            ChargeError::Declined => problem(
                StatusCode::PAYMENT_REQUIRED,
                "card-declined",
                "Card declined",
                format!(
                    "The card was declined (the limit is {}.{:02}). Nothing was charged; \
                     the same key may be used again.",
                    LIMIT_CENTS / 100,
                    LIMIT_CENTS % 100
                ),
            )
            .into_response(),
            ChargeError::NetworkDown => problem(
                StatusCode::BAD_GATEWAY,
                "card-network-down",
                "Card network unavailable",
                "The card network could not be reached. Nothing was charged; retry the \
                 request unchanged, with the same key."
                    .to_owned(),
            )
            .into_response(),
            ChargeError::Timeout => problem(
                StatusCode::GATEWAY_TIMEOUT,
                "card-network-timeout",
                "Card network timed out",
                "The card network did not answer in time: the charge may or may not have been \
                 made, and it is being established. Retry the same request, with the same key, \
                 later: it is never charged twice."
                    .to_owned(),
            )
            .with_retry_after(Duration::from_secs(30))
            .into_response(),
            ChargeError::Database(_) | ChargeError::Encoding(_) | ChargeError::Header(_) => {
                tracing::error!(error = %detail, "charge failed");
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "Internal error",
                    "The charge may have been made, and it is being established. Retry the same \
                     request, with the same key, later: it is never charged twice."
                        .to_owned(),
                )
                .into_response()
            }
        }
    }
}

/// One of this service's own problem types.
fn problem(status: StatusCode, slug: &str, title: &'static str, detail: String) -> Problem {
    Problem::new(
        status,
        format!("https://payments.example/problems/{slug}"),
        title,
        detail,
    )
}

#[cfg(test)]
mod timeouts {
    use super::{CardNetwork, TIME_OUT_EVERY, Timeout};
    use std::time::Duration;

    #[test]
    fn the_first_call_times_out_after_charging_then_one_in_every_alternately() {
        let network = CardNetwork::new(Duration::ZERO);
        network.time_out_every(TIME_OUT_EVERY);
        let timeouts: Vec<(usize, Timeout)> = (1..=16)
            .filter_map(|call| network.next_timeout().map(|timeout| (call, timeout)))
            .collect();
        assert_eq!(
            timeouts,
            [
                (1, Timeout::AfterCharging),
                (6, Timeout::BeforeCharging),
                (11, Timeout::AfterCharging),
                (16, Timeout::BeforeCharging),
            ]
        );
        // A planned timeout comes first and does not count.
        network.time_out_next(Timeout::BeforeCharging);
        assert_eq!(network.next_timeout(), Some(Timeout::BeforeCharging));
        assert_eq!(network.next_timeout(), None);
    }

    #[test]
    fn no_call_times_out_unless_asked() {
        let network = CardNetwork::new(Duration::ZERO);
        assert!((0..20).all(|_| network.next_timeout().is_none()));
    }
}
