//! gRPC over the same layer: a gRPC request (`content-type:
//! application/grpc*`) is refused with a gRPC status rather than
//! problem+json, and its response is judged by its `grpc-status`. A
//! gRPC-web response (`application/grpc-web*`) carries that status in a
//! trailer frame at the end of its body, which is read for it.
//!
//! The refusals are the same [`Problem`]s as for HTTP (one mapping from
//! [`Rejected`](crate::Rejected)), told in gRPC's terms: the problem's
//! status and type pick the code, its detail is the message.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::body::{BufferedBody, Whole};
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
        .is_some_and(|value| starts_with_ignoring_case(value.as_bytes(), b"application/grpc"))
}

/// Whether a content type begins with `prefix` (lowercase): media types
/// are case-insensitive (RFC 9110, 8.3.1), so `Application/gRPC` is gRPC
/// too, and its response must be judged by its `grpc-status`.
fn starts_with_ignoring_case(content_type: &[u8], prefix: &[u8]) -> bool {
    content_type
        .get(..prefix.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
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

/// The HTTP status a whole gRPC response stands for: [`status_of`] its
/// headers and HTTP trailers, or, for gRPC-web (which has no HTTP
/// trailers: its status travels in the body), of its trailer frame.
pub(super) fn status_of_whole(headers: &HeaderMap, whole: &Whole) -> StatusCode {
    let web_trailers = match web_encoding(headers) {
        Some(WebEncoding::Binary) if whole.trailers.is_none() => web_trailers(&whole.data),
        Some(WebEncoding::Text) if whole.trailers.is_none() => {
            web_trailers(&decode_web_text(&whole.data))
        }
        _ => None,
    };
    status_of(headers, web_trailers.as_ref().or(whole.trailers.as_ref()))
}

/// How a gRPC-web body is written.
enum WebEncoding {
    /// `application/grpc-web`, `+proto`, `+json`: frames as bytes.
    Binary,
    /// `application/grpc-web-text`: the frames in base64.
    Text,
}

/// The gRPC-web encoding a response's content type names, if it is one.
fn web_encoding(headers: &HeaderMap) -> Option<WebEncoding> {
    let content_type = headers.get(CONTENT_TYPE)?.as_bytes();
    if starts_with_ignoring_case(content_type, b"application/grpc-web-text") {
        Some(WebEncoding::Text)
    } else if starts_with_ignoring_case(content_type, b"application/grpc-web") {
        Some(WebEncoding::Binary)
    } else {
        None
    }
}

/// The flag bit of a gRPC-web frame that marks it the trailer frame.
const TRAILER_FRAME: u8 = 0x80;

/// The trailers of a gRPC-web body: the payload of its frame flagged
/// [`TRAILER_FRAME`], HTTP/1-style `name: value` lines. `None` when the
/// body has no such frame, or its frames do not add up (a truncated
/// body: no status, judged a failure).
fn web_trailers(body: &[u8]) -> Option<HeaderMap> {
    let mut rest = body;
    while let Some((&flag, after_flag)) = rest.split_first() {
        let (length, after_length) = after_flag.split_first_chunk::<4>()?;
        let length = usize::try_from(u32::from_be_bytes(*length)).ok()?;
        if after_length.len() < length {
            return None;
        }
        let (payload, next) = after_length.split_at(length);
        if flag & TRAILER_FRAME != 0 {
            return Some(trailer_lines(payload));
        }
        rest = next;
    }
    None
}

/// `name: value` lines, each ended by CRLF (a bare LF is accepted), as a
/// header map; lines that are no valid field are skipped.
fn trailer_lines(payload: &[u8]) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    for line in payload.split(|&byte| byte == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&byte| byte == b':') else {
            continue;
        };
        let (name, value) = line.split_at(colon);
        let value = value.get(1..).unwrap_or_default().trim_ascii();
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&name.trim_ascii().to_ascii_lowercase()),
            HeaderValue::from_bytes(value),
        ) {
            trailers.append(name, value);
        }
    }
    trailers
}

/// A `grpc-web-text` body decoded: base64, possibly several padded
/// chunks one after another (each flush of the server ends one). What
/// does not decode is dropped, leaving no trailer frame to find.
fn decode_web_text(body: &[u8]) -> Vec<u8> {
    let text: Vec<u8> = body
        .iter()
        .copied()
        .filter(|byte| !byte.is_ascii_whitespace())
        .collect();
    let mut decoded = Vec::new();
    let mut chunk = Vec::new();
    for quad in text.chunks(4) {
        chunk.extend_from_slice(quad);
        if quad.contains(&b'=') {
            decoded.extend(BASE64.decode(&chunk).unwrap_or_default());
            chunk.clear();
        }
    }
    decoded.extend(BASE64.decode(&chunk).unwrap_or_default());
    decoded
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
        // Done, and nothing to hand back (never kept, or no longer):
        // not to retry, unlike the other 409s.
        // Superseded by a newer event: nothing left to do either.
        (409, "already-succeeded" | "response-no-longer-kept" | "superseded") => {
            code::ALREADY_EXISTS
        }
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
        // Done, its response no longer kept: not to retry, as above.
        assert_eq!(code(Problem::from(&Rejected::ValueNotKept)), "6");
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

    /// A gRPC-web body: a message frame, then a trailer frame of `lines`.
    fn web_body(lines: &str) -> Vec<u8> {
        let mut body = vec![0, 0, 0, 0, 2, b'h', b'i', TRAILER_FRAME];
        body.extend_from_slice(&u32::try_from(lines.len()).unwrap().to_be_bytes());
        body.extend_from_slice(lines.as_bytes());
        body
    }

    fn web_whole(content_type: &'static str, data: Vec<u8>) -> (HeaderMap, Whole) {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        let whole = Whole {
            data: data.into(),
            trailers: None,
        };
        (headers, whole)
    }

    #[test]
    fn a_grpc_web_status_is_read_from_its_trailer_frame() {
        let (headers, whole) = web_whole(
            "application/grpc-web+proto",
            web_body("grpc-status: 0\r\ngrpc-message: ok\r\n"),
        );
        assert_eq!(status_of_whole(&headers, &whole), StatusCode::OK);
        let (headers, whole) = web_whole("application/grpc-web", web_body("Grpc-Status:14\r\n"));
        assert_eq!(
            status_of_whole(&headers, &whole),
            StatusCode::SERVICE_UNAVAILABLE
        );
        // Two base64 chunks, each padded, as a server flushing twice writes.
        let body = web_body("grpc-status: 5\r\n");
        let (message, trailer) = body.split_at(7);
        let text = format!("{}{}", BASE64.encode(message), BASE64.encode(trailer));
        let (headers, whole) = web_whole("application/grpc-web-text", text.into_bytes());
        assert_eq!(status_of_whole(&headers, &whole), StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_grpc_web_body_without_a_whole_trailer_frame_is_a_failure() {
        let mut truncated = web_body("grpc-status: 0\r\n");
        truncated.truncate(truncated.len() - 3);
        let (headers, whole) = web_whole("application/grpc-web", truncated);
        assert_eq!(
            status_of_whole(&headers, &whole),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let (headers, whole) = web_whole("application/grpc-web", vec![0, 0, 0, 0, 1, b'x']);
        assert_eq!(
            status_of_whole(&headers, &whole),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        // Plain gRPC is never read for frames: its status is in trailers.
        let (headers, whole) = web_whole("application/grpc", web_body("grpc-status: 0\r\n"));
        assert_eq!(
            status_of_whole(&headers, &whole),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("50% off, café"), "50%25 off, caf%C3%A9");
    }
}
