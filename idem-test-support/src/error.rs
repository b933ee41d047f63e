//! The error type of the tests' guarded functions.

use idem::Rejected;
use idem::sqlx;

/// What a guarded function in a test returns on failure: the gate's
/// refusal, the failure the test planned, or the store's error from a body
/// that writes through the claim's transaction.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The gate refused the call (a duplicate, a hold, an outage).
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// The body failed, as the test asked it to.
    #[error("the body failed, as the test asked")]
    Failed,
    /// The body's own statement failed.
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}
