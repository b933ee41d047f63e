//! Problem details (RFC 9457): an error response whose body tells a program
//! what went wrong and a person what to do next.

use std::borrow::Cow;
use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

/// The media type of a problem details body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where idem's problem types live: each `type` is this followed by a slug
/// (`in-flight`, `key-reused`, ...). Clients compare it as an opaque string;
/// it stays the same from release to release.
pub const PROBLEM_TYPE_BASE: &str = "https://idem.dev/problems/";

/// An RFC 9457 problem details response: status, `type`, `title`, `detail`,
/// and optionally a `Retry-After` header.
///
/// [`Rejected`](crate::Rejected) and [`KeyRejection`](super::KeyRejection)
/// become one; build your own for your handler's errors so that every error
/// of the service has the same shape.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::http::Problem;
/// use http::{Response, StatusCode};
///
/// let declined = Problem::new(
///     StatusCode::PAYMENT_REQUIRED,
///     "https://example.com/problems/card-declined",
///     "Card declined",
///     "The card was declined; ask the customer for another one.",
/// );
/// // With axum: `declined.into_response()`; here, the framework-neutral form.
/// let response = Response::from(declined.with_retry_after(Duration::from_millis(1500)));
/// assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
/// assert_eq!(response.headers()["retry-after"], "2"); // whole seconds, rounded up
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    status: StatusCode,
    problem_type: Cow<'static, str>,
    title: Cow<'static, str>,
    detail: Cow<'static, str>,
    retry_after_secs: Option<u64>,
}

impl Problem {
    /// A problem with this status, `type` URI, short `title` (the same for
    /// every occurrence of the type) and `detail` (this occurrence: what
    /// happened and what to do next).
    pub fn new(
        status: StatusCode,
        problem_type: impl Into<Cow<'static, str>>,
        title: impl Into<Cow<'static, str>>,
        detail: impl Into<Cow<'static, str>>,
    ) -> Problem {
        Problem {
            status,
            problem_type: problem_type.into(),
            title: title.into(),
            detail: detail.into(),
            retry_after_secs: None,
        }
    }

    /// One of idem's own problem types: [`PROBLEM_TYPE_BASE`] and `slug`.
    pub(crate) fn idem(
        status: StatusCode,
        slug: &str,
        title: &'static str,
        detail: impl Into<Cow<'static, str>>,
    ) -> Problem {
        Problem::new(status, format!("{PROBLEM_TYPE_BASE}{slug}"), title, detail)
    }

    /// Adds `Retry-After: <seconds>`. HTTP counts whole seconds, so `after`
    /// is rounded up: rounding down would invite the retry too early.
    #[must_use = "`with_retry_after` returns the changed problem"]
    pub fn with_retry_after(mut self, after: Duration) -> Problem {
        let whole = after.as_secs();
        self.retry_after_secs = Some(if after.subsec_nanos() > 0 {
            whole.saturating_add(1)
        } else {
            whole
        });
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `type` URI: what kind of problem this is, for programs.
    pub fn problem_type(&self) -> &str {
        &self.problem_type
    }

    /// The `title`: the problem type, for people.
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The `detail`: this occurrence, and what to do next.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `Retry-After` delay in seconds, if the response carries one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after_secs
    }

    /// The body: the four RFC 9457 members in their usual order.
    pub fn body(&self) -> String {
        // Written by hand rather than derived: `Value::to_string` cannot
        // fail, so there is no error path to handle, and the members keep
        // the order that people reading a response expect.
        let text = |value: &str| serde_json::Value::from(value).to_string();
        format!(
            r#"{{"type":{},"title":{},"status":{},"detail":{}}}"#,
            text(&self.problem_type),
            text(&self.title),
            self.status.as_u16(),
            text(&self.detail),
        )
    }
}

impl From<Problem> for Response<String> {
    /// The response: its status, `Content-Type: application/problem+json`,
    /// `Retry-After` when set, and the JSON body.
    fn from(problem: Problem) -> Response<String> {
        let mut response = Response::new(problem.body());
        *response.status_mut() = problem.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = problem.retry_after_secs {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_has_the_four_members_escaped_in_order() {
        let problem = Problem::new(
            StatusCode::CONFLICT,
            "about:blank",
            "Conflict",
            "a \"quoted\" detail\nover two lines",
        );
        assert_eq!(
            problem.body(),
            r#"{"type":"about:blank","title":"Conflict","status":409,"detail":"a \"quoted\" detail\nover two lines"}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&problem.body()).unwrap();
        assert_eq!(parsed["detail"], "a \"quoted\" detail\nover two lines");
    }

    #[test]
    fn retry_after_counts_whole_seconds_rounded_up() {
        let problem = |after| {
            Problem::new(StatusCode::CONFLICT, "t", "t", "d")
                .with_retry_after(after)
                .retry_after_secs()
        };
        assert_eq!(problem(Duration::from_secs(3)), Some(3));
        assert_eq!(problem(Duration::from_millis(1)), Some(1));
        assert_eq!(problem(Duration::from_millis(2001)), Some(3));
        assert_eq!(problem(Duration::ZERO), Some(0));
    }

    #[test]
    fn the_response_is_problem_json_with_retry_after_only_when_set() {
        let plain = Response::from(Problem::new(StatusCode::BAD_REQUEST, "t", "t", "d"));
        assert_eq!(plain.status(), StatusCode::BAD_REQUEST);
        assert_eq!(plain.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert!(!plain.headers().contains_key(RETRY_AFTER));
        let later = Response::from(
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "t", "t", "d")
                .with_retry_after(Duration::from_secs(5)),
        );
        assert_eq!(later.headers()[RETRY_AFTER], "5");
    }
}
