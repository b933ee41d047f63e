//! Claims held in doubt, and reading a claim's state back: the set-up of
//! the reconciler's tests (`reconcile::bounds`, `reconcile::documented_promises`).

use idem::operations::{self, NamespaceFilter, ScopeFilter};
use idem::{Gate, Identity};
use idem_test_support::ChargeError;

/// Holds `identity` in doubt: its body timed out, it may have charged.
pub(crate) async fn in_doubt(gate: &Gate, identity: &Identity) {
    let outcome: Result<(), ChargeError> = gate
        .guard(identity)
        .disposition(ChargeError::disposition)
        .run(async { Err(ChargeError::Timeout) })
        .await;
    assert!(matches!(outcome, Err(ChargeError::Timeout)), "{outcome:?}");
}

/// The state and fence of the claim of `identity` in the gate's account,
/// if any.
pub(crate) async fn state_of(gate: &Gate, identity: &Identity) -> Option<(String, i64)> {
    let scope = ScopeFilter::new()
        .account(gate.account_name())
        .namespace(NamespaceFilter::Any);
    operations::find(gate.pool(), &identity.address(), &scope)
        .await
        .expect("find the claim")
        .into_iter()
        .next()
        .map(|row| (row.state.to_string(), row.fence))
}
