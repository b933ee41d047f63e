//! Two processes: every mode, every entry point, the same keys through the
//! target's gate and through another process's (its own pool, its own
//! registry of claims in flight, its own wake-up listener), under the
//! connection faults, which cut the listeners too. A duplicate that waits
//! on the other process's claim is woken by its notification, or by its
//! own looks when one is lost; the rules are the same.

use idem_test_support::history::{self, Target, Workload};

use super::{CONNECTIONS, SEED_VARIABLE, connection_faults, every_mode, faults};

/// Half the calls through the other process's gate.
const ELSEWHERE: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_split_across_two_processes_under_connection_faults_keeps_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    let elsewhere = target.elsewhere().await;
    let target = target.beside(elsewhere);
    let workload = Workload {
        cached: ELSEWHERE,
        ..every_mode(4_000)
    };
    let run = history::run(&target, &workload, Some(&faults(connection_faults()))).await;
    history::assert_no_anomalies(&run, "history (two processes)", SEED_VARIABLE);
    history::assert_recovers(&target).await;
}
