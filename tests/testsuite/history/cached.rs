//! Cached gates beside uncached ones (feature `cache`): every mode, every
//! entry point, the same keys through a gate with an outcome cache and
//! through the same gate without, under the connection faults; the same
//! rules. A cache hit is judged as the store's answer would be: a hit that
//! answers what the store no longer (or not yet) says is an anomaly.

use idem::cache::OutcomeCache;
use idem_test_support::history::{self, Batches, Target, Workload};

use super::{CONNECTIONS, SEED_VARIABLE, connection_faults, every_fault, every_mode, faults};

/// Half the calls through the cached gate.
const CACHED: u64 = 50;

fn cached_beside(target: Target) -> Target {
    let cache = OutcomeCache::builder().max_entries(100_000).build();
    let cached = target.gate.with_cache(cache);
    target.beside(cached)
}

fn workload(calls: usize) -> Workload {
    Workload {
        cached: CACHED,
        ..every_mode(calls)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_and_uncached_gates_under_connection_faults_keep_every_promise() {
    let target = cached_beside(Target::proxied(CONNECTIONS).await);
    let faults = faults(connection_faults());
    let run = history::run(&target, &workload(4_000), Some(&faults)).await;
    history::assert_no_anomalies(&run, "history (cached beside uncached)", SEED_VARIABLE);
    history::assert_recovers(&target).await;
}

/// Batches through both gates: the cache never changes a batch's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_through_cached_and_uncached_gates_keep_every_promise() {
    let target = cached_beside(Target::proxied(CONNECTIONS).await);
    let batches = Batches {
        cached: CACHED,
        ..super::batches::batches(300, 0)
    };
    super::batches::batches_keep_every_promise(target, batches, "history (batches, cached)").await;
}

/// The long run of the cache: `IDEM_HISTORY_CALLS` sizes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long history of the cache (minutes): run it with -- --ignored"]
async fn a_long_history_of_cached_and_uncached_gates_keeps_every_promise() {
    let target = cached_beside(Target::cluster(CONNECTIONS).await);
    let faults = faults(every_fault());
    let run = history::run(&target, &workload(50_000), Some(&faults)).await;
    history::assert_no_anomalies(&run, "history (cached, long)", SEED_VARIABLE);
    history::assert_recovers(&target).await;
}
