//! The guarded work itself: nothing, or a wait standing in for an external
//! call. Every scenario of a group runs the same body.

use std::fmt;
use std::time::Duration;

/// What a finished request answers, which the alternatives store with its
/// outcome (idem's plain gate keeps no response; its replay mode will).
pub const RESPONSE_BODY: &str = r#"{"status":"succeeded"}"#;

/// What runs between the claim and the record of its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Returns at once: what remains is the bookkeeping.
    NoOp,
    /// Sleeps, as a call to a payment provider or another service would.
    Sleep(Duration),
}

impl Body {
    /// Runs the body.
    pub async fn run(self) {
        if let Body::Sleep(duration) = self {
            tokio::time::sleep(duration).await;
        }
    }
}

impl fmt::Display for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Body::NoOp => f.write_str("no-op"),
            Body::Sleep(duration) => write!(f, "sleep {} ms", duration.as_millis()),
        }
    }
}
