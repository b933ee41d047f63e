//! The entry points the guard builder replaces, which keep working for one
//! release as `#[deprecated]`: `Gate::{claim_with, claim_in, run_with,
//! run_replayed, run_disposed, run_detached, run_batch, run_batch_replayed,
//! run_batch_disposed}` and `Claim::{settle_in, release_in, dispose_in}`.
//! Their replacements are `gate.guard(&id)` with the mode's options as its
//! methods (`.replay()`, `.disposition(E::disposition)`, `.tx(conn)`, ...)
//! ending in `.run(body)`, `.run_detached(..)` or `.claim()` (a `TxClaim`,
//! recorded on the transaction, after `.tx`), and `gate.guard_batch(batch)`.
//!
//! First one short test per entry point showing that it still works; then
//! the behaviour only these entry points have, because the builder's types
//! rule it out: a claim in a transaction asked for a lease, a wait, failing
//! open or an asynchronous commit (refused or ignored at run time), and a
//! claim recorded on the wrong connection (refused, never waiting).
//! Removing the deprecated entry points deletes this file.
#![allow(deprecated)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::batch::Batch;
use idem::cache::OutcomeCache;
use idem::sqlx;
use idem::testing;
use idem::{Detached, Disposition, Gate, Identity, Mode, OnUnavailable, OutcomeCommit, Rejected};
use idem_test_support::{ChargeError, rows};

use crate::modes::outcome_commit;

/// Long enough that only a call that waits (on a lock, on a transaction)
/// reaches it: it tells a hang from an answer, and measures no speed.
const HANG: Duration = Duration::from_secs(20);

fn refusal<T: std::fmt::Debug>(result: &Result<T, Rejected>) -> &Rejected {
    match result {
        Err(rejected) => rejected,
        Ok(value) => panic!("expected a refusal, got Ok({value:?})"),
    }
}

/// A fresh gate in an account of its own, with a cache of its own.
async fn cached_gate() -> Gate {
    testing::gate()
        .await
        .with_cache(OutcomeCache::builder().ttl(Duration::from_secs(60)).build())
}

// ---------------------------------------------------------------------------
// Each entry point still works.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_with_claims_under_a_mode() {
    let gate = testing::gate().await;
    let id = Identity::new("dep_claim_with").part(1);
    let mode = Mode::new().lease(Duration::from_secs(30));
    let claim = gate.claim_with(&id, &mode).await.expect("won");
    assert!(claim.fence().is_some());
    let duplicate = gate.claim_with(&id, &mode).await;
    assert!(
        matches!(duplicate, Err(Rejected::InFlight)),
        "{duplicate:?}"
    );
    claim.settle().await.expect("settled");
    let later = gate.claim_with(&id, &mode).await;
    assert!(matches!(later, Err(Rejected::AlreadyDone)), "{later:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_runs_once_under_a_mode() {
    let gate = testing::gate().await;
    let id = Identity::new("dep_run_with").part(1);
    let mode = Mode::new().wait(Duration::from_secs(1));
    let first = gate
        .run_with(&id, &mode, async { Ok::<_, Rejected>(1) })
        .await;
    assert_eq!(first.expect("ran"), 1);
    let again = gate
        .run_with(&id, &mode, async { Ok::<_, Rejected>(2) })
        .await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_replayed_hands_a_duplicate_the_kept_value() {
    let gate = testing::gate().await;
    let id = Identity::new("dep_run_replayed").part(1);
    let first = gate
        .run_replayed(&id, &Mode::new(), async {
            Ok::<_, Rejected>("r_1".to_owned())
        })
        .await;
    assert_eq!(first.expect("ran"), "r_1");
    let again = gate
        .run_replayed(&id, &Mode::new(), async {
            Ok::<_, Rejected>("r_2".to_owned())
        })
        .await;
    assert_eq!(again.expect("replayed"), "r_1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_disposed_keeps_a_definite_failure() {
    let gate = testing::gate().await;
    let id = Identity::new("dep_run_disposed").part(1);
    let declined: Result<(), ChargeError> = gate
        .run_disposed(&id, &Mode::new(), async { Err(ChargeError::Declined) })
        .await;
    assert!(
        matches!(declined, Err(ChargeError::Declined)),
        "{declined:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("failed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_detached_runs_the_body_to_completion() {
    let gate = testing::gate().await;
    let detached = Detached::new();
    let id = Identity::new("dep_run_detached").part(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let body = {
        let ran = Arc::clone(&ran);
        async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(7)
        }
    };
    let answer = gate.run_detached(&id, &Mode::new(), &detached, body).await;
    assert_eq!(answer.expect("ran"), 7);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    detached.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
}

/// A batch of `n` items of `action`, each its own identity.
fn batch_of(action: &str, n: u64) -> Batch<u64> {
    (1..=n)
        .map(|i| (i, Identity::new(action).part(i)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_batch_runs_each_item_once() {
    let gate = testing::gate().await;
    let first = gate
        .run_batch(batch_of("dep_run_batch", 3), |n| async move {
            Ok::<_, Rejected>(n)
        })
        .await;
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let again = gate
        .run_batch(batch_of("dep_run_batch", 3), |n| async move {
            Ok::<_, Rejected>(n)
        })
        .await;
    assert!(
        again
            .iter()
            .all(|a| matches!(a, Err(Rejected::AlreadyDone))),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_batch_replayed_replays_each_items_value() {
    let gate = testing::gate().await;
    let body = |n: u64| async move { Ok::<_, Rejected>(n * 10) };
    let first = gate
        .run_batch_replayed(batch_of("dep_run_batch_replayed", 3), body)
        .await;
    let again = gate
        .run_batch_replayed(batch_of("dep_run_batch_replayed", 3), |_| async {
            Ok::<_, Rejected>(0)
        })
        .await;
    let values = |answers: Vec<Result<u64, Rejected>>| -> Vec<u64> {
        answers.into_iter().map(|a| a.expect("answered")).collect()
    };
    assert_eq!(values(first), [10, 20, 30]);
    assert_eq!(values(again), [10, 20, 30]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_batch_disposed_keeps_each_definite_failure() {
    let gate = testing::gate().await;
    let answers = gate
        .run_batch_disposed(batch_of("dep_run_batch_disposed", 2), |_| async {
            Err::<(), _>(ChargeError::Declined)
        })
        .await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(ChargeError::Declined))),
        "{answers:?}"
    );
    let again = gate
        .run_batch(batch_of("dep_run_batch_disposed", 2), |_| async {
            Ok::<(), Rejected>(())
        })
        .await;
    assert!(
        again
            .iter()
            .all(|a| matches!(a, Err(Rejected::AlreadyFailed))),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_in_with_release_in_frees_the_slot_when_its_transaction_commits() {
    let gate = testing::gate().await;
    let id = Identity::new("dep_release_in").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .claim_in(&mut tx, &id, &Mode::new())
        .await
        .expect("claimed");
    claim.release_in(&mut tx).await.expect("released in the tx");
    tx.commit().await.expect("commit");
    assert_eq!(rows::row_state(&gate, &id.address()).await, None);
    gate.run(&id, async { Ok::<_, Rejected>(()) })
        .await
        .expect("a retry runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_in_with_dispose_in_keeps_a_failure_when_its_transaction_commits() {
    let gate = testing::gate().await;
    let id = Identity::new("dep_dispose_in").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .claim_in(&mut tx, &id, &Mode::new())
        .await
        .expect("claimed");
    claim
        .dispose_in(&mut tx, Disposition::Keep)
        .await
        .expect("kept in the tx");
    tx.commit().await.expect("commit");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("failed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_a_transaction_recorded_with_the_in_methods_commits_with_it() {
    let gate = testing::gate().await;
    let id = Identity::new("h21_in_method").part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .claim_in(&mut tx, &id, &Mode::new())
        .await
        .expect("claimed");
    claim.settle_in(&mut tx).await.expect("settled in the tx");
    tx.commit().await.expect("commit");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
}

/// The other way round is no misuse: a claim made on the pool is committed
/// already, so recording its outcome inside a transaction of the caller's
/// (with its own writes) waits on nothing and commits with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_claim_recorded_inside_a_transaction_commits_with_it() {
    let gate = testing::gate().await;
    let id = Identity::new("h21_pool_claim_in_tx").part(1);
    let claim = gate.claim(&id).await.expect("claimed on the pool");
    let mut tx = gate.pool().begin().await.expect("begin");
    let settled = tokio::time::timeout(HANG, claim.settle_in(&mut tx)).await;
    assert!(
        matches!(settled, Ok(Ok(()))),
        "settled in the transaction: {settled:?}"
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
}

// ---------------------------------------------------------------------------
// A claim in a transaction: what only `claim_in` can be asked, and the
// connection discipline its `Claim` keeps at run time (a `TxClaim` keeps it
// in its type).
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_a_transaction_refuses_a_lease_a_wait_and_failing_open_before_any_statement() {
    let gate = testing::gate().await;
    let modes = [
        ("lease", Mode::new().lease(Duration::from_secs(30))),
        ("wait", Mode::new().wait(Duration::from_secs(1))),
        (
            "on_unavailable",
            Mode::new().on_unavailable(OnUnavailable::Run),
        ),
    ];
    for (option, mode) in modes {
        let id = Identity::new("h20_claim_in").part(option);
        let mut tx = gate.pool().begin().await.expect("begin");
        let claimed = gate.claim_in(&mut tx, &id, &mode).await;
        let refused = match claimed {
            Err(rejected) => rejected,
            Ok(claim) => {
                let _ = claim.settle_in(&mut tx).await;
                tx.rollback().await.expect("rollback");
                panic!("claim_in accepted `{option}`, which a transaction cannot honour");
            }
        };
        assert!(
            matches!(&refused, Rejected::InvalidOption { option: named, .. } if *named == option),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("transaction"),
            "the message says why: {refused}"
        );
        // Before any statement: the transaction is still usable.
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("the caller's transaction is untouched");
        tx.rollback().await.expect("rollback");
        assert_eq!(rows::row_state(&gate, &id.address()).await, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_a_transaction_recorded_on_the_pool_fails_at_once_naming_the_in_method() {
    let gate = testing::gate().await;
    type Finish = fn(idem::Claim) -> futures_util::future::BoxFuture<'static, Result<(), Rejected>>;
    let finishes: [(&str, &str, Finish); 3] = [
        ("settle", "settle_in", |claim| Box::pin(claim.settle())),
        ("release", "release_in", |claim| Box::pin(claim.release())),
        ("dispose", "dispose_in", |claim| {
            Box::pin(claim.dispose(Disposition::Keep))
        }),
    ];
    for (method, instead, finish) in finishes {
        let id = Identity::new("h21_pool_method").part(method);
        let mut tx = gate.pool().begin().await.expect("begin");
        let claim = gate
            .claim_in(&mut tx, &id, &Mode::new())
            .await
            .expect("claimed in the transaction");
        let told = tokio::time::timeout(HANG, finish(claim)).await;
        tx.rollback().await.expect("rollback");
        let told = told.unwrap_or_else(|_| {
            panic!("Claim::{method} on a claim made with claim_in waited on the caller's own transaction")
        });
        let refused = refusal(&told);
        assert!(
            refused.to_string().contains(instead),
            "the error names the method to call: {refused}"
        );
        assert!(!refused.is_outage(), "a misuse is no outage: {refused:?}");
    }
}

/// Promise (Gate::claim_in): "[`Claim::settle`] and its kin would wait on
/// the row this open transaction holds, so they fail at once, naming the
/// method to call"; (Rejected::WrongConnection) "nothing waited". Here the
/// kin is `settle_in` on another transaction than the claim's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_settled_in_another_transaction_fails_at_once_instead_of_waiting_on_its_own() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_h_other_tx").part(1);
    let mut mine = gate.pool().begin().await.expect("begin");
    let claim = gate
        .claim_in(&mut mine, &id, &Mode::new())
        .await
        .expect("won");
    let mut other = gate.pool().begin().await.expect("begin another");
    let settled = tokio::time::timeout(Duration::from_secs(3), claim.settle_in(&mut other)).await;
    drop(other);
    mine.rollback().await.expect("rollback");
    let settled = settled.unwrap_or_else(|_| {
        panic!(
            "settle_in on another transaction than claim_in's waited on the claim's own \
             open transaction (it would wait forever)"
        )
    });
    assert!(
        matches!(settled, Err(Rejected::WrongConnection { .. })),
        "told which connection to use: {settled:?}"
    );
    // Nothing was written outside the claim's rolled-back transaction.
    assert_eq!(rows::row_state(&gate, &id.address()).await, None);
}

/// Promise (Gate::claim): "An absent identity (a `None` key part) yields an
/// ungated claim whose settle and release do nothing", a `claim_in` one
/// too, even on the pool: it has no row to wait on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ungated_claim_in_claim_settles_on_the_pool_as_nothing() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_absent").part(None::<&str>);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .claim_in(&mut tx, &id, &Mode::new())
        .await
        .expect("ungated");
    assert!(!claim.is_gated());
    assert!(
        claim.settle().await.is_ok(),
        "an ungated claim_in claim has no row to wait on"
    );
    tx.rollback().await.expect("rollback");
}

/// A claim made inside a transaction, recorded through the pool: nothing
/// was sent to the store, which did not fail; the transaction rolls back
/// and leaves no pending claim. Counting it `unrecorded` sends operators
/// after a stale pending claim that does not exist.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_connection_misuse_is_not_counted_as_the_store_failing_to_record() {
    super::redteam::counted::install();
    let gate = testing::gate().await;
    let action = testing::unique_name("rt_h_wrong_conn_metric");
    let id = Identity::new(&action).part(1);
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .claim_in(&mut tx, &id, &Mode::new())
        .await
        .expect("won");
    let told = claim.settle().await;
    assert_eq!(refusal(&told).reason(), "wrong_connection", "{told:?}");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await,
        None,
        "no pending claim"
    );
    let counted = super::redteam::counted::outcomes(&action);
    assert!(
        !counted.iter().any(|(outcome, _)| outcome == "unrecorded"),
        "a misuse, with no statement sent and no claim left pending, counted as the store \
         failing to record an outcome: {counted:?}"
    );
}

/// Promise (cache.rs): "never from a settle inside the caller's transaction
/// ... which may still roll back". A pool claim settled inside a
/// transaction that rolls back must not be cached as settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_claim_settled_in_a_transaction_that_rolls_back_is_never_cached() {
    let gate = cached_gate().await;
    let id = Identity::new("rt_h_settle_in_rollback").part(1);
    let claim = gate.claim(&id).await.expect("won");
    let mut tx = gate.pool().begin().await.expect("begin");
    claim.settle_in(&mut tx).await.expect("settled in tx");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("pending")
    );
    let again = gate.run(&id, async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(again, Err(Rejected::InFlight)), "{again:?}");
}

// ---------------------------------------------------------------------------
// An asynchronous commit where a `Mode` still asks for it and the builder
// does not compile: under a lease, inside the caller's transaction.
// ---------------------------------------------------------------------------

/// Claims `id` under `mode` on the pool, then settles it (or releases it,
/// if `fail`).
async fn claim_and_record(gate: &Gate, id: u64, mode: &Mode, fail: bool) -> Result<(), Rejected> {
    let claim = gate
        .claim_with(&Identity::new("pay").part(id), mode)
        .await?;
    if fail {
        claim.release().await
    } else {
        claim.settle().await
    }
}

/// Settles claim `id` and releases claim `id + 1`, both under `mode`: one
/// UPDATE and one DELETE for the log, in that order.
async fn settle_one_and_release_the_next(gate: &Gate, id: u64, mode: &Mode) {
    claim_and_record(gate, id, mode, false)
        .await
        .expect("settle");
    claim_and_record(gate, id + 1, mode, true)
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_is_ignored_under_a_lease_and_inside_the_caller_s_transaction() {
    let (gate, pool) = outcome_commit::logged_gate().await;
    let leased = Mode::new()
        .outcome_commit(OutcomeCommit::Async)
        .lease(std::time::Duration::from_secs(60));
    settle_one_and_release_the_next(&gate, 1, &leased).await;

    let mut tx = pool.begin().await.expect("begin");
    let claim = gate
        .claim_in(
            &mut tx,
            &Identity::new("pay").part(3_u64),
            &Mode::new().outcome_commit(OutcomeCommit::Async),
        )
        .await
        .expect("claim in the transaction");
    claim.settle_in(&mut tx).await.expect("settle in it");
    tx.commit().await.expect("commit");

    assert_eq!(
        outcome_commit::take_log(&pool).await,
        [
            outcome_commit::entry("UPDATE", "on"),
            outcome_commit::entry("DELETE", "on"),
            outcome_commit::entry("UPDATE", "on")
        ],
        "a lost settle under a lease could run the action twice, and the caller's commit is \
         the caller's: both stay durable"
    );
}

/// Promise (OutcomeCommit::Async): "Ignored (the outcome commits durably)
/// ... inside the caller's transaction, whose whole commit it would
/// otherwise make asynchronous."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_outcome_recorded_inside_the_callers_transaction_leaves_its_commit_durable() {
    let gate = testing::gate().await;
    let mode = Mode::new().outcome_commit(idem::OutcomeCommit::Async);
    type Finish = for<'c> fn(
        idem::Claim,
        &'c mut idem::sqlx::PgConnection,
    ) -> futures_util::future::BoxFuture<'c, Result<(), Rejected>>;
    let finishes: [(&str, Finish); 3] = [
        ("settle_in", |claim, conn| Box::pin(claim.settle_in(conn))),
        ("release_in", |claim, conn| Box::pin(claim.release_in(conn))),
        ("dispose_in", |claim, conn| {
            Box::pin(claim.dispose_in(conn, Disposition::Keep))
        }),
    ];
    for (method, finish) in finishes {
        for in_tx in [false, true] {
            let id = Identity::new("rt_h_async_in_tx").part(method).part(in_tx);
            let mut tx = gate.pool().begin().await.expect("begin");
            let claim = if in_tx {
                gate.claim_in(&mut tx, &id, &mode)
                    .await
                    .expect("won in the tx")
            } else {
                gate.guard(&id)
                    .outcome_commit(idem::OutcomeCommit::Async)
                    .claim()
                    .await
                    .expect("won on the pool")
            };
            finish(claim, &mut tx).await.expect("recorded in the tx");
            let setting: String = idem::sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&mut *tx)
                .await
                .expect("show");
            tx.rollback().await.expect("rollback");
            assert_eq!(
                setting,
                "on",
                "Claim::{method} (claim made {}) turned the caller's whole transaction \
                 asynchronous",
                if in_tx { "in the tx" } else { "on the pool" }
            );
        }
    }
}
