//! Most clients meet idempotency as Stripe's `Idempotency-Key` header on a
//! `POST`: the client sends a value unique to the request, the same value on
//! every retry of it, and the server runs the request once. This module
//! (`idem::http` in the facade) speaks that protocol, following the IETF
//! draft *The Idempotency-Key HTTP Header Field*.
//!
//! It does so two ways, with the same refusals:
//!
//! - **per handler** (feature `axum`): an axum handler guarded by
//!   `#[idempotent]` takes the [`IdempotencyKey`] extractor and returns a
//!   [`StoredResponse`] (below);
//! - **per service** (feature `tower`): `IdempotencyLayer`, one tower layer
//!   around any HTTP or gRPC service (an axum `Router`, a hyper service, a
//!   tonic server), configured once: which methods, which header, the body
//!   limit, the route and caller scope, which statuses are kept.
//!
//! | piece | what it does |
//! |---|---|
//! | `IdempotencyLayer` (feature `tower`) | the whole protocol around a service: the key, a fingerprint of the request, the claim, the response kept and replayed or the key released per status; gRPC refusals as gRPC statuses |
//! | [`IdempotencyKey`] | extractor for the header: 1 to 255 visible ASCII characters, or a 400 with a problem+json body saying what is wrong; `Option<IdempotencyKey>` when the header is optional. A [`KeyPart`](crate::KeyPart), so it can be the guarded function's key |
//! | [`Rejected`](crate::Rejected) as a response | each refusal as the draft's status, with a problem+json body that says what to do next (table below) |
//! | [`StoredResponse`] | a response that `replay` keeps byte for byte and gives back to duplicates, marked `Idempotent-Replayed: true` |
//! | [`Problem`] | an RFC 9457 problem+json response, for the refusals and for your own errors |
//!
//! A handler is an ordinary guarded function: `#[idempotent(key = "key",
//! fingerprint = "...", replay)]` on an axum handler that takes `key:
//! IdempotencyKey` and returns `Result<StoredResponse, E>` where `E` turns a
//! [`Rejected`](crate::Rejected) into its response. `examples/payments/`
//! is a whole service.
//!
//! | the gate says | status | `Retry-After` | problem `type` (after [`PROBLEM_TYPE_BASE`]) | the client should |
//! |---|---|---|---|---|
//! | the body ran | the handler's | | | |
//! | a settled duplicate, response kept (`replay`) | the first answer's, byte for byte, plus `Idempotent-Replayed: true` | | | use it |
//! | `InFlight` | 409 Conflict | 1 s | `in-flight` | retry the same request later |
//! | `KeyReused` | 422 Unprocessable Content | | `key-reused` | send the new request under a new key |
//! | `Unavailable` | 503 Service Unavailable | 5 s | `store-unavailable` | retry the same request later |
//! | `AlreadyDone` | 409 Conflict | | `already-succeeded` | not retry: it took effect; look the result up |
//! | `ValueNotKept` | 409 Conflict | | `response-no-longer-kept` | not retry: it took effect, and its response was kept only for a window (`keep_value_for`), now over; look the result up |
//! | `InDoubt` | 409 Conflict | 30 s | `outcome-in-doubt` | retry the same request later: the first one's outcome is being established |
//! | `AlreadyFailed` | 409 Conflict | | `already-failed` | not retry: it failed definitively; make a new request under a new key |
//! | `Collision` | 422 Unprocessable Content | | `key-collision` | send the request under a new key |
//! | `ClaimLost`, `LeaseLost`, `NotRecorded`, `WrongConnection` | 500 Internal Server Error | | `outcome-unknown` | check whether it took effect before retrying |
//! | `InvalidScope` | 400 Bad Request | | `invalid-scope` | not retry under that account name |
//!
//! The tower layer adds its own: 401 `unidentified-caller` (its scope
//! named no caller for a request with a key: authenticate, then retry),
//! 413 `body-too-large`, 400 `unreadable-body`, 500 `response-failed`.
//!
//! The delays are [`IN_FLIGHT_RETRY_AFTER`], [`IN_DOUBT_RETRY_AFTER`] and [`UNAVAILABLE_RETRY_AFTER`];
//! for others, answer with `Problem::from(&rejected).with_retry_after(..)`.
//!
//! **How long a key is held.** By default for ever: a retry under a key
//! that succeeded is answered from its outcome however late it comes. The
//! IETF draft asks a server to publish its keys' expiry policy; say it in
//! your API's documentation. The tower layer's `keep_slot_for(window)`
//! holds each key for `window` after its outcome is recorded, then lets
//! the same key run again, and says when in the
//! [`IDEMPOTENCY_KEY_EXPIRES`] header of every response it keeps;
//! `keep_value_for(window)` keeps the response itself only that long, after
//! which a retry is refused 409 `response-no-longer-kept`, never run again.
//!
//! Only a success is kept (with `replay`): a refused request, a failed one
//! (the body returned `Err`, so the claim was released and the key is free
//! again) and a malformed one are never replayed. Return a
//! [`StoredResponse`] to have the success given back byte for byte and
//! marked as a replay.
//!
//! ```
//! # #[cfg(feature = "axum")] { // with `tower` alone, axum's traits are absent
//! use idem_runtime::Rejected;
//! use idem_runtime::http::StoredResponse;
//! use axum::http::StatusCode;
//! use axum::response::IntoResponse;
//!
//! // A duplicate while the first request runs: 409, retry in a second.
//! let refused = Rejected::InFlight.into_response();
//! assert_eq!(refused.status(), StatusCode::CONFLICT);
//! assert_eq!(refused.headers()["retry-after"], "1");
//! assert_eq!(refused.headers()["content-type"], "application/problem+json");
//!
//! // What `replay` keeps, and what a duplicate gets back from the store.
//! let first = StoredResponse::new(StatusCode::CREATED).with_body(r#"{"id":"ch_1"}"#);
//! let kept = serde_json::to_string(&first)?;
//! let replayed: StoredResponse = serde_json::from_str(&kept)?;
//! assert_eq!(replayed.body(), first.body());
//! assert!(!first.into_response().headers().contains_key("idempotent-replayed"));
//! assert_eq!(replayed.into_response().headers()["idempotent-replayed"], "true");
//! # }
//! # Ok::<(), serde_json::Error>(())
//! ```

mod key;
mod problem;
mod rejected;
mod stored;

// One file per web framework, each only adapters of the neutral types
// above: an extractor for the key, and each response type as the
// framework's response. A second framework goes beside it, behind a
// feature of its own that enables `http`.
#[cfg(feature = "axum")]
mod axum;

// The protocol for a whole service, as one tower layer (feature `tower`).
#[cfg(feature = "tower")]
mod layer;

use http::HeaderName;

pub use key::{IdempotencyKey, KeyRejection};
pub use problem::{PROBLEM_JSON, PROBLEM_TYPE_BASE, Problem};
pub use rejected::{IN_DOUBT_RETRY_AFTER, IN_FLIGHT_RETRY_AFTER, UNAVAILABLE_RETRY_AFTER};
pub use stored::StoredResponse;

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use layer::{
    BufferedBody, DEFAULT_KEPT_HEADERS, IdempotencyLayer, IdempotencyService, RequestBody,
    ResponseBody, ResponseFuture, ScopeChosen, Scoped, Unscoped, default_status_policy,
};

/// The request header that carries the client's key for this request.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header that marks a replay: `Idempotent-Replayed: true` on a
/// response given back from the store rather than produced by the handler.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The response header that says until when a response's key is held:
/// `Idempotency-Key-Expires: Sun, 06 Dec 2026 21:30:00 GMT`, an HTTP-date
/// (RFC 9110 §5.6.7). The tower layer sends it on every response it keeps
/// (and so on its replays, byte for byte) when it holds keys for a window
/// (`IdempotencyLayer::keep_slot_for`); without a window a key is held for
/// ever and no such header is sent. Until the time stated, a retry with
/// the same key is answered from the first request's outcome; after it
/// (once the database's clock says so), it runs again.
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");
