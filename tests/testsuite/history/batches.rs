//! Batches: consumers calling `gate.guard_batch(..)`, with and without `.replay()`,
//! at one barrier, over overlapping windows of the same message ids, under
//! the connection faults; each item held to the same rules as a call of
//! `Gate::run` (see `idem-test-support/src/history/batch.rs` for what an
//! item's answer proves). `IDEM_HISTORY_ROUNDS` sizes the long run.

use std::time::Duration;

use idem_test_support::XorShift;
use idem_test_support::history::{self, Batches, Guard, Target, count_from_env};

use super::{CONNECTIONS, SEED_VARIABLE, connection_faults, every_fault, faults};

pub(crate) fn batches(rounds: usize, duplicates: u64) -> Batches {
    Batches {
        consumers: count_from_env("IDEM_HISTORY_CONSUMERS", 6),
        rounds: count_from_env("IDEM_HISTORY_ROUNDS", rounds),
        block: 24,
        rounds_per_block: 3,
        size: 12,
        duplicates,
        fail: 25,
        cached: 0,
        work: Duration::from_millis(3),
        guards: vec![Guard::Plain, Guard::Replay, Guard::Fingerprint],
        until: None,
        seed: XorShift::seed_from_env(SEED_VARIABLE),
    }
}

pub(crate) async fn batches_keep_every_promise(target: Target, batches: Batches, name: &str) {
    let faults = if target.cluster.is_some() {
        faults(every_fault())
    } else {
        faults(connection_faults())
    };
    let run = history::run_batches(&target, &batches, Some(&faults)).await;
    history::assert_no_anomalies(&run, name, SEED_VARIABLE);
    history::assert_recovers(&target).await;
}

/// Overlapping consumers, each id at most once a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_under_connection_faults_keep_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    batches_keep_every_promise(target, batches(400, 0), "history (batches)").await;
}

/// The same, with ids pushed twice into one batch: each copy must get
/// what `Gate::run` would give it. On 4f59d0d the second copy is always
/// refused `InFlight`, whatever the slot says: rule 4 finds it (seed
/// 1796183122064127957: 956 anomalies, e.g. a copy refused in flight
/// beside its twin in the same batch that was replayed the value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_with_duplicates_inside_under_connection_faults_keep_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    let name = "history (batches, duplicates inside)";
    batches_keep_every_promise(target, batches(400, 15), name).await;
}

/// Batches of ordered events (`Batch::push_ordered`), ids pushed twice
/// too: rule 10 on top of every other (no two events of an entity at once,
/// none after a newer one was applied, a superseded one older than one
/// applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_ordered_events_under_connection_faults_keep_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    let name = "history (batches of ordered events)";
    let batches = Batches {
        guards: vec![Guard::Ordered],
        ..batches(150, 15)
    };
    batches_keep_every_promise(target, batches, name).await;
}

/// The long run: `IDEM_HISTORY_ROUNDS`, `IDEM_HISTORY_CONSUMERS`, and
/// `IDEM_HISTORY_DUPLICATES` (percent of items pushed twice; 0 until item
/// 14 lands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long history of batches (minutes): run it with -- --ignored"]
async fn a_long_history_of_batches_under_every_fault_keeps_every_promise() {
    let target = Target::cluster(CONNECTIONS).await;
    let name = "history (batches, long, every fault)";
    let duplicates = count_from_env("IDEM_HISTORY_DUPLICATES", 15) as u64;
    batches_keep_every_promise(target, batches(3_000, duplicates), name).await;
}
