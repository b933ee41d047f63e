//! A response that `replay` can keep in the store and give back, byte for
//! byte, to the duplicates of the request that produced it.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::IDEMPOTENT_REPLAYED;

/// A response kept whole: status, the headers the handler chose, and the
/// body's exact bytes. Return it as the `Ok` value of a handler guarded with
/// `#[idempotent(..., replay)]`: the first request gets it as built; every
/// later duplicate (with the same fingerprint) gets the same status, headers
/// and body back from the store, plus `Idempotent-Replayed: true`.
///
/// Keeping the rendered bytes, rather than the value they were rendered
/// from, makes the replay identical even if serialization would come out
/// differently today (another field order, a changed `Serialize`, a new
/// deploy). Keep only headers that describe the result (`Content-Type`,
/// `Location`, `ETag`), not ones about this one response (`Date`,
/// `Set-Cookie`, `Content-Length`).
///
/// **How a replay is recognised.** The gate returns a replayed value as the
/// same `Ok` as the first time, so the handler cannot tell. A
/// `StoredResponse` can: the only way one is ever deserialized is the gate
/// reading it back from the store, so one that was deserialized is a
/// replay, and its conversion into a response marks it.
/// Nothing else (no middleware, no task-local) is needed.
///
/// **Stored form** (JSON, in the claim row's `output` column):
/// `{"status":201,"headers":[["content-type","application/json"]],"body":"..."}`.
/// A body that is UTF-8 without NUL is kept as text, readable with
/// `idem claims show`; any other body as `"body_base64"`, since PostgreSQL's
/// `jsonb` cannot hold a NUL character in a string and JSON has no bytes.
/// Header values are kept one character per byte (ISO-8859-1), which maps
/// every byte a header may hold, the non-ASCII ones included. Trailers
/// (gRPC's `grpc-status`, kept by the tower layer) are a `"trailers"` list
/// of the same form, present only when there are some.
///
/// ```
/// use http::{StatusCode, header::LOCATION, HeaderValue};
/// use idem_runtime::http::StoredResponse;
///
/// #[derive(serde::Serialize)]
/// struct Charge { id: String, amount_cents: i64 }
///
/// let charge = Charge { id: "ch_1".into(), amount_cents: 4_999 };
/// let response = StoredResponse::json(StatusCode::CREATED, &charge)?
///     .with_header(LOCATION, HeaderValue::from_static("/charges/ch_1"));
/// assert_eq!(response.body(), br#"{"id":"ch_1","amount_cents":4999}"#);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// assert!(!response.is_replay());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
    trailers: HeaderMap,
    replayed: bool,
}

impl StoredResponse {
    /// A response with this status, no headers and an empty body.
    pub fn new(status: StatusCode) -> StoredResponse {
        StoredResponse {
            status,
            headers: HeaderMap::new(),
            body: Vec::new(),
            trailers: HeaderMap::new(),
            replayed: false,
        }
    }

    /// A response whose body is `value` as JSON, with
    /// `Content-Type: application/json`.
    pub fn json<T: Serialize + ?Sized>(
        status: StatusCode,
        value: &T,
    ) -> Result<StoredResponse, serde_json::Error> {
        let body = serde_json::to_vec(value)?;
        Ok(StoredResponse::new(status)
            .with_header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .with_body(body))
    }

    /// Sets the body.
    #[must_use = "`with_body` returns the changed response"]
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> StoredResponse {
        self.body = body.into();
        self
    }

    /// Adds a header (after any of the same name).
    #[must_use = "`with_header` returns the changed response"]
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> StoredResponse {
        self.headers.append(name, value);
        self
    }

    /// Adds a trailer (after any of the same name): a field sent after the
    /// body, as gRPC sends its `grpc-status`. Only a body that can carry
    /// trailers (HTTP/2, chunked HTTP/1.1) sends them; the tower layer's
    /// replay does, the plain `http::Response<Vec<u8>>` conversion cannot
    /// and leaves them out.
    #[must_use = "`with_trailer` returns the changed response"]
    pub fn with_trailer(mut self, name: HeaderName, value: HeaderValue) -> StoredResponse {
        self.trailers.append(name, value);
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers kept with the response.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body's bytes.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The trailers kept with the response (none unless added with
    /// [`with_trailer`](StoredResponse::with_trailer)).
    pub fn trailers(&self) -> &HeaderMap {
        &self.trailers
    }

    /// The parts, to build a response of another body type: status,
    /// headers, body bytes and trailers.
    pub fn into_parts(self) -> (StatusCode, HeaderMap, Vec<u8>, HeaderMap) {
        (self.status, self.headers, self.body, self.trailers)
    }

    /// `true` when this response was read back from the store: a duplicate
    /// is getting the first request's answer.
    pub fn is_replay(&self) -> bool {
        self.replayed
    }
}

impl From<StoredResponse> for Response<Vec<u8>> {
    /// The response as kept: status, headers and body, nothing added but
    /// `Idempotent-Replayed: true` on a replay (no `Content-Type` the
    /// handler did not choose).
    fn from(stored: StoredResponse) -> Response<Vec<u8>> {
        let mut response = Response::new(stored.body);
        *response.status_mut() = stored.status;
        *response.headers_mut() = stored.headers;
        if stored.replayed {
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        response
    }
}

/// The stored form; see [`StoredResponse`]. Exactly one of `body` and
/// `body_base64` is present; `trailers` only when there are some, so a
/// response without them is stored as it always was.
#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    status: u16,
    headers: Vec<(Cow<'a, str>, String)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    trailers: Vec<(Cow<'a, str>, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

impl Serialize for StoredResponse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let headers = fields(&self.headers);
        let trailers = fields(&self.trailers);
        let text = std::str::from_utf8(&self.body)
            .ok()
            .filter(|text| !text.contains('\0'));
        let (body, body_base64) = match text {
            Some(text) => (Some(Cow::Borrowed(text)), None),
            None => (None, Some(BASE64.encode(&self.body))),
        };
        Stored {
            status: self.status.as_u16(),
            headers,
            trailers,
            body,
            body_base64,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StoredResponse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = Stored::deserialize(deserializer)?;
        let status = StatusCode::from_u16(stored.status).map_err(D::Error::custom)?;
        let headers = header_map(stored.headers).map_err(D::Error::custom)?;
        let trailers = header_map(stored.trailers).map_err(D::Error::custom)?;
        let body = match (stored.body, stored.body_base64) {
            (Some(text), None) => text.into_owned().into_bytes(),
            (None, Some(encoded)) => BASE64.decode(encoded).map_err(D::Error::custom)?,
            _ => {
                return Err(D::Error::custom(
                    "a stored response has exactly one of `body` and `body_base64`",
                ));
            }
        };
        Ok(StoredResponse {
            status,
            headers,
            body,
            trailers,
            // Only the gate's replay reads a stored response back.
            replayed: true,
        })
    }
}

/// A map's fields in the stored form: names as they are, values as latin1.
fn fields(map: &HeaderMap) -> Vec<(Cow<'_, str>, String)> {
    map.iter()
        .map(|(name, value)| (Cow::Borrowed(name.as_str()), latin1(value.as_bytes())))
        .collect()
}

/// The fields of the stored form, as a map: repeated names keep their order.
fn header_map(fields: Vec<(Cow<'_, str>, String)>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
        let bytes = bytes_of_latin1(&value)
            .ok_or_else(|| format!("header {name} holds a character above U+00FF"))?;
        let value = HeaderValue::from_bytes(&bytes).map_err(|e| e.to_string())?;
        map.append(name, value);
    }
    Ok(map)
}

/// Each byte as the character of the same number (ISO-8859-1): lossless for
/// any bytes, and never NUL for a header value.
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&byte| char::from(byte)).collect()
}

/// The inverse of [`latin1`]; `None` for a character above U+00FF.
fn bytes_of_latin1(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| u8::try_from(c).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{LOCATION, SET_COOKIE};

    fn round_trip(response: &StoredResponse) -> (String, StoredResponse) {
        let json = serde_json::to_string(response).unwrap();
        let back = serde_json::from_str(&json).unwrap();
        (json, back)
    }

    #[test]
    fn a_text_body_is_kept_as_text_and_read_back_as_a_replay() {
        let response = StoredResponse::json(StatusCode::CREATED, &serde_json::json!({"id": 1}))
            .unwrap()
            .with_header(LOCATION, HeaderValue::from_static("/charges/1"));
        let (json, back) = round_trip(&response);
        assert_eq!(
            json,
            r#"{"status":201,"headers":[["content-type","application/json"],["location","/charges/1"]],"body":"{\"id\":1}"}"#
        );
        assert!(back.is_replay() && !response.is_replay());
        assert_eq!(back.status(), response.status());
        assert_eq!(back.headers(), response.headers());
        assert_eq!(back.body(), response.body());
    }

    #[test]
    fn any_bytes_survive_as_base64_and_any_header_bytes_as_latin1() {
        let body = vec![0, 159, 146, 150, b'\n', 0xff];
        let response = StoredResponse::new(StatusCode::OK)
            .with_header(SET_COOKIE, HeaderValue::from_static("a=1"))
            .with_header(SET_COOKIE, HeaderValue::from_static("b=2"))
            .with_header(
                HeaderName::from_static("x-raw"),
                HeaderValue::from_bytes(b"caf\xe9 \xff").unwrap(),
            )
            .with_body(body.clone());
        let (json, back) = round_trip(&response);
        assert!(
            json.contains(r#""body_base64":"#) && !json.contains(r#""body":"#),
            "{json}"
        );
        assert!(!json.contains("\\u0000"), "jsonb refuses NUL: {json}");
        assert_eq!(back.body(), &body[..]);
        assert_eq!(back.headers(), response.headers());
        let cookies: Vec<_> = back.headers().get_all(SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"], "repeated headers keep their order");
    }

    #[test]
    fn trailers_are_kept_only_when_there_are_some() {
        let plain = StoredResponse::new(StatusCode::OK).with_body("x");
        let (json, back) = round_trip(&plain);
        assert!(!json.contains("trailers"), "{json}");
        assert!(back.trailers().is_empty());
        let grpc = plain
            .with_trailer(
                HeaderName::from_static("grpc-status"),
                HeaderValue::from_static("0"),
            )
            .with_trailer(
                HeaderName::from_static("grpc-message"),
                HeaderValue::from_static("ok%20then"),
            );
        let (json, back) = round_trip(&grpc);
        assert!(
            json.contains(r#""trailers":[["grpc-status","0"],["grpc-message","ok%20then"]]"#),
            "{json}"
        );
        assert_eq!(back.trailers(), grpc.trailers());
    }

    #[test]
    fn text_with_nul_is_kept_as_base64() {
        let response = StoredResponse::new(StatusCode::OK).with_body("a\0b");
        let (json, back) = round_trip(&response);
        assert!(json.contains("body_base64"), "{json}");
        assert_eq!(back.body(), b"a\0b");
    }

    #[test]
    fn only_a_replay_is_marked_as_one() {
        let response = StoredResponse::new(StatusCode::ACCEPTED).with_body("ok");
        let (_, back) = round_trip(&response);
        let first = Response::from(response);
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        assert!(!first.headers().contains_key(IDEMPOTENT_REPLAYED));
        let replayed = Response::from(back);
        assert_eq!(replayed.status(), StatusCode::ACCEPTED);
        assert_eq!(replayed.headers()[IDEMPOTENT_REPLAYED], "true");
    }

    #[test]
    fn a_malformed_stored_response_is_refused_not_guessed() {
        for bad in [
            r#"{"status":1000,"headers":[],"body":""}"#,
            r#"{"status":200,"headers":[["bad name","x"]],"body":""}"#,
            r#"{"status":200,"headers":[["x-a","\u0100"]],"body":""}"#,
            r#"{"status":200,"headers":[]}"#,
            r#"{"status":200,"headers":[],"body":"","body_base64":""}"#,
            r#"{"status":200,"headers":[],"body_base64":"not base64!"}"#,
        ] {
            assert!(
                serde_json::from_str::<StoredResponse>(bad).is_err(),
                "accepted {bad}"
            );
        }
    }
}
