//! The reconciler: bodies charge a fake provider (or do not), then settle,
//! fail for good, release, or say they cannot tell; slow holders outlive
//! their lease, some renewing it; two `Reconciler`s run at once, their
//! probes reading the provider's ledger. Rule 7 holds everything to the
//! ledger: one charge per key at most, and the probes, the rows and every
//! caller tell its story. `IDEM_HISTORY_CALLS` sizes the long run.

use std::time::Duration;

use idem_test_support::XorShift;
use idem_test_support::history::{self, RECONCILED_LEASE, Reconciling, Target, count_from_env};

use super::{CONNECTIONS, SEED_VARIABLE, connection_faults, every_fault, faults};

fn reconciling(calls: usize, slow: u64, renew: u64) -> Reconciling {
    let calls = count_from_env("IDEM_HISTORY_CALLS", calls);
    Reconciling {
        tasks: count_from_env("IDEM_HISTORY_TASKS", 8),
        calls,
        identities: (calls / 5).max(1),
        in_play: 8,
        charge: 50,
        in_doubt: 40,
        slow,
        renew,
        unknown: 15,
        pending_older_than: None,
        until: None,
        seed: XorShift::seed_from_env(SEED_VARIABLE),
    }
}

async fn reconciled_keeps_the_ledger(target: Target, reconciling: Reconciling, name: &str) {
    let faults = if target.cluster.is_some() {
        faults(every_fault())
    } else {
        faults(connection_faults())
    };
    let run = history::run_reconciling(&target, &reconciling, Some(&faults)).await;
    history::assert_no_anomalies(&run, name, SEED_VARIABLE);
    history::assert_recovers(&target).await;
}

/// Bodies in doubt, two reconcilers probing them, no holder outliving its
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_over_bodies_in_doubt_keep_the_ledger() {
    let target = Target::proxied(CONNECTIONS).await;
    let run = reconciling(2_000, 0, 0);
    reconciled_keeps_the_ledger(target, run, "history (reconciled)").await;
}

/// Slow holders whose lease runs out into doubt while they work: a
/// reconciler settles the claim from the ledger, and the holder's late
/// outcome must not tell its caller another story. On 4f59d0d it does,
/// in each of three runs (rule 7: "callers were told 2 stories", seed
/// 1796185616508823210: 3 anomalies; the holder got `Ok(its value)`, its
/// events `[Won, Settled]`, while the duplicates are replayed the probe's
/// receipt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_holders_beside_two_reconcilers_keep_the_ledger() {
    let target = Target::proxied(CONNECTIONS).await;
    // Many slow holders that charged and will say so: the case at stake.
    let run = Reconciling {
        in_doubt: 20,
        ..reconciling(2_500, 40, 0)
    };
    reconciled_keeps_the_ledger(target, run, "history (reconciled, slow holders)").await;
}

/// Slow holders that renew their lease, and a reconciler that also probes
/// stale pending claims: a claim whose lease is being renewed has a living
/// holder, and is never resolved under it. Every slow holder here renews.
/// On 4f59d0d one run in four: a holder renewed its lease four times
/// (every renewal landed), a reconciler's stale-pending probe resolved its
/// claim all the same, and its settle then told it `Ok(its value)` beside
/// the probe's receipt (rule 7, seed 1796185755473846033).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_leases_beside_a_reconciler_of_stale_pending_claims_keep_the_ledger() {
    let target = Target::proxied(CONNECTIONS).await;
    let run = Reconciling {
        pending_older_than: Some(RECONCILED_LEASE * 2),
        ..reconciling(1_500, 30, 100)
    };
    let name = "history (reconciled, renewed leases, stale pending probed)";
    reconciled_keeps_the_ledger(target, run, name).await;
}

/// The long run: every fault, slow holders, renewals, stale pending
/// claims probed. `IDEM_HISTORY_CALLS`, and `IDEM_HISTORY_SLOW` (percent of
/// holders outliving their lease; 0 until items 10 and 11 land).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long history of the reconciler (minutes): run it with -- --ignored"]
async fn a_long_history_of_two_reconcilers_under_every_fault_keeps_the_ledger() {
    let target = Target::cluster(CONNECTIONS).await;
    let slow = count_from_env("IDEM_HISTORY_SLOW", 15) as u64;
    let run = Reconciling {
        pending_older_than: Some(Duration::from_secs(2)),
        ..reconciling(30_000, slow, 50)
    };
    let name = "history (reconciled, long, every fault)";
    reconciled_keeps_the_ledger(target, run, name).await;
}
