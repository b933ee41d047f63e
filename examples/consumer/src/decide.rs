//! What to tell JetStream about each message, from what the batch guard
//! said about it: the one place where idem's answers become acks.

use std::time::Duration;

use idem::{Disposition, Rejected};

use crate::ledger::EffectError;

/// An item's result, as the batch guard hands it back: the body's `Ok`, its
/// own error, or idem's refusal.
pub type ItemResult = Result<(), ItemError>;

/// Why an item did not end in `Ok`.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    /// idem did not run the body (or could not record its outcome).
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// The body ran and its effect failed.
    #[error(transparent)]
    Effect(#[from] EffectError),
}

impl ItemError {
    /// How the gate records a failed body: the effect's own classification.
    /// A refusal never reaches the classifier (the body did not run), but
    /// the type must answer for it: release, the default.
    pub fn disposition(&self) -> Disposition {
        match self {
            ItemError::Effect(effect) => effect.disposition(),
            ItemError::Rejected(_) => Disposition::Release,
        }
    }
}

/// What to send back for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// `+ACK`: the effect is applied (now, or by an earlier delivery).
    Ack,
    /// `-NAK` with a delay: not now; JetStream redelivers after `delay`,
    /// and that delivery gets a truthful answer from the gate again.
    Nak(Duration),
    /// `+TERM`: never redeliver; it would fail the same way.
    Term,
}

/// How long a retryable message waits before it is redelivered.
#[derive(Debug, Clone, Copy)]
pub struct Delays {
    /// For an item whose slot is held (in flight, in doubt), or whose store
    /// is down, or whose body released its slot: long enough for a holder
    /// to finish, or a reconciler to resolve, without spinning.
    pub retry: Duration,
    /// For an answer that says something is misconfigured (the store
    /// refused a statement, an invalid scope): long, so the log stays
    /// readable while an operator fixes it. Never a `Term`: the message
    /// is not at fault and must not be lost.
    pub misconfigured: Duration,
}

/// The one mapping from an item's result to an ack decision.
///
/// - `Ok`, `AlreadyDone`: the effect happened exactly once: ack.
/// - `InFlight`, `InDoubt`, `Unavailable`, a step in doubt
///   (`is_retryable()`): nak, to be asked again after `delays.retry`.
/// - `AlreadyFailed`, `KeyReused`: the same message would be refused the
///   same way forever: term (dead-letter it).
/// - The body's own error: as its disposition recorded it. `Release`: the
///   effect did not happen and the slot is free: nak. `Keep`: kept failed:
///   term. `InDoubt`: held for the reconciler: nak, and the redelivery is
///   answered once the reconciler has resolved it.
/// - Anything else (`LeaseLost`, `ClaimLost`, `NotRecorded` after a body
///   that ran; `StoreRefused` and the like): nak. A redelivery asks the
///   gate again, and its answer is the truth of the slot (done, or free to
///   run), so a nak is never wrong; an ack or a term could be.
pub fn decide(result: &ItemResult, delays: Delays) -> Decision {
    match result {
        Ok(()) | Err(ItemError::Rejected(Rejected::AlreadyDone)) => Decision::Ack,
        Err(ItemError::Rejected(Rejected::AlreadyFailed | Rejected::KeyReused)) => Decision::Term,
        Err(ItemError::Rejected(rejected)) if rejected.is_retryable() => {
            Decision::Nak(delays.retry)
        }
        Err(ItemError::Rejected(
            Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. } | Rejected::NotRecorded { .. },
        )) => Decision::Nak(delays.retry),
        Err(ItemError::Rejected(_)) => Decision::Nak(delays.misconfigured),
        Err(ItemError::Effect(effect)) => match effect.disposition() {
            Disposition::Keep => Decision::Term,
            // Release, InDoubt, and any disposition added later: ask again.
            _ => Decision::Nak(delays.retry),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const DELAYS: Delays = Delays {
        retry: Duration::from_millis(500),
        misconfigured: Duration::from_secs(30),
    };

    fn rejected(rejected: Rejected) -> ItemResult {
        Err(ItemError::Rejected(rejected))
    }

    fn outage() -> Rejected {
        Rejected::Unavailable {
            source: Arc::new(idem::sqlx::Error::PoolTimedOut),
        }
    }

    #[test]
    fn done_is_acked() {
        assert_eq!(decide(&Ok(()), DELAYS), Decision::Ack);
        assert_eq!(
            decide(&rejected(Rejected::AlreadyDone), DELAYS),
            Decision::Ack
        );
    }

    #[test]
    fn held_or_unavailable_is_naked_with_the_retry_delay() {
        let nak = Decision::Nak(DELAYS.retry);
        assert_eq!(decide(&rejected(Rejected::InFlight), DELAYS), nak);
        assert_eq!(decide(&rejected(Rejected::InDoubt), DELAYS), nak);
        assert_eq!(decide(&rejected(outage()), DELAYS), nak);
    }

    #[test]
    fn kept_failures_and_reused_keys_are_terminated() {
        assert_eq!(
            decide(&rejected(Rejected::AlreadyFailed), DELAYS),
            Decision::Term
        );
        assert_eq!(
            decide(&rejected(Rejected::KeyReused), DELAYS),
            Decision::Term
        );
    }

    #[test]
    fn a_lost_claim_is_asked_again_never_acked() {
        let lost = Rejected::LeaseLost {
            address: "claim_0123456789abcdef01234567".to_owned(),
        };
        assert_eq!(decide(&rejected(lost), DELAYS), Decision::Nak(DELAYS.retry));
    }

    #[test]
    fn the_bodys_error_follows_its_disposition() {
        let refused = EffectError::Refused(idem::sqlx::Error::PoolTimedOut);
        assert_eq!(refused.disposition(), Disposition::Release);
        assert_eq!(
            decide(&Err(ItemError::Effect(refused)), DELAYS),
            Decision::Nak(DELAYS.retry)
        );

        let invalid = EffectError::Invalid("amount must not be negative".to_owned());
        assert_eq!(invalid.disposition(), Disposition::Keep);
        assert_eq!(
            decide(&Err(ItemError::Effect(invalid)), DELAYS),
            Decision::Term
        );

        let unknown = EffectError::Unknown(idem::sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(unknown.disposition(), Disposition::InDoubt);
        assert_eq!(
            decide(&Err(ItemError::Effect(unknown)), DELAYS),
            Decision::Nak(DELAYS.retry)
        );
    }
}
