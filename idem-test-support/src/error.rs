//! The error types of the tests' guarded functions.

use idem::sqlx;
use idem::{Disposition, Rejected};

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

/// What a guarded payment call in a test returns on failure: a provider's
/// answers, each with the disposition its slot gets.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    /// The gate refused the call (a duplicate, a hold, an outage).
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// Refused before anything was sent: released, a retry runs.
    #[error("invalid request")]
    Invalid,
    /// The provider said no: a definite failure, kept.
    #[error("card declined")]
    Declined,
    /// Sent, and no answer came: it may have been charged, held in doubt.
    #[error("the provider did not answer in time")]
    Timeout,
}

impl ChargeError {
    /// What the slot becomes: a decline is definite, a timeout may have
    /// charged, anything else changed nothing. An inherent function, so an
    /// `#[idempotent(disposition = ChargeError::disposition)]` can name it.
    pub fn disposition(&self) -> Disposition {
        match self {
            ChargeError::Declined => Disposition::Keep,
            ChargeError::Timeout => Disposition::InDoubt,
            ChargeError::Rejected(_) | ChargeError::Invalid => Disposition::Release,
        }
    }
}
