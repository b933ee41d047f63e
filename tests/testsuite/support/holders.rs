//! Holders that go away without a word.

use idem::Claim;

/// The claim's holder vanishes without recording an outcome, as a crashed
/// process does: the row stays pending, its lease (if any) running out, for
/// duplicates, the reconciler and the operator's tools to find.
///
/// Dropped, not `mem::forget`: forgetting a claim leaks the pool it holds,
/// and with it every open connection, for the rest of the test process; a
/// few dozen such tests later the server refuses new clients. Dropping it
/// differs only inside this process (a warning is logged, and this
/// process's waiters on the claim are told to look at the row), which is
/// what a duplicate from another process sees anyway.
pub(crate) fn vanish(claim: Claim) {
    drop(claim);
}
