//! Outcome metrics (feature `metrics`): every outcome the gate can come to
//! is counted once, under its action (and account, when asked), with the
//! claim, body and settle histograms beside it, and the gauges say what is
//! stuck. Against a real PostgreSQL: races at a barrier, leases that run
//! out, a store cut off by the fault proxy, a reconciler.
//!
//! The recorder is installed once for the whole test binary and read
//! without being drained, so tests running at the same time never take each
//! other's counts: each test counts under an action (and an account) of its
//! own.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem::batch::Batch;
use idem::metrics::{Gauges, MetricsOptions, names};
use idem::reconcile::{Reconciler, Verdict};
use idem::testing;
use idem::{Disposition, Fingerprint, Gate, Identity, OnExpiry, OnUnavailable, Rejected};
use idem_test_support::{JobError, Proxy};
use metrics::Key;

// The recorder is the process's, shared with the other modules that read
// metrics (one global recorder per process).
use crate::support::recorder::recorder;

/// Whether `key` is the metric `name` with exactly the labels `labels`.
fn is(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    let mut theirs: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
    let mut ours = labels.to_vec();
    theirs.sort_unstable();
    ours.sort_unstable();
    key.name() == name && theirs == ours
}

/// The counter `name` with exactly `labels` (0 when never counted).
fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let registry = &recorder().registry;
    registry
        .get_counter_handles()
        .into_iter()
        .filter(|(key, _)| is(key, name, labels))
        .map(|(_, value)| value.load(Ordering::SeqCst))
        .sum()
}

/// Every outcome counted for `action` (with no account label), by outcome,
/// zeros left out.
fn outcomes(action: &str) -> Vec<(String, u64)> {
    let mut outcomes: Vec<(String, u64)> = recorder()
        .registry
        .get_counter_handles()
        .into_iter()
        .filter(|(key, _)| {
            key.name() == names::OUTCOMES_TOTAL
                && key
                    .labels()
                    .any(|l| l.key() == names::ACTION && l.value() == action)
                && key.labels().count() == 2
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

/// The outcomes `expected` for `action`, written as `[("won", 1), ...]`.
fn expect(action: &str, expected: &[(&str, u64)]) {
    let mut expected: Vec<(String, u64)> = expected
        .iter()
        .map(|(outcome, count)| ((*outcome).to_owned(), *count))
        .collect();
    expected.sort();
    assert_eq!(outcomes(action), expected, "outcomes of {action}");
}

/// How many values the histogram `name` of `action` (no account label) holds.
fn histogram_count(name: &str, action: &str) -> usize {
    recorder()
        .registry
        .get_histogram_handles()
        .into_iter()
        .filter(|(key, _)| is(key, name, &[(names::ACTION, action)]))
        .map(|(_, bucket)| bucket.data().len())
        .sum()
}

/// The gauge `name` with exactly `labels`.
fn gauge(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    recorder()
        .registry
        .get_gauge_handles()
        .into_iter()
        .find(|(key, _)| is(key, name, labels))
        .map(|(_, bits)| f64::from_bits(bits.load(Ordering::SeqCst)))
}

/// A gate in an account of its own, the recorder installed, and an action
/// no other test counts under.
async fn setup(action: &str) -> (Gate, String) {
    recorder();
    (testing::gate().await, testing::unique_name(action))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_race_counts_one_win_and_every_refusal_with_its_durations() {
    const N: usize = 8;
    let (gate, action) = setup("m_race").await;
    let id = Identity::new(&action).part("ord_1");
    // The winner's body waits until its rivals have returned, so that each
    // meets the claim in flight however slowly its own claim arrives.
    let returned = AtomicUsize::new(0);
    let body_ran = Mutex::new(Duration::ZERO);
    let report = testing::race(N, || async {
        let result = gate
            .run(&id, async {
                let started = Instant::now();
                let deadline = started + Duration::from_secs(10);
                while returned.load(Ordering::SeqCst) < N - 1 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                *body_ran.lock().unwrap_or_else(PoisonError::into_inner) = started.elapsed();
                Ok::<_, Rejected>(())
            })
            .await;
        returned.fetch_add(1, Ordering::SeqCst);
        result
    })
    .await;
    report.assert_exactly_once();
    let in_flight = report
        .refusals()
        .filter(|r| matches!(r, Rejected::InFlight))
        .count();
    assert_eq!(in_flight, N - 1, "{report}");
    // A later duplicate is refused as done.
    let again: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");

    expect(
        &action,
        &[
            ("won", 1),
            ("in_flight", (N - 1) as u64),
            ("settled", 1),
            ("already_done", 1),
        ],
    );
    assert_eq!(
        histogram_count(names::CLAIM_DURATION_SECONDS, &action),
        N + 1
    );
    assert_eq!(histogram_count(names::BODY_DURATION_SECONDS, &action), 1);
    assert_eq!(histogram_count(names::SETTLE_DURATION_SECONDS, &action), 1);
    let body = recorder()
        .registry
        .get_histogram_handles()
        .into_iter()
        .find(|(key, _)| {
            is(
                key,
                names::BODY_DURATION_SECONDS,
                &[(names::ACTION, &action)],
            )
        })
        .map(|(_, bucket)| bucket.data())
        .expect("the body was timed");
    let ran = body_ran
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_secs_f64();
    assert!(body[0] >= ran, "the body ran {ran} s: {body:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_key_reuse_an_absent_key_and_a_release_are_each_counted() {
    let (gate, action) = setup("m_modes").await;
    let id = Identity::new(&action).part("ord_2");
    let first = gate
        .guard(&id)
        .fingerprint(Fingerprint::new().part(4_999))
        .replay()
        .run(async { Ok::<_, Rejected>(7) })
        .await;
    let replayed = gate
        .guard(&id)
        .fingerprint(Fingerprint::new().part(4_999))
        .replay()
        .run(async { Ok::<_, Rejected>(8) })
        .await;
    assert_eq!((first.ok(), replayed.ok()), (Some(7), Some(7)));
    let reused = gate
        .guard(&id)
        .fingerprint(Fingerprint::new().part(5_000))
        .replay()
        .run(async { Ok::<_, Rejected>(9) })
        .await;
    assert!(matches!(reused, Err(Rejected::KeyReused)), "{reused:?}");

    let absent = Identity::new(&action).part(None::<i64>);
    let ungated: Result<(), Rejected> = gate.run(&absent, async { Ok(()) }).await;
    assert!(ungated.is_ok());

    let failing = Identity::new(&action).part("ord_3");
    let failed: Result<(), JobError> = gate.run(&failing, async { Err(JobError::Failed) }).await;
    assert!(matches!(failed, Err(JobError::Failed)), "{failed:?}");

    expect(
        &action,
        &[
            ("won", 2),
            ("settled", 1),
            ("replayed", 1),
            ("key_reused", 1),
            ("ungated", 1),
            ("released", 1),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_failures_and_doubts_are_counted_and_so_are_their_refusals() {
    let (gate, action) = setup("m_dispositions").await;
    let kept = Identity::new(&action).part("declined");
    let claim = gate.claim(&kept).await.expect("won");
    claim.dispose(Disposition::Keep).await.expect("kept");
    let refused = gate.claim(&kept).await;
    assert!(
        matches!(refused, Err(Rejected::AlreadyFailed)),
        "{refused:?}"
    );

    let doubt = Identity::new(&action).part("timed_out");
    let claim = gate.claim(&doubt).await.expect("won");
    claim.dispose(Disposition::InDoubt).await.expect("held");
    let refused = gate.claim(&doubt).await;
    assert!(matches!(refused, Err(Rejected::InDoubt)), "{refused:?}");

    expect(
        &action,
        &[
            ("won", 2),
            ("kept_failure", 1),
            ("already_failed", 1),
            ("held_in_doubt", 1),
            ("in_doubt", 1),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_taken_over_counts_the_takeover_and_the_stale_settle() {
    let (gate, action) = setup("m_lease").await;
    let id = Identity::new(&action).part("ord_4");
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .claim()
        .await
        .expect("taken over");
    current.release().await.expect("released by the new holder");
    // The old holder's success comes late: it is kept, and counted stale.
    let late = stale.settle().await;
    assert!(matches!(late, Err(Rejected::LeaseLost { .. })), "{late:?}");
    expect(
        &action,
        &[
            ("won", 1),
            ("taken_over", 1),
            ("released", 1),
            ("stale_settle", 1),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_run_out_under_in_doubt_is_held_once_and_refused_to_every_racer() {
    const N: usize = 8;
    let (gate, action) = setup("m_expiry").await;
    let id = Identity::new(&action).part("ord_5");
    let abandoned = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    crate::support::holders::vanish(abandoned); // the holder crashed
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = testing::race(N, || {
        gate.guard(&id)
            .lease(Duration::from_millis(200))
            .on_expiry(OnExpiry::InDoubt)
            .run(async { Ok::<_, Rejected>(()) })
    })
    .await;
    assert_eq!(report.wins(), 0, "{report}");
    expect(
        &action,
        &[("won", 1), ("held_in_doubt", 1), ("in_doubt", N as u64)],
    );
}

/// A late failure on a claim its lease turned in doubt was not recorded
/// (the slot stays in doubt): it counts `not_recorded`, never
/// `kept_failure` or `released` (issue 25, item 12).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_failure_on_a_claim_turned_in_doubt_counts_not_recorded() {
    let (gate, action) = setup("m_late_doubt").await;
    for (part, disposition) in [
        ("keep", Disposition::Keep),
        ("release", Disposition::Release),
    ] {
        let id = Identity::new(&action).part(part);
        let slow = gate
            .guard(&id)
            .lease(Duration::from_millis(150))
            .on_expiry(OnExpiry::InDoubt)
            .claim()
            .await
            .expect("won");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let refused = gate
            .guard(&id)
            .lease(Duration::from_millis(150))
            .on_expiry(OnExpiry::InDoubt)
            .claim()
            .await;
        assert!(matches!(refused, Err(Rejected::InDoubt)), "{refused:?}");
        let late = slow.dispose(disposition).await;
        assert_eq!(
            late.as_ref().err().map(Rejected::reason),
            Some("not_recorded"),
            "{late:?}"
        );
    }
    expect(
        &action,
        &[
            ("won", 2),
            ("held_in_doubt", 2),
            ("in_doubt", 2),
            ("not_recorded", 2),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_cut_off_counts_unavailable_failed_open_and_unrecorded() {
    recorder();
    let action = testing::unique_name("m_down");
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(4).await).await;
    let held = gate
        .claim(&Identity::new(&action).part("held"))
        .await
        .expect("won before the outage");

    proxy.cut().await;
    let refused: Result<(), Rejected> = gate
        .run(&Identity::new(&action).part("refused"), async { Ok(()) })
        .await;
    assert!(
        matches!(refused, Err(Rejected::Unavailable { .. })),
        "{refused:?}"
    );
    let ran: Result<(), Rejected> = gate
        .guard(&Identity::new(&action).part("open"))
        .on_unavailable(OnUnavailable::Run)
        .run(async { Ok(()) })
        .await;
    assert!(ran.is_ok(), "{ran:?}");
    let unrecorded = held.settle().await;
    assert!(
        matches!(unrecorded, Err(Rejected::Unavailable { .. })),
        "{unrecorded:?}"
    );

    expect(
        &action,
        &[
            ("won", 1),
            ("unavailable", 1),
            ("failed_open", 1),
            ("unrecorded", 1),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_counts_each_item_as_one_run_would() {
    let (gate, action) = setup("m_batch").await;
    let id = |key: &str| Identity::new(&action).part(key);
    let done: Result<(), Rejected> = gate.run(&id("a"), async { Ok(()) }).await;
    assert!(done.is_ok());
    let mut batch = Batch::new();
    batch
        .push("a", id("a")) // settled before: refused as done
        .push("b", id("b"))
        .push("b again", id("b")) // the same slot twice: done, once b settled
        .push("c", id("c"))
        .push("d", id("d"));
    let results = gate
        .guard_batch(batch)
        .run(|message| async move {
            if message == "d" {
                Err(JobError::Failed)
            } else {
                Ok(())
            }
        })
        .await;
    assert_eq!(results.len(), 5);
    expect(
        &action,
        &[
            ("won", 4),
            ("settled", 3),
            ("already_done", 2),
            ("released", 1),
        ],
    );
    // One claim duration per item (and one for the run before); one body
    // and one recording per item that ran.
    assert_eq!(histogram_count(names::CLAIM_DURATION_SECONDS, &action), 6);
    assert_eq!(histogram_count(names::BODY_DURATION_SECONDS, &action), 4);
    assert_eq!(histogram_count(names::SETTLE_DURATION_SECONDS, &action), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_label_is_there_only_when_asked_for() {
    let (gate, action) = setup("m_account").await;
    let account = gate.account_name().to_owned();
    let labelled = gate.with_metrics(MetricsOptions::new().label_account(true));
    assert!(labelled.metrics_options().labels_account());
    assert!(
        labelled.namespace("ns").metrics_options().labels_account(),
        "a scoped copy keeps the options"
    );
    let id = |key: &str| Identity::new(&action).part(key);
    let _: Result<(), Rejected> = labelled.run(&id("labelled"), async { Ok(()) }).await;
    let _: Result<(), Rejected> = gate.run(&id("plain"), async { Ok(()) }).await;

    let with_account = [
        (names::ACTION, action.as_str()),
        (names::ACCOUNT, account.as_str()),
        (names::OUTCOME, "won"),
    ];
    let without = [(names::ACTION, action.as_str()), (names::OUTCOME, "won")];
    assert_eq!(counter(names::OUTCOMES_TOTAL, &with_account), 1);
    assert_eq!(counter(names::OUTCOMES_TOTAL, &without), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_counts_what_it_resolved() {
    let (gate, action) = setup("m_reconciled").await;
    let id = Identity::new(&action).part("ord_6");
    let claim = gate.claim(&id).await.expect("won");
    claim.dispose(Disposition::InDoubt).await.expect("held");
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe(action.clone(), |_| async { Verdict::succeeded() });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 1, "{pass:?}");
    expect(
        &action,
        &[("won", 1), ("held_in_doubt", 1), ("reconciled", 1)],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauges_count_stale_pending_and_in_doubt_claims_and_their_ages() {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (gate, action) = setup("m_gauges").await;
    let account = gate.account_name().to_owned();
    // Ages far apart, so that a slow server cannot blur the threshold.
    let gauges = Gauges::new(gate.pool().clone(), Duration::from_secs(2)).account(&account);
    let labels = [(names::ACCOUNT, account.as_str())];

    let empty = gauges.sample_once().await.expect("a sample");
    assert_eq!(
        (
            empty.stale_pending,
            empty.in_doubt,
            empty.oldest_in_doubt_age
        ),
        (0, 0, None)
    );
    assert_eq!(gauge(names::CLAIMS_IN_DOUBT, &labels), Some(0.0));

    let key = || {
        Identity::new(&action).part(i64::try_from(NEXT.fetch_add(1, Ordering::SeqCst)).unwrap_or(0))
    };
    // Two claims whose holders crashed, one in doubt, then one fresh claim.
    for _ in 0..2 {
        crate::support::holders::vanish(gate.claim(&key()).await.expect("won"));
    }
    let doubt = gate.claim(&key()).await.expect("won");
    doubt.dispose(Disposition::InDoubt).await.expect("held");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    crate::support::holders::vanish(gate.claim(&key()).await.expect("won"));

    let sample = gauges.sample_once().await.expect("a sample");
    assert_eq!(
        (sample.stale_pending, sample.in_doubt),
        (2, 1),
        "{sample:?}"
    );
    let oldest_doubt = sample.oldest_in_doubt_age.expect("one in doubt");
    let oldest_pending = sample.oldest_pending_age.expect("three pending");
    assert!(oldest_doubt >= Duration::from_secs(2), "{sample:?}");
    assert!(oldest_pending >= oldest_doubt, "{sample:?}");
    assert_eq!(gauge(names::STALE_PENDING_CLAIMS, &labels), Some(2.0));
    assert_eq!(gauge(names::CLAIMS_IN_DOUBT, &labels), Some(1.0));
    let age = gauge(names::OLDEST_IN_DOUBT_CLAIM_AGE_SECONDS, &labels).expect("set");
    assert!(
        (age - oldest_doubt.as_secs_f64()).abs() < 1e-6,
        "{age} against {sample:?}"
    );
    assert!(gauge(names::OLDEST_PENDING_CLAIM_AGE_SECONDS, &labels).is_some_and(|a| a >= age));
}

/// `idem_steps_total` for `action`, by outcome, zeros left out.
fn steps(action: &str) -> Vec<(String, u64)> {
    let outcomes = [
        "recorded",
        "replayed",
        "repeated",
        "failed",
        "in_doubt",
        "unrecorded",
    ];
    outcomes
        .iter()
        .map(|&outcome| {
            let labels = [(names::ACTION, action), (names::OUTCOME, outcome)];
            (outcome.to_owned(), counter(names::STEPS_TOTAL, &labels))
        })
        .filter(|(_, count)| *count > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_s_outcome_is_counted_under_its_action() {
    let (gate, action) = setup("m_steps").await;
    let id = Identity::new(&action).part("ord_1");
    // Charged, then the shipment fails: the claim is released.
    let first: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<_, Rejected>(1) }).await?;
            idem::step("ship", async { Err::<u64, _>(Rejected::InFlight) }).await?;
            Ok(())
        })
        .await;
    assert!(first.is_err());
    // The retry replays the charge and ships.
    let second: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async { Ok::<_, Rejected>(1) }).await?;
            idem::step("ship", async { Ok::<_, Rejected>(2) }).await?;
            Ok(())
        })
        .await;
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(
        steps(&action),
        [
            ("recorded".to_owned(), 2),
            ("replayed".to_owned(), 1),
            ("failed".to_owned(), 1)
        ]
    );
}
