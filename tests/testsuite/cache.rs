//! The local outcome cache (feature `cache`, issue 17 part 1): settled
//! successes and kept failures answered with no round trip, by the same
//! rules as the store, and nothing else ever answered from it.
//!
//! "No round trip" is proved by cutting the proxy a cached gate's pool goes
//! through: a gate without the cache is then refused `Unavailable`, one
//! with it still answers.

use idem::{Disposition, Outcome};
use std::time::{Duration, SystemTime};

use idem::cache::OutcomeCache;
use idem::operations::{self, PruneFilter, Resolved, Slot};
use idem::testing;
use idem::testing::GateEvent;
use idem::{Fingerprint, Gate, Identity, Rejected};
use idem_test_support::fault_proxy::Proxy;
use idem_test_support::rows;
use idem_test_support::{ChargeError, JobError};

fn cache() -> OutcomeCache {
    OutcomeCache::builder()
        .max_entries(1_000)
        .ttl(Duration::from_secs(60))
        .build()
}

/// A gate in an account of its own whose pool goes through a fresh proxy.
async fn gate_behind_a_proxy() -> (Proxy, Gate) {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(4).await).await;
    (proxy, gate)
}

/// The same account as `gate`, on the test database directly: another
/// process, which has no cache of this one's.
async fn elsewhere(gate: &Gate) -> Gate {
    testing::gate_on(testing::pool_with(2).await)
        .await
        .account(gate.account_name())
}

async fn ok(gate: &Gate, id: &Identity) -> Result<(), JobError> {
    gate.run(id, async { Ok(()) }).await
}

/// Asserts that `outcome` was refused with a rejection matching `pattern`;
/// the rest is the message, as for `assert!`.
macro_rules! assert_refused {
    ($outcome:expr, $pattern:pat, $($message:tt)+) => {
        assert!(matches!(refused(&$outcome), Some($pattern)), $($message)+)
    };
}

fn refused(result: &Result<(), JobError>) -> Option<&Rejected> {
    match result {
        Err(JobError::Rejected(rejected)) => Some(rejected),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_with_the_cache_on_runs_the_body_exactly_once() {
    let gate = testing::gate().await.with_cache(cache());
    let id = Identity::new("cached_race").part(1);
    let report = testing::race(16, || ok(&gate, &id)).await;
    report.assert_exactly_once();
    // Every duplicate now is answered from the cache, and reported as a
    // refusal from the store would be.
    let again = testing::race(16, || ok(&gate, &id)).await;
    again.assert_all_refused(&Rejected::AlreadyDone);
    let cache = gate.outcome_cache().expect("the gate has its cache");
    assert_eq!(cache.entry_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_settled_here_is_answered_with_no_round_trip() {
    let (proxy, plain) = gate_behind_a_proxy().await;
    let cached = plain.with_cache(cache());
    let id = Identity::new("cached_settle").part(1);
    ok(&cached, &id).await.expect("the first call runs");
    proxy.cut().await;
    let (again, events) = testing::observe(ok(&cached, &id)).await;
    assert_refused!(
        again,
        Rejected::AlreadyDone,
        "answered from the cache with the store cut off: {again:?}"
    );
    assert!(
        matches!(events[..], [GateEvent::Refused(Rejected::AlreadyDone)]),
        "the same event as a refusal from the store: {events:?}"
    );
    // The control: without the cache, the same call needs the store.
    let uncached = ok(&plain, &id).await;
    assert_refused!(uncached, Rejected::Unavailable { .. }, "{uncached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_the_store_reports_is_cached_and_answered_with_no_round_trip() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(cache());
    let id = Identity::new("cached_held").part(1);
    ok(&elsewhere(&gate).await, &id)
        .await
        .expect("another process runs it");
    let first = ok(&gate, &id).await;
    assert!(matches!(refused(&first), Some(Rejected::AlreadyDone)));
    proxy.cut().await;
    let again = ok(&gate, &id).await;
    assert_refused!(again, Rejected::AlreadyDone, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_failure_is_answered_from_the_cache() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(cache());
    let id = Identity::new("cached_declined").part(1);
    let declined: Result<(), ChargeError> = gate
        .guard(&id)
        .disposition(ChargeError::disposition)
        .run(async { Err(ChargeError::Declined) })
        .await;
    assert!(matches!(declined, Err(ChargeError::Declined)));
    proxy.cut().await;
    let again: Result<(), ChargeError> = gate
        .guard(&id)
        .disposition(ChargeError::disposition)
        .run(async { Ok(()) })
        .await;
    assert!(
        matches!(again, Err(ChargeError::Rejected(Rejected::AlreadyFailed))),
        "{again:?}"
    );
}

/// The guard of `id` for a payload of `amount`.
fn priced<'a>(gate: &'a Gate, id: &'a Identity, amount: u32) -> idem::Guard<'a> {
    gate.guard(id).fingerprint(Fingerprint::new().part(amount))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_value_is_replayed_only_to_a_matching_fingerprint() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(cache());
    let id = Identity::new("cached_replay").part(1);
    let receipt: Result<String, Rejected> = priced(&gate, &id, 4_999)
        .replay()
        .run(async { Ok("r_1".to_owned()) })
        .await;
    assert_eq!(receipt.ok().as_deref(), Some("r_1"));
    proxy.cut().await;
    let (replayed, events) = testing::observe(
        priced(&gate, &id, 4_999)
            .replay()
            .run(async { Ok::<String, Rejected>("ran again".to_owned()) }),
    )
    .await;
    assert_eq!(
        replayed.ok().as_deref(),
        Some("r_1"),
        "replayed from the cache"
    );
    assert!(matches!(events[..], [GateEvent::Replayed]), "{events:?}");
    let other: Result<String, Rejected> = priced(&gate, &id, 1)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert!(
        matches!(other, Err(Rejected::KeyReused)),
        "another payload: {other:?}"
    );
    let unknown: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert!(
        matches!(unknown, Err(Rejected::AlreadyDone)),
        "a caller without a fingerprint is not handed the value: {unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_cached_without_its_value_sends_a_replaying_caller_to_the_store() {
    let (mut proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(cache());
    let id = Identity::new("cached_valueless").part(1);
    let receipt: Result<String, Rejected> = elsewhere(&gate)
        .await
        .guard(&id)
        .replay()
        .run(async { Ok("r_2".to_owned()) })
        .await;
    assert_eq!(receipt.ok().as_deref(), Some("r_2"));
    // Read by a caller that does not replay: the value is not known here.
    let plain = ok(&gate, &id).await;
    assert!(matches!(refused(&plain), Some(Rejected::AlreadyDone)));
    proxy.cut().await;
    let blind: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert!(
        matches!(blind, Err(Rejected::Unavailable { .. })),
        "the value is asked of the store, never guessed: {blind:?}"
    );
    proxy.resume().await;
    let replayed: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert_eq!(replayed.ok().as_deref(), Some("r_2"));
    // Now known: answered with the store cut off again.
    proxy.cut().await;
    let cached: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert_eq!(cached.ok().as_deref(), Some("r_2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collision_is_still_detected_from_the_cache() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(cache());
    let id = Identity::new("cached_collision").part(1);
    let other = Identity::new("cached_collision").part(2);
    rows::plant_row(
        &elsewhere(&gate).await,
        &id.address(),
        "success",
        other.canonical(),
    )
    .await;
    let first = ok(&gate, &id).await;
    assert_refused!(first, Rejected::Collision { .. }, "{first:?}");
    proxy.cut().await;
    let again = ok(&gate, &id).await;
    assert_refused!(again, Rejected::Collision { .. }, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_answers_across_accounts_or_namespaces() {
    let gate = testing::gate().await.with_cache(cache());
    let id = Identity::new("cached_scope").part(1);
    ok(&gate, &id).await.expect("runs");
    ok(&gate.account(format!("{}_b", gate.account_name())), &id)
        .await
        .expect("another account runs its own");
    ok(&gate.namespace("tenant_a"), &id)
        .await
        .expect("a namespace runs its own");
    let again = ok(&gate.namespace("tenant_a"), &id).await;
    assert!(matches!(refused(&again), Some(Rejected::AlreadyDone)));
    assert_eq!(
        gate.outcome_cache().map(OutcomeCache::entry_count),
        Some(3),
        "the copies share one cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_flight_or_in_doubt_is_never_cached() {
    let gate = testing::gate().await.with_cache(cache());
    let cache = gate.outcome_cache().expect("cached").clone();
    // In flight, then released: the next call runs.
    let id = Identity::new("cached_pending").part(1);
    let claim = gate.claim(&id).await.expect("claimed");
    let duplicate = ok(&gate, &id).await;
    assert!(matches!(refused(&duplicate), Some(Rejected::InFlight)));
    claim.release().await.expect("released");
    ok(&gate, &id).await.expect("runs once released");
    // In doubt, then released by hand: refused until then, runs after.
    let doubtful = Identity::new("cached_in_doubt").part(1);
    let timeout: Result<(), ChargeError> = gate
        .guard(&doubtful)
        .disposition(ChargeError::disposition)
        .run(async { Err(ChargeError::Timeout) })
        .await;
    assert!(matches!(timeout, Err(ChargeError::Timeout)));
    for _ in 0..2 {
        let held = ok(&gate, &doubtful).await;
        assert_refused!(held, Rejected::InDoubt, "{held:?}");
    }
    assert_eq!(cache.entry_count(), 1, "only the settled one");
    let resolved = operations::resolve(
        gate.pool(),
        Slot::new(gate.account_name(), None, &doubtful.address()),
        Outcome::Failed(Disposition::Release),
    )
    .await
    .expect("resolved");
    assert!(matches!(resolved, Resolved::Changed { after: None, .. }));
    ok(&gate, &doubtful).await.expect("runs once resolved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_in_a_transaction_rolled_back_is_not_cached() {
    let gate = testing::gate().await.with_cache(cache());
    let id = Identity::new("cached_rolled_back").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("claimed");
    claim.settle(&mut tx).await.expect("settled in the tx");
    // The transaction sees its own settle: refused, but not remembered.
    let inside = gate.guard(&id).tx(&mut tx).claim().await;
    assert!(matches!(inside, Err(Rejected::AlreadyDone)), "{inside:?}");
    tx.rollback().await.expect("rolled back");
    assert_eq!(gate.outcome_cache().map(OutcomeCache::entry_count), Some(0));
    ok(&gate, &id)
        .await
        .expect("runs: the settle never committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_expires_after_its_ttl_and_a_pruned_row_is_seen_then() {
    let ttl = Duration::from_millis(400);
    let cache = OutcomeCache::builder().ttl(ttl).build();
    let gate = testing::gate().await.with_cache(cache.clone());
    let id = Identity::new("cached_pruned").part(1);
    ok(&gate, &id).await.expect("runs");
    let pruned = operations::prune(
        gate.pool(),
        &PruneFilter::new(SystemTime::now() + Duration::from_secs(1)).account(gate.account_name()),
    )
    .await
    .expect("pruned");
    assert_eq!(pruned, 1);
    // Within the TTL the cache still answers for the pruned row, as
    // documented; the store would let it run.
    let stale = ok(&gate, &id).await;
    assert!(matches!(refused(&stale), Some(Rejected::AlreadyDone)));
    ok(&gate.without_cache(), &id)
        .await
        .expect("without the cache, the store lets it run");
    // Drop its row again, and wait out the TTL.
    rows::delete_row(&gate, &id.address()).await;
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    ok(&gate, &id).await.expect("runs once the entry expired");
    // `clear` forgets at once.
    rows::delete_row(&gate, &id.address()).await;
    cache.clear();
    ok(&gate, &id)
        .await
        .expect("runs once the cache is cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_is_bounded_by_entries_and_by_bytes() {
    let by_count = OutcomeCache::builder().max_entries(8).build();
    let gate = testing::gate().await.with_cache(by_count.clone());
    for n in 0..40 {
        ok(&gate, &Identity::new("cached_many").part(n))
            .await
            .expect("runs");
    }
    let held = by_count.entry_count();
    assert!(held <= 8, "at most 8 entries, holds {held}");

    let by_bytes = OutcomeCache::builder()
        .max_entries(1_000)
        .max_bytes(64 << 10)
        .build();
    let gate = gate.with_cache(by_bytes.clone());
    let big = "x".repeat(10 << 10);
    for n in 0..20 {
        let kept: Result<String, Rejected> = gate
            .guard(&Identity::new("cached_big").part(n))
            .replay()
            .run(async { Ok(big.clone()) })
            .await;
        assert!(kept.is_ok());
    }
    let held = by_bytes.entry_count();
    assert!(
        (1..=6).contains(&held),
        "10 kB values in 64 kB: at most 6, holds {held}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_what_its_gate_has_seen_settled_with_no_statement() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let gate = gate.with_cache(cache());
    let keys: Vec<String> = (0..10).map(|i| format!("batched_{i}")).collect();
    let batch = || -> idem::batch::Batch<&str> {
        keys.iter()
            .map(|key| (key.as_str(), Identity::new("cached_batch").part(key)))
            .collect()
    };
    let first = gate
        .guard_batch(batch())
        .run(|_| async { Ok::<_, JobError>(()) })
        .await;
    assert!(first.iter().all(Result::is_ok));

    // Settled by this batch, so known: the redelivered batch is answered
    // in process, and another process's batch still asks the store.
    let before = proxy.executions();
    let again = gate
        .guard_batch(batch())
        .run(|_| async { Ok::<_, JobError>(()) })
        .await;
    assert_eq!(proxy.executions(), before, "no statement: {again:?}");
    assert!(
        again
            .iter()
            .all(|r| matches!(refused(r), Some(Rejected::AlreadyDone)))
    );
    let other = elsewhere(&gate).await;
    let there = other
        .guard_batch(batch())
        .run(|_| async { Ok::<_, JobError>(()) })
        .await;
    assert!(
        there
            .iter()
            .all(|r| matches!(refused(r), Some(Rejected::AlreadyDone)))
    );
}
