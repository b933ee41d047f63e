//! Every mode, alone and combined, compiles cleanly under strict lints.
#![deny(warnings)]

use idem::sqlx::{PgConnection, Postgres, Transaction};
use idem::{Gate, Rejected, idempotent};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub id: u64,
}

#[idempotent(key = "id", replay)]
async fn replayed(gate: &Gate, id: u64) -> Result<Receipt, Rejected> {
    Ok(Receipt { id })
}

#[idempotent(key = "id", fingerprint = "amount, currency", replay, wait = "5s")]
async fn fingerprinted(gate: &Gate, id: u64, amount: i64, currency: &str) -> Result<Receipt, Rejected> {
    Ok(Receipt { id })
}

#[idempotent(key = "id", lease = "1m 30s", on_unavailable = "run")]
async fn leased(gate: &Gate, id: u64) -> Result<(), Rejected> {
    Ok(())
}

// The longest lease, idem::MAX_LEASE.
#[idempotent(key = "id", lease = "100y")]
async fn longest_lease(gate: &Gate, id: u64) -> Result<(), Rejected> {
    Ok(())
}

// The retention windows, alone, together (equal is fine) and beside
// every other option; the longest window, idem::MAX_WINDOW.
#[idempotent(key = "id", keep_value_for = "1h", keep_slot_for = "1d", replay)]
async fn kept_for_a_while(gate: &Gate, id: u64) -> Result<Receipt, Rejected> {
    Ok(Receipt { id })
}

#[idempotent(key = "id", keep_value_for = "7d")]
async fn value_kept_a_week(gate: &Gate, id: u64) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "id", keep_slot_for = "100y", keep_value_for = "100y", fingerprint = "amount", replay, lease = "30s", on_expiry = "in_doubt", wait = "1s", on_unavailable = "run")]
async fn longest_windows(gate: &Gate, id: u64, amount: i64) -> Result<Receipt, Rejected> {
    Ok(Receipt { id: id + amount.unsigned_abs() })
}

#[idempotent(key = "id", outcome_commit = "async", keep_slot_for = "31d", disposition = ChargeError::disposition)]
async fn async_kept(gate: &Gate, id: u64) -> Result<(), ChargeError> {
    Ok(())
}

#[idempotent(key = "id", tx = tx, replay, keep_value_for = "24h", keep_slot_for = "24h")]
async fn kept_in_transaction(gate: &Gate, tx: &mut Transaction<'_, Postgres>, id: u64) -> Result<Receipt, Rejected> {
    let _ = &mut **tx;
    Ok(Receipt { id })
}

#[idempotent(key = "id", on_unavailable = "refuse", outcome_commit = "durable")]
async fn strict(gate: &Gate, id: u64) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "id", outcome_commit = "async", replay, wait = "2s")]
async fn async_outcome(gate: &Gate, id: u64) -> Result<Receipt, Rejected> {
    Ok(Receipt { id })
}

#[derive(Debug)]
pub enum ChargeError {
    Rejected(Rejected),
    Declined,
}

impl From<Rejected> for ChargeError {
    fn from(rejected: Rejected) -> Self {
        ChargeError::Rejected(rejected)
    }
}

impl ChargeError {
    fn disposition(&self) -> idem::Disposition {
        match self {
            ChargeError::Declined => idem::Disposition::Keep,
            ChargeError::Rejected(_) => idem::Disposition::Release,
        }
    }
}

#[idempotent(key = "id", disposition = ChargeError::disposition, lease = "30s", on_expiry = "in_doubt", replay)]
async fn disposed(gate: &Gate, id: u64) -> Result<Receipt, ChargeError> {
    Ok(Receipt { id })
}

#[idempotent(key = "id", lease = "30s", on_expiry = "take_over")]
async fn taken_over(gate: &Gate, id: u64) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "id", tx = tx, replay, fingerprint = "amount", disposition = ChargeError::disposition)]
async fn disposed_in_transaction(gate: &Gate, tx: &mut Transaction<'_, Postgres>, id: u64, amount: i64) -> Result<Receipt, ChargeError> {
    let _ = &mut **tx;
    Ok(Receipt { id: id + amount.unsigned_abs() })
}

#[idempotent(key = "id", tx = tx, replay, fingerprint = "amount")]
async fn in_transaction(gate: &Gate, tx: &mut Transaction<'_, Postgres>, id: u64, amount: i64) -> Result<Receipt, Rejected> {
    let _ = &mut **tx;
    Ok(Receipt { id })
}

#[idempotent(key = "id", tx = conn)]
async fn on_a_connection(gate: &Gate, conn: &mut PgConnection, id: u64) -> Result<(), Rejected> {
    let _ = conn;
    Ok(())
}

#[allow(dead_code)]
async fn exercise(gate: &Gate, tx: &mut Transaction<'_, Postgres>, conn: &mut PgConnection) -> Result<(), Rejected> {
    replayed(gate, 1).await?;
    fingerprinted(gate, 1, 5, "EUR").await?;
    leased(gate, 1).await?;
    longest_lease(gate, 1).await?;
    strict(gate, 1).await?;
    async_outcome(gate, 1).await?;
    in_transaction(gate, tx, 1, 5).await?;
    on_a_connection(gate, conn, 1).await?;
    let _ = disposed(gate, 1).await;
    taken_over(gate, 1).await?;
    let _ = disposed_in_transaction(gate, tx, 1, 5).await;
    kept_for_a_while(gate, 1).await?;
    value_kept_a_week(gate, 1).await?;
    longest_windows(gate, 1, 5).await?;
    let _ = async_kept(gate, 1).await;
    kept_in_transaction(gate, tx, 1).await?;
    Ok(())
}

fn main() {}

// Ordered events: an integer order (a u64 too: one beyond an i64 is
// refused when it runs), a time, beside other options and in a transaction.
pub struct Event {
    pub id: String,
    pub object_id: String,
    pub sequence: u64,
    pub occurred_at: std::time::SystemTime,
}

#[idempotent(key = "event.id", entity = "event.object_id", order = "event.sequence")]
async fn ordered(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "event.id", entity = "event.object_id, event.id.len()", order = "event.occurred_at", replay, keep_value_for = "7d", wait = "2s")]
async fn ordered_by_time(gate: &Gate, event: &Event) -> Result<Receipt, Rejected> {
    Ok(Receipt { id: event.sequence })
}

#[idempotent(key = "event.id", entity = "event.object_id", order = "event.sequence", tx = tx)]
async fn ordered_in_transaction(gate: &Gate, tx: &mut Transaction<'_, Postgres>, event: &Event) -> Result<(), Rejected> {
    let _ = &mut **tx;
    Ok(())
}
