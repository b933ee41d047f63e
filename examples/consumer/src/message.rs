//! A message's payload, and the identity it is applied under.

use idem::{Fingerprint, Identity};
use serde::{Deserialize, Serialize};

/// The action every ledger entry is claimed under; the reconciler's probe
/// is registered for it. Named explicitly: renaming it would make every
/// past entry look new.
pub const ACTION: &str = "ledger_entry";

/// An order to enter in the ledger, as the publisher sends it:
/// `{"order": "o-17", "amount": 1700}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The business key: one ledger entry per order, however often the
    /// message is published or delivered.
    pub order: String,
    /// The amount, in cents.
    pub amount: i64,
}

impl Order {
    /// Reads a payload; `Err` says why it cannot be an order.
    pub fn parse(payload: &[u8]) -> Result<Order, serde_json::Error> {
        serde_json::from_slice(payload)
    }

    /// The identity the entry is claimed under: the business key, not the
    /// NATS message id. JetStream drops a re-publish with the same
    /// `Nats-Msg-Id` within its duplicate window; a re-publish with another
    /// id, after the window, or a redelivery all carry the same order, and
    /// only the order says they are one entry.
    pub fn identity(&self) -> Identity {
        Identity::new(ACTION).part(self.order.as_str())
    }

    /// What must match for a message to count as the same entry: an order
    /// re-sent with another amount is refused `KeyReused` (and
    /// terminated), not silently dropped as done.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::new().part(self.amount)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_the_order_alone() {
        let a = Order::parse(br#"{"order":"o-1","amount":5}"#).ok();
        let b = Order::parse(br#"{"amount":7,"order":"o-1"}"#).ok();
        let (Some(a), Some(b)) = (a, b) else {
            panic!("both payloads are orders");
        };
        assert_eq!(a.identity().address(), b.identity().address());
        assert_ne!(a.fingerprint().digest(), b.fingerprint().digest());
        assert!(Order::parse(b"not json").is_err());
    }
}
