//! What a claim's holder is told, the hand-written
//! API, dispositions and the outcome cache. Each test is named after the
//! promise it attacks (quoted from the docs in its comment).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::cache::OutcomeCache;
use idem::operations::{self, Resolved, Resolver, Slot};
use idem::testing;
use idem::testing::GateEvent;
use idem::{Disposition, Gate, Identity, OnExpiry, Outcome, Rejected};
use idem_test_support::rows;
use tokio::sync::Notify;

fn refusal<T: std::fmt::Debug>(result: &Result<T, Rejected>) -> &Rejected {
    match result {
        Err(rejected) => rejected,
        Ok(value) => panic!("expected a refusal, got Ok({value:?})"),
    }
}

fn slot<'a>(gate: &'a Gate, address: &'a str) -> Slot<'a> {
    Slot::new(gate.account_name(), gate.namespace_name(), address)
}

fn cache() -> OutcomeCache {
    OutcomeCache::builder().ttl(Duration::from_secs(60)).build()
}

/// A fresh gate in an account of its own, with a cache of its own.
async fn cached_gate() -> Gate {
    testing::gate().await.with_cache(cache())
}

async fn resolve(gate: &Gate, address: &str, resolution: Outcome<Option<&str>>) {
    let outcome = operations::resolve_as(
        gate.pool(),
        slot(gate, address),
        resolution,
        Resolver::new("red team"),
    )
    .await
    .expect("resolved");
    assert!(matches!(outcome, Resolved::Changed { .. }), "{outcome:?}");
}

/// 16 replaying duplicates at a barrier on `gate`: their values (or refusals).
async fn sixteen_replays(gate: &Gate, id: &Identity) -> Vec<Result<String, String>> {
    let ran = AtomicUsize::new(0);
    let report = testing::race(16, || async {
        gate.guard(id)
            .replay()
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>("a duplicate's value".to_owned())
            })
            .await
    })
    .await;
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "no duplicate runs: {report:?}"
    );
    let _ = report;
    let mut out = Vec::new();
    for _ in 0..16 {
        let r: Result<String, Rejected> = gate
            .guard(id)
            .replay()
            .run(async { Ok::<_, Rejected>("a later duplicate's value".to_owned()) })
            .await;
        out.push(r.map_err(|e| e.reason().to_owned()));
    }
    out
}

// ---------------------------------------------------------------------------
// NotRecorded and the cache.
// Promise (cache.rs): "Only final facts ... An entry is made when the store
// tells a claim the slot is settled or failed, and when this process's own
// settle (or kept failure) commits"; (Rejected::NotRecorded) "Every
// duplicate is told what the slot records (with `replay`, its value), never
// this holder's outcome".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_recorded_every_cached_duplicate_replays_the_resolved_value_never_the_holders() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_cache_resolved").part(1);
    let address = id.address();
    let (started, resolved) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let holder = {
        let (gate, id, started, resolved) = (
            gate.clone(),
            id.clone(),
            Arc::clone(&started),
            Arc::clone(&resolved),
        );
        tokio::spawn(async move {
            gate.guard(&id)
                .replay()
                .run(async {
                    started.notify_one();
                    resolved.notified().await;
                    Ok::<_, Rejected>("the holder's value".to_owned())
                })
                .await
        })
    };
    started.notified().await;
    resolve(
        &gate,
        &address,
        Outcome::Succeeded(Some(r#""the probe's value""#)),
    )
    .await;
    resolved.notify_one();
    let told = holder.await.expect("holder");
    assert_eq!(refusal(&told).reason(), "not_recorded", "{told:?}");
    for replay in sixteen_replays(&gate, &id).await {
        assert_eq!(replay.as_deref(), Ok("the probe's value"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_recorded_a_claim_resolved_failed_is_already_failed_for_every_cached_duplicate() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_cache_failed").part(1);
    let claim = gate.claim(&id).await.expect("won");
    resolve(&gate, &id.address(), Outcome::Failed(Disposition::Keep)).await;
    let (late, events) = testing::observe(claim.settle()).await;
    assert_eq!(refusal(&late).reason(), "not_recorded", "{late:?}");
    assert!(
        late.as_ref().unwrap_err().to_string().contains("fail"),
        "the message says the slot records a failure: {late:?}"
    );
    assert!(
        matches!(events[..], [GateEvent::Unrecorded(_)]),
        "{events:?}"
    );
    let report = testing::race(16, || async {
        gate.run(&id, async { Ok::<_, Rejected>(()) }).await
    })
    .await;
    report.assert_all_refused(&Rejected::AlreadyFailed);
    assert_eq!(report.refused(), 16);
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("failed")
    );
}

/// A holder disposes of its failure as Keep after an operator resolved the
/// claim as succeeded: not recorded, and the cache must not learn a kept
/// failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_recorded_a_late_keep_over_a_resolved_success_leaves_already_done_for_cached_duplicates()
 {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_cache_keep_over").part(1);
    let claim = gate.claim(&id).await.expect("won");
    resolve(&gate, &id.address(), Outcome::Succeeded(None)).await;
    let late = claim.dispose(Disposition::Keep).await;
    assert_eq!(refusal(&late).reason(), "not_recorded", "{late:?}");
    for _ in 0..3 {
        let again = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
        assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
    }
}

// ---------------------------------------------------------------------------
// Lease takeover: the stale holder's late success and failure.
// Promise (Rejected::LeaseLost): "A success of this holder is still
// recorded (... the slot is settled unless it already was); a failure
// changes nothing, the new holder decides."
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_lost_a_stale_holders_late_failure_changes_nothing() {
    let gate = testing::gate().await;
    for (part, late) in [
        ("release", None),
        ("keep", Some(Disposition::Keep)),
        ("in_doubt", Some(Disposition::InDoubt)),
        ("dispose_release", Some(Disposition::Release)),
    ] {
        let id = Identity::new("rt_h_stale_failure").part(part);
        let stale = gate
            .guard(&id)
            .lease(Duration::from_millis(150))
            .claim()
            .await
            .expect("first");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let current = gate
            .guard(&id)
            .lease(Duration::from_millis(150))
            .claim()
            .await
            .expect("taken over");
        let told = match late {
            None => stale.release().await,
            Some(d) => stale.dispose(d).await,
        };
        assert_eq!(refusal(&told).reason(), "lease_lost", "{part}: {told:?}");
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("pending"),
            "{part}: the new holder's claim is untouched"
        );
        current.settle().await.expect("the new holder settles");
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("success")
        );
    }
}

/// The new holder settled with its value first; the stale holder's late
/// success is told LeaseLost and must not put its own value in the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_lost_after_the_new_holder_settled_every_cached_replay_gets_the_new_value() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_stale_success").part(1);
    let lease = Duration::from_millis(150);
    let go = Arc::new(Notify::new());
    let stale = {
        let (gate, id, go) = (gate.clone(), id.clone(), Arc::clone(&go));
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(lease)
                .replay()
                .run(async {
                    go.notified().await;
                    Ok::<_, Rejected>("stale".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new: Result<String, Rejected> = gate
        .guard(&id)
        .lease(lease)
        .replay()
        .run(async { Ok::<_, Rejected>("new".to_owned()) })
        .await;
    assert_eq!(new.expect("the taker-over runs"), "new");
    go.notify_one();
    let told = stale.await.expect("stale");
    assert_eq!(refusal(&told).reason(), "lease_lost", "{told:?}");
    for replay in sixteen_replays(&gate, &id).await {
        assert_eq!(replay.as_deref(), Ok("new"));
    }
}

/// The stale holder's late success lands over the new holder's pending row;
/// the new holder is told NotRecorded; every (cached) replay on either gate
/// gets the stale holder's value, the one the slot records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_recorded_after_a_stale_late_success_replays_on_both_cached_gates_agree_with_the_row() {
    let first = cached_gate().await;
    let second = first.without_cache().with_cache(cache());
    let id = Identity::new("rt_h_stale_first").part(1);
    let lease = Duration::from_millis(150);
    let (go_stale, go_new, started_new) = (
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
    );
    let stale = {
        let (gate, id, go) = (first.clone(), id.clone(), Arc::clone(&go_stale));
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(lease)
                .replay()
                .run(async {
                    go.notified().await;
                    Ok::<_, Rejected>("stale".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = {
        let (gate, id, go, started) = (
            second.clone(),
            id.clone(),
            Arc::clone(&go_new),
            Arc::clone(&started_new),
        );
        tokio::spawn(async move {
            // A lease of its own, long enough to outlive the test.
            let long = Duration::from_secs(30);
            gate.guard(&id)
                .lease(long)
                .replay()
                .run(async {
                    started.notify_one();
                    go.notified().await;
                    Ok::<_, Rejected>("new".to_owned())
                })
                .await
        })
    };
    started_new.notified().await;
    go_stale.notify_one();
    let told_stale = stale.await.expect("stale");
    assert_eq!(
        refusal(&told_stale).reason(),
        "lease_lost",
        "{told_stale:?}"
    );
    go_new.notify_one();
    let told_new = new.await.expect("new");
    assert_eq!(refusal(&told_new).reason(), "not_recorded", "{told_new:?}");
    for gate in [&first, &second] {
        for replay in sixteen_replays(gate, &id).await {
            assert_eq!(replay.as_deref(), Ok("stale"));
        }
    }
}

// ---------------------------------------------------------------------------
// on_expiry = "in_doubt", then the holder comes back.
// Promise (Claim::settle): "A claim its lease turned in doubt (... nobody
// took it over) is settled with this success, the outcome nobody knew, and
// `Ok` is returned."
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_success_on_a_claim_turned_in_doubt_is_ok_and_every_cached_replay_gets_it() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_late_in_doubt").part(1);
    let lease = Duration::from_millis(150);
    let go = Arc::new(Notify::new());
    let holder = {
        let (gate, id, go) = (gate.clone(), id.clone(), Arc::clone(&go));
        tokio::spawn(async move {
            gate.guard(&id)
                .lease(lease)
                .on_expiry(OnExpiry::InDoubt)
                .replay()
                .run(async {
                    go.notified().await;
                    Ok::<_, Rejected>("late".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = testing::race(16, || async {
        gate.guard(&id)
            .lease(lease)
            .on_expiry(OnExpiry::InDoubt)
            .replay()
            .run(async { Ok::<_, Rejected>("dup".to_owned()) })
            .await
    })
    .await;
    report.assert_all_refused(&Rejected::InDoubt);
    go.notify_one();
    let told = holder.await.expect("holder");
    assert_eq!(told.expect("the late success is recorded"), "late");
    for replay in sixteen_replays(&gate, &id).await {
        assert_eq!(replay.as_deref(), Ok("late"));
    }
}

/// Promise (Claim::extend): "Renews the lease ... [`Rejected::LeaseLost`] if
/// the claim was taken over meanwhile." A holder whose claim is no longer
/// pending under its lease (turned in doubt; resolved by an operator) must
/// not be told its lease was renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_is_not_ok_on_a_claim_turned_in_doubt() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_extend_in_doubt").part(1);
    let slow = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dup = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await;
    assert!(matches!(dup, Err(Rejected::InDoubt)), "{dup:?}");
    let extended = slow.extend(Duration::from_secs(30)).await;
    let state = rows::row_state(&gate, &id.address()).await;
    assert!(
        extended.is_err(),
        "extend said Ok on a claim held in doubt (row {state:?})"
    );
    assert_eq!(
        state.as_deref(),
        Some("in_doubt"),
        "the slot stays in doubt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_is_not_ok_on_a_claim_an_operator_resolved() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_extend_resolved").part(1);
    // A lease that ran out (nobody took it over): an operator may resolve it.
    let claim = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    resolve(&gate, &id.address(), Outcome::Failed(Disposition::Keep)).await;
    let extended = claim.extend(Duration::from_secs(30)).await;
    assert!(
        extended.is_err(),
        "extend said Ok on a claim resolved as failed meanwhile"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("failed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_is_not_ok_on_a_claim_an_operator_released() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_extend_released").part(1);
    let claim = gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .claim()
        .await
        .expect("won");
    operations::release_pending(gate.pool(), slot(&gate, &id.address()))
        .await
        .expect("released");
    let extended = claim.extend(Duration::from_secs(30)).await;
    assert!(extended.is_err(), "extend said Ok on a released claim");
}

/// Promise (Claim::extend): "`lease` is checked as Guard::lease checks it
/// (InvalidOption)."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_with_a_lease_of_zero_or_too_long_is_invalid_option() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_extend_bad").part(1);
    let claim = gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .claim()
        .await
        .expect("won");
    for lease in [
        Duration::ZERO,
        idem::MAX_LEASE + Duration::from_secs(1),
        Duration::MAX,
    ] {
        let told = claim.extend(lease).await;
        assert!(
            matches!(
                told,
                Err(Rejected::InvalidOption {
                    option: "lease",
                    ..
                })
            ),
            "{lease:?}: {told:?}"
        );
    }
    claim.settle().await.expect("still ours");
}

// ---------------------------------------------------------------------------
// Dropping a claim; races on a cached gate; scopes of one cache.
// ---------------------------------------------------------------------------

/// Promise (Claim): "dropping it unresolved leaves the row pending, which
/// refuses every retry"; (cache) "never a claim pending".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_claim_stays_pending_and_every_cached_duplicate_is_in_flight() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_dropped").part(1);
    drop(gate.claim(&id).await.expect("won"));
    for _ in 0..2 {
        let report = testing::race(16, || async {
            gate.run(&id, async { Ok::<_, Rejected>(()) }).await
        })
        .await;
        report.assert_all_refused(&Rejected::InFlight);
    }
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("pending")
    );
}

/// Promise (README): "lets exactly one concurrent insert win"; (cache) a hit
/// reports "the same GateEvent a refusal from the store does".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_at_a_barrier_on_a_cached_gate_run_once_and_cached_refusals_report_as_the_store() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_race16").part(1);
    let ran = AtomicUsize::new(0);
    let report = testing::race(16, || async {
        gate.run(&id, async {
            ran.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, Rejected>(())
        })
        .await
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let (store, store_events) = testing::observe(
        gate.without_cache()
            .run(&id, async { Ok::<_, Rejected>(()) }),
    )
    .await;
    let (hit, hit_events) = testing::observe(gate.run(&id, async { Ok::<_, Rejected>(()) })).await;
    assert!(matches!(store, Err(Rejected::AlreadyDone)), "{store:?}");
    assert!(matches!(hit, Err(Rejected::AlreadyDone)), "{hit:?}");
    assert_eq!(format!("{store_events:?}"), format!("{hit_events:?}"));
}

/// Promise (cache.rs): "an entry is keyed by store, account, namespace and
/// address, so it never answers across them".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_cache_never_answers_across_accounts_or_namespaces() {
    let shared = cache();
    let base = testing::gate().await.with_cache(shared.clone());
    let account = testing::unique_name("rt_acct");
    let gates = [
        base.clone(),
        base.account(&account),
        base.namespace("n1"),
        base.namespace("n2"),
        base.account(&account).namespace("n1"),
        // An account name that is the other's name plus its namespace.
        base.account(format!("{account}n1")),
        base.account(format!("{account}\u{1}n1")),
        // NFC and NFD spellings are distinct names (bytes, not glyphs).
        base.account(format!("{account}\u{e9}")),
        base.account(format!("{account}e\u{301}")),
    ];
    let id = Identity::new("rt_h_scopes").part("k");
    let ran = AtomicUsize::new(0);
    for (n, gate) in gates.iter().enumerate() {
        match gate.claim(&id).await {
            Ok(claim) => {
                ran.fetch_add(1, Ordering::SeqCst);
                claim.dispose(Disposition::Keep).await.expect("kept");
            }
            Err(other) => panic!("scope {n} ({:?}): {other:?}", gate.account_name()),
        }
        assert_eq!(
            ran.load(Ordering::SeqCst),
            n + 1,
            "scope {n} ran its own body"
        );
    }
    for gate in &gates {
        let again = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
        assert!(matches!(again, Err(Rejected::AlreadyFailed)), "{again:?}");
    }
    // A name PostgreSQL text cannot hold is refused as the request's error.
    let nul = base.account(format!("{account}\u{0}n1"));
    let refused = nul.claim(&id).await;
    assert!(
        matches!(&refused, Err(Rejected::InvalidScope { .. })),
        "{:?}",
        refused.as_ref().err()
    );
    assert!(
        !refused
            .as_ref()
            .err()
            .map(Rejected::is_outage)
            .unwrap_or(true)
    );
}

// ---------------------------------------------------------------------------
// Replay of values that no longer deserialize.
// Promise (Guard::replay): "So is a duplicate whose stored value no
// longer deserializes into `T`" (refused AlreadyDone).
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_value_that_no_longer_deserializes_is_already_done_from_store_and_cache() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_deser").part(1);
    let first: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("text".to_owned()) })
        .await;
    assert_eq!(first.expect("runs"), "text");
    for g in [gate.clone(), gate.without_cache()] {
        let other: Result<u64, Rejected> = g.guard(&id).replay().run(async { Ok(7) }).await;
        assert!(matches!(other, Err(Rejected::AlreadyDone)), "{other:?}");
    }
    let same: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("again".to_owned()) })
        .await;
    assert_eq!(same.expect("still replayed"), "text");
}

/// A value resolved by an operator as JSON that is not valid for `T`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolved_value_of_another_shape_is_already_done_not_an_error_or_a_run() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_deser_resolved").part(1);
    let claim = gate.claim(&id).await.expect("won");
    resolve(
        &gate,
        &id.address(),
        Outcome::Succeeded(Some(r#"{"not":"a string"}"#)),
    )
    .await;
    drop(claim);
    let ran = AtomicUsize::new(0);
    for _ in 0..3 {
        let told: Result<String, Rejected> = gate
            .guard(&id)
            .replay()
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok("ran".to_owned())
            })
            .await;
        assert!(matches!(told, Err(Rejected::AlreadyDone)), "{told:?}");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// The ungated claim and the claim in a transaction.
// ---------------------------------------------------------------------------

/// Promise (Gate::claim): "An absent identity (a `None` key part) yields an
/// ungated claim whose settle and release do nothing."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_identity_yields_an_ungated_claim_whose_outcomes_do_nothing() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_absent").part(None::<&str>);
    assert!(id.is_absent());
    for n in 0..3 {
        let claim = gate.claim(&id).await.expect("ungated");
        assert!(!claim.is_gated());
        assert_eq!(claim.fence(), None);
        assert!(claim.extend(Duration::from_secs(1)).await.is_ok());
        let done = match n {
            0 => claim.settle().await,
            1 => claim.release().await,
            _ => claim.dispose(Disposition::Keep).await,
        };
        assert!(done.is_ok(), "{done:?}");
    }
    // In a transaction too.
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("ungated");
    assert!(!claim.is_gated());
    assert_eq!(claim.fence(), None);
    assert!(
        claim.settle(&mut tx).await.is_ok(),
        "an ungated claim in a transaction settles as nothing"
    );
    tx.rollback().await.expect("rollback");
}

/// A claim in a transaction settled there, on a cached gate, then rolled
/// back: it leaves the slot free to a next claimer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_rolled_back_leaves_the_slot_free_and_caches_nothing() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_claim_in_rollback").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("won");
    claim.settle(&mut tx).await.expect("settled");
    tx.rollback().await.expect("rollback");
    let ran = AtomicUsize::new(0);
    let report = testing::race(16, || async {
        gate.run(&id, async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// A failure recorded over a claim somebody removed.
// Promise (Rejected): "Why a guarded invocation did not run (or, for
// ClaimLost, why its outcome could not be recorded)"; (ClaimLost) "The claim
// was released or removed by someone else while the body ran ... a failure
// changes nothing"; (GateEvent::Kept) "A definite failure was kept: the slot
// is `failed`, and duplicates are refused AlreadyFailed"; (GateEvent::InDoubt)
// "the slot is held `in_doubt`".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_lost_a_keep_or_doubt_over_a_claim_an_operator_released_is_not_told_ok() {
    let gate = testing::gate().await;
    for (part, disposition) in [
        ("keep", Disposition::Keep),
        ("in_doubt", Disposition::InDoubt),
    ] {
        let id = Identity::new("rt_h_keep_over_released").part(part);
        let claim = gate.claim(&id).await.expect("won");
        let released = operations::release_pending(gate.pool(), slot(&gate, &id.address()))
            .await
            .expect("released by an operator");
        assert!(released.is_some());
        let (told, events) = testing::observe(claim.dispose(disposition)).await;
        let state = rows::row_state(&gate, &id.address()).await;
        assert_eq!(state, None, "the slot is vacant: a retry runs");
        assert!(
            told.is_err(),
            "{part}: the holder was told its {disposition:?} was recorded (events {events:?}), \
             but the slot is vacant and the next retry runs the action"
        );
        assert!(
            matches!(events[..], [GateEvent::Unrecorded(_)]),
            "{part}: {events:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// The cache learns this process's own settles.
// Promise (cache.rs): "An entry is made ... when this process's own settle
// (or kept failure) commits on the gate's pool"; "answered with no round
// trip".
// ---------------------------------------------------------------------------

/// A settle whose reply was lost, retried and found to be its own (Ok):
/// the cache must know it, so that a duplicate is answered with the store
/// cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_whose_reply_was_lost_is_remembered_by_the_cache() {
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let pool = crate::support::proxy::pool_through(&proxy).await;
    let gate = testing::gate_on(pool).await.with_cache(cache());
    let id = Identity::new("rt_h_lost_reply_cached").part(1);
    assert!(proxy.lose_next_reply(idem_test_support::fault_proxy::Statement::Settle));
    let first: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("mine".to_owned()) })
        .await;
    assert_eq!(
        proxy.take_lost_replies().len(),
        1,
        "the settle's reply was lost"
    );
    assert_eq!(first.expect("its own"), "mine");
    proxy.cut().await;
    let again: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("again".to_owned()) })
        .await;
    assert_eq!(
        again.map_err(|e| e.reason()),
        Ok("mine".to_owned()),
        "a settle of this process that committed is answered from the cache"
    );
}

/// A late success over a claim its lease turned in doubt is this holder's
/// own, told Ok: the cache must know it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_over_a_claim_turned_in_doubt_is_remembered_by_the_cache() {
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(4).await)
        .await
        .with_cache(cache());
    let id = Identity::new("rt_h_late_in_doubt_cached").part(1);
    let slow = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dup = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await;
    assert!(matches!(dup, Err(Rejected::InDoubt)), "{dup:?}");
    slow.settle()
        .await
        .expect("the late success is recorded, Ok");
    proxy.cut().await;
    let again = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(
        matches!(again, Err(Rejected::AlreadyDone)),
        "the holder's own Ok settle is answered from the cache: {again:?}"
    );
}

/// Promise (cache.rs): "never ... from a row read inside one [the caller's
/// transaction]".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_read_inside_a_transaction_is_never_cached() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_read_in_tx").part(1);
    // Settled by another process (no cache here).
    gate.without_cache()
        .run(&id, async { Ok::<_, Rejected>(()) })
        .await
        .expect("runs");
    let mut tx = gate.pool().begin().await.expect("begin");
    let seen = gate.guard(&id).tx(&mut tx).claim().await;
    assert!(matches!(seen, Err(Rejected::AlreadyDone)), "{seen:?}");
    tx.rollback().await.expect("rollback");
    rows::delete_row(&gate, &id.address()).await;
    let ran = AtomicUsize::new(0);
    run_counted(&gate, &id, &ran)
        .await
        .expect("runs: nothing was cached");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

async fn run_counted(gate: &Gate, id: &Identity, ran: &AtomicUsize) -> Result<(), Rejected> {
    gate.run(id, async {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// A waiting duplicate and a resolution.
// Promise (README): wait: "an in-flight duplicate polls until the holder
// resolves, then gets the outcome".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_duplicate_gets_the_operators_resolution_not_the_late_holders() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_wait_resolved").part(1);
    let claim = gate.claim(&id).await.expect("won");
    let waiter = {
        let (gate, id) = (gate.clone(), id.clone());
        tokio::spawn(async move {
            gate.guard(&id)
                .wait(Duration::from_secs(10))
                .replay()
                .run(async { Ok::<_, Rejected>("waiter ran".to_owned()) })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    resolve(
        &gate,
        &id.address(),
        Outcome::Succeeded(Some(r#""resolved""#)),
    )
    .await;
    let late = claim.settle().await;
    assert_eq!(refusal(&late).reason(), "not_recorded");
    let waited = waiter.await.expect("waiter");
    assert_eq!(waited.map_err(|e| e.reason()), Ok("resolved".to_owned()));
}

// ---------------------------------------------------------------------------
// Fingerprints and the cache.
// Promise (Guard::replay): "a value goes only to a caller that gave the
// same fingerprint, or that gave none when none was stored"; (README)
// "never given the other payload's value".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprints_from_the_cache_are_judged_as_from_the_store() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_fp").part(1);
    // The guard of `id` on `gate` for payload `n`.
    fn fp<'a>(gate: &'a Gate, id: &'a Identity, n: i64) -> idem::Guard<'a> {
        gate.guard(id).fingerprint(idem::Fingerprint::new().part(n))
    }
    let first: Result<String, Rejected> = fp(&gate, &id, 1)
        .replay()
        .run(async { Ok("one".to_owned()) })
        .await;
    assert_eq!(first.expect("runs"), "one");
    for g in [gate.clone(), gate.without_cache(), gate.clone()] {
        let same: Result<String, Rejected> = fp(&g, &id, 1)
            .replay()
            .run(async { Ok("x".to_owned()) })
            .await;
        assert_eq!(same.map_err(|e| e.reason()), Ok("one".to_owned()));
        let other: Result<String, Rejected> = fp(&g, &id, 2)
            .replay()
            .run(async { Ok("x".to_owned()) })
            .await;
        assert!(matches!(other, Err(Rejected::KeyReused)), "{other:?}");
        let none: Result<String, Rejected> = g
            .guard(&id)
            .replay()
            .run(async { Ok("x".to_owned()) })
            .await;
        assert!(matches!(none, Err(Rejected::AlreadyDone)), "{none:?}");
    }
}

/// The control of the two above: a plain settle through the proxy is
/// remembered, and answered with the store cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_settle_is_remembered_by_the_cache_and_answered_with_the_store_cut_off() {
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(4).await)
        .await
        .with_cache(cache());
    let id = Identity::new("rt_h_plain_cached").part(1);
    let first: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("mine".to_owned()) })
        .await;
    assert_eq!(first.expect("runs"), "mine");
    proxy.cut().await;
    let again: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("again".to_owned()) })
        .await;
    assert_eq!(again.map_err(|e| e.reason()), Ok("mine".to_owned()));
}

// ---------------------------------------------------------------------------
// Who is told LeaseLost, who ClaimLost; a takeover race of 16.
// ---------------------------------------------------------------------------

/// Promise (Rejected::LeaseLost): "The claim's lease ran out while the
/// body ran, and the claim is no longer this holder's: ... or, once the
/// lease had run out, it was released or removed (... by an operator: once
/// the row is gone, the two cannot be told apart)". The red team found the
/// older wording ("another invocation took the claim over") untrue here:
/// nobody took it over, an operator released it once its lease ran out.
/// The success is still recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_when_an_operator_released_an_expired_claim_nobody_took_over() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_expired_released").part(1);
    let claim = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    operations::release_pending(gate.pool(), slot(&gate, &id.address()))
        .await
        .expect("released by an operator");
    let late = claim.settle().await;
    assert_eq!(
        refusal(&late).reason(),
        "lease_lost",
        "the lease ran out and the claim is no longer this holder's: {late:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "a success that happened is never forgotten"
    );
}

/// Promise (Claim::extend): "LeaseLost if the claim was taken over
/// meanwhile"; (README) "a pending claim whose holder crashed expires and
/// is taken over with a higher fence"; 16 racers take it over: one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_racers_take_an_expired_lease_over_once_and_the_stale_holder_is_told() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_takeover16").part(1);
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("first");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = testing::race(16, || async {
        gate.guard(&id).lease(Duration::from_secs(30)).claim().await
    })
    .await;
    assert_eq!(report.wins(), 1, "{report:?}");
    for rejected in report.refusals() {
        assert!(matches!(rejected, Rejected::InFlight), "{rejected:?}");
    }
    let extended = stale.extend(Duration::from_secs(30)).await;
    assert_eq!(refusal(&extended).reason(), "lease_lost", "{extended:?}");
    let late = stale.settle().await;
    assert_eq!(refusal(&late).reason(), "lease_lost", "{late:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
}

/// Promise (Claim::release): "A claim somebody else recorded meanwhile is
/// left as it is, with NotRecorded".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_recorded_a_late_release_over_a_resolved_claim_leaves_it() {
    let gate = cached_gate().await;
    for (part, resolution, state) in [
        ("succeeded", Outcome::Succeeded(None), "success"),
        ("failed", Outcome::Failed(Disposition::Keep), "failed"),
    ] {
        let id = Identity::new("rt_h_release_over").part(part);
        let claim = gate.claim(&id).await.expect("won");
        resolve(&gate, &id.address(), resolution).await;
        let late = claim.release().await;
        assert_eq!(refusal(&late).reason(), "not_recorded", "{part}: {late:?}");
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some(state)
        );
    }
}

// ---------------------------------------------------------------------------
// Metric labels match what happened.
// Promise (idem::metrics): "`unrecorded` | the store failed to record the
// outcome: the claim stays pending"; operations.md: "any
// outcome="unrecorded" | an outcome could not be written: its claim stays
// pending | as a stale pending claim".
// ---------------------------------------------------------------------------

pub(super) mod counted {
    use std::sync::atomic::Ordering;

    use idem::metrics::names;

    // One global recorder per process: the one the `metrics` module reads.
    use crate::support::recorder::recorder;

    pub fn install() {
        recorder();
    }

    /// Every outcome counted for `action`, by outcome, zeros left out.
    pub fn outcomes(action: &str) -> Vec<(String, u64)> {
        let mut outcomes: Vec<(String, u64)> = recorder()
            .registry
            .get_counter_handles()
            .into_iter()
            .filter(|(key, _)| {
                key.name() == names::OUTCOMES_TOTAL
                    && key
                        .labels()
                        .any(|l| l.key() == names::ACTION && l.value() == action)
            })
            .filter_map(|(key, value)| {
                let outcome = key
                    .labels()
                    .find(|l| l.key() == names::OUTCOME)?
                    .value()
                    .to_owned();
                Some((outcome, value.load(Ordering::SeqCst)))
            })
            .filter(|(_, count)| *count > 0)
            .collect();
        outcomes.sort();
        outcomes
    }
}

/// The labels of the outcomes a holder is told: NotRecorded is
/// `not_recorded`, ClaimLost `stale_settle`, a cache hit `already_done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_match_what_the_holder_was_told() {
    counted::install();
    let gate = cached_gate().await;
    let action = testing::unique_name("rt_h_labels");
    let resolved = Identity::new(&action).part("resolved");
    let claim = gate.claim(&resolved).await.expect("won");
    resolve(
        &gate,
        &resolved.address(),
        Outcome::Failed(Disposition::Keep),
    )
    .await;
    assert_eq!(refusal(&claim.settle().await).reason(), "not_recorded");
    let released = Identity::new(&action).part("released");
    let claim = gate.claim(&released).await.expect("won");
    operations::release_pending(gate.pool(), slot(&gate, &released.address()))
        .await
        .expect("released");
    assert_eq!(
        refusal(&claim.dispose(Disposition::Keep).await).reason(),
        "claim_lost"
    );
    let again = gate.run(&resolved, async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(again, Err(Rejected::AlreadyFailed)), "{again:?}");
    let again = gate.run(&resolved, async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(again, Err(Rejected::AlreadyFailed)), "{again:?}");
    assert_eq!(
        counted::outcomes(&action),
        [
            ("already_failed".to_owned(), 2),
            ("not_recorded".to_owned(), 1),
            ("stale_settle".to_owned(), 1),
            ("won".to_owned(), 2),
        ]
    );
}

// ---------------------------------------------------------------------------
// Values that cannot be kept.
// Promise (Guard::replay): "A value that fails to serialize, or that
// the store refuses ..., never loses the success: the claim is settled
// without a value, a tracing error says so, and duplicates are refused
// with AlreadyDone."
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_fails_to_serialize_still_settles_and_duplicates_are_already_done() {
    use std::collections::HashMap;
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_unserializable").part(1);
    // serde_json refuses a map whose keys are not strings.
    let value: HashMap<(i32, i32), i32> = [((1, 2), 3)].into_iter().collect();
    let first: Result<HashMap<(i32, i32), i32>, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok(value.clone()) })
        .await;
    assert_eq!(first.expect("the success is returned"), value);
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
    for g in [gate.clone(), gate.without_cache()] {
        let again: Result<HashMap<(i32, i32), i32>, Rejected> = g
            .guard(&id)
            .replay()
            .run(async { Ok(HashMap::new()) })
            .await;
        assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_store_refuses_still_settles_and_cached_duplicates_are_already_done() {
    let gate = cached_gate().await;
    let account = gate.account_name().to_owned();
    let trigger = rows::RowTrigger::install(
        gate.pool(),
        &testing::unique_name("rt_refuse_value"),
        "BEFORE UPDATE",
        &format!(
            "IF NEW.account = '{account}' AND NEW.output_json IS NOT NULL THEN \
             RAISE EXCEPTION 'no values here' USING ERRCODE = '22023'; END IF; RETURN NEW;"
        ),
    )
    .await;
    let id = Identity::new("rt_h_refused_value").part(1);
    let first: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("big".to_owned()) })
        .await;
    trigger.remove(gate.pool()).await;
    assert_eq!(first.expect("the success is returned"), "big");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
    for g in [gate.clone(), gate.without_cache(), gate.clone()] {
        let again: Result<String, Rejected> = g
            .guard(&id)
            .replay()
            .run(async { Ok("again".to_owned()) })
            .await;
        assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
    }
}

// ---------------------------------------------------------------------------
// A failure kept or held in doubt outlives its lease.
// Promise (README): Keep: "refused AlreadyFailed: do not retry"; InDoubt:
// "held: in_doubt, until an operator or a reconciler resolves it"; (mode)
// "never a second run of a kept or doubtful one".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_or_doubtful_failure_is_never_taken_over_when_its_lease_would_have_run_out() {
    let gate = testing::gate().await;
    let short = Duration::from_millis(100);
    for (part, disposition, expected) in [
        ("keep", Disposition::Keep, "already_failed"),
        ("in_doubt", Disposition::InDoubt, "in_doubt"),
    ] {
        let id = Identity::new("rt_h_disposed_lease").part(part);
        let claim = gate.guard(&id).lease(short).claim().await.expect("won");
        claim.dispose(disposition).await.expect("disposed");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let ran = AtomicUsize::new(0);
        // The same short lease, it run out into doubt, and no lease at all.
        for mode in ["lease", "lease_in_doubt", "plain"] {
            let report = testing::race(16, || async {
                let body = async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Rejected>(())
                };
                match mode {
                    "lease" => gate.guard(&id).lease(short).run(body).await,
                    "lease_in_doubt" => {
                        gate.guard(&id)
                            .lease(short)
                            .on_expiry(OnExpiry::InDoubt)
                            .run(body)
                            .await
                    }
                    _ => gate.guard(&id).run(body).await,
                }
            })
            .await;
            assert_eq!(report.wins(), 0, "{part}: {report:?}");
            for rejected in report.refusals() {
                assert_eq!(rejected.reason(), expected, "{part}");
            }
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}

/// Promise (Claim): "for ... a fail-open run, no slot at all ... Settling or
/// releasing it does nothing."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_open_claim_settles_and_disposes_as_nothing() {
    let proxy = idem_test_support::fault_proxy::Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(2).await)
        .await
        .with_cache(cache());
    proxy.cut().await;
    let id = Identity::new("rt_h_fail_open").part(1);
    for n in 0..3 {
        let claim = gate
            .guard(&id)
            .on_unavailable(idem::OnUnavailable::Run)
            .claim()
            .await
            .expect("fails open");
        assert!(!claim.is_gated());
        let done = match n {
            0 => claim.settle().await,
            1 => claim.release().await,
            _ => claim.dispose(Disposition::InDoubt).await,
        };
        assert!(done.is_ok(), "{done:?}");
    }
    let refused = gate.claim(&id).await;
    assert!(
        matches!(&refused, Err(rejected) if rejected.is_outage()),
        "without failing open the gate fails closed: {refused:?}"
    );
}

// ---------------------------------------------------------------------------
// The holder and an operator at the same instant.
// Promise (operations::resolve_as): "exactly once, however many resolvers
// race ... a racing resolver, or the original holder's late settle, waits
// for the lock and then finds the claim resolved"; (NotRecorded) "Every
// duplicate is told what the slot records ..., never this holder's outcome".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_and_a_resolver_at_a_barrier_tell_one_story_to_holder_operator_and_replays() {
    let gate = cached_gate().await;
    for round in 0..16 {
        let id = Identity::new("rt_h_settle_vs_resolve").part(round);
        let address = id.address();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let holder = {
            let (gate, id, barrier) = (gate.clone(), id.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                gate.guard(&id)
                    .replay()
                    .run(async {
                        barrier.wait().await;
                        Ok::<_, Rejected>("mine".to_owned())
                    })
                    .await
            })
        };
        // The claim is made (the body waits at the barrier) before the
        // resolver goes.
        while rows::row_state(&gate, &address).await.is_none() {
            tokio::task::yield_now().await;
        }
        barrier.wait().await;
        let resolved = operations::resolve_as(
            gate.pool(),
            slot(&gate, &address),
            Outcome::Succeeded(Some(r#""probe""#)),
            Resolver::new("red team"),
        )
        .await
        .expect("resolve");
        let told = holder.await.expect("holder");
        let recorded = match (&told, &resolved) {
            (Ok(value), Resolved::NotResolvable(_)) => value.clone(),
            (Err(rejected), Resolved::Changed { .. }) if rejected.reason() == "not_recorded" => {
                "probe".to_owned()
            }
            other => panic!("round {round}: two stories: {other:?}"),
        };
        for replay in [gate.clone(), gate.without_cache()] {
            let again: Result<String, Rejected> = replay
                .guard(&id)
                .replay()
                .run(async { Ok("dup".to_owned()) })
                .await;
            assert_eq!(
                again.map_err(|e| e.reason()),
                Ok(recorded.clone()),
                "round {round}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holders_keep_and_a_resolvers_success_at_a_barrier_tell_one_story() {
    let gate = cached_gate().await;
    for round in 0..16 {
        let id = Identity::new("rt_h_keep_vs_resolve").part(round);
        let address = id.address();
        let claim = gate.claim(&id).await.expect("won");
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let holder = {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                claim.dispose(Disposition::Keep).await
            })
        };
        barrier.wait().await;
        let resolved = operations::resolve_as(
            gate.pool(),
            slot(&gate, &address),
            Outcome::Succeeded(None),
            Resolver::new("red team"),
        )
        .await
        .expect("resolve");
        let told = holder.await.expect("holder");
        let expected = match (&told, &resolved) {
            (Ok(()), Resolved::NotResolvable(_)) => "already_failed",
            (Err(rejected), Resolved::Changed { .. }) if rejected.reason() == "not_recorded" => {
                "already_done"
            }
            other => panic!("round {round}: two stories: {other:?}"),
        };
        for g in [gate.clone(), gate.without_cache(), gate.clone()] {
            let again = g.run(&id, async { Ok::<_, Rejected>(()) }).await;
            assert_eq!(refusal(&again).reason(), expected, "round {round}");
        }
    }
}

// ---------------------------------------------------------------------------
// Collisions from the cache; events of a cached replay; lost release and
// extend replies.
// ---------------------------------------------------------------------------

/// Promise (cache.rs): "a different identity at the same address is a
/// Collision" from the cache as from the store; (holder) a failure or a
/// success over a slot a colliding identity holds changes nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_colliding_identity_is_refused_from_store_and_cache_and_a_holder_never_writes_over_it() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_collide").part(1);
    let other = Identity::new("rt_h_collide_other").part(2);
    rows::plant_row(&gate, &id.address(), "success", other.canonical()).await;
    let ran = AtomicUsize::new(0);
    for _ in 0..2 {
        let report = testing::race(16, || async {
            gate.guard(&id)
                .replay()
                .run(async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Rejected>("x".to_owned())
                })
                .await
        })
        .await;
        for rejected in report.refusals() {
            assert!(
                matches!(rejected, Rejected::Collision { .. }),
                "{rejected:?}"
            );
        }
        assert_eq!(report.refused(), 16);
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);

    // A holder whose row was replaced by a colliding identity's pending claim.
    let held = Identity::new("rt_h_collide_held").part(1);
    for (part, finish) in [("settle", 0), ("keep", 1), ("release", 2)] {
        let id = held.clone().part(part);
        let claim = gate.claim(&id).await.expect("won");
        rows::delete_row(&gate, &id.address()).await;
        rows::plant_row(&gate, &id.address(), "pending", other.canonical()).await;
        let told = match finish {
            0 => claim.settle().await,
            1 => claim.dispose(Disposition::Keep).await,
            _ => claim.release().await,
        };
        if part != "release" {
            assert_eq!(refusal(&told).reason(), "claim_lost", "{part}: {told:?}");
        }
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("pending"),
            "{part}: the colliding claim is left as it was"
        );
    }
}

/// Promise (cache.rs): "A hit reports the same GateEvent a refusal from the
/// store does".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_replay_and_kept_failure_report_the_events_the_store_does() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_events").part(1);
    let _: String = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>("v".to_owned()) })
        .await
        .expect("runs");
    let replay = |g: Gate| {
        let id = id.clone();
        async move {
            testing::observe(async move {
                let r: Result<String, Rejected> = g
                    .guard(&id)
                    .replay()
                    .run(async { Ok("w".to_owned()) })
                    .await;
                r
            })
            .await
        }
    };
    let (from_store, store_events) = replay(gate.without_cache()).await;
    let (from_cache, cache_events) = replay(gate.clone()).await;
    assert_eq!(from_store.expect("replayed"), "v");
    assert_eq!(from_cache.expect("replayed"), "v");
    assert_eq!(format!("{store_events:?}"), format!("{cache_events:?}"));

    let kept = Identity::new("rt_h_events").part(2);
    gate.claim(&kept)
        .await
        .expect("won")
        .dispose(Disposition::Keep)
        .await
        .expect("kept");
    let (a, store_events) = testing::observe(
        gate.without_cache()
            .run(&kept, async { Ok::<_, Rejected>(()) }),
    )
    .await;
    let (b, cache_events) =
        testing::observe(gate.run(&kept, async { Ok::<_, Rejected>(()) })).await;
    assert!(matches!(a, Err(Rejected::AlreadyFailed)), "{a:?}");
    assert!(matches!(b, Err(Rejected::AlreadyFailed)), "{b:?}");
    assert_eq!(format!("{store_events:?}"), format!("{cache_events:?}"));
}

/// Promise (Claim::release): "A claim that is gone already (released ... by
/// an earlier attempt of this release whose reply was lost) counts as
/// released"; (Claim::extend) renewed, a repeat changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_or_extend_whose_reply_was_lost_is_still_its_own() {
    use idem_test_support::fault_proxy::{Proxy, Statement};
    let proxy = Proxy::start().await;
    let pool = crate::support::proxy::pool_through(&proxy).await;
    let gate = testing::gate_on(pool).await.with_cache(cache());
    let id = Identity::new("rt_h_lost_release").part(1);
    let claim = gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .claim()
        .await
        .expect("won");
    assert!(proxy.lose_next_reply(Statement::Extend));
    let extended = claim.extend(Duration::from_secs(60)).await;
    assert_eq!(
        proxy.take_lost_replies().len(),
        1,
        "the extend's reply was lost"
    );
    assert!(extended.is_ok(), "{extended:?}");
    assert!(proxy.lose_next_reply(Statement::Release));
    let (released, events) = testing::observe(claim.release()).await;
    assert_eq!(
        proxy.take_lost_replies().len(),
        1,
        "the release's reply was lost"
    );
    assert!(released.is_ok(), "{released:?}");
    assert!(matches!(events[..], [GateEvent::Released]), "{events:?}");
    let ran = AtomicUsize::new(0);
    run_counted(&gate, &id, &ran).await.expect("a retry runs");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Promise (Guard::wait): "A duplicate that finds the slot in flight waits up
// to `wait` for it to resolve ..., then returns the outcome: the stored
// value (with replay), AlreadyDone, or it runs if the holder failed."
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_get_each_disposition_of_the_holder() {
    let gate = cached_gate().await;
    for (part, disposition, expected) in [
        ("keep", Some(Disposition::Keep), "already_failed"),
        ("in_doubt", Some(Disposition::InDoubt), "in_doubt"),
        ("release", Some(Disposition::Release), "ran"),
        ("operator_release", None, "ran"),
    ] {
        let id = Identity::new("rt_h_wait_disposed").part(part);
        let claim = gate.claim(&id).await.expect("won");
        let ran = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let (gate, id, ran) = (gate.clone(), id.clone(), Arc::clone(&ran));
                tokio::spawn(async move {
                    gate.guard(&id)
                        .wait(Duration::from_secs(10))
                        .run(async move {
                            ran.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Rejected>(())
                        })
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        match disposition {
            Some(d) => claim.dispose(d).await.expect("disposed"),
            None => {
                operations::release_pending(gate.pool(), slot(&gate, &id.address()))
                    .await
                    .expect("released");
                drop(claim);
            }
        }
        let mut told = Vec::new();
        for waiter in waiters {
            told.push(waiter.await.expect("waiter").map_err(|e| e.reason()));
        }
        if expected == "ran" {
            assert_eq!(
                ran.load(Ordering::SeqCst),
                1,
                "{part}: one waiter runs: {told:?}"
            );
            assert_eq!(
                told.iter().filter(|t| t.is_ok()).count(),
                1,
                "{part}: {told:?}"
            );
        } else {
            assert_eq!(ran.load(Ordering::SeqCst), 0, "{part}");
            assert!(told.iter().all(|t| *t == Err(expected)), "{part}: {told:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Promise (Gate::run): "If the store fails to record the success, the
// body's Ok value is still returned, the claim stays pending, and a tracing
// error says so"; (cache) "never a claim pending".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_the_store_could_not_record_is_returned_stays_pending_and_is_never_cached() {
    let proxy = Arc::new(idem_test_support::fault_proxy::Proxy::start().await);
    let shared = cache();
    let through = testing::gate_on(proxy.pool(2).await)
        .await
        .with_cache(shared.clone());
    let direct = testing::gate()
        .await
        .account(through.account_name())
        .with_cache(shared);
    let id = Identity::new("rt_h_unrecorded").part(1);
    let (told, events) = testing::observe(through.guard(&id).replay().run({
        let proxy = Arc::clone(&proxy);
        async move {
            proxy.cut().await;
            Ok::<_, Rejected>("charged".to_owned())
        }
    }))
    .await;
    assert_eq!(told.expect("the body's value is still returned"), "charged");
    assert!(
        matches!(events.last(), Some(GateEvent::Unrecorded(r)) if r.is_outage()),
        "{events:?}"
    );
    assert_eq!(
        rows::row_state(&direct, &id.address()).await.as_deref(),
        Some("pending")
    );
    let again: Result<String, Rejected> = direct
        .guard(&id)
        .replay()
        .run(async { Ok("again".to_owned()) })
        .await;
    assert!(matches!(again, Err(Rejected::InFlight)), "{again:?}");
}

/// An error of the body's own, with a disposition.
#[derive(Debug)]
enum BodyError {
    Rejected(Rejected),
    Declined,
}

impl From<Rejected> for BodyError {
    fn from(rejected: Rejected) -> Self {
        BodyError::Rejected(rejected)
    }
}

impl BodyError {
    fn disposition(&self) -> Disposition {
        match self {
            BodyError::Declined => Disposition::Keep,
            BodyError::Rejected(_) => Disposition::Release,
        }
    }
}

/// Promise (Gate::run): "If somebody else recorded the claim's outcome
/// meanwhile (a reconciler or an operator resolved it ...), the call
/// returns NotRecorded: the slot keeps that outcome, and every duplicate is
/// told it, not this body's value." Here the body's value is an `Err` it
/// keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disposed_run_whose_claim_was_resolved_meanwhile_returns_not_recorded() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_disposed_resolved").part(1);
    let (started, resolved) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let holder = {
        let (gate, id, started, resolved) = (
            gate.clone(),
            id.clone(),
            Arc::clone(&started),
            Arc::clone(&resolved),
        );
        tokio::spawn(async move {
            gate.guard(&id)
                .disposition(BodyError::disposition)
                .run(async {
                    started.notify_one();
                    resolved.notified().await;
                    Err::<(), _>(BodyError::Declined)
                })
                .await
        })
    };
    started.notified().await;
    resolve(&gate, &id.address(), Outcome::Succeeded(None)).await;
    resolved.notify_one();
    let told = holder.await.expect("holder");
    assert!(
        matches!(&told, Err(BodyError::Rejected(r)) if r.reason() == "not_recorded"),
        "the caller must hear its kept failure was not recorded: {told:?}"
    );
    let again = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
}

// ---------------------------------------------------------------------------
// Odd cache options.
// Promise (OutcomeCacheBuilder::max_entries): "Holds at most `entries`
// outcomes (0: none at all)"; (ttl) "Forgets each entry `ttl` after it was
// learned".
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_of_zero_entries_or_zero_ttl_holds_nothing() {
    for (name, cache) in [
        (
            "max_entries(0)",
            OutcomeCache::builder().max_entries(0).build(),
        ),
        (
            "ttl(0)",
            OutcomeCache::builder().ttl(Duration::ZERO).build(),
        ),
    ] {
        let gate = testing::gate().await.with_cache(cache.clone());
        let id = Identity::new("rt_h_zero_cache").part(name);
        let ran = AtomicUsize::new(0);
        run_counted(&gate, &id, &ran).await.expect("runs");
        let again = run_counted(&gate, &id, &ran).await;
        assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
        // Pruned: a gate whose cache holds nothing runs it again at once.
        rows::delete_row(&gate, &id.address()).await;
        run_counted(&gate, &id, &ran)
            .await
            .unwrap_or_else(|e| panic!("{name}: answered from a cache that holds nothing: {e:?}"));
        assert_eq!(ran.load(Ordering::SeqCst), 2, "{name}");
    }
}

/// Promise (cache.rs): "an entry heavier than its shard (a value to replay
/// of more than about a MiB) is not kept, and its duplicates ask the
/// store".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_heavier_than_a_shard_is_replayed_from_the_store_and_never_cached() {
    let gate = testing::gate()
        .await
        .with_cache(OutcomeCache::builder().max_bytes(1 << 20).build());
    let id = Identity::new("rt_h_heavy").part(1);
    let heavy = "x".repeat(2 << 20);
    let first: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok(heavy.clone()) })
        .await;
    assert_eq!(first.expect("runs").len(), heavy.len());
    let again: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("y".to_owned()) })
        .await;
    assert_eq!(again.expect("replayed from the store").len(), heavy.len());
    rows::delete_row(&gate, &id.address()).await;
    let after: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert_eq!(after.map_err(|e| e.reason()), Ok("ran again".to_owned()));
}

// ---------------------------------------------------------------------------
// Promise (Claim::fence): "higher for every later claim or takeover of any
// slot"; hostile identities are claimed, or refused as the request's error.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_rise_with_every_later_claim_or_takeover_and_racers_never_share_one() {
    let gate = testing::gate().await;
    let first = gate
        .guard(&Identity::new("rt_h_fence").part("a"))
        .lease(Duration::from_millis(100))
        .claim()
        .await
        .expect("won");
    let second = gate
        .claim(&Identity::new("rt_h_fence").part("b"))
        .await
        .expect("won");
    assert!(second.fence() > first.fence(), "{first:?} {second:?}");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let taken = gate
        .guard(&Identity::new("rt_h_fence").part("a"))
        .lease(Duration::from_millis(100))
        .claim()
        .await
        .expect("taken over");
    assert!(taken.fence() > second.fence(), "{second:?} {taken:?}");
    let n = AtomicUsize::new(0);
    let report = testing::race(16, || async {
        let part = n.fetch_add(1, Ordering::SeqCst);
        gate.claim(&Identity::new("rt_h_fence_race").part(part as u64))
            .await
            .map(|claim| claim.fence())
    })
    .await;
    let mut raced: Vec<i64> = report
        .invocations
        .iter()
        .map(|i| match &i.outcome {
            Ok(Ok(Some(fence))) => *fence,
            other => panic!("{other:?}"),
        })
        .collect();
    raced.sort_unstable();
    raced.dedup();
    assert_eq!(raced.len(), 16, "16 racers, 16 fences: {raced:?}");
    let mut fences = Vec::new();
    for part in 0..16u64 {
        let claim = gate
            .claim(&Identity::new("rt_h_fence_seq").part(part))
            .await
            .expect("won");
        fences.push(claim.fence().expect("gated"));
    }
    assert!(fences.windows(2).all(|w| w[1] > w[0]), "{fences:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identities_are_claimed_settled_and_refused_as_duplicates() {
    let gate = cached_gate().await;
    let huge = "k".repeat(1 << 20);
    let ids = [
        Identity::new("\u{0}\n\r\u{202e}\u{feff}action").part("\u{0}"),
        Identity::new("rt_h_huge").part(huge.as_str()),
        Identity::new("").part(""),
        Identity::new("rt_h_emoji")
            .part("🦀")
            .part(-0i64)
            .part(i64::MIN),
    ];
    for id in &ids {
        let claim = gate.claim(id).await.expect("claimed");
        claim.settle().await.expect("settled");
        for g in [gate.clone(), gate.without_cache()] {
            let again = g.run(id, async { Ok::<_, Rejected>(()) }).await;
            assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
        }
    }
}

/// Promise (Gate::run): "The body is not polled unless the claim is won. If
/// it panics, or its future is dropped, the claim stays pending: ...
/// retries are refused (fail closed)"; (cache) never a claim pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_or_dropped_body_leaves_the_claim_pending_for_every_cached_duplicate() {
    let gate = cached_gate().await;
    let panicked = Identity::new("rt_h_panic").part(1);
    let task = {
        let (gate, id) = (gate.clone(), panicked.clone());
        tokio::spawn(async move {
            gate.run(&id, async {
                if id.part_count() > 0 {
                    panic!("the body panics");
                }
                Ok::<_, Rejected>(())
            })
            .await
        })
    };
    assert!(task.await.is_err(), "the body panicked");
    let dropped = Identity::new("rt_h_dropped_future").part(1);
    let started = Arc::new(Notify::new());
    let run = {
        let (gate, id, started) = (gate.clone(), dropped.clone(), Arc::clone(&started));
        tokio::spawn(async move {
            gate.run(&id, async {
                started.notify_one();
                std::future::pending::<()>().await;
                Ok::<_, Rejected>(())
            })
            .await
        })
    };
    started.notified().await;
    run.abort();
    let _ = run.await;
    for id in [&panicked, &dropped] {
        let report = testing::race(16, || async {
            gate.run(id, async { Ok::<_, Rejected>(()) }).await
        })
        .await;
        report.assert_all_refused(&Rejected::InFlight);
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("pending")
        );
    }
}

/// Promise (Rejected::LeaseLost): "The claim's lease ran out while the body
/// ran, and another invocation took the claim over"; (ClaimLost) "released
/// or removed by someone else". The new holder kept a definite failure;
/// the stale holder's late success is told it lost its lease, and the kept
/// failure (final: the cache may hold it) is never changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_a_stale_success_after_the_new_holder_kept_a_failure() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_stale_over_kept").part(1);
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("first");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("taken over");
    current.dispose(Disposition::Keep).await.expect("kept");
    let late = stale.settle().await;
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("failed")
    );
    let again = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(again, Err(Rejected::AlreadyFailed)), "{again:?}");
    assert_eq!(
        refusal(&late).reason(),
        "lease_lost",
        "its claim was taken over, not released: {late:?}"
    );
}

/// Promise (Rejected::WrongConnection): "nothing waited". A claim won
/// inside one transaction, recorded on another, fails at once instead of
/// waiting on the claim's own open transaction (it would wait forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_claim_settled_in_another_transaction_fails_at_once_instead_of_waiting_on_its_own() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_tx_claim_other_tx").part(1);
    let mut mine = gate.pool().begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut mine).claim().await.expect("won");
    let mut other = gate.pool().begin().await.expect("begin another");
    let settled = tokio::time::timeout(Duration::from_secs(3), claim.settle(&mut other)).await;
    drop(other);
    mine.rollback().await.expect("rollback");
    let settled = settled.unwrap_or_else(|_| {
        panic!("a TxClaim settled on another transaction waited on its own open transaction")
    });
    assert!(
        matches!(settled, Err(Rejected::WrongConnection { .. })),
        "told which connection to use: {settled:?}"
    );
    // Nothing was written outside the claim's rolled-back transaction.
    assert_eq!(rows::row_state(&gate, &id.address()).await, None);
}
