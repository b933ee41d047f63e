//! One HTTP answer read whole, and what tests assert about it: shared by
//! the payments service's tests and the tower layer's.
//!
//! The wire values are written out here, not imported from idem: a test
//! that pins the protocol fails when a constant of idem's changes.

use std::sync::Arc;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;
use tokio::sync::Barrier;

/// The media type of every refusal (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where the `type` of each of idem's problems begins.
pub const PROBLEM_TYPE_BASE: &str = "https://idem.dev/problems/";

/// One HTTP answer, read whole.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body's bytes.
    pub body: Vec<u8>,
}

impl Answer {
    /// Sends `request` and reads the answer whole.
    pub async fn of(request: reqwest::RequestBuilder) -> Answer {
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("the body").to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Sends every request from a task of its own, all released at once by
    /// a barrier, and reads their answers whole, in the requests' order.
    pub async fn all_at_once(requests: Vec<reqwest::RequestBuilder>) -> Vec<Answer> {
        let barrier = Arc::new(Barrier::new(requests.len()));
        let racers: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    Answer::of(request).await
                })
            })
            .collect();
        let mut answers = Vec::with_capacity(racers.len());
        for racer in racers {
            answers.push(racer.await.expect("a racer panicked"));
        }
        answers
    }

    /// The header `name`, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// It is marked `Idempotent-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The body as JSON; panics saying what it was otherwise.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts a problem+json answer of idem's type `slug`; returns its
    /// detail.
    #[track_caller]
    pub fn assert_problem(&self, status: StatusCode, slug: &str) -> String {
        self.assert_problem_of_type(status, &format!("{PROBLEM_TYPE_BASE}{slug}"))
    }

    /// Asserts an RFC 9457 answer of this status and type; returns its
    /// detail.
    #[track_caller]
    pub fn assert_problem_of_type(&self, status: StatusCode, problem_type: &str) -> String {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header("content-type"), Some(PROBLEM_JSON), "{self:?}");
        let problem = self.json();
        assert_eq!(problem["type"], problem_type, "{problem}");
        assert_eq!(problem["status"], status.as_u16(), "{problem}");
        assert!(problem["title"].is_string(), "{problem}");
        problem["detail"].as_str().expect("a detail").to_owned()
    }
}
