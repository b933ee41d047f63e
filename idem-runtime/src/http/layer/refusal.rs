//! The answers the layer gives without the inner service's: the gate's
//! refusals and a malformed key (the same [`Problem`]s as the extractor's),
//! and the layer's own (too large, unreadable, no caller, no route, a
//! response that failed), in problem+json or, for gRPC, as a status.

use http::{Response, StatusCode};

use super::body::BufferedBody;
use super::grpc;
use crate::http::Problem;

/// `problem` as the response: problem+json, or a gRPC status for a gRPC
/// request.
pub(super) fn respond(problem: &Problem, grpc: bool) -> Response<BufferedBody> {
    if grpc {
        return grpc::refusal(problem);
    }
    Response::<String>::from(problem.clone()).map(|body| BufferedBody::new(body, None))
}

/// A body longer than the layer reads: never run unguarded, and never
/// half-read into a fingerprint.
pub(super) fn too_large(limit: usize) -> Problem {
    Problem::idem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "Request body too large",
        format!(
            "The request body is larger than the {limit} bytes this server reads for a request \
             with an Idempotency-Key, so it was not run. Send a smaller body, or split the \
             request."
        ),
    )
}

/// A body whose reading failed part-way: it was not run, so the same
/// request may be sent again.
pub(super) fn unreadable() -> Problem {
    Problem::idem(
        StatusCode::BAD_REQUEST,
        "unreadable-body",
        "Request body unreadable",
        "The request body could not be read to its end (the connection failed, or the body \
         was malformed), so the request was not run. Send it again, with the same key.",
    )
}

/// A request with a key whose caller the layer's scope could not name:
/// claiming it in a shared account could answer it with another caller's
/// response, so it is not run.
pub(super) fn unidentified_caller() -> Problem {
    Problem::idem(
        StatusCode::UNAUTHORIZED,
        "unidentified-caller",
        "Caller unidentified",
        "This request carries an Idempotency-Key, but the server could not tell who sent it, \
         and keys are kept per caller, so it was not run. Authenticate, and send it again with \
         the same key.",
    )
}

/// A request with a key that no route matched (or a layer never given
/// routes): there is nothing to keep its key under, and running it
/// unguarded would run every retry again, so it is not run.
pub(super) fn no_route() -> Problem {
    Problem::idem(
        StatusCode::NOT_FOUND,
        "no-route",
        "No route for this request",
        "This request carries an Idempotency-Key, but no route of this server matched it, so \
         its key cannot be kept and it was not run. Check the method and path. (A service that \
         has no route templates, such as a bare hyper service, names its routes with \
         IdempotencyLayer::route.)",
    )
}

/// The inner service answered, but its response body failed while it was
/// read: the request may have taken effect, and there is no answer to give
/// or keep.
pub(super) fn response_failed() -> Problem {
    Problem::idem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "response-failed",
        "Response lost",
        "The request ran, but its response failed while it was being produced, so it can be \
         neither sent nor kept. Check whether it took effect before retrying: a retry with the \
         same key is refused while its outcome is in doubt, and runs again once it is released.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CONTENT_TYPE;
    use http_body::Body as _;

    #[test]
    fn a_problem_is_problem_json_for_http_and_a_status_for_grpc() {
        let http = respond(&too_large(10), false);
        assert_eq!(http.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(http.headers()[CONTENT_TYPE], crate::http::PROBLEM_JSON);
        assert!(http.body().size_hint().exact() > Some(0));
        let grpc = respond(&too_large(10), true);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()["grpc-status"], "8");
    }
}
