//! The payments service: `POST /charges` with an `Idempotency-Key` header,
//! guarded by `#[idempotent]`, writing one row per charge into a real
//! `charges` table. `tests.rs` starts it on 127.0.0.1 and sends it real
//! requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::header::{AUTHORIZATION, InvalidHeaderValue, LOCATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem::axum::{IdempotencyKey, Problem, StoredResponse};
use idem::sqlx::{self, PgPool};
use idem::{Gate, Rejected, idempotent};
use serde::{Deserialize, Serialize};

/// The stand-in card network declines any charge above this (1,000.00).
pub const LIMIT_CENTS: i64 = 100_000;

/// The table the charges are written to. No unique constraint on
/// `(account, idempotency_key)`: idem alone keeps one charge per key here,
/// and the tests count the rows to prove it.
pub const CHARGES_TABLE: &str = "
    CREATE TABLE IF NOT EXISTS charges (
        id              bigserial PRIMARY KEY,
        account         text NOT NULL,
        idempotency_key text NOT NULL,
        amount_cents    bigint NOT NULL CHECK (amount_cents > 0),
        currency        text NOT NULL,
        created_at      timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS charges_by_key ON charges (account, idempotency_key);
";

/// Creates the `charges` table if it is missing. Under an advisory lock:
/// two concurrent `CREATE TABLE IF NOT EXISTS` can both try to create it,
/// and one then fails on PostgreSQL's catalog.
pub async fn create_charges_table(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem examples: charges table'))")
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
    /// How long the stand-in card network takes to answer: long enough for
    /// a retry sent meanwhile to find the first request in flight.
    pub network_latency: Duration,
    /// How many of the next calls to the card network fail, as in an
    /// outage: a failure that a retry of the very same request gets past.
    pub network_failures: AtomicU32,
}

impl Payments {
    /// A service whose card network answers after `network_latency`.
    pub fn new(gate: Gate, network_latency: Duration) -> Payments {
        Payments {
            gate,
            network_latency,
            network_failures: AtomicU32::new(0),
        }
    }

    /// The stand-in card network: slow, sometimes down, and it declines
    /// charges above the limit.
    async fn authorize(&self, charge: &NewCharge) -> Result<(), ChargeError> {
        tokio::time::sleep(self.network_latency).await;
        let down = self
            .network_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if down {
            return Err(ChargeError::NetworkDown);
        }
        if charge.amount_cents > LIMIT_CENTS {
            return Err(ChargeError::Declined);
        }
        Ok(())
    }
}

/// The service: `POST /charges`.
pub fn router(payments: Arc<Payments>) -> Router {
    Router::new()
        .route("/charges", post(create_charge))
        .with_state(payments)
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
/// - The charge failed (`Err`): the claim is released and nothing is kept,
///   so the key can be used again, with this payload or a corrected one.
///
/// The charge row is written in its own transaction, committed last, so a
/// response that cannot be built leaves no charge behind for a retry to
/// repeat. The claim is not in that transaction (`tx = ...`) on purpose: a
/// duplicate would then wait for the first request to commit instead of
/// getting the 409 that the Idempotency-Key draft requires. The price is one
/// narrow window: a commit whose answer is lost (the connection drops
/// mid-commit) is released like any failure, so its retry may charge again.
#[idempotent(
    key = "key",
    action = "create_charge",
    gate = app.gate,
    account = caller.0,
    fingerprint = "charge.amount_cents, charge.currency",
    replay,
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
    app.authorize(&charge).await?;

    let mut tx = app.gate.pool().begin().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO charges (account, idempotency_key, amount_cents, currency) \
         VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(&caller.0)
    .bind(key.as_str())
    .bind(charge.amount_cents)
    .bind(&charge.currency)
    .fetch_one(&mut *tx)
    .await?;
    let id = format!("ch_{id}");
    let location = HeaderValue::try_from(format!("/charges/{id}"))?;
    let made = Charge {
        id,
        amount_cents: charge.amount_cents,
        currency: &charge.currency,
        status: "succeeded",
    };
    let response =
        StoredResponse::json(StatusCode::CREATED, &made)?.with_header(LOCATION, location);
    tx.commit().await?;
    Ok(response)
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
    /// The card network did not answer: outcome unknown.
    #[error("the card network did not answer")]
    NetworkDown,
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
                "The card network did not answer. Nothing was charged; retry the request \
                 unchanged, with the same key."
                    .to_owned(),
            )
            .into_response(),
            ChargeError::Database(_) | ChargeError::Encoding(_) | ChargeError::Header(_) => {
                tracing::error!(error = %detail, "charge failed");
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "Internal error",
                    "The charge was not made. Retry with the same key.".to_owned(),
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
