//! The quickstart's domain: a payment guarded by `#[idempotent]`, raced by
//! `races.rs`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem::{Gate, Rejected, idempotent};

/// What a charge can fail with. A refusal from the gate is one variant, so
/// `charge` can say "a duplicate was refused" through its own error type.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    /// The gate refused the charge: a duplicate, or one still in flight.
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// The provider declined the card; the slot is released for a retry.
    #[error("card declined")]
    Declined,
}

/// An order to charge.
pub struct Order {
    /// Its id: part of the charge's identity.
    pub id: String,
}

/// What a charge that ran returns.
#[derive(Debug)]
pub struct Receipt {
    /// The order charged.
    pub order_id: String,
    /// The amount charged, in cents.
    pub amount_cents: i64,
}

/// Stands in for a payment provider: counts the charges that really happen.
#[derive(Default)]
pub struct Provider {
    /// The charges that really happened.
    pub charges: AtomicUsize,
    /// Decline the next charge (once).
    pub decline_next: AtomicBool,
}

/// Charges an order once per (order, amount), however often it is retried.
///
/// The gate claims the slot before the body runs. `Ok` settles the claim, so
/// every later retry is refused; `Err` releases it, so a retry can run.
#[idempotent(key = "order.id, amount_cents")]
pub async fn charge(
    gate: &Gate,
    order: &Order,
    amount_cents: i64,
    provider: &Provider,
) -> Result<Receipt, ChargeError> {
    // A real provider takes a while: long enough for retries to pile up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    if provider.decline_next.swap(false, Ordering::SeqCst) {
        return Err(ChargeError::Declined);
    }
    provider.charges.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        order_id: order.id.clone(),
        amount_cents,
    })
}
