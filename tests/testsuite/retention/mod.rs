//! How long idem keeps what (`Guard::keep_value_for`,
//! `Guard::keep_slot_for`): a value past its window is no longer handed
//! out but its slot still refuses every duplicate; a slot past its window
//! runs again, once, as a new action (its steps anew); prune deletes
//! exactly the slots past their window, never one inside it; and a
//! history with prune racing the claims runs no identity twice inside its
//! window.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use idem::operations::{self, PruneFilter};
use idem::{Fingerprint, Identity, Rejected, testing};

mod at_the_edges;
mod compaction;
mod history;

/// A window short enough to wait out in a test.
const WINDOW: Duration = Duration::from_millis(600);

/// Sleeps past [`WINDOW`], with a margin for the two clocks (the test's
/// and the database's) to disagree by a little.
async fn past_the_window() {
    tokio::time::sleep(WINDOW + Duration::from_millis(300)).await;
}

/// A body that counts its runs and returns `value`.
fn counted(
    runs: &Arc<AtomicUsize>,
    value: &'static str,
) -> impl std::future::Future<Output = Result<String, Rejected>> + use<> {
    let runs = Arc::clone(runs);
    async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(value.to_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_value_window_a_replaying_duplicate_is_told_the_value_is_no_longer_kept() {
    let gate = testing::gate().await;
    let id = Identity::new("receipt").part("ord_value_window");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = || gate.guard(&id).replay().keep_value_for(WINDOW);

    assert_eq!(
        guard().run(counted(&runs, "r_1")).await.ok().as_deref(),
        Some("r_1")
    );
    // Inside the window: the value is replayed.
    assert_eq!(
        guard().run(counted(&runs, "r_2")).await.ok().as_deref(),
        Some("r_1")
    );

    past_the_window().await;
    let again = guard().run(counted(&runs, "r_3")).await;
    assert!(
        matches!(again, Err(Rejected::ValueNotKept)),
        "past the value's window a replaying duplicate is refused, told the value is gone: \
         {again:?}"
    );
    assert_eq!(again.unwrap_err().reason(), "value_not_kept");
    // A caller that does not replay is told the action is done, as ever.
    let plain = gate.guard(&id).run(counted(&runs, "r_4")).await;
    assert!(matches!(plain, Err(Rejected::AlreadyDone)), "{plain:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran once, and only once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_value_window_another_payload_is_refused_without_running() {
    let gate = testing::gate().await;
    let id = Identity::new("receipt").part("ord_value_payload");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = |amount: i64| {
        gate.guard(&id)
            .replay()
            .fingerprint(Fingerprint::new().part(amount))
            .keep_value_for(WINDOW)
    };
    assert!(guard(100).run(counted(&runs, "r_1")).await.is_ok());
    let reused = guard(200).run(counted(&runs, "r_2")).await;
    assert!(
        matches!(reused, Err(Rejected::KeyReused)),
        "inside: {reused:?}"
    );

    past_the_window().await;
    // The fingerprint went with the value: whatever the payload, the slot
    // refuses, and says there is nothing to hand out.
    for amount in [100, 200] {
        let late = guard(amount).run(counted(&runs, "r_3")).await;
        assert!(
            matches!(late, Err(Rejected::ValueNotKept)),
            "{amount}: {late:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_past_its_window_runs_again_once_however_many_race_for_it() {
    let gate = testing::gate().await;
    let id = Identity::new("daily_report").part("acct_race");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = || gate.guard(&id).keep_slot_for(WINDOW);

    assert!(guard().run(counted(&runs, "first")).await.is_ok());
    let inside = guard().run(counted(&runs, "dup")).await;
    assert!(
        matches!(inside, Err(Rejected::AlreadyDone)),
        "inside: {inside:?}"
    );

    past_the_window().await;
    let report = testing::race(8, || guard().run(counted(&runs, "second"))).await;
    report.assert_exactly_once();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "past the window the slot runs again, once however many found it expired"
    );
    // The new run holds the slot for a window of its own.
    let after = guard().run(counted(&runs, "dup")).await;
    assert!(
        matches!(after, Err(Rejected::AlreadyDone)),
        "after: {after:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_past_its_window_runs_its_steps_anew() {
    let gate = testing::gate().await;
    let id = Identity::new("monthly_invoice").part("acct_steps");
    let charges = Arc::new(AtomicUsize::new(0));
    let body = || {
        let charges = Arc::clone(&charges);
        async move {
            let charge: usize = idem::step("charge", async move {
                Ok::<usize, Rejected>(charges.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await?;
            Ok::<usize, Rejected>(charge)
        }
    };
    assert_eq!(
        gate.guard(&id).keep_slot_for(WINDOW).run(body()).await.ok(),
        Some(1)
    );
    past_the_window().await;
    // A new action: its step is not the old one's replayed.
    assert_eq!(
        gate.guard(&id).keep_slot_for(WINDOW).run(body()).await.ok(),
        Some(2),
        "the expired run's step was replayed into the new one"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_flight_or_in_doubt_never_expires() {
    let gate = testing::gate().await;
    let id = Identity::new("slow_export").part("acct_pending");
    let claim = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .claim()
        .await
        .expect("won");
    past_the_window().await;
    let dup = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .run(async { Ok::<_, Rejected>(()) })
        .await;
    assert!(
        matches!(dup, Err(Rejected::InFlight)),
        "a pending claim holds its slot whatever its window: {dup:?}"
    );
    claim.settle().await.expect("settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_the_slots_past_their_window_and_never_one_inside_it() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let ok = || async { Ok::<_, Rejected>(()) };
    let forever = Identity::new("prune_window").part("forever");
    let short = Identity::new("prune_window").part("short");
    let long = Identity::new("prune_window").part("long");
    gate.guard(&forever).run(ok()).await.expect("forever");
    gate.guard(&short)
        .keep_slot_for(WINDOW)
        .run(ok())
        .await
        .expect("short");
    gate.guard(&long)
        .keep_slot_for(Duration::from_secs(3600))
        .run(ok())
        .await
        .expect("long");
    past_the_window().await;

    let pool = gate.pool();
    let expired = PruneFilter::expired().account(account.as_str());
    assert_eq!(
        operations::count_prunable(pool, &expired)
            .await
            .expect("count"),
        1
    );
    assert_eq!(
        operations::prune(pool, &expired).await.expect("prune"),
        1,
        "the short one"
    );
    // A horizon that covers all three takes the one kept for ever, never
    // the one inside its window.
    let everything =
        PruneFilter::new(SystemTime::now() + Duration::from_secs(60)).account(account.as_str());
    assert_eq!(
        operations::prune(pool, &everything).await.expect("prune"),
        1,
        "the forever one"
    );
    let inside = gate.guard(&long).run(ok()).await;
    assert!(
        matches!(inside, Err(Rejected::AlreadyDone)),
        "a slot inside its window survives every prune: {inside:?}"
    );
    // The pruned ones run again.
    for id in [&forever, &short] {
        assert!(gate.guard(id).run(ok()).await.is_ok());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_zero_or_past_a_hundred_years_is_refused_before_any_statement() {
    let gate = testing::gate().await;
    let id = Identity::new("bad_window").part(1);
    for (option, refused) in [
        (
            "keep_value_for",
            gate.guard(&id)
                .keep_value_for(Duration::ZERO)
                .run(async { Ok::<_, Rejected>(()) })
                .await,
        ),
        (
            "keep_slot_for",
            gate.guard(&id)
                .keep_slot_for(idem::MAX_WINDOW + Duration::from_secs(1))
                .run(async { Ok::<_, Rejected>(()) })
                .await,
        ),
    ] {
        match refused {
            Err(Rejected::InvalidOption { option: named, .. }) => assert_eq!(named, option),
            other => panic!("{option}: {other:?}"),
        }
    }
    // Nothing was claimed.
    assert!(
        gate.guard(&id)
            .run(async { Ok::<_, Rejected>(()) })
            .await
            .is_ok()
    );
}

#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_gate_never_answers_for_a_slot_with_a_window() {
    let gate = testing::gate()
        .await
        .with_cache(idem::cache::OutcomeCache::builder().build());
    let id = Identity::new("cached_window").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = || gate.guard(&id).keep_slot_for(WINDOW);
    assert!(guard().run(counted(&runs, "a")).await.is_ok());
    assert!(matches!(
        guard().run(counted(&runs, "b")).await,
        Err(Rejected::AlreadyDone)
    ));
    past_the_window().await;
    assert!(
        guard().run(counted(&runs, "c")).await.is_ok(),
        "the cache answered for a slot whose window was over"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claims_with_its_windows_and_runs_the_items_past_them_again() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let batch = || {
        let mut batch = idem::batch::Batch::new();
        for item in 0..5_u32 {
            batch.push(item, Identity::new("windowed_job").part(item));
        }
        batch
    };
    let run = || {
        let runs = Arc::clone(&runs);
        gate.guard_batch(batch())
            .keep_slot_for(WINDOW)
            .run(move |_| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Rejected>(())
                }
            })
    };
    assert!(run().await.iter().all(Result::is_ok));
    assert!(
        run()
            .await
            .iter()
            .all(|result| matches!(result, Err(Rejected::AlreadyDone))),
        "inside the window every item is refused"
    );
    past_the_window().await;
    assert!(
        run().await.iter().all(Result::is_ok),
        "past it every item runs again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_failure_past_its_slot_window_runs_again() {
    let gate = testing::gate().await;
    let id = Identity::new("payout").part("acct_failed");
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = || {
        let runs = Arc::clone(&runs);
        gate.guard(&id)
            .keep_slot_for(WINDOW)
            .disposition(|_: &Rejected| idem::Disposition::Keep)
            .run(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<(), Rejected>(Rejected::InFlight)
            })
    };
    assert!(failing().await.is_err());
    assert!(
        matches!(failing().await, Err(Rejected::AlreadyFailed)),
        "inside the window the kept failure refuses"
    );
    past_the_window().await;
    assert!(failing().await.is_err());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "past it the key ran again, once"
    );
}

/// A holder whose claim an operator released, and which then succeeds,
/// writes its success into the vacant slot (a success that happened is
/// never lost): with the windows its action set, not for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_written_into_a_vacant_slot_keeps_its_windows() {
    let gate = testing::gate().await;
    let id = Identity::new("late_export").part("acct_vacant");
    let claim = gate
        .guard(&id)
        .keep_slot_for(WINDOW)
        .claim()
        .await
        .expect("won");
    let address = id.address();
    let slot = operations::Slot::new(gate.account_name(), gate.namespace_name(), &address);
    let released = operations::release_pending(gate.pool(), slot)
        .await
        .expect("released by an operator");
    assert!(released.is_some());
    let told = claim.settle().await;
    assert!(
        told.is_err(),
        "the holder is told its claim was lost: {told:?}"
    );
    let ok = || async { Ok::<_, Rejected>(()) };
    let inside = gate.guard(&id).keep_slot_for(WINDOW).run(ok()).await;
    assert!(
        matches!(inside, Err(Rejected::AlreadyDone)),
        "the late success holds the slot: {inside:?}"
    );
    past_the_window().await;
    let past = gate.guard(&id).keep_slot_for(WINDOW).run(ok()).await;
    assert!(
        past.is_ok(),
        "past the action's slot window the late success's slot runs again, as the \
         action said: {past:?}"
    );
}
