//! Batch claims for message consumers (issue 17 part 2): one statement
//! claims a batch, the won bodies run, one statement per kind records
//! their outcomes; every answer is what `Gate::run` gives one item.
//!
//! Races fire at one instant (a barrier) against a real PostgreSQL; round
//! trips are counted by a proxy that sees every statement the gate sends.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use idem::batch::Batch;
use idem::operations::{self, Slot};
use idem::testing;
use idem::testing::GateEvent;
use idem::{Fingerprint, Gate, Identity, OnExpiry, Rejected};
use idem_test_support::fault_proxy::{Proxy, Statement};
use idem_test_support::{ChargeError, JobError, rows};
use tokio::sync::Barrier;

/// How often each identity's body ran, by key.
#[derive(Default)]
struct Ledger(Mutex<HashMap<String, usize>>);

impl Ledger {
    fn ran(&self, key: &str) {
        let mut runs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *runs.entry(key.to_owned()).or_default() += 1;
    }

    fn runs(&self) -> HashMap<String, usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn id(key: &str) -> Identity {
    Identity::new("deliver").part(key)
}

fn batch_of(keys: &[String]) -> Batch<&str> {
    keys.iter().map(|key| (key.as_str(), id(key))).collect()
}

fn keys(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}_{i}")).collect()
}

fn refusal<T>(result: &Result<T, JobError>) -> Option<&Rejected> {
    match result {
        Err(JobError::Rejected(rejected)) => Some(rejected),
        _ => None,
    }
}

/// Asserts that `result` was refused with a rejection matching `pattern`;
/// the rest is the message, as for `assert!`.
macro_rules! assert_refused {
    ($result:expr, $pattern:pat, $($message:tt)+) => {
        assert!(matches!(refusal(&$result), Some($pattern)), $($message)+)
    };
}

/// Whether every result was refused with a rejection matching `pattern`.
macro_rules! all_refused {
    ($results:expr, $pattern:pat) => {
        $results
            .iter()
            .all(|result| matches!(refusal(result), Some($pattern)))
    };
}

/// Runs `batch` on `gate` with bodies that do nothing.
async fn run_noop<M>(gate: &Gate, batch: Batch<M>) -> Vec<Result<(), JobError>> {
    gate.guard_batch(batch)
        .run(|_| async { Ok::<_, JobError>(()) })
        .await
}

/// The state of `key`'s row, if there is one.
async fn state(gate: &Gate, key: &str) -> Option<String> {
    rows::row_state(gate, &id(key).address()).await
}

/// Runs a batch of `keys` whose bodies count themselves in `ran`.
async fn counted(gate: &Gate, keys: &[String], ran: &AtomicUsize) -> Vec<Result<(), JobError>> {
    gate.guard_batch(batch_of(keys))
        .run(|_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, JobError>(())
        })
        .await
}

/// Whether every result was refused as an outage.
fn all_outages<T>(results: &[Result<T, JobError>]) -> bool {
    results
        .iter()
        .all(|result| refusal(result).is_some_and(Rejected::is_outage))
}

/// A gate in an account of its own whose pool goes through a fresh proxy.
async fn gate_behind_a_proxy(connections: u32) -> (Proxy, Gate) {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(connections).await).await;
    (proxy, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_consumers_racing_overlapping_batches_run_each_identity_once() {
    const CONSUMERS: usize = 8;
    const ROUNDS: usize = 12;
    const BATCH: usize = 100;
    // Each consumer reads a window of 100 out of 300 messages, shifted by
    // 40 (wrapping): every message is in several consumers' batches, in a different
    // order in each (the windows are reversed for odd consumers).
    const MESSAGES: usize = 300;
    let gate = testing::gate().await;
    for round in 0..ROUNDS {
        let all = keys(&format!("r{round}"), 0..MESSAGES);
        let amount = |key: &str| -> i64 {
            key.rsplit('_')
                .next()
                .and_then(|n| n.parse::<i64>().ok())
                .map_or(0, |n| n + 1)
        };
        let ledger = Ledger::default();
        let total = AtomicI64::new(0);
        let barrier = Barrier::new(CONSUMERS);
        let consumers = (0..CONSUMERS).map(|consumer| {
            let mut window: Vec<String> = (0..BATCH)
                .map(|i| all[(consumer * 40 + i) % MESSAGES].clone())
                .collect();
            if consumer % 2 == 1 {
                window.reverse();
            }
            let (gate, ledger, total, barrier) = (&gate, &ledger, &total, &barrier);
            async move {
                let batch = batch_of(&window);
                barrier.wait().await;
                let (results, events) = tokio::time::timeout(
                    Duration::from_secs(60),
                    testing::observe(gate.guard_batch(batch).concurrency(8).run(
                        |key| async move {
                            ledger.ran(key);
                            total.fetch_add(amount(key), Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            Ok::<_, JobError>(())
                        },
                    )),
                )
                .await
                .expect("overlapping batches finish");
                // A deadlock would be detected by PostgreSQL (after its
                // deadlock_timeout) and the claim sent again: none may be.
                let retried = events
                    .iter()
                    .filter(|event| matches!(event, GateEvent::Retried))
                    .count();
                assert_eq!(retried, 0, "round {round}: a batch claim deadlocked");
                (window, results)
            }
        });
        let mut covered = HashMap::new();
        let done = join_all(consumers).await;
        for (window, results) in done {
            assert_eq!(window.len(), results.len());
            for (key, result) in window.iter().zip(&results) {
                match result {
                    Ok(()) => *covered.entry(key.clone()).or_insert(0) += 1,
                    Err(JobError::Rejected(Rejected::InFlight | Rejected::AlreadyDone)) => {
                        covered.entry(key.clone()).or_insert(0);
                    }
                    other => panic!("round {round}, {key}: {other:?}"),
                }
            }
        }
        let runs = ledger.runs();
        let covered_keys: Vec<&String> = covered.keys().collect();
        assert_eq!(
            covered_keys.len(),
            MESSAGES,
            "round {round}: every message was read"
        );
        for key in &all {
            assert_eq!(
                runs.get(key),
                Some(&1),
                "round {round}: {key} ran once: {runs:?}"
            );
            assert_eq!(covered.get(key), Some(&1), "round {round}: {key} won once");
        }
        let expected: i64 = all.iter().map(|key| amount(key)).sum();
        assert_eq!(
            total.load(Ordering::SeqCst),
            expected,
            "round {round}: totals exact"
        );
        // Nothing is left in flight: every message is now done.
        let again = run_noop(&gate, batch_of(&all)).await;
        assert!(
            all_refused!(again, Rejected::AlreadyDone),
            "round {round}: {again:?}"
        );
    }
    assert_eq!(rows::count_rows(&gate, "pending").await, 0);
    assert_eq!(
        rows::count_rows(&gate, "success").await,
        i64::try_from(ROUNDS * MESSAGES).expect("small")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_costs_one_statement_to_claim_and_one_per_kind_of_outcome() {
    let (proxy, gate) = gate_behind_a_proxy(2).await;
    let fresh = keys("fresh", 0..100);

    let before = proxy.executions();
    let nothing = run_noop(&gate, Batch::<&str>::new()).await;
    assert!(nothing.is_empty());
    assert_eq!(proxy.executions(), before, "an empty batch sends nothing");

    let before = proxy.executions();
    let results = run_noop(&gate, batch_of(&fresh)).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(proxy.executions() - before, 2, "one claim, one settle");

    // Duplicates of settled items: the insert, then one lookup.
    let before = proxy.executions();
    let results = run_noop(&gate, batch_of(&fresh)).await;
    assert!(all_refused!(results, Rejected::AlreadyDone));
    assert_eq!(proxy.executions() - before, 2, "one claim, one lookup");

    // Half succeed, half fail: one settle and one release.
    let mixed = keys("mixed", 0..100);
    let before = proxy.executions();
    let results = gate
        .guard_batch(batch_of(&mixed))
        .run(|key| async move {
            let n: usize = key
                .rsplit('_')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if n.is_multiple_of(2) {
                Ok(())
            } else {
                Err(JobError::Failed)
            }
        })
        .await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 50);
    assert_eq!(
        proxy.executions() - before,
        3,
        "one claim, one settle, one release"
    );
    assert_eq!(rows::count_rows(&gate, "success").await, 150);
    assert_eq!(rows::count_rows(&gate, "pending").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_item_gets_what_gate_run_would_give_it() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    // Done before; in flight (held by a claim of its own); failed for good;
    // in doubt; and a fresh one, twice in the batch; and one ungated.
    gate.run(&id("done"), async { Ok::<_, JobError>(()) })
        .await
        .expect("settled");
    let in_flight = gate.claim(&id("in_flight")).await.expect("claimed");
    let failed = gate.claim(&id("failed")).await.expect("claimed");
    failed.dispose(idem::Disposition::Keep).await.expect("kept");
    let doubtful = gate.claim(&id("in_doubt")).await.expect("claimed");
    doubtful
        .dispose(idem::Disposition::InDoubt)
        .await
        .expect("held");

    let mut batch = Batch::new();
    for key in ["done", "in_flight", "failed", "in_doubt", "fresh", "fresh"] {
        batch.push(key, id(key));
    }
    batch.push("ungated", Identity::new("deliver").part(None::<&str>));
    let results = gate
        .guard_batch(batch)
        .run(|key| {
            let ledger = &ledger;
            async move {
                ledger.ran(key);
                Ok::<_, JobError>(key.len())
            }
        })
        .await;
    assert_refused!(results[0], Rejected::AlreadyDone, "{results:?}");
    assert_refused!(results[1], Rejected::InFlight, "{results:?}");
    assert_refused!(results[2], Rejected::AlreadyFailed, "{results:?}");
    assert_refused!(results[3], Rejected::InDoubt, "{results:?}");
    assert!(matches!(results[4], Ok(5)), "{results:?}");
    assert_refused!(
        results[5],
        Rejected::AlreadyDone,
        "the same identity twice in a batch runs once, and the second copy is told what \
         Gate::run would tell it after the first: {results:?}"
    );
    assert!(
        matches!(results[6], Ok(7)),
        "an absent identity runs ungated: {results:?}"
    );
    let runs = ledger.runs();
    assert_eq!(runs.get("fresh"), Some(&1));
    assert_eq!(runs.get("ungated"), Some(&1));
    assert_eq!(runs.len(), 2, "{runs:?}");
    in_flight.release().await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_hands_duplicates_the_stored_values() {
    let gate = testing::gate().await;
    let keys = keys("replayed", 0..20);
    let first = gate
        .guard_batch(batch_of(&keys))
        .replay()
        .run(|key| async move { Ok::<_, JobError>(format!("receipt for {key}")) })
        .await;
    let again = gate
        .guard_batch(batch_of(&keys))
        .replay()
        .run(|_| async { Ok::<String, JobError>("ran again".into()) })
        .await;
    // One at a time, as a single call would see it, too.
    let single = gate
        .guard(&id(&keys[3]))
        .replay()
        .run(async { Ok::<String, JobError>("ran again".into()) })
        .await;
    for (key, (first, again)) in keys.iter().zip(first.iter().zip(&again)) {
        let expected = format!("receipt for {key}");
        assert_eq!(first.as_deref().ok(), Some(expected.as_str()));
        assert_eq!(again.as_deref().ok(), Some(expected.as_str()), "replayed");
    }
    assert_eq!(single.ok().as_deref(), Some("receipt for replayed_3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_that_differs_is_refused_as_a_reused_key() {
    let gate = testing::gate().await;
    let mut batch = Batch::new();
    batch.push_fingerprinted("a", id("fp_a"), Fingerprint::new().part(100));
    batch.push_fingerprinted("b", id("fp_b"), Fingerprint::new().part(200));
    let first = run_noop(&gate, batch).await;
    assert!(first.iter().all(Result::is_ok));

    let mut batch = Batch::new();
    batch.push_fingerprinted("a", id("fp_a"), Fingerprint::new().part(100));
    batch.push_fingerprinted("b", id("fp_b"), Fingerprint::new().part(999));
    let again = run_noop(&gate, batch).await;
    assert_refused!(again[0], Rejected::AlreadyDone, "{again:?}");
    assert_refused!(again[1], Rejected::KeyReused, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispositions_release_keep_or_hold_each_failure() {
    let gate = testing::gate().await;
    let outcomes = ["ok", "invalid", "declined", "timeout"];
    let batch: Batch<&str> = outcomes.iter().map(|&key| (key, id(key))).collect();
    let results = gate
        .guard_batch(batch)
        .disposition(ChargeError::disposition)
        .run(|key| async move {
            match key {
                "invalid" => Err(ChargeError::Invalid),
                "declined" => Err(ChargeError::Declined),
                "timeout" => Err(ChargeError::Timeout),
                _ => Ok(()),
            }
        })
        .await;
    assert!(results[0].is_ok());
    assert_eq!(state(&gate, "ok").await.as_deref(), Some("success"));
    assert_eq!(
        state(&gate, "invalid").await,
        None,
        "released: a retry runs"
    );
    assert_eq!(state(&gate, "declined").await.as_deref(), Some("failed"));
    assert_eq!(state(&gate, "timeout").await.as_deref(), Some("in_doubt"));

    let batch: Batch<&str> = outcomes.iter().map(|&key| (key, id(key))).collect();
    let ran = AtomicUsize::new(0);
    let again = gate
        .guard_batch(batch)
        .disposition(ChargeError::disposition)
        .run(|_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ChargeError>(())
        })
        .await;
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "only the released one runs again"
    );
    assert!(again[1].is_ok());
    assert!(matches!(
        again[2],
        Err(ChargeError::Rejected(Rejected::AlreadyFailed))
    ));
    assert!(matches!(
        again[3],
        Err(ChargeError::Rejected(Rejected::InDoubt))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_out_is_taken_over_or_turned_in_doubt_as_asked() {
    let gate = testing::gate().await;
    let abandoned = ["take_me", "doubt_me"];
    for key in abandoned {
        let claim = gate
            .guard(&id(key))
            .lease(Duration::from_millis(1))
            .claim()
            .await
            .expect("claimed");
        // The holder vanishes without a word.
        crate::support::holders::vanish(claim);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;

    let batch = Batch::from_iter([("take_me", id("take_me"))]);
    let taken = gate
        .guard_batch(batch)
        .lease(Duration::from_secs(30))
        .run(|_| async { Ok::<_, JobError>("ran") })
        .await;
    assert_eq!(
        taken[0].as_deref().ok(),
        Some("ran"),
        "taken over: {taken:?}"
    );

    let batch = Batch::from_iter([("doubt_me", id("doubt_me"))]);
    let held = gate
        .guard_batch(batch)
        .lease(Duration::from_secs(30))
        .on_expiry(OnExpiry::InDoubt)
        .run(|_| async { Ok::<_, JobError>("ran") })
        .await;
    assert_refused!(held[0], Rejected::InDoubt, "{held:?}");
    assert_eq!(state(&gate, "take_me").await.as_deref(), Some("success"));
    assert_eq!(state(&gate, "doubt_me").await.as_deref(), Some("in_doubt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_would_take_over_holds_a_claim_made_in_doubt_on_expiry() {
    let gate = testing::gate().await;
    let claim = gate
        .guard(&id("made_in_doubt"))
        .lease(Duration::from_millis(1))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("claimed");
    crate::support::holders::vanish(claim);
    tokio::time::sleep(Duration::from_millis(20)).await;

    let ran = AtomicUsize::new(0);
    let batch = Batch::from_iter([("made_in_doubt", id("made_in_doubt"))]);
    let held = gate
        .guard_batch(batch)
        .lease(Duration::from_secs(30))
        .run(|_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, JobError>("ran")
        })
        .await;
    assert_refused!(held[0], Rejected::InDoubt, "{held:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "run again: {held:?}");
    assert_eq!(
        state(&gate, "made_in_doubt").await.as_deref(),
        Some("in_doubt")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_released_under_its_body_keeps_the_success_and_says_so() {
    let gate = testing::gate().await;
    let keys = keys("released", 0..3);
    let results = gate
        .guard_batch(batch_of(&keys))
        .run(|key| {
            let gate = &gate;
            async move {
                if key == "released_1" {
                    // An operator releases it while the body runs.
                    let address = id(key).address();
                    let slot = Slot::new(gate.account_name(), None, &address);
                    operations::release_pending(gate.pool(), slot)
                        .await
                        .expect("released by hand")
                        .expect("it was pending");
                }
                Ok::<_, JobError>(())
            }
        })
        .await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert_refused!(results[1], Rejected::ClaimLost { .. }, "{results:?}");
    assert_eq!(
        rows::row_state(&gate, &id("released_1").address())
            .await
            .as_deref(),
        Some("success"),
        "the success is kept in the vacant slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_refuses_every_item_and_runs_none() {
    let (proxy, gate) = gate_behind_a_proxy(2).await;
    proxy.cut().await;
    let keys = keys("down", 0..10);
    let ran = AtomicUsize::new(0);
    let results = counted(&gate, &keys, &ran).await;
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert!(all_outages(&results), "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claim_whose_reply_is_lost_holds_its_items_and_never_runs_them() {
    let (proxy, gate) = gate_behind_a_proxy(2).await;
    let keys = keys("lost", 0..10);
    let ran = AtomicUsize::new(0);
    assert!(proxy.lose_next_reply(Statement::Claim));
    let results = counted(&gate, &keys, &ran).await;
    assert_eq!(
        proxy.take_lost_replies().len(),
        1,
        "the claim's reply was lost"
    );
    assert!(all_outages(&results), "{results:?}");
    // Committed all the same: every retry finds its item held, none runs.
    let again = counted(&gate, &keys, &ran).await;
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert!(all_refused!(again, Rejected::InFlight), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_settle_whose_reply_is_lost_is_kept_and_reported_settled() {
    let (proxy, gate) = gate_behind_a_proxy(2).await;
    let keys = keys("settle_lost", 0..10);
    assert!(proxy.lose_next_reply(Statement::Settle));
    let results = run_noop(&gate, batch_of(&keys)).await;
    assert_eq!(
        proxy.take_lost_replies().len(),
        1,
        "the settle's reply was lost"
    );
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(rows::count_rows(&gate, "success").await, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_run_at_most_as_many_at_a_time_as_asked() {
    let gate = testing::gate().await;
    let keys = keys("bounded", 0..24);
    let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let results = gate
        .guard_batch(batch_of(&keys))
        .concurrency(4)
        .run(|_| async {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, JobError>(())
        })
        .await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(most.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_lease_refuses_the_batch_before_any_statement() {
    let (proxy, gate) = gate_behind_a_proxy(2).await;
    let keys = keys("zero", 0..3);
    let before = proxy.executions();
    let results = gate
        .guard_batch(batch_of(&keys))
        .lease(Duration::ZERO)
        .run(|_| async { Ok::<_, JobError>(()) })
        .await;
    assert!(results.iter().all(|r| matches!(
        refusal(r),
        Some(Rejected::InvalidOption {
            option: "lease",
            ..
        })
    )));
    assert_eq!(proxy.executions(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_a_namespace_never_meets_the_same_identities_without_one() {
    let gate = testing::gate().await;
    let live = gate.namespace("live");
    let keys = keys("scoped", 0..5);
    let plain = run_noop(&gate, batch_of(&keys)).await;
    let scoped = run_noop(&live, batch_of(&keys)).await;
    assert!(plain.iter().chain(&scoped).all(Result::is_ok));
    let again = run_noop(&live, batch_of(&keys)).await;
    assert!(all_refused!(again, Rejected::AlreadyDone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_outcomes_settle_and_release_a_batch_alike() {
    let gate = testing::gate().await;
    let keys = keys("async", 0..6);
    let results = gate
        .guard_batch(batch_of(&keys))
        .outcome_commit(idem::OutcomeCommit::Async)
        .run(|key| async move {
            let n: usize = key
                .rsplit('_')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if n < 3 { Ok(()) } else { Err(JobError::Failed) }
        })
        .await;
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        3,
        "{results:?}"
    );
    assert_eq!(rows::count_rows(&gate, "success").await, 3);
    assert_eq!(
        rows::count_rows(&gate, "pending").await,
        0,
        "released, not left"
    );
}

// ------------------------------------ issue 25: duplicates inside one batch

/// What a message of the duplicate tests asks its body to return.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Ok,
    /// Released: a retry runs.
    Invalid,
    /// Kept: a retry is refused as already failed.
    Declined,
    /// Held in doubt.
    Timeout,
}

/// A message of the duplicate tests: its key, what its body returns, and
/// the payload it carries (a fingerprint), if any.
type Planned = (&'static str, Plan, Option<i64>);

/// Every case of a later copy: a success, a failure kept, one in doubt, one
/// released (the copy runs again), another payload, and three copies; their
/// copies interleaved.
const DUPLICATES: [Planned; 13] = [
    ("twice", Plan::Ok, None),
    ("kept", Plan::Declined, None),
    ("doubt", Plan::Timeout, None),
    ("released", Plan::Invalid, None),
    ("reused", Plan::Ok, Some(1)),
    ("thrice", Plan::Ok, None),
    ("twice", Plan::Ok, None),
    ("kept", Plan::Ok, None),
    ("doubt", Plan::Ok, None),
    ("released", Plan::Ok, None),
    ("reused", Plan::Ok, Some(2)),
    ("thrice", Plan::Ok, None),
    ("thrice", Plan::Ok, None),
];

/// The body of a planned message: counts itself, then does as planned.
fn planned_body(ledger: &Ledger, (key, plan, _): Planned) -> Result<String, ChargeError> {
    ledger.ran(key);
    match plan {
        Plan::Ok => Ok(format!("{key} ran {}", ledger.runs()[key])),
        Plan::Invalid => Err(ChargeError::Invalid),
        Plan::Declined => Err(ChargeError::Declined),
        Plan::Timeout => Err(ChargeError::Timeout),
    }
}

fn planned_batch(messages: &[Planned]) -> Batch<Planned> {
    let mut batch = Batch::new();
    for &message in messages {
        match message.2 {
            Some(payload) => {
                batch.push_fingerprinted(message, id(message.0), Fingerprint::new().part(payload))
            }
            None => batch.push(message, id(message.0)),
        };
    }
    batch
}

/// The guard of one planned message: its payload's fingerprint, if any.
fn planned_guard<'a>(
    gate: &'a Gate,
    identity: &'a Identity,
    (_, _, payload): Planned,
) -> idem::Guard<'a> {
    match payload {
        Some(payload) => gate
            .guard(identity)
            .fingerprint(Fingerprint::new().part(payload)),
        None => gate.guard(identity),
    }
}

/// The answers and the runs of `messages` as one disposed batch on `gate`.
async fn disposed_as_a_batch(
    gate: &Gate,
    messages: &[Planned],
) -> (Vec<String>, HashMap<String, usize>) {
    let ledger = Ledger::default();
    let results = gate
        .guard_batch(planned_batch(messages))
        .disposition(ChargeError::disposition)
        .run(|message| {
            let answer = planned_body(&ledger, message);
            async move { answer }
        })
        .await;
    let answers = results.iter().map(|r| format!("{r:?}")).collect();
    (answers, ledger.runs())
}

/// The oracle: the same messages, one disposed guard at a time.
async fn disposed_one_by_one(
    gate: &Gate,
    messages: &[Planned],
) -> (Vec<String>, HashMap<String, usize>) {
    let ledger = Ledger::default();
    let mut answers = Vec::new();
    for &message in messages {
        let identity = id(message.0);
        let result = planned_guard(gate, &identity, message)
            .disposition(ChargeError::disposition)
            .run(async { planned_body(&ledger, message) })
            .await;
        answers.push(format!("{result:?}"));
    }
    (answers, ledger.runs())
}

/// Replayed: a success handed to its later copies, a failure released
/// (the copy runs), as one batch or one call at a time (`one_by_one`).
async fn replayed_duplicates(gate: &Gate, one_by_one: bool) -> Vec<String> {
    let messages = ["r_ok", "r_failed", "r_ok", "r_failed", "r_ok"];
    let failing = AtomicUsize::new(0);
    let body = |key: &'static str| {
        let answer = if key == "r_failed" && failing.fetch_add(1, Ordering::SeqCst) == 0 {
            Err(JobError::Failed)
        } else {
            Ok(format!(
                "{key} answered at {}",
                failing.load(Ordering::SeqCst)
            ))
        };
        async move { answer }
    };
    let results: Vec<Result<String, JobError>> = if one_by_one {
        let mut results = Vec::new();
        for key in messages {
            results.push(gate.guard(&id(key)).replay().run(body(key)).await);
        }
        results
    } else {
        let batch: Batch<&'static str> = messages.iter().map(|&key| (key, id(key))).collect();
        gate.guard_batch(batch).replay().run(body).await
    };
    results.iter().map(|r| format!("{r:?}")).collect()
}

/// Asserts that a batch of the duplicate cases answers each copy as the
/// oracle does, on gates that `gate` makes (uncached, or cached alike).
async fn duplicates_answer_as_one_by_one(gate: impl Fn(Gate) -> Gate) {
    let (batch, oracle) = (gate(testing::gate().await), gate(testing::gate().await));
    let (answers, runs) = disposed_as_a_batch(&batch, &DUPLICATES).await;
    let (expected, expected_runs) = disposed_one_by_one(&oracle, &DUPLICATES).await;
    for (i, (answer, expected)) in answers.iter().zip(&expected).enumerate() {
        assert_eq!(
            answer, expected,
            "copy {i} ({:?}) is answered as Gate::run answers it: batch {answers:#?}, \
             one by one {expected:#?}",
            DUPLICATES[i]
        );
    }
    assert_eq!(runs, expected_runs, "the same bodies ran");
    // And a redelivery of the whole batch, now that every slot is decided.
    let (again, _) = disposed_as_a_batch(&batch, &DUPLICATES).await;
    let (expected_again, _) = disposed_one_by_one(&oracle, &DUPLICATES).await;
    assert_eq!(again, expected_again, "redelivered");

    let (batch, oracle) = (gate(testing::gate().await), gate(testing::gate().await));
    assert_eq!(
        replayed_duplicates(&batch, false).await,
        replayed_duplicates(&oracle, true).await,
        "replayed copies are answered as a replayed guard answers them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_copy_of_an_identity_in_a_batch_gets_what_gate_run_gives_it() {
    duplicates_answer_as_one_by_one(|gate| gate).await;
}

#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_cache_never_changes_the_answers_to_copies_in_a_batch() {
    duplicates_answer_as_one_by_one(|gate| {
        gate.with_cache(idem::cache::OutcomeCache::builder().build())
    })
    .await;
}

// ------------------------------------------ issue 25: the lost lookup

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_whose_reply_is_lost_still_runs_the_won_items() {
    let (proxy, gate) = gate_behind_a_proxy(2).await;
    let done = keys("looked_done", 0..3);
    assert!(
        run_noop(&gate, batch_of(&done))
            .await
            .iter()
            .all(Result::is_ok)
    );
    let fresh = keys("looked_fresh", 0..3);
    let mixed: Vec<String> = done
        .iter()
        .zip(&fresh)
        .flat_map(|(done, fresh)| [done.clone(), fresh.clone()])
        .collect();
    let ran = AtomicUsize::new(0);
    // The claim commits and replies; the lookup of the lost (settled) items
    // loses its reply, and with it the connection.
    assert!(proxy.lose_next_reply_to("unnest($2::text[]) AS item(address)"));
    let results = counted(&gate, &mixed, &ran).await;
    let lost = proxy.take_lost_fragment_replies();
    assert_eq!(lost.len(), 1, "the lookup's reply was lost: {lost:?}");
    for (key, result) in mixed.iter().zip(&results) {
        if key.starts_with("looked_fresh") {
            assert!(result.is_ok(), "{key}, won, still runs: {results:?}");
        } else {
            assert!(
                refusal(result).is_some_and(Rejected::is_outage),
                "{key}, lost, is refused as an outage: {results:?}"
            );
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 3, "the won bodies ran");
    assert_eq!(
        rows::count_rows(&gate, "pending").await,
        0,
        "no won row is stranded pending"
    );
    assert_eq!(rows::count_rows(&gate, "success").await, 6);
}

// ------------------------------------ issue 25: a body queued past its lease

/// Whether the claim of `key` holds a live lease now, by the store's clock.
async fn lease_is_live(gate: &Gate, key: &str) -> bool {
    idem::sqlx::query_scalar::<_, bool>(
        "SELECT state = 'pending' AND lease_expires_at > now() FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL",
    )
    .bind(gate.account_name())
    .bind(id(key).address())
    .fetch_optional(gate.pool())
    .await
    .expect("read the lease")
    .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_queued_body_starts_on_a_lease_that_ran_out() {
    let gate = testing::gate().await;
    let lease = Duration::from_millis(300);
    let keys = keys("queued", 0..5);
    let ledger = Ledger::default();
    let started_live = Mutex::new(Vec::new());
    // Each item's lease ran from the batch's claim, at 0 ms; its body's turn
    // opens at 200 ms × its place. Two rivals, each released by a barrier
    // the batch's bodies reach: one takes the fourth item over while it
    // waits (when the second body ends, at 400 ms: its lease ran out at
    // 300), the other races the fifth item's turn as it opens (when the
    // third body ends: the fourth's body never starts).
    let (waiting, opening) = (Barrier::new(2), Barrier::new(2));
    let rival = |key: &str, barrier| {
        let (gate, ledger, key) = (&gate, &ledger, key.to_owned());
        async move {
            Barrier::wait(barrier).await;
            gate.guard(&id(&key))
                .lease(lease)
                .run(async {
                    ledger.ran(&key);
                    Ok::<_, JobError>(())
                })
                .await
        }
    };
    let batch = gate
        .guard_batch(batch_of(&keys))
        .concurrency(1)
        .lease(lease)
        .run(|key| {
            let (gate, ledger, started_live) = (&gate, &ledger, &started_live);
            let (waiting, opening) = (&waiting, &opening);
            async move {
                let live = lease_is_live(gate, key).await;
                started_live
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((key.to_owned(), live));
                ledger.ran(key);
                tokio::time::sleep(Duration::from_millis(200)).await;
                match key {
                    "queued_1" => {
                        waiting.wait().await;
                    }
                    "queued_2" => {
                        opening.wait().await;
                    }
                    _ => {}
                }
                Ok::<_, JobError>(())
            }
        });
    let (results, taken, raced) =
        tokio::join!(batch, rival(&keys[3], &waiting), rival(&keys[4], &opening));
    let started = started_live.into_inner().unwrap_or_else(|e| e.into_inner());
    for (key, live) in &started {
        assert!(
            live,
            "{key}'s body started on a lease that had run out: {started:?}"
        );
    }
    let runs = ledger.runs();
    for key in &keys {
        assert_eq!(runs.get(key), Some(&1), "{key} ran once: {runs:?}");
    }
    assert!(results[..3].iter().all(Result::is_ok), "{results:?}");
    // Taken over while it waited: the rival ran it, the batch's body never
    // started, and the item is answered as a duplicate of the rival.
    assert!(taken.is_ok(), "the rival took the fourth over: {taken:?}");
    assert_refused!(
        results[3],
        Rejected::AlreadyDone | Rejected::InFlight,
        "{results:?}"
    );
    // Whichever won the fifth, the other was refused.
    assert!(
        results[4].is_ok() != raced.is_ok(),
        "exactly one of the batch ({:?}) and the rival ({raced:?}) ran it",
        results[4]
    );
}

// --------------------------------------------- issue 25: a panicking body

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_body_holds_only_its_own_item() {
    use futures_util::FutureExt;
    let gate = testing::gate().await;
    let keys = keys("panics", 0..10);
    let ledger = Ledger::default();
    let run = gate.guard_batch(batch_of(&keys)).concurrency(2).run(|key| {
        let ledger = &ledger;
        async move {
            ledger.ran(key);
            tokio::task::yield_now().await;
            match key {
                "panics_4" => panic!("body 4 panics"),
                "panics_7" => Err(JobError::Failed),
                _ => Ok(()),
            }
        }
    });
    let panicked = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    let message = panicked
        .err()
        .and_then(|payload| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()));
    assert_eq!(
        message.as_deref(),
        Some("body 4 panics"),
        "the body's panic reaches the caller, as from Gate::run"
    );
    assert_eq!(
        ledger.runs().len(),
        10,
        "every body ran: {:?}",
        ledger.runs()
    );
    for key in &keys {
        let expected = match key.as_str() {
            "panics_4" => Some("pending"),
            "panics_7" => None,
            _ => Some("success"),
        };
        assert_eq!(state(&gate, key).await.as_deref(), expected, "{key}");
    }
    // Redelivered: the 8 successes are done, the released one runs, the
    // panicked one is held.
    let again = Ledger::default();
    let results = gate
        .guard_batch(batch_of(&keys))
        .run(|key| {
            let again = &again;
            async move {
                again.ran(key);
                Ok::<_, JobError>(())
            }
        })
        .await;
    for (key, result) in keys.iter().zip(&results) {
        match key.as_str() {
            "panics_4" => assert_refused!(result, Rejected::InFlight, "{key}: {results:?}"),
            "panics_7" => assert!(result.is_ok(), "{key}: {results:?}"),
            _ => assert_refused!(result, Rejected::AlreadyDone, "{key}: {results:?}"),
        }
    }
    assert_eq!(again.runs().len(), 1, "{:?}", again.runs());
}

// ------------------------- issue 25: a lease that ran out into doubt, told so

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_ran_out_into_doubt_is_told_what_happened() {
    let gate = testing::gate().await;
    let lease = Duration::from_millis(150);
    // A duplicate arrives after the lease ran out, while the body still
    // runs: it turns the claim in doubt (nobody takes it over).
    let duplicate = |key: &'static str| {
        let gate = &gate;
        async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            gate.guard(&id(key))
                .lease(lease)
                .on_expiry(OnExpiry::InDoubt)
                .claim()
                .await
                .map(|claim| claim.fence())
        }
    };
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        Ok::<_, JobError>("charged")
    };

    let batch = Batch::from_iter([("doubted_batch", id("doubted_batch"))]);
    let guarded = gate
        .guard_batch(batch)
        .lease(lease)
        .on_expiry(OnExpiry::InDoubt);
    let ((results, events), refused) = tokio::join!(
        testing::observe(guarded.run(|_| slow())),
        duplicate("doubted_batch")
    );
    assert!(matches!(refused, Err(Rejected::InDoubt)), "{refused:?}");
    let single_id = id("doubted_single");
    let ((single, single_events), refused) = tokio::join!(
        testing::observe(
            gate.guard(&single_id)
                .lease(lease)
                .on_expiry(OnExpiry::InDoubt)
                .run(slow())
        ),
        duplicate("doubted_single")
    );
    assert!(matches!(refused, Err(Rejected::InDoubt)), "{refused:?}");

    for (what, result, events, key) in [
        ("batch", &results[0], &events, "doubted_batch"),
        ("single", &single, &single_events, "doubted_single"),
    ] {
        assert_eq!(
            result.as_deref().ok(),
            Some("charged"),
            "{what}: nobody took the claim over, the body ran once and its success is \
             recorded: {result:?}"
        );
        assert_eq!(
            state(&gate, key).await.as_deref(),
            Some("success"),
            "{what}"
        );
        assert!(
            events.iter().any(|e| matches!(e, GateEvent::Settled)),
            "{what}: {events:?}"
        );
        assert!(
            !events.iter().any(|e| matches!(e, GateEvent::Unrecorded(_))),
            "{what}: {events:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_on_a_spawned_task() {
    // The body is called through a lock inside the batch; its future must
    // stay `Send`, so that a consumer can spawn it.
    let gate = testing::gate().await;
    let keys = keys("spawned", 0..3);
    let spawned = tokio::spawn(async move {
        let batch = batch_of(&keys);
        gate.guard_batch(batch)
            .concurrency(2)
            .run(|_| async { Ok::<_, JobError>(()) })
            .await
            .iter()
            .filter(|result| result.is_ok())
            .count()
    });
    assert_eq!(spawned.await.expect("the batch ran"), 3);
}

// ------------------------------- red team: concurrency on the batch guard

/// Runs a batch of `keys` at `concurrency` (none: the default), each body
/// sleeping a little; returns the order the bodies started in, the most
/// that ran at once, and the results.
async fn measured(
    gate: &Gate,
    keys: &[String],
    concurrency: Option<usize>,
) -> (Vec<String>, usize, Vec<Result<(), JobError>>) {
    let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let started = Mutex::new(Vec::new());
    let guard = gate.guard_batch(batch_of(keys));
    let guard = match concurrency {
        Some(n) => guard.concurrency(n),
        None => guard,
    };
    let results = guard
        .run(|key| {
            let (running, most, started) = (&running, &most, &started);
            async move {
                started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(key.to_owned());
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Uneven times, so a bound that leaks shows.
                let pause = 2 + (key.len() * 7 + started.lock().unwrap().len() * 3) % 9;
                tokio::time::sleep(Duration::from_millis(pause as u64)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, JobError>(())
            }
        })
        .await;
    let started = started.into_inner().unwrap_or_else(|e| e.into_inner());
    (started, most.load(Ordering::SeqCst), results)
}

/// "One body at a time by default, in the batch's order": the bodies start
/// in the order the items were pushed (not the address order the claim
/// visits), never two at once; `concurrency(0)` is one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_and_at_concurrency_zero_bodies_run_one_at_a_time_in_the_batch_s_order() {
    let gate = testing::gate().await;
    for (round, concurrency) in [None, Some(0), Some(1)].into_iter().enumerate() {
        // Keys whose address order is not the batch's.
        let keys: Vec<String> = (0..16)
            .rev()
            .map(|i| format!("order_{round}_{i}"))
            .collect();
        let (started, most, results) = measured(&gate, &keys, concurrency).await;
        assert!(
            results.iter().all(Result::is_ok),
            "{concurrency:?}: {results:?}"
        );
        assert_eq!(most, 1, "{concurrency:?}: one body at a time");
        assert_eq!(started, keys, "{concurrency:?}: in the batch's order");
    }
}

/// `concurrency(n)` runs at most `n` won bodies at a time, and reaches `n`;
/// a bound above the batch's size runs them all at once; each result is at
/// its item's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_s_concurrency_is_a_bound_its_bodies_reach_and_never_pass() {
    let gate = testing::gate().await;
    for n in [2usize, 3, 7, 64, usize::MAX] {
        let keys = keys(&format!("bound_{}", n.min(999)), 0..20);
        let (started, most, results) = measured(&gate, &keys, Some(n)).await;
        assert_eq!(results.len(), keys.len());
        assert!(results.iter().all(Result::is_ok), "{n}: {results:?}");
        assert_eq!(started.len(), keys.len(), "{n}: every won body ran once");
        assert!(most <= n, "{n}: {most} ran at once");
        assert_eq!(most, n.min(keys.len()), "{n}: the bound is reached");
    }
}

/// The same identity many times in one batch at a high concurrency: its
/// body runs once, and each later copy is told what a duplicate made after
/// the first finished would be told (`AlreadyDone`), in its own place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_one_identity_in_a_concurrent_batch_run_once() {
    let gate = testing::gate().await;
    let ledger = Ledger::default();
    let mut batch = Batch::new();
    for i in 0..12 {
        let key = if i % 3 == 0 { "twice" } else { "other" };
        batch.push((i, key), id(key));
    }
    let results = gate
        .guard_batch(batch)
        .concurrency(8)
        .run(|(_, key)| {
            let ledger = &ledger;
            async move {
                ledger.ran(key);
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, JobError>(())
            }
        })
        .await;
    assert_eq!(
        ledger.runs(),
        HashMap::from([("twice".to_owned(), 1), ("other".to_owned(), 1)])
    );
    for (i, result) in results.iter().enumerate() {
        if i <= 1 {
            assert!(result.is_ok(), "{i}: {results:?}");
        } else {
            assert_refused!(result, Rejected::AlreadyDone, "{i}: {results:?}");
        }
    }
}

/// A body waits for its turn within the lease at any concurrency: with two
/// at a time and each body taking most of the lease, a body whose turn
/// opens late never starts on a lease that has run out, and every item runs
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_two_at_a_time_no_body_starts_on_a_lease_that_ran_out() {
    let gate = testing::gate().await;
    let keys = keys("turns2", 0..6);
    let lease = Duration::from_millis(400);
    let ledger = Ledger::default();
    let started_with = Mutex::new(Vec::new());
    let results = gate
        .guard_batch(batch_of(&keys))
        .lease(lease)
        .concurrency(2)
        .run(|key| {
            let (gate, ledger, started_with) = (&gate, &ledger, &started_with);
            async move {
                let left: Option<f64> = idem::sqlx::query_scalar(
                    "SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8 \
                     FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2",
                )
                .bind(gate.account_name())
                .bind(id(key).address())
                .fetch_one(gate.pool())
                .await
                .expect("read the lease");
                started_with
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((key.to_owned(), left));
                ledger.ran(key);
                tokio::time::sleep(Duration::from_millis(250)).await;
                Ok::<_, JobError>(())
            }
        })
        .await;
    let started = started_with.into_inner().unwrap_or_else(|e| e.into_inner());
    for (key, left) in &started {
        let left = left.unwrap_or_else(|| panic!("{key} started without a lease"));
        assert!(
            left > 0.15,
            "{key} started with {left:.3} s of its lease left: {started:?}"
        );
    }
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(
        ledger.runs().values().all(|n| *n == 1),
        "{:?}",
        ledger.runs()
    );
}
