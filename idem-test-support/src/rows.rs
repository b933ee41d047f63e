//! Claim rows read straight from `idem_records`, behind the gate's back:
//! what a test asserts the gate left there. Deliberately not through the
//! runtime's store (the code under test), and not on the claim path, so
//! these reads need not be shaped for the partial unique indexes.

use idem::Gate;
use idem::sqlx;

/// The state of a claim row of `gate`'s account and namespace: `None` when
/// absent.
///
/// # Panics
/// When the table cannot be read.
pub async fn row_state(gate: &Gate, address: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT state FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2 \
         AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("read idem_records")
}

/// How many claim rows `gate`'s account holds in `state`.
///
/// # Panics
/// When the table cannot be read.
pub async fn count_rows(gate: &Gate, state: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE account = $1 AND kind = 'claim' AND state = $2",
    )
    .bind(gate.account_name())
    .bind(state)
    .fetch_one(gate.pool())
    .await
    .expect("count idem_records")
}

/// Deletes the row at `address` in `gate`'s account, as an operator's
/// `idem claims release` does behind its holder's back.
///
/// # Panics
/// When the statement fails.
pub async fn delete_row(gate: &Gate, address: &str) {
    sqlx::query("DELETE FROM idem_records WHERE account = $1 AND address = $2")
        .bind(gate.account_name())
        .bind(address)
        .execute(gate.pool())
        .await
        .expect("delete the claim row");
}

/// Plants a claim row in `state` at `address` in `gate`'s account whose
/// stored identity is `identity` (canonical bytes): when that is another
/// identity's, the row is what a digest collision would leave.
///
/// # Panics
/// When the statement fails.
pub async fn plant_row(gate: &Gate, address: &str, state: &str, identity: &[u8]) {
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity) \
         VALUES ($1, 'claim', $2, $3, $4)",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(state)
    .bind(identity)
    .execute(gate.pool())
    .await
    .expect("plant a claim row");
}
