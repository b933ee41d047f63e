//! The axum adapters: [`IdempotencyKey`] as an extractor (required, or
//! optional as `Option<IdempotencyKey>`), and [`Problem`], [`KeyRejection`],
//! [`Rejected`] and [`StoredResponse`] as responses.
//!
//! Only adapters live here: what a key, a problem or a kept response is and
//! how it reads and writes is framework-neutral, in the sibling modules.

use axum::body::Body;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::{IdempotencyKey, KeyRejection, Problem, StoredResponse};
use crate::error::Rejected;

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = KeyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, KeyRejection> {
        IdempotencyKey::from_headers(&parts.headers)?.ok_or(KeyRejection::Missing)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = KeyRejection;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, KeyRejection> {
        IdempotencyKey::from_headers(&parts.headers)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        http::Response::<String>::from(self).map(Body::from)
    }
}

impl IntoResponse for KeyRejection {
    /// A 400 whose problem+json detail says what is wrong with the key.
    fn into_response(self) -> Response {
        Problem::from(&self).into_response()
    }
}

impl IntoResponse for Rejected {
    /// The [`Problem`] for this refusal (see the table in
    /// [`idem::http`](super)). The store's own error never reaches the
    /// client: the gate has already logged it.
    fn into_response(self) -> Response {
        Problem::from(&self).into_response()
    }
}

impl IntoResponse for StoredResponse {
    /// The response as kept, marked `Idempotent-Replayed: true` on a replay.
    fn into_response(self) -> Response {
        http::Response::<Vec<u8>>::from(self).map(Body::from)
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use axum::http::header::CONTENT_TYPE;

    use super::*;
    use crate::http::{IDEMPOTENT_REPLAYED, PROBLEM_JSON};

    #[test]
    fn a_problem_is_the_same_response_through_axum() {
        let response = Problem::new(StatusCode::CONFLICT, "t", "t", "d")
            .with_retry_after(std::time::Duration::from_secs(1))
            .into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()["retry-after"], "1");
    }

    #[test]
    fn a_stored_response_adds_no_content_type_and_marks_only_a_replay() {
        let first = StoredResponse::new(StatusCode::ACCEPTED).with_body("ok");
        let kept = serde_json::to_string(&first).unwrap();
        let replayed: StoredResponse = serde_json::from_str(&kept).unwrap();
        let first = first.into_response();
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        assert!(!first.headers().contains_key(CONTENT_TYPE));
        assert!(!first.headers().contains_key(IDEMPOTENT_REPLAYED));
        assert_eq!(
            replayed.into_response().headers()[IDEMPOTENT_REPLAYED],
            "true"
        );
    }

    #[test]
    fn a_malformed_key_is_a_400_saying_what_is_wrong() {
        let response = KeyRejection::Empty.into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
    }
}
