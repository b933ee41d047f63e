//! What a response means for its key, as an [`Outcome`]: a success is
//! kept and given back to duplicates; a failure is recorded as its
//! [`Disposition`] says.

use http::StatusCode;
use http::header::{self, HeaderName};

use crate::mode::Disposition;
use crate::outcome::Outcome;

/// The default status policy: what each response means for its key, as an
/// [`Outcome`]. A [`Succeeded`](Outcome::Succeeded) response is kept (status,
/// the kept headers, body bytes, trailers) and every later duplicate gets it
/// back byte for byte, marked `Idempotent-Replayed: true`; a
/// [`Failed`](Outcome::Failed) one goes to this client only, and the key is
/// recorded as its [`Disposition`] says (`Release`: a retry runs; `Keep`:
/// duplicates are refused 409 `already-failed`; `InDoubt`: refused 409
/// `outcome-in-doubt` until a reconciler or an operator resolves it).
///
/// By default every final answer is kept and replayed,
/// except the ones that say the request was refused before it ran, or
/// that nothing was done, or that the server failed: those release the
/// key, so that a retry (the fixed request, with the same key) runs.
///
/// | status | outcome | why |
/// |---|---|---|
/// | 1xx to 4xx, except below | [`Succeeded`](Outcome::Succeeded) | the request's answer: a retry should get the same one (the draft's behaviour, and Stripe's) |
/// | 400, 405, 413, 415, 422 | [`Failed(Release)`](Outcome::Failed) | the request failed validation (axum's extractors answer a malformed body 400, a missing or wrong `Content-Type` 415, a body that does not fit the handler's type 422; a method the route does not have 405): it never ran, so the client may fix it and retry with the same key (Stripe keeps no result for a request that failed validation) |
/// | 408, 425, 429, 499 | [`Failed(Release)`](Outcome::Failed) | the server asks for a retry (timeout, too early, rate limited) or the client went away: nothing was done |
/// | 5xx | [`Failed(Release)`](Outcome::Failed) | a server error, like an `Err` of a guarded function by default: a retry runs |
///
/// **The trade-off.** The layer cannot tell an extractor's 400 or 422
/// from a handler's: a handler that takes its effect and *then* answers
/// 400 or 422 (a charge made, then a check of the response failed) is run
/// again by a retry. Such a service should keep those answers, or hold
/// them in doubt, with a policy of its own. So should one whose handlers
/// fail *after* their effect (a timeout while calling a payment
/// provider):
///
/// ```
/// use http::StatusCode;
/// use idem_runtime::Disposition;
/// use idem_runtime::Outcome;
/// use idem_runtime::http::default_status_policy;
///
/// fn payments_policy(status: StatusCode) -> Outcome {
///     match status {
///         StatusCode::GATEWAY_TIMEOUT => Outcome::Failed(Disposition::InDoubt),
///         StatusCode::PAYMENT_REQUIRED => Outcome::Failed(Disposition::Keep),
///         // Our handlers validate before they charge, except this one's
///         // 422, which follows the provider's answer.
///         StatusCode::UNPROCESSABLE_ENTITY => Outcome::Succeeded(()),
///         other => default_status_policy(other),
///     }
/// }
/// assert_eq!(payments_policy(StatusCode::CREATED), Outcome::Succeeded(()));
/// ```
///
/// A gRPC response is judged by its `grpc-status`, as the HTTP status
/// gRPC gateways map it to (`OK` 200, `INVALID_ARGUMENT` 400,
/// `NOT_FOUND` 404, `ALREADY_EXISTS` and `ABORTED` 409,
/// `RESOURCE_EXHAUSTED` 429, `CANCELLED` 499, `UNAVAILABLE` 503,
/// `DEADLINE_EXCEEDED` 504, `INTERNAL`, `UNKNOWN` and `DATA_LOSS` 500, ...):
/// so by default `OK` and answers such as `NOT_FOUND` or `ALREADY_EXISTS`
/// are replayed, and `INVALID_ARGUMENT`, `FAILED_PRECONDITION` and
/// `OUT_OF_RANGE` (400: the request was refused), `UNAVAILABLE`,
/// `INTERNAL` and the like release the key.
pub fn default_status_policy(status: StatusCode) -> Outcome {
    match status.as_u16() {
        // Refused before it ran: failed validation, or a method the route
        // does not have. The fixed request must be able to use its key.
        400 | 405 | 413 | 415 | 422 => Outcome::Failed(Disposition::Release),
        408 | 425 | 429 | 499 | 500..=599 => Outcome::Failed(Disposition::Release),
        _ => Outcome::Succeeded(()),
    }
}

/// The response headers (and trailers) kept with a replayed response by
/// default: those that describe the result and are needed to read its
/// bytes, never those about one delivery (`Date`, `Set-Cookie`,
/// `Content-Length`, which the server recomputes).
///
/// `content-type`, `content-encoding`, `content-language`,
/// `content-location`, `location`, `etag`, `last-modified`, and for gRPC
/// `grpc-encoding`, `grpc-status`, `grpc-message` and
/// `grpc-status-details-bin`.
pub const DEFAULT_KEPT_HEADERS: [HeaderName; 11] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    HeaderName::from_static("grpc-encoding"),
    HeaderName::from_static("grpc-status"),
    HeaderName::from_static("grpc-message"),
    HeaderName::from_static("grpc-status-details-bin"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_replayed_and_refusals_and_server_failures_release() {
        for kept in [200, 201, 204, 301, 401, 402, 403, 404, 409, 410, 412] {
            let status = StatusCode::from_u16(kept).unwrap();
            assert_eq!(
                default_status_policy(status),
                Outcome::Succeeded(()),
                "{kept}"
            );
        }
        for released in [
            400, 405, 408, 413, 415, 422, 425, 429, 499, 500, 502, 503, 504,
        ] {
            let status = StatusCode::from_u16(released).unwrap();
            assert_eq!(
                default_status_policy(status),
                Outcome::Failed(Disposition::Release),
                "{released}"
            );
        }
    }
}
