//! gRPC over the same layer: a gRPC request (`content-type:
//! application/grpc*`) is refused with a gRPC status rather than
//! problem+json, and its response is judged by its `grpc-status`.
//!
//! The refusals are the same [`Problem`]s as for HTTP (one mapping from
//! [`Rejected`](crate::Rejected)), told in gRPC's terms: the problem's
//! status and type pick the code, its detail is the message.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::body::BufferedBody;
use crate::http::{PROBLEM_TYPE_BASE, Problem};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// gRPC status codes the refusals use (the gRPC spec's numbering).
mod code {
    pub(super) const INVALID_ARGUMENT: u16 = 3;
    pub(super) const ALREADY_EXISTS: u16 = 6;
    pub(super) const RESOURCE_EXHAUSTED: u16 = 8;
    pub(super) const FAILED_PRECONDITION: u16 = 9;
    pub(super) const ABORTED: u16 = 10;
    pub(super) const INTERNAL: u16 = 13;
    pub(super) const UNAVAILABLE: u16 = 14;
    pub(super) const UNAUTHENTICATED: u16 = 16;
}

/// Whether a request speaks gRPC: its content type is `application/grpc`
/// or one of its `+proto`, `+json`, ... variants.
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// The HTTP status a gRPC response stands for, for the status policy: its
/// `grpc-status` (in the trailers, or in the headers of a trailers-only
/// response) mapped as gRPC gateways map it. A response without a valid
/// one is a server failure (500).
pub(super) fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> StatusCode {
    let grpc_status = trailers
        .and_then(|trailers| trailers.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u16>().ok());
    let http = match grpc_status {
        Some(0) => 200,
        Some(1) => 499,
        Some(3 | 9 | 11) => 400,
        Some(4) => 504,
        Some(5) => 404,
        Some(6 | 10) => 409,
        Some(7) => 403,
        Some(8) => 429,
        Some(12) => 501,
        Some(14) => 503,
        Some(16) => 401,
        // UNKNOWN, INTERNAL, DATA_LOSS, a code gRPC does not define, none.
        _ => 500,
    };
    StatusCode::from_u16(http).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The HTTP status a gRPC response stands for when its trailers never
/// came (its body failed): the status of a trailers-only response, else
/// `OK`, as the service had begun to answer.
pub(super) fn status_before_trailers(headers: &HeaderMap) -> StatusCode {
    if headers.contains_key(GRPC_STATUS) {
        status_of(headers, None)
    } else {
        StatusCode::OK
    }
}

/// The gRPC code for a refusal: chosen by what the client should do, as
/// the problem's status is.
fn code_of(problem: &Problem) -> u16 {
    let slug = problem
        .problem_type()
        .strip_prefix(PROBLEM_TYPE_BASE)
        .unwrap_or_default();
    match (problem.status().as_u16(), slug) {
        // A malformed or missing key, a key reused for another payload,
        // an unusable account name: the request itself is wrong.
        (400 | 422, _) => code::INVALID_ARGUMENT,
        // No caller the layer's scope could name.
        (401, _) => code::UNAUTHENTICATED,
        (409, "already-succeeded") => code::ALREADY_EXISTS,
        (409, "already-failed") => code::FAILED_PRECONDITION,
        // In flight, or in doubt: retry the same call later.
        (409, _) => code::ABORTED,
        (413, _) => code::RESOURCE_EXHAUSTED,
        (503, _) => code::UNAVAILABLE,
        _ => code::INTERNAL,
    }
}

/// A refusal as a trailers-only gRPC response: HTTP 200, and the status in
/// the headers, which every gRPC client reads as the call's status.
pub(super) fn refusal(problem: &Problem) -> Response<BufferedBody> {
    let mut response = Response::new(BufferedBody::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(code_of(problem)));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(problem.detail())) {
        headers.insert(GRPC_MESSAGE, message);
    }
    if let Some(seconds) = problem.retry_after_secs() {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII,
/// and `%` itself (the gRPC over HTTP/2 spec).
fn percent_encode(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Rejected;
    use crate::http::KeyRejection;

    #[test]
    fn refusals_get_the_code_that_says_what_to_do() {
        let code = |problem: Problem| {
            refusal(&problem).headers()[GRPC_STATUS]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(code(Problem::from(&Rejected::InFlight)), "10");
        assert_eq!(code(Problem::from(&Rejected::InDoubt)), "10");
        assert_eq!(code(Problem::from(&Rejected::AlreadyDone)), "6");
        assert_eq!(code(Problem::from(&Rejected::AlreadyFailed)), "9");
        assert_eq!(code(Problem::from(&Rejected::KeyReused)), "3");
        assert_eq!(code(Problem::from(&KeyRejection::Missing)), "3");
        let refused = refusal(&Problem::from(&Rejected::InFlight));
        assert_eq!(refused.status(), StatusCode::OK);
        assert_eq!(refused.headers()["retry-after"], "1");
        assert!(
            refused.headers()[GRPC_MESSAGE]
                .to_str()
                .unwrap()
                .starts_with("A request with this Idempotency-Key is still being processed")
        );
    }

    #[test]
    fn a_response_is_judged_by_its_grpc_status_wherever_it_is() {
        let map = |status: &'static str| {
            let mut map = HeaderMap::new();
            map.insert(GRPC_STATUS, HeaderValue::from_static(status));
            map
        };
        let none = HeaderMap::new();
        assert_eq!(status_of(&none, Some(&map("0"))), StatusCode::OK);
        assert_eq!(status_of(&map("14"), None), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status_of(&none, Some(&map("3"))), StatusCode::BAD_REQUEST);
        assert_eq!(status_of(&none, None), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            status_of(&none, Some(&map("x"))),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("50% off, café"), "50%25 off, caf%C3%A9");
    }
}
