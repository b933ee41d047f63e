//! The guard builder: each promise the
//! docs of `Gate::guard`, `Guard`, `TxClaim`, `BatchGuard` and the
//! attribute reference make, attacked against a real PostgreSQL: races at
//! one instant, backends terminated and connections cut, futures dropped
//! and bodies or classifiers panicking mid-call, misuse of every end, and
//! hostile input. Then the attribute against the same guard by hand.
//!
//! A test here that passes pins a promise that held; each test's doc
//! comment quotes the promise it attacks.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use idem::batch::Batch;
use idem::sqlx::{self, PgConnection};
use idem::sqlx::{Postgres, Transaction};
use idem::testing;
use idem::{
    ClaimOrReplay, Detached, Disposition, Fingerprint, Gate, Identity, OnExpiry, OnUnavailable,
    OutcomeCommit, Rejected, idempotent,
};
use idem_test_support::connections::{named_pool, terminate_backends};
use idem_test_support::fault_proxy::{Proxy, Statement};
use idem_test_support::rows::row_state;

use crate::support::bodies::counted;
use crate::support::proxy::pool_through;

const RACERS: usize = 8;
const LEASE: Duration = Duration::from_secs(30);

/// A body's error: a refusal, or a definite decline.
#[derive(Debug)]
enum Failure {
    Rejected(Rejected),
    Declined,
    Doubtful,
    Database,
}

impl From<Rejected> for Failure {
    fn from(rejected: Rejected) -> Self {
        Failure::Rejected(rejected)
    }
}

/// Declines are kept, doubts held, refusals released.
fn classify(failure: &Failure) -> Disposition {
    match failure {
        Failure::Declined => Disposition::Keep,
        Failure::Doubtful => Disposition::InDoubt,
        Failure::Rejected(_) | Failure::Database => Disposition::Release,
    }
}

/// The state of `id`'s row in `gate`'s account, read behind its back.
async fn state(gate: &Gate, id: &Identity) -> Option<String> {
    row_state(gate, &id.address()).await
}

fn fp(cents: i64) -> Fingerprint {
    Fingerprint::new().part(cents)
}

fn keep_all(_: &Rejected) -> Disposition {
    Disposition::Keep
}

/// Races `RACERS` invocations at one instant and asserts one ran.
async fn exactly_once<F, Fut, T>(label: &str, invoke: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Rejected>>,
{
    let report = testing::race(RACERS, invoke).await;
    assert_eq!(report.wins(), 1, "{label}: {} won", report.wins());
    report.assert_exactly_once();
}

/// "Its methods are the attribute's options": in whatever order they are
/// written, a race at one instant runs the body once, and with `replay`
/// every later duplicate is handed the first value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_option_order_lets_exactly_one_of_a_race_through() {
    let gate = testing::gate_on(testing::pool_with(RACERS as u32 + 4).await).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = |n: u32| Identity::new("rt_orders").part(n);

    let (a, b, c, d, e, f) = (id(1), id(2), id(3), id(4), id(5), id(6));
    exactly_once("fingerprint lease on_expiry replay disposition", || {
        gate.guard(&a)
            .fingerprint(fp(1))
            .lease(LEASE)
            .on_expiry(OnExpiry::InDoubt)
            .replay()
            .disposition(keep_all)
            .run(counted(&runs, "a"))
    })
    .await;
    exactly_once("disposition replay lease on_expiry fingerprint", || {
        gate.guard(&b)
            .disposition(keep_all)
            .replay()
            .lease(LEASE)
            .on_expiry(OnExpiry::TakeOver)
            .fingerprint(fp(1))
            .run(counted(&runs, "b"))
    })
    .await;
    exactly_once("replay wait lease fingerprint", || {
        gate.guard(&c)
            .replay()
            .wait(Duration::from_secs(5))
            .lease(LEASE)
            .fingerprint(fp(1))
            .run(counted(&runs, "c"))
    })
    .await;
    exactly_once("wait on_unavailable lease replay", || {
        gate.guard(&d)
            .wait(Duration::from_secs(5))
            .on_unavailable(OnUnavailable::Refuse)
            .lease(LEASE)
            .replay()
            .run(counted(&runs, "d"))
    })
    .await;
    exactly_once("outcome_commit wait replay fingerprint", || {
        gate.guard(&e)
            .outcome_commit(OutcomeCommit::Async)
            .wait(Duration::from_secs(5))
            .replay()
            .fingerprint(fp(1))
            .run(counted(&runs, "e"))
    })
    .await;
    exactly_once("on_unavailable outcome_commit disposition replay", || {
        gate.guard(&f)
            .on_unavailable(OnUnavailable::Run)
            .outcome_commit(OutcomeCommit::Async)
            .disposition(keep_all)
            .replay()
            .run(counted(&runs, "f"))
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 6, "one run per identity");

    // Every later duplicate, options in yet another order, gets the value.
    let again = gate
        .guard(&a)
        .replay()
        .disposition(keep_all)
        .fingerprint(fp(1))
        .lease(LEASE)
        .run(counted(&runs, "other"))
        .await;
    assert_eq!(again.expect("replayed"), "a");
    let again = gate
        .guard(&c)
        .fingerprint(fp(1))
        .replay()
        .run(counted(&runs, "other"))
        .await;
    assert_eq!(again.expect("replayed"), "c");
    // A wait and a replay both on: duplicates of the async-committed one.
    let again = gate
        .guard(&e)
        .fingerprint(fp(1))
        .replay()
        .run(counted(&runs, "other"))
        .await;
    assert_eq!(again.expect("replayed"), "e");
    assert_eq!(runs.load(Ordering::SeqCst), 6, "no duplicate ran");
}

/// "`tx`: claim and record inside the caller's transaction" on "a
/// `&mut PgConnection`": a pooled connection that is in no transaction
/// autocommits each statement; the body still runs once, and a claim
/// dropped there is already committed `pending` (fail closed). A claim
/// made on one bare connection can be recorded on another: its row is
/// committed, so nothing waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tx_on_a_bare_pooled_connection_autocommits_and_fails_closed() {
    let pool = testing::pool_with(6).await;
    let gate = testing::gate_on(pool.clone()).await;
    let mut conn = pool.acquire().await.expect("a connection");
    let id = Identity::new("rt_bare").part("ran");

    let first = gate
        .guard(&id)
        .tx(&mut conn)
        .replay()
        .run(async |_: &mut PgConnection| Ok::<_, Rejected>("v".to_owned()))
        .await;
    assert_eq!(first.expect("ran"), "v");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("success"));
    let pooled = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>("not run".to_owned()) })
        .await;
    assert_eq!(pooled.expect("replayed"), "v");

    // Dropped unrecorded on a bare connection: committed pending at once.
    let dropped = Identity::new("rt_bare").part("dropped");
    let claim = gate
        .guard(&dropped)
        .tx(&mut conn)
        .claim()
        .await
        .expect("won");
    drop(claim);
    assert_eq!(state(&gate, &dropped).await.as_deref(), Some("pending"));
    let dup = gate.guard(&dropped).claim().await;
    assert!(matches!(dup, Err(Rejected::InFlight)), "{dup:?}");

    // Claimed on one bare connection, settled on another.
    let moved = Identity::new("rt_bare").part("moved");
    let claim = gate.guard(&moved).tx(&mut conn).claim().await.expect("won");
    let mut other = pool.acquire().await.expect("another connection");
    let settled = tokio::time::timeout(Duration::from_secs(10), claim.settle(&mut other))
        .await
        .expect("a settle on another bare connection must not wait");
    settled.expect("settled");
    assert_eq!(state(&gate, &moved).await.as_deref(), Some("success"));
}

/// `TxClaim`: "Dropped unrecorded, the row stays pending until the
/// transaction ends: a commit keeps it pending (fail closed), a rollback
/// removes it."
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tx_claim_dropped_stays_pending_on_commit_and_is_gone_on_rollback() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;

    let committed = Identity::new("rt_tx_dropped").part("committed");
    let mut tx = pool.begin().await.expect("begin");
    drop(
        gate.guard(&committed)
            .tx(&mut tx)
            .claim()
            .await
            .expect("won"),
    );
    tx.commit().await.expect("commit");
    assert_eq!(state(&gate, &committed).await.as_deref(), Some("pending"));
    let dup = gate
        .guard(&committed)
        .run(async { Ok::<_, Rejected>(()) })
        .await;
    assert!(matches!(dup, Err(Rejected::InFlight)), "{dup:?}");

    let rolled = Identity::new("rt_tx_dropped").part("rolled_back");
    let mut tx = pool.begin().await.expect("begin");
    drop(gate.guard(&rolled).tx(&mut tx).claim().await.expect("won"));
    tx.rollback().await.expect("rollback");
    assert_eq!(state(&gate, &rolled).await, None);
    let retry = gate
        .guard(&rolled)
        .run(async { Ok::<_, Rejected>(()) })
        .await;
    assert!(retry.is_ok(), "{retry:?}");

    // The transaction itself dropped (no commit, no rollback): sqlx rolls
    // it back, so the slot is free too.
    let abandoned = Identity::new("rt_tx_dropped").part("abandoned");
    {
        let mut tx = pool.begin().await.expect("begin");
        drop(
            gate.guard(&abandoned)
                .tx(&mut tx)
                .claim()
                .await
                .expect("won"),
        );
    }
    let retry = tokio::time::timeout(
        Duration::from_secs(10),
        gate.guard(&abandoned).run(async { Ok::<_, Rejected>(()) }),
    )
    .await
    .expect("a dropped transaction must not hold the slot");
    assert!(retry.is_ok(), "{retry:?}");
}

/// `TxClaim::settle`: "Records success on `connection`, the claim's
/// transaction"; "there is no way to record it through the pool (which
/// would wait forever on the row the open transaction holds)". Handed
/// another transaction, or a bare pooled connection, the settle must
/// neither wait forever nor report a success it did not record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tx_claim_settled_on_another_transaction_neither_hangs_nor_lies() {
    let pool = testing::pool_with(6).await;
    let gate = testing::gate_on(pool.clone()).await;

    for (label, other_is_tx) in [("another transaction", true), ("a bare connection", false)] {
        let id = Identity::new("rt_tx_elsewhere").part(label);
        let mut first = pool.begin().await.expect("begin");
        let claim = gate.guard(&id).tx(&mut first).claim().await.expect("won");

        let answer = if other_is_tx {
            let mut second = pool.begin().await.expect("begin");
            let answer =
                tokio::time::timeout(Duration::from_secs(5), claim.settle(&mut second)).await;
            drop(second);
            answer
        } else {
            let mut bare = pool.acquire().await.expect("a connection");
            tokio::time::timeout(Duration::from_secs(5), claim.settle(&mut bare)).await
        };
        first
            .commit()
            .await
            .expect("commit the claim's own transaction");
        let after = state(&gate, &id).await;
        match answer {
            Err(_) => panic!(
                "{label}: the settle waited 5 s and more (the row stays {after:?}); it must fail \
                 at once"
            ),
            // What it does: refused at once, nothing recorded anywhere.
            Ok(Err(Rejected::WrongConnection { .. })) => assert_eq!(
                after.as_deref(),
                Some("pending"),
                "{label}: refused, so the row must stay pending (fail closed)"
            ),
            Ok(other) => panic!(
                "{label}: expected WrongConnection at once, got {other:?} (the row is {after:?})"
            ),
        }
    }
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    charge_id: String,
    cents: i64,
}

#[derive(Debug, serde::Deserialize)]
#[allow(
    dead_code,
    reason = "only its shape matters: it must not read a Receipt"
)]
struct Refund {
    refund_id: u64,
}

/// `claim_or_replay::<T>`: "`AlreadyDone` when the settled call kept none,
/// or it no longer reads back as `T`". And `replay` of an `Ok` whose JSON
/// is `null` (`()`, `None`) is still a kept value, handed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_or_replay_with_the_wrong_type_is_refused_never_misread() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_wrong_t").part(1);
    let ClaimOrReplay::Won(claim) = gate
        .guard(&id)
        .replay()
        .claim_or_replay::<Receipt>()
        .await
        .expect("won")
    else {
        panic!("nothing kept yet")
    };
    let receipt = Receipt {
        charge_id: "ch_1".into(),
        cents: 500,
    };
    claim.settle_value(&receipt).await.expect("settled");

    let wrong = gate.guard(&id).replay().claim_or_replay::<Refund>().await;
    assert!(matches!(wrong, Err(Rejected::AlreadyDone)), "{wrong:?}");
    let wrong = gate.guard(&id).replay().claim_or_replay::<String>().await;
    assert!(matches!(wrong, Err(Rejected::AlreadyDone)), "{wrong:?}");
    match gate.guard(&id).replay().claim_or_replay::<Receipt>().await {
        Ok(ClaimOrReplay::Replayed(value)) => assert_eq!(value, receipt),
        other => panic!("expected the receipt, got {other:?}"),
    }
    // A `run` whose `Ok` type differs is refused the same way, not run.
    let runs = Arc::new(AtomicUsize::new(0));
    let other = gate.guard(&id).replay().run(counted(&runs, "x")).await;
    assert!(matches!(other, Err(Rejected::AlreadyDone)), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // `Ok(None)` and `Ok(())` are values too: JSON `null`.
    let none = Identity::new("rt_wrong_t").part("none");
    let first = gate
        .guard(&none)
        .replay()
        .run(async { Ok::<Option<u64>, Rejected>(None) })
        .await;
    assert_eq!(first.expect("ran"), None);
    let again = gate
        .guard(&none)
        .replay()
        .run(async { Ok::<Option<u64>, Rejected>(Some(9)) })
        .await;
    assert_eq!(again.expect("a kept None is replayed"), None);
    let unit = Identity::new("rt_wrong_t").part("unit");
    gate.guard(&unit)
        .replay()
        .run(async { Ok::<(), Rejected>(()) })
        .await
        .expect("ran");
    let again = gate
        .guard(&unit)
        .replay()
        .run(async { Err::<(), Rejected>(Rejected::InFlight) })
        .await;
    assert!(again.is_ok(), "a kept () is replayed: {again:?}");
}

/// The batch: "A later copy of an identity ... gets what `Gate::run` gives
/// a duplicate made once the earlier copy has finished", with replay the
/// value; "the copy of a failure that released its slot runs"; a copy
/// with another payload is refused `KeyReused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_with_duplicates_answers_each_copy_as_a_later_duplicate() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = |name: &str| Identity::new("rt_batch_dups").part(name);

    let mut batch: Batch<(&str, u64)> = Batch::new();
    batch
        .push(("a", 1), id("a"))
        .push(("b", 2), id("b"))
        .push(("a", 3), id("a"))
        .push(("a", 4), id("a"));
    let answers = gate
        .guard_batch(batch)
        .replay()
        .run(|(_, n)| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(n * 10)
            }
        })
        .await;
    let values: Vec<u64> = answers
        .into_iter()
        .map(|a| a.expect("ran or replayed"))
        .collect();
    assert_eq!(values, [10, 20, 10, 10], "the copies get the first value");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Released, kept, in doubt, another payload: each copy as a redelivery.
    let mut batch: Batch<&str> = Batch::new();
    batch
        .push("released", id("released"))
        .push("kept", id("kept"))
        .push("doubt", id("doubt"))
        .push_fingerprinted("fp", id("fp"), fp(1))
        .push("released", id("released"))
        .push("kept", id("kept"))
        .push("doubt", id("doubt"))
        .push_fingerprinted("fp", id("fp"), fp(2));
    let tries = Arc::new(AtomicUsize::new(0));
    let answers = gate
        .guard_batch(batch)
        .disposition(classify)
        .run(|name| {
            let tries = Arc::clone(&tries);
            async move {
                match name {
                    "released" if tries.fetch_add(1, Ordering::SeqCst) == 0 => {
                        Err(Failure::Rejected(Rejected::InFlight))
                    }
                    "kept" => Err(Failure::Declined),
                    "doubt" => Err(Failure::Doubtful),
                    _ => Ok(name.to_owned()),
                }
            }
        })
        .await;
    let seen: Vec<String> = answers.iter().map(|a| format!("{a:?}")).collect();
    assert!(
        matches!(answers[0], Err(Failure::Rejected(Rejected::InFlight))),
        "{seen:?}"
    );
    assert!(matches!(answers[1], Err(Failure::Declined)), "{seen:?}");
    assert!(matches!(answers[2], Err(Failure::Doubtful)), "{seen:?}");
    assert!(matches!(&answers[3], Ok(v) if v == "fp"), "{seen:?}");
    assert!(
        matches!(&answers[4], Ok(v) if v == "released"),
        "the copy of a released failure runs: {seen:?}"
    );
    assert!(
        matches!(answers[5], Err(Failure::Rejected(Rejected::AlreadyFailed))),
        "{seen:?}"
    );
    assert!(
        matches!(answers[6], Err(Failure::Rejected(Rejected::InDoubt))),
        "{seen:?}"
    );
    assert!(
        matches!(answers[7], Err(Failure::Rejected(Rejected::KeyReused))),
        "{seen:?}"
    );
}

/// A classifier that panics. The docs promise for a panicking body: "its
/// claim is then left `pending`" (fail closed); a classifier runs where
/// the body's outcome is recorded, so its panic must not release the slot
/// (or record anything else) either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disposition_that_panics_leaves_the_claim_pending() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_panicking_classifier").part(1);
    let panicked = AssertUnwindSafe(
        gate.guard(&id)
            .disposition(|_: &Failure| -> Disposition { panic!("the classifier panicked") })
            .run(async { Err::<(), _>(Failure::Declined) }),
    )
    .catch_unwind()
    .await;
    assert!(panicked.is_err(), "the panic reaches the caller");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("pending"));
    let retry = gate.guard(&id).run(async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(retry, Err(Rejected::InFlight)), "{retry:?}");
}

/// The same in a batch, where the docs promise of a panicking body: "The
/// other bodies of the batch still run, and every outcome that finished is
/// recorded; then the panic resumes." A classifier that panics on one
/// item's `Err` should hold that item alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disposition_that_panics_in_a_batch_holds_only_its_own_item() {
    let gate = testing::gate().await;
    let item = |n: u32| Identity::new("rt_panicking_classifier_batch").part(n);
    let batch: Batch<u32> = (1..=3).map(|n| (n, item(n))).collect();
    let panicked = AssertUnwindSafe(
        gate.guard_batch(batch)
            .disposition(|_: &Failure| -> Disposition { panic!("the classifier panicked") })
            .run(|n| async move {
                if n == 2 {
                    Err(Failure::Declined)
                } else {
                    Ok(n)
                }
            }),
    )
    .catch_unwind()
    .await;
    assert!(panicked.is_err(), "the panic reaches the caller");
    let states = [
        state(&gate, &item(1)).await,
        state(&gate, &item(2)).await,
        state(&gate, &item(3)).await,
    ];
    assert_eq!(states[1].as_deref(), Some("pending"), "{states:?}");
    assert_eq!(
        (states[0].as_deref(), states[2].as_deref()),
        (Some("success"), Some("success")),
        "as with a panicking body, the finished items are recorded: {states:?}"
    );
}

/// "An absent identity (a `None` key part) yields an ungated claim whose
/// records do nothing", and a run that is not gated: on every end, raced,
/// in a transaction, in a batch, with replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_absent_identity_runs_ungated_on_every_end() {
    let pool = testing::pool_with(RACERS as u32 + 2).await;
    let gate = testing::gate_on(pool.clone()).await;
    let id = Identity::new("rt_absent").part("x").part(None::<&str>);
    let runs = Arc::new(AtomicUsize::new(0));

    let report = testing::race(RACERS, || {
        gate.guard(&id)
            .lease(LEASE)
            .replay()
            .run(counted(&runs, "v"))
    })
    .await;
    assert_eq!(report.ungated(), RACERS, "every racer ran ungated");
    assert_eq!(runs.load(Ordering::SeqCst), RACERS);

    let claim = gate.guard(&id).claim().await.expect("ungated claim");
    assert!(!claim.is_gated());
    assert_eq!(claim.address(), None);
    claim.settle().await.expect("does nothing");
    match gate.guard(&id).replay().claim_or_replay::<String>().await {
        Ok(ClaimOrReplay::Won(claim)) => {
            assert!(!claim.is_gated());
            claim
                .settle_value(&"v".to_owned())
                .await
                .expect("does nothing");
        }
        other => panic!("an absent identity is never replayed: {other:?}"),
    }
    let mut tx = pool.begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("ungated");
    assert!(!claim.is_gated());
    claim
        .dispose(&mut tx, Disposition::Keep)
        .await
        .expect("does nothing");
    tx.commit().await.expect("commit");

    let batch: Batch<u32> = (0..3).map(|n| (n, id.clone())).collect();
    let answers = gate
        .guard_batch(batch)
        .replay()
        .run(|n| async move { Ok::<_, Rejected>(n) })
        .await;
    let values: Vec<u32> = answers.into_iter().map(|a| a.expect("ran")).collect();
    assert_eq!(values, [0, 1, 2], "every copy of an absent identity runs");
    assert_eq!(state(&gate, &id).await, None, "nothing was ever written");
}

/// `fingerprint`: "a duplicate whose fingerprint differs from the claim's
/// is refused `KeyReused` ... never run or handed another's value"; and
/// "a claim made without a fingerprint never replays to one made with it,
/// nor the other way round (both get `AlreadyDone`)".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fingerprint_differences_are_refused_never_replayed() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let runs = Arc::new(AtomicUsize::new(0));

    // In flight: another fingerprint is a reused key, the same one in flight.
    let held = Identity::new("rt_fp").part("held");
    let claim = gate
        .guard(&held)
        .fingerprint(fp(1))
        .claim()
        .await
        .expect("won");
    let other = gate.guard(&held).fingerprint(fp(2)).claim().await;
    assert!(matches!(other, Err(Rejected::KeyReused)), "{other:?}");
    let same = gate.guard(&held).fingerprint(fp(1)).claim().await;
    assert!(matches!(same, Err(Rejected::InFlight)), "{same:?}");
    // A waiting duplicate with another fingerprint does not wait to be told.
    let waited = tokio::time::timeout(
        Duration::from_secs(2),
        gate.guard(&held)
            .fingerprint(fp(2))
            .wait(Duration::from_secs(30))
            .run(counted(&runs, "x")),
    )
    .await
    .expect("a reused key is refused without waiting");
    assert!(matches!(waited, Err(Rejected::KeyReused)), "{waited:?}");
    claim.settle().await.expect("settled");

    // Settled with a value and no fingerprint; asked with one.
    let bare = Identity::new("rt_fp").part("bare");
    let first = gate
        .guard(&bare)
        .replay()
        .run(counted(&runs, "secret"))
        .await;
    assert_eq!(first.expect("ran"), "secret");
    let with = gate
        .guard(&bare)
        .fingerprint(fp(1))
        .replay()
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(with, Err(Rejected::AlreadyDone)), "{with:?}");

    // Settled with a fingerprint; asked without one.
    let printed = Identity::new("rt_fp").part("printed");
    let first = gate
        .guard(&printed)
        .fingerprint(fp(1))
        .replay()
        .run(counted(&runs, "secret"))
        .await;
    assert_eq!(first.expect("ran"), "secret");
    let without = gate.guard(&printed).replay().run(counted(&runs, "x")).await;
    assert!(matches!(without, Err(Rejected::AlreadyDone)), "{without:?}");
    let other = gate
        .guard(&printed)
        .fingerprint(fp(2))
        .replay()
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(other, Err(Rejected::KeyReused)), "{other:?}");
    // An empty fingerprint is a fingerprint, not the absence of one.
    let empty = gate
        .guard(&printed)
        .fingerprint(Fingerprint::new())
        .replay()
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(empty, Err(Rejected::KeyReused)), "{empty:?}");

    // In a transaction: the committed claim's fingerprint is checked too.
    let in_tx = Identity::new("rt_fp").part("tx");
    let mut tx = pool.begin().await.expect("begin");
    gate.guard(&in_tx)
        .tx(&mut tx)
        .fingerprint(fp(1))
        .replay()
        .run(async |_: &mut PgConnection| Ok::<_, Rejected>(1))
        .await
        .expect("ran");
    tx.commit().await.expect("commit");
    let mut tx = pool.begin().await.expect("begin");
    let other = gate
        .guard(&in_tx)
        .fingerprint(fp(2))
        .tx(&mut tx)
        .replay()
        .run(async |_: &mut PgConnection| Ok::<_, Rejected>(2))
        .await;
    tx.rollback().await.expect("rollback");
    assert!(matches!(other, Err(Rejected::KeyReused)), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "no refused duplicate ran");
}

/// `replay`: "any value it can write is kept, NUL characters included";
/// large values too (32 MiB here). NUL in a key part is just another key;
/// NUL in an account is refused before any statement, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_values_are_kept_whole_and_hostile_scopes_refused() {
    let gate = testing::gate().await;

    let huge = "x\0y\u{1F600}".repeat(32 * 1024 * 1024 / 8);
    let id = Identity::new("rt_hostile").part("huge");
    let first = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>(huge.clone()) })
        .await;
    assert_eq!(first.expect("ran").len(), huge.len());
    let again = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>(String::new()) })
        .await;
    assert!(
        again.expect("replayed") == huge,
        "the value came back whole"
    );

    let nul = Identity::new("rt_hostile").part("a\0b");
    let plain = Identity::new("rt_hostile").part("ab");
    for (id, value) in [(&nul, "with NUL"), (&plain, "without")] {
        let ran = gate
            .guard(id)
            .replay()
            .run(async { Ok::<_, Rejected>(value.to_owned()) })
            .await;
        assert_eq!(ran.expect("each key is its own"), value);
    }
    let again = gate
        .guard(&nul)
        .replay()
        .run(async { Ok::<_, Rejected>(String::new()) })
        .await;
    assert_eq!(again.expect("replayed"), "with NUL");

    let hostile = gate.account("tenant\0evil");
    let runs = Arc::new(AtomicUsize::new(0));
    let answer = hostile
        .guard(&id)
        .on_unavailable(OnUnavailable::Run)
        .run(counted(&runs, "x"))
        .await;
    assert!(
        matches!(answer, Err(Rejected::InvalidScope { .. })),
        "{answer:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "an invalid scope never runs"
    );
}

/// Durations at the edges: a lease "must be more than zero ... and at most
/// `idem::MAX_LEASE`; otherwise every claim with this mode is refused with
/// `Rejected::InvalidOption` before any statement runs (never as an
/// outage, so never failing open)". A wait of `Duration::MAX` is input
/// too: it must not panic the library.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durations_at_the_edges_are_refused_or_honoured_never_a_panic() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = Identity::new("rt_edges").part(1);

    for lease in [Duration::ZERO, Duration::MAX] {
        let answer = gate
            .guard(&id)
            .on_unavailable(OnUnavailable::Run)
            .lease(lease)
            .run(counted(&runs, "x"))
            .await;
        assert!(
            matches!(answer, Err(Rejected::InvalidOption { .. })),
            "lease {lease:?}: {answer:?}"
        );
        let claim = gate.guard(&id).lease(lease).claim().await;
        assert!(
            matches!(claim, Err(Rejected::InvalidOption { .. })),
            "lease {lease:?}: {claim:?}"
        );
        let batch: Batch<u32> = std::iter::once((1, id.clone())).collect();
        let answers = gate
            .guard_batch(batch)
            .lease(lease)
            .run(|_| counted(&runs, "x"))
            .await;
        assert!(
            matches!(answers[0], Err(Rejected::InvalidOption { .. })),
            "batch lease {lease:?}: {answers:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // A duplicate waiting "forever" on a claim that then settles.
    let held = gate.guard(&id).claim().await.expect("won");
    let waiter = {
        let (gate, id, runs) = (gate.clone(), id.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            gate.guard(&id)
                .wait(Duration::MAX)
                .run(counted(&runs, "x"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.settle().await.expect("settled");
    let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter hears the outcome")
        .expect("the waiter must not panic on a wait of Duration::MAX");
    assert!(matches!(answer, Err(Rejected::AlreadyDone)), "{answer:?}");
}

/// "When that future is dropped ... Its claim is then left `pending`, as
/// for a panic: without a lease every retry is refused `InFlight` ...;
/// with one, the retry takes the claim over when it expires ... (or, with
/// `on_expiry = "in_doubt"`, finds it in doubt)." In a transaction the
/// rollback frees it; detached, the body runs on and is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_future_dropped_mid_body_fails_closed_on_every_end() {
    let pool = testing::pool_with(6).await;
    let gate = testing::gate_on(pool.clone()).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let stuck = || async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, Rejected>("never".to_owned())
    };
    let short = Duration::from_secs(1);

    let plain = Identity::new("rt_dropped").part("plain");
    let leased = Identity::new("rt_dropped").part("leased");
    let doubted = Identity::new("rt_dropped").part("in_doubt");
    let cut = Duration::from_millis(300);
    assert!(
        tokio::time::timeout(cut, gate.guard(&plain).replay().run(stuck()))
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(cut, gate.guard(&leased).lease(short).run(stuck()))
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(
            cut,
            gate.guard(&doubted)
                .lease(short)
                .on_expiry(OnExpiry::InDoubt)
                .run(stuck())
        )
        .await
        .is_err()
    );
    for id in [&plain, &leased, &doubted] {
        assert_eq!(state(&gate, id).await.as_deref(), Some("pending"));
    }
    let retry = gate.guard(&plain).run(counted(&runs, "x")).await;
    assert!(matches!(retry, Err(Rejected::InFlight)), "{retry:?}");
    tokio::time::sleep(short + Duration::from_millis(300)).await;
    let retry = gate
        .guard(&leased)
        .lease(short)
        .run(counted(&runs, "taken"))
        .await;
    assert_eq!(retry.expect("taken over"), "taken");
    let retry = gate
        .guard(&doubted)
        .lease(short)
        .on_expiry(OnExpiry::InDoubt)
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(retry, Err(Rejected::InDoubt)), "{retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // In a transaction, then rolled back: the slot is free.
    let in_tx = Identity::new("rt_dropped").part("tx");
    let mut tx = pool.begin().await.expect("begin");
    let dropped = tokio::time::timeout(
        cut,
        gate.guard(&in_tx)
            .tx(&mut tx)
            .run(async |_: &mut PgConnection| {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, Rejected>(())
            }),
    )
    .await;
    assert!(dropped.is_err());
    tx.rollback().await.expect("rollback");
    let retry = gate
        .guard(&in_tx)
        .run(async { Ok::<_, Rejected>(()) })
        .await;
    assert!(retry.is_ok(), "{retry:?}");

    // Detached: the caller leaves, the body runs on and is recorded.
    let detached = Detached::new();
    let away = Identity::new("rt_dropped").part("detached");
    let slow = {
        let runs = Arc::clone(&runs);
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>("done".to_owned())
        }
    };
    let left = tokio::time::timeout(
        Duration::from_millis(100),
        gate.guard(&away).replay().run_detached(&detached, slow),
    )
    .await;
    assert!(left.is_err(), "the caller left");
    detached.shutdown(Duration::from_secs(10)).await;
    assert_eq!(state(&gate, &away).await.as_deref(), Some("success"));
    let retry = gate
        .guard(&away)
        .replay()
        .run(async { Ok::<_, Rejected>(String::new()) })
        .await;
    assert_eq!(retry.expect("replayed"), "done");
}

/// "a panic ... leaves it `pending`, refused: idem fails closed"; in a
/// transaction, the panic unwinds through the caller's transaction, which
/// rolls back with the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_panics_fails_closed_on_the_pool_and_rolls_back_in_a_transaction() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;

    let id = Identity::new("rt_panics").part("pool");
    let panicked = AssertUnwindSafe(gate.guard(&id).lease(LEASE).replay().run(async {
        if id.part_count() > 0 {
            panic!("the body panicked");
        }
        Ok::<u32, Rejected>(1)
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    assert_eq!(state(&gate, &id).await.as_deref(), Some("pending"));
    let retry = gate.guard(&id).run(async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(retry, Err(Rejected::InFlight)), "{retry:?}");

    let in_tx = Identity::new("rt_panics").part("tx");
    let panicked = AssertUnwindSafe(async {
        let mut tx = pool.begin().await.expect("begin");
        let _: Result<(), Rejected> = gate
            .guard(&in_tx)
            .tx(&mut tx)
            .run(async |_: &mut PgConnection| -> Result<(), Rejected> {
                panic!("the body panicked")
            })
            .await;
        tx.commit().await.expect("never reached");
    })
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    let retry = tokio::time::timeout(
        Duration::from_secs(10),
        gate.guard(&in_tx).run(async { Ok::<_, Rejected>(()) }),
    )
    .await
    .expect("the unwound transaction must not hold the slot");
    assert!(retry.is_ok(), "{retry:?}");
}

/// Backends terminated for real (`pg_terminate_backend`). On the pool, a
/// record "repeated after a transient failure": the settle lands on a new
/// connection. In a transaction, the server's rollback takes the claim
/// with it: the record fails (never a false `Ok`), and the slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminated_backend_loses_nothing_on_the_pool_and_everything_in_a_transaction() {
    let name = testing::unique_name("rt_killed");
    let pool = named_pool(&name, 4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let admin = testing::pool_with(2).await;

    // On the pool: killed while the body runs.
    let id = Identity::new("rt_killed").part("pool");
    let ran = gate
        .guard(&id)
        .lease(LEASE)
        .replay()
        .run(async {
            assert!(terminate_backends(&admin, &name).await >= 1);
            Ok::<_, Rejected>("kept".to_owned())
        })
        .await;
    assert_eq!(ran.expect("the settle lands on a new connection"), "kept");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("success"));

    // In a transaction: a claim whose backend died, then settled.
    let in_tx = Identity::new("rt_killed").part("tx_claim");
    let mut tx = pool.begin().await.expect("begin");
    let claim = gate.guard(&in_tx).tx(&mut tx).claim().await.expect("won");
    assert!(terminate_backends(&admin, &name).await >= 1);
    let settled = tokio::time::timeout(Duration::from_secs(10), claim.settle(&mut tx))
        .await
        .expect("a settle on a dead transaction fails, it does not hang");
    assert!(settled.is_err(), "nothing was recorded: {settled:?}");
    drop(tx);
    assert_eq!(
        state(&gate, &in_tx).await,
        None,
        "the server rolled it back"
    );

    // In a transaction: the body's backend dies under it.
    let body_killed = Identity::new("rt_killed").part("tx_run");
    let mut tx = pool.begin().await.expect("begin");
    let answer = gate
        .guard(&body_killed)
        .tx(&mut tx)
        .replay()
        .run(async |_: &mut PgConnection| {
            assert!(terminate_backends(&admin, &name).await >= 1);
            Ok::<_, Rejected>("lost with the transaction".to_owned())
        })
        .await;
    // "An outcome that cannot be recorded inside the transaction ... is
    // returned as that refusal, never as the body's `Ok`": nothing of it
    // happened.
    assert!(
        matches!(answer, Err(Rejected::Unavailable { .. })),
        "the lost transaction is an outage, not the body's Ok: {answer:?}"
    );
    assert!(
        tx.commit().await.is_err(),
        "the dead transaction cannot commit"
    );
    assert_eq!(state(&gate, &body_killed).await, None);
    let retry = gate
        .guard(&body_killed)
        .replay()
        .run(async { Ok::<_, Rejected>("ran again".to_owned()) })
        .await;
    assert_eq!(retry.expect("the retry runs"), "ran again");
}

/// The TCP connection cut through the fault proxy. "If the store cannot be
/// reached the claim is refused `Unavailable` and the body never runs"
/// (unless `on_unavailable(Run)`); a settle that cannot land "stays
/// `pending` (fail closed)"; "A settle repeated after its reply was lost
/// finds the row as it wrote it, and is `Ok` too", value and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_connection_fails_closed_and_a_lost_settle_reply_keeps_the_value() {
    let mut proxy = Proxy::start().await;
    let gate = testing::gate_on(pool_through(&proxy).await).await;
    let direct = Gate::connect(testing::pool_with(2).await)
        .await
        .expect("a direct gate")
        .account(gate.account_name());
    let runs = Arc::new(AtomicUsize::new(0));

    // A lost settle reply: the retried settle finds its own row.
    let lost = Identity::new("rt_cut").part("lost_reply");
    assert!(proxy.lose_next_reply(Statement::Settle));
    let ran = gate
        .guard(&lost)
        .lease(LEASE)
        .replay()
        .run(counted(&runs, "receipt"))
        .await;
    assert_eq!(ran.expect("the settle's retry is Ok"), "receipt");
    let again = gate.guard(&lost).replay().run(counted(&runs, "x")).await;
    assert_eq!(again.expect("the kept value"), "receipt");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Claimed, then the connection cut before the settle.
    let held = Identity::new("rt_cut").part("held");
    let claim = gate.guard(&held).lease(LEASE).claim().await.expect("won");
    proxy.cut().await;
    let settled = claim.settle().await;
    assert!(
        matches!(settled, Err(Rejected::Unavailable { .. })),
        "{settled:?}"
    );
    assert_eq!(state(&direct, &held).await.as_deref(), Some("pending"));

    // Cut: refused, never run; fail-open runs ungated.
    let down = Identity::new("rt_cut").part("down");
    let refused = gate.guard(&down).replay().run(counted(&runs, "x")).await;
    assert!(
        matches!(refused, Err(Rejected::Unavailable { .. })),
        "{refused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let open = gate
        .guard(&down)
        .on_unavailable(OnUnavailable::Run)
        .replay()
        .run(counted(&runs, "open"))
        .await;
    assert_eq!(open.expect("failed open"), "open");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    proxy.resume().await;
    let dup = gate.guard(&held).claim().await;
    assert!(matches!(dup, Err(Rejected::InFlight)), "{dup:?}");
    assert_eq!(
        state(&direct, &down).await,
        None,
        "the open run wrote nothing"
    );
}

// The attribute against the same guard by hand: one function per
// combination, and the hand-written twin of each, run through the same
// steps on gates of their own; then each side's rows answered by the other.

#[idempotent(key = "key", action = "rt_cmp_plain")]
async fn attr_plain(
    gate: &Gate,
    key: &str,
    cents: i64,
    fail: Option<Failure>,
) -> Result<i64, Failure> {
    fail.map_or(Ok(cents), Err)
}

#[idempotent(
    key = "key",
    action = "rt_cmp_replay_fp",
    replay,
    fingerprint = "cents"
)]
async fn attr_replay_fp(
    gate: &Gate,
    key: &str,
    cents: i64,
    fail: Option<Failure>,
) -> Result<i64, Failure> {
    fail.map_or(Ok(cents), Err)
}

#[idempotent(
    key = "key",
    action = "rt_cmp_lease",
    lease = "30s",
    on_expiry = "in_doubt",
    disposition = classify
)]
async fn attr_lease_disposed(
    gate: &Gate,
    key: &str,
    cents: i64,
    fail: Option<Failure>,
) -> Result<i64, Failure> {
    fail.map_or(Ok(cents), Err)
}

#[idempotent(key = "key", action = "rt_cmp_wait", replay, wait = "2s", disposition = classify)]
async fn attr_wait_replay_disposed(
    gate: &Gate,
    key: &str,
    cents: i64,
    fail: Option<Failure>,
) -> Result<i64, Failure> {
    fail.map_or(Ok(cents), Err)
}

#[idempotent(
    key = "key",
    action = "rt_cmp_async",
    outcome_commit = "async",
    on_unavailable = "run",
    replay,
    fingerprint = "cents"
)]
async fn attr_async_open(
    gate: &Gate,
    key: &str,
    cents: i64,
    fail: Option<Failure>,
) -> Result<i64, Failure> {
    fail.map_or(Ok(cents), Err)
}

#[idempotent(
    key = "key",
    action = "rt_cmp_tx",
    tx = tx,
    replay,
    fingerprint = "cents",
    disposition = classify
)]
async fn attr_tx(
    gate: &Gate,
    tx: &mut Transaction<'_, Postgres>,
    key: &str,
    cents: i64,
    fail: Option<Failure>,
) -> Result<i64, Failure> {
    sqlx::query("SELECT 1")
        .execute(&mut **tx)
        .await
        .map_err(|_| Failure::Database)?;
    fail.map_or(Ok(cents), Err)
}

/// A step: the key, the payload, and the body's failure if it fails.
type Step = (&'static str, i64, Option<fn() -> Failure>);

/// The same steps for every combination: a success and its duplicates
/// (same payload, another payload), a released failure then its retry, a
/// kept failure, a doubtful one.
const STEPS: &[Step] = &[
    ("ok", 5, None),
    ("ok", 5, None),
    ("ok", 7, None),
    (
        "released",
        5,
        Some(|| Failure::Rejected(Rejected::InFlight)),
    ),
    ("released", 5, None),
    ("kept", 5, Some(|| Failure::Declined)),
    ("kept", 5, None),
    ("doubt", 5, Some(|| Failure::Doubtful)),
    ("doubt", 5, None),
];

/// Runs `STEPS` through `call`; what each returned, then each key's row.
macro_rules! steps {
    (|$key:ident, $cents:ident, $fail:ident| $call:expr) => {{
        let mut seen = Vec::new();
        for (key, cents, fail) in STEPS {
            let ($key, $cents, $fail) = (*key, *cents, fail.map(|f| f()));
            seen.push(format!("{key} {cents}: {:?}", $call.await));
        }
        seen
    }};
}

/// The rows a comparison left, by key, under `action`.
async fn rows_of(gate: &Gate, action: &str) -> Vec<Option<String>> {
    let mut rows = Vec::new();
    for key in ["ok", "released", "kept", "doubt"] {
        rows.push(state(gate, &Identity::new(action).part(key)).await);
    }
    rows
}

/// "`#[idempotent]` expands to the guard": every combination answers
/// the same steps as the same guard by hand, leaves the same rows, and a
/// row one wrote is answered by the other as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_attribute_combination_behaves_as_the_same_guard_by_hand() {
    let pool = testing::pool_with(4).await;
    let by_attr = testing::gate_on(pool.clone()).await;
    let by_hand = testing::gate_on(pool.clone()).await;
    let body = |cents: i64, fail: Option<Failure>| async move { fail.map_or(Ok(cents), Err) };
    let id = |action: &str, key: &str| Identity::new(action).part(key);

    let compare = async |action: &str, attr: Vec<String>, hand: Vec<String>| {
        assert_eq!(attr, hand, "{action}: the attribute and the guard differ");
        assert_eq!(
            rows_of(&by_attr, action).await,
            rows_of(&by_hand, action).await,
            "{action}: rows differ"
        );
    };

    let a = steps!(|key, cents, fail| attr_plain(&by_attr, key, cents, fail));
    let h = steps!(|key, cents, fail| by_hand
        .guard(&id("rt_cmp_plain", key))
        .run(body(cents, fail)));
    compare("rt_cmp_plain", a, h).await;

    let a = steps!(|key, cents, fail| attr_replay_fp(&by_attr, key, cents, fail));
    let h = steps!(|key, cents, fail| by_hand
        .guard(&id("rt_cmp_replay_fp", key))
        .replay()
        .fingerprint(fp(cents))
        .run(body(cents, fail)));
    compare("rt_cmp_replay_fp", a, h).await;

    let a = steps!(|key, cents, fail| attr_lease_disposed(&by_attr, key, cents, fail));
    let h = steps!(|key, cents, fail| by_hand
        .guard(&id("rt_cmp_lease", key))
        .disposition(classify)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .run(body(cents, fail)));
    compare("rt_cmp_lease", a, h).await;

    let a = steps!(|key, cents, fail| attr_wait_replay_disposed(&by_attr, key, cents, fail));
    let h = steps!(|key, cents, fail| by_hand
        .guard(&id("rt_cmp_wait", key))
        .wait(Duration::from_secs(2))
        .disposition(classify)
        .replay()
        .run(body(cents, fail)));
    compare("rt_cmp_wait", a, h).await;

    let a = steps!(|key, cents, fail| attr_async_open(&by_attr, key, cents, fail));
    let h = steps!(|key, cents, fail| by_hand
        .guard(&id("rt_cmp_async", key))
        .fingerprint(fp(cents))
        .replay()
        .on_unavailable(OnUnavailable::Run)
        .outcome_commit(OutcomeCommit::Async)
        .run(body(cents, fail)));
    compare("rt_cmp_async", a, h).await;

    let a = steps!(|key, cents, fail| async {
        let mut tx = pool.begin().await.expect("begin");
        let answer = attr_tx(&by_attr, &mut tx, key, cents, fail).await;
        tx.commit().await.expect("commit");
        answer
    });
    let h = steps!(|key, cents, fail| async {
        let mut tx = pool.begin().await.expect("begin");
        let answer = by_hand
            .guard(&id("rt_cmp_tx", key))
            .fingerprint(fp(cents))
            .tx(&mut tx)
            .disposition(classify)
            .replay()
            .run(async |conn: &mut PgConnection| {
                sqlx::query("SELECT 1")
                    .execute(conn)
                    .await
                    .map_err(|_| Failure::Database)?;
                fail.map_or(Ok(cents), Err)
            })
            .await;
        tx.commit().await.expect("commit");
        answer
    });
    assert_eq!(
        a[2..]
            .iter()
            .map(|s| s.split(": ").nth(1).unwrap_or(""))
            .collect::<Vec<_>>(),
        [
            "Err(Rejected(KeyReused))",
            "Err(Rejected(InFlight))",
            "Ok(5)",
            "Err(Declined)",
            "Err(Rejected(AlreadyFailed))",
            "Err(Doubtful)",
            "Err(Rejected(InDoubt))",
        ],
        "{a:?}"
    );
    compare("rt_cmp_tx", a, h).await;

    // Crossed: what the attribute kept, the guard by hand replays, and the
    // other way round; the identities are the same.
    let crossed = by_attr
        .guard(&id("rt_cmp_replay_fp", "ok"))
        .fingerprint(fp(5))
        .replay()
        .run(async { Ok::<i64, Failure>(-1) })
        .await;
    assert!(matches!(crossed, Ok(5)), "{crossed:?}");
    let crossed = attr_replay_fp(&by_hand, "ok", 5, None).await;
    assert!(matches!(crossed, Ok(5)), "{crossed:?}");
    let crossed = attr_lease_disposed(&by_hand, "kept", 5, None).await;
    assert!(
        matches!(crossed, Err(Failure::Rejected(Rejected::AlreadyFailed))),
        "{crossed:?}"
    );
}

/// The batch's own promise for a panicking body, beside R1: "every outcome
/// that finished is recorded; then the panic resumes".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_panics_in_a_batch_holds_only_its_own_item() {
    let gate = testing::gate().await;
    let item = |n: u32| Identity::new("rt_panicking_batch_body").part(n);
    let batch: Batch<u32> = (1..=3).map(|n| (n, item(n))).collect();
    let panicked = AssertUnwindSafe(gate.guard_batch(batch).run(|n| async move {
        if n == 2 {
            panic!("the body panicked");
        }
        Ok::<_, Rejected>(n)
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err(), "the panic reaches the caller");
    let states = [
        state(&gate, &item(1)).await,
        state(&gate, &item(2)).await,
        state(&gate, &item(3)).await,
    ];
    assert_eq!(
        states.map(|s| s.unwrap_or_default()),
        ["success", "pending", "success"].map(str::to_owned)
    );
}

/// A map with non-string keys, which serde_json cannot write.
fn unwritable() -> std::collections::HashMap<(u8, u8), u8> {
    [((1, 2), 3)].into_iter().collect()
}

/// `replay`: "A value that fails to serialize ... never loses the
/// success: the claim is settled without a value, a tracing error says
/// so, and duplicates are refused with `Rejected::AlreadyDone`. So is a
/// duplicate whose stored value no longer deserializes". On every end
/// that keeps a value: `run`, `Claim::settle_value`, `TxClaim::settle_value`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_value_that_cannot_be_kept_never_loses_the_success() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let runs = Arc::new(AtomicUsize::new(0));

    let ran = Identity::new("rt_unkeepable").part("run");
    let first = gate
        .guard(&ran)
        .replay()
        .run(async { Ok::<_, Rejected>(unwritable()) })
        .await;
    assert_eq!(first.expect("the success is returned"), unwritable());
    assert_eq!(state(&gate, &ran).await.as_deref(), Some("success"));
    let dup = gate
        .guard(&ran)
        .replay()
        .run({
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(unwritable())
            }
        })
        .await;
    assert!(matches!(dup, Err(Rejected::AlreadyDone)), "{dup:?}");

    let claimed = Identity::new("rt_unkeepable").part("claim");
    let claim = gate.guard(&claimed).claim().await.expect("won");
    claim.settle_value(&unwritable()).await.expect("settled");
    let dup = gate
        .guard(&claimed)
        .replay()
        .claim_or_replay::<std::collections::HashMap<(u8, u8), u8>>()
        .await;
    assert!(matches!(dup, Err(Rejected::AlreadyDone)), "{dup:?}");

    let in_tx = Identity::new("rt_unkeepable").part("tx");
    let mut tx = pool.begin().await.expect("begin");
    let claim = gate.guard(&in_tx).tx(&mut tx).claim().await.expect("won");
    claim
        .settle_value(&mut tx, &unwritable())
        .await
        .expect("settled");
    tx.commit().await.expect("commit");
    assert_eq!(state(&gate, &in_tx).await.as_deref(), Some("success"));

    // NaN is written as `null`, which no f64 reads back.
    let nan = Identity::new("rt_unkeepable").part("nan");
    let first = gate
        .guard(&nan)
        .replay()
        .run(async { Ok::<f64, Rejected>(f64::NAN) })
        .await;
    assert!(first.expect("ran").is_nan());
    let dup = gate
        .guard(&nan)
        .replay()
        .run(async { Ok::<f64, Rejected>(1.0) })
        .await;
    assert!(matches!(dup, Err(Rejected::AlreadyDone)), "{dup:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no duplicate ran");
}

/// Races at one instant on the ends `guard.rs` races less: `claim_or_replay`
/// (one wins, then everyone is handed the kept value), transactions with
/// replay (duplicates wait for the first, then get its value), and two
/// overlapping batches (each item's body once in all).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn races_on_claim_or_replay_replayed_transactions_and_overlapping_batches() {
    let pool = testing::pool_with(RACERS as u32 * 2 + 2).await;
    let gate = testing::gate_on(pool.clone()).await;

    let id = Identity::new("rt_race").part("claim_or_replay");
    let barrier = tokio::sync::Barrier::new(RACERS);
    let answers = futures_util::future::join_all((0..RACERS).map(|_| async {
        barrier.wait().await;
        gate.guard(&id)
            .lease(LEASE)
            .replay()
            .claim_or_replay::<String>()
            .await
    }))
    .await;
    let mut won = Vec::new();
    for answer in answers {
        match answer {
            Ok(ClaimOrReplay::Won(claim)) => won.push(claim),
            Err(Rejected::InFlight) => {}
            other => panic!("a racer got {other:?}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one racer wins");
    won.pop()
        .expect("one")
        .settle_value(&"kept".to_owned())
        .await
        .expect("settled");
    let replays = testing::race(RACERS, || async {
        match gate.guard(&id).replay().claim_or_replay::<String>().await? {
            ClaimOrReplay::Replayed(value) => Ok::<_, Rejected>(value),
            ClaimOrReplay::Won(_) => panic!("a settled slot was won again"),
        }
    })
    .await;
    assert_eq!(replays.errors().len(), 0, "{:?}", replays.errors());

    // In transactions, with replay.
    let in_tx = Identity::new("rt_race").part("tx_replay");
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = tokio::sync::Barrier::new(RACERS);
    let answers = futures_util::future::join_all((0..RACERS).map(|_| async {
        barrier.wait().await;
        let mut tx = pool.begin().await.expect("begin");
        let answer = gate
            .guard(&in_tx)
            .tx(&mut tx)
            .replay()
            .run(async |_: &mut PgConnection| {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, Rejected>("in tx".to_owned())
            })
            .await;
        tx.commit().await.expect("commit");
        answer
    }))
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one body ran: {answers:?}");
    for answer in &answers {
        assert!(
            matches!(answer, Ok(v) if v == "in tx"),
            "every duplicate waits, then gets the value: {answers:?}"
        );
    }

    // Two batches that overlap, raced.
    let runs = Arc::new(AtomicUsize::new(0));
    let item = |n: u32| Identity::new("rt_race_batch").part(n);
    let barrier = tokio::sync::Barrier::new(2);
    let batches = [1..=6, 4..=9].map(|range| {
        let batch: Batch<u32> = range.map(|n| (n, item(n))).collect();
        let (gate, barrier, runs) = (&gate, &barrier, &runs);
        async move {
            barrier.wait().await;
            gate.guard_batch(batch)
                .replay()
                .run(|n| {
                    let runs = Arc::clone(runs);
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, Rejected>(n)
                    }
                })
                .await
        }
    });
    let answers = futures_util::future::join_all(batches).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        9,
        "each of 9 items once: {answers:?}"
    );
}

/// `TxClaim::dispose`: "Records a failure as `disposition` says, on the
/// claim's transaction": kept or held in doubt once committed, gone when
/// rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tx_claim_disposed_holds_what_it_says_once_committed() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    for (disposition, committed, expected) in [
        (Disposition::Keep, true, Some("failed")),
        (Disposition::InDoubt, true, Some("in_doubt")),
        (Disposition::Release, true, None),
        (Disposition::Keep, false, None),
        (Disposition::InDoubt, false, None),
    ] {
        let id = Identity::new("rt_tx_dispose")
            .part(format!("{disposition:?}"))
            .part(committed);
        let mut tx = pool.begin().await.expect("begin");
        let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("won");
        claim.dispose(&mut tx, disposition).await.expect("disposed");
        if committed {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        let row = state(&gate, &id).await;
        assert_eq!(
            row.as_deref(),
            expected,
            "{disposition:?}, committed {committed}"
        );
        let retry = gate.guard(&id).run(async { Ok::<_, Rejected>(()) }).await;
        match expected {
            Some("failed") => assert!(matches!(retry, Err(Rejected::AlreadyFailed)), "{retry:?}"),
            Some(_) => assert!(matches!(retry, Err(Rejected::InDoubt)), "{retry:?}"),
            None => assert!(retry.is_ok(), "{retry:?}"),
        }
    }
}

/// Leases by hand: one racer takes an expired claim over; the old holder's
/// late settle "is still recorded in the slot unless it is already
/// settled ... `Rejected::LeaseLost`", and the new holder's settle over it
/// is `NotRecorded`; `extend` is "checked as `Guard::lease` checks it".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_taken_over_by_one_racer_keeps_the_late_success() {
    let gate = testing::gate_on(testing::pool_with(RACERS as u32 + 2).await).await;
    let short = Duration::from_secs(1);
    let id = Identity::new("rt_lease").part(1);

    let old = gate.guard(&id).lease(short).claim().await.expect("won");
    let zero = old.extend(Duration::ZERO).await;
    assert!(
        matches!(zero, Err(Rejected::InvalidOption { .. })),
        "{zero:?}"
    );
    tokio::time::sleep(short + Duration::from_millis(300)).await;

    let barrier = tokio::sync::Barrier::new(RACERS);
    let claims = futures_util::future::join_all((0..RACERS).map(|_| async {
        barrier.wait().await;
        gate.guard(&id).lease(LEASE).claim().await
    }))
    .await;
    let (mut won, refused): (Vec<_>, Vec<_>) = claims.into_iter().partition(Result::is_ok);
    assert_eq!(won.len(), 1, "one racer takes it over: {refused:?}");
    let new = won.pop().expect("one").expect("won");
    assert!(new.fence() > old.fence(), "a higher fence");

    let late = old.settle().await;
    assert!(matches!(late, Err(Rejected::LeaseLost { .. })), "{late:?}");
    assert_eq!(
        state(&gate, &id).await.as_deref(),
        Some("success"),
        "the late success is kept"
    );
    let over = new.settle().await;
    assert!(
        matches!(over, Err(Rejected::NotRecorded { .. })),
        "{over:?}"
    );
}

/// `wait`: "Waits up to `wait` for an in-flight duplicate to finish, then
/// takes its outcome (or its slot, if it released), instead of refusing
/// at once with `Rejected::InFlight`."
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_duplicate_takes_a_released_slot_and_gives_up_in_time() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = Identity::new("rt_wait").part(1);

    let held = gate.guard(&id).claim().await.expect("won");
    let waiter = {
        let (gate, id, runs) = (gate.clone(), id.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            gate.guard(&id)
                .wait(Duration::from_secs(10))
                .replay()
                .run(counted(&runs, "second"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the duplicate waits");
    held.release().await.expect("released");
    let answer = waiter.await.expect("the waiter");
    assert_eq!(answer.expect("it took the slot"), "second");

    let kept = Identity::new("rt_wait").part(2);
    let _held = gate.guard(&kept).claim().await.expect("won");
    let started = std::time::Instant::now();
    let answer = gate
        .guard(&kept)
        .wait(Duration::from_millis(400))
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(answer, Err(Rejected::InFlight)), "{answer:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up near its wait: {:?}",
        started.elapsed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A `TxClaim` recorded on another transaction is refused
/// `WrongConnection` at once (pinned above); its message must name what
/// the caller called and what to call instead, and no method that does
/// not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tx_claim_on_the_wrong_transaction_is_told_what_to_call() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let id = Identity::new("rt_wrong_message").part(1);
    let mut tx = pool.begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("won");
    let mut other = pool.begin().await.expect("begin");
    let refused = claim.release(&mut other).await.expect_err("refused");
    assert!(
        matches!(refused, Rejected::WrongConnection { .. }),
        "{refused:?}"
    );
    let message = refused.to_string();
    for stale in ["claim_in", "release_in", "the same method"] {
        assert!(!message.contains(stale), "names `{stale}`: {message}");
    }
    assert!(message.contains("TxClaim::release"), "{message}");
}

/// Savepoints (a `Transaction` begun inside another): the claim and its
/// record are that savepoint's, undone with it. A claim settled in an
/// inner savepoint that rolls back stays pending in the outer one (fail
/// closed once committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_in_a_savepoint_rolls_back_with_the_savepoint() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let id = Identity::new("rt_savepoint").part(1);
    let mut outer = pool.begin().await.expect("begin");
    {
        let mut inner = sqlx::Connection::begin(&mut *outer)
            .await
            .expect("savepoint");
        let claim = gate.guard(&id).tx(&mut inner).claim().await.expect("won");
        claim
            .settle(&mut inner)
            .await
            .expect("settled in the savepoint");
        inner.rollback().await.expect("rollback to the savepoint");
    }
    let claim = gate
        .guard(&id)
        .tx(&mut outer)
        .claim()
        .await
        .expect("the savepoint's claim is gone: won again");
    {
        let mut inner = sqlx::Connection::begin(&mut *outer)
            .await
            .expect("savepoint");
        claim.settle(&mut inner).await.expect("settled");
        inner.rollback().await.expect("rollback to the savepoint");
    }
    outer.commit().await.expect("commit");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("pending"));
}

/// More edges, each a promise or plain input: `idem::MAX_LEASE` is
/// accepted and one second more refused; `claim` and `claim_or_replay`
/// honour `wait`; a wait of zero refuses at once; a batch's
/// `concurrency(0)` is "at least one"; a `Detached` bound and a shutdown
/// grace of `Duration::MAX` do not panic; scopes of 1024 bytes each (the
/// limit) and a 16 MiB key part work, 1025 bytes is `InvalidScope`;
/// `on_unavailable(Run)` hands an ungated claim when the store is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn more_edges_of_the_options_and_of_input() {
    let pool = testing::pool_with(6).await;
    let gate = testing::gate_on(pool.clone()).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = |n: u32| Identity::new("rt_more_edges").part(n);

    let ran = gate
        .guard(&id(1))
        .lease(idem::MAX_LEASE)
        .run(counted(&runs, "v"))
        .await;
    assert_eq!(ran.expect("the longest lease"), "v");
    let claim = gate
        .guard(&id(2))
        .lease(Duration::from_secs(1))
        .claim()
        .await
        .expect("won");
    claim.extend(idem::MAX_LEASE).await.expect("extended");
    let longer = claim.extend(idem::MAX_LEASE + Duration::from_secs(1)).await;
    assert!(
        matches!(longer, Err(Rejected::InvalidOption { .. })),
        "{longer:?}"
    );

    let started = std::time::Instant::now();
    let waited = gate
        .guard(&id(2))
        .wait(Duration::from_millis(500))
        .claim()
        .await;
    assert!(matches!(waited, Err(Rejected::InFlight)), "{waited:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "claim waited"
    );
    let started = std::time::Instant::now();
    let waited = gate
        .guard(&id(2))
        .wait(Duration::from_millis(500))
        .replay()
        .claim_or_replay::<String>()
        .await;
    assert!(matches!(waited, Err(Rejected::InFlight)), "{waited:?}");
    assert!(started.elapsed() >= Duration::from_millis(400), "it waited");
    let started = std::time::Instant::now();
    let at_once = gate
        .guard(&id(2))
        .wait(Duration::ZERO)
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(at_once, Err(Rejected::InFlight)), "{at_once:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    claim.settle().await.expect("settled");

    let batch: Batch<u32> = (10..12).map(|n| (n, id(n))).collect();
    let answers = tokio::time::timeout(
        Duration::from_secs(10),
        gate.guard_batch(batch)
            .concurrency(0)
            .run(|n| async move { Ok::<_, Rejected>(n) }),
    )
    .await
    .expect("a concurrency of 0 runs one at a time");
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");

    let detached = Detached::with_bound(Duration::MAX);
    let left = tokio::time::timeout(
        Duration::from_millis(100),
        gate.guard(&id(20)).run_detached(&detached, async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, Rejected>(1)
        }),
    )
    .await;
    assert!(left.is_err(), "the caller left");
    let shutdown = tokio::time::timeout(Duration::from_secs(10), detached.shutdown(Duration::MAX))
        .await
        .expect("the shutdown ends when its bodies do");
    assert_eq!(shutdown.held_in_doubt, 0);
    assert_eq!(state(&gate, &id(20)).await.as_deref(), Some("success"));

    // Unique to this run (the account is the test gate's, padded).
    let padded = |bytes: usize| {
        let own = gate.account_name();
        format!("{own}{}", "a".repeat(bytes - own.len()))
    };
    let widest = gate.account(padded(1024)).namespace("é".repeat(512));
    let ran = widest.guard(&id(30)).run(counted(&runs, "v")).await;
    assert_eq!(ran.expect("scopes at the limit"), "v");
    let wider = gate.account(padded(1025));
    let refused = wider
        .guard(&id(30))
        .on_unavailable(OnUnavailable::Run)
        .run(counted(&runs, "x"))
        .await;
    assert!(
        matches!(refused, Err(Rejected::InvalidScope { .. })),
        "{refused:?}"
    );
    let big_key = Identity::new("rt_more_edges").part("k".repeat(16 * 1024 * 1024));
    let ran = gate.guard(&big_key).run(counted(&runs, "v")).await;
    assert_eq!(ran.expect("a 16 MiB key part"), "v");
    let dup = gate.guard(&big_key).run(counted(&runs, "x")).await;
    assert!(matches!(dup, Err(Rejected::AlreadyDone)), "{dup:?}");

    let mut proxy = Proxy::start().await;
    let through = testing::gate_on(pool_through(&proxy).await).await;
    proxy.cut().await;
    let open = through
        .guard(&id(40))
        .on_unavailable(OnUnavailable::Run)
        .claim()
        .await
        .expect("fails open");
    assert!(!open.is_gated());
    open.settle().await.expect("does nothing");
    let batch: Batch<u32> = (41..43).map(|n| (n, id(n))).collect();
    let answers = through
        .guard_batch(batch)
        .run(|_| counted(&runs, "x"))
        .await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(Rejected::Unavailable { .. }))),
        "{answers:?}"
    );
    proxy.resume().await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "nothing refused ran");
}

/// The attribute refuses an option given twice (`tests/ui/duplicate_option`);
/// by hand the same option twice compiles, and the last one wins (a lease
/// of zero, refused alone, is replaced by a valid one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_option_given_twice_by_hand_takes_the_last() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let id = Identity::new("rt_twice").part(1);
    let ran = gate
        .guard(&id)
        .lease(Duration::ZERO)
        .lease(LEASE)
        .fingerprint(fp(1))
        .fingerprint(fp(2))
        .run(counted(&runs, "v"))
        .await;
    assert_eq!(ran.expect("the last lease counts"), "v");
    let dup = gate
        .guard(&id)
        .fingerprint(fp(2))
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(dup, Err(Rejected::AlreadyDone)), "{dup:?}");
    let other = gate
        .guard(&id)
        .fingerprint(fp(1))
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(other, Err(Rejected::KeyReused)), "{other:?}");
}

/// In a transaction, "the claim, the body's own writes and the outcome
/// commit or roll back together". A body that leaves the transaction
/// aborted (a statement of its own failed, the error swallowed) and
/// returns `Ok`: the outcome cannot be recorded, PostgreSQL answers the
/// caller's COMMIT with a rollback, and nothing of the call happened. The
/// caller must be told: by `run`'s answer or by the commit. sqlx's
/// `commit()` answers `Ok` to PostgreSQL's `ROLLBACK` tag (as tokio-postgres
/// did: rust-postgres/rust-postgres#1342), so only `run` can say it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_aborts_its_transaction_does_not_report_a_committed_success() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let id = Identity::new("rt_aborted_tx").part(1);
    let mut tx = pool.begin().await.expect("begin");
    let answer = gate
        .guard(&id)
        .tx(&mut tx)
        .replay()
        .run(async |conn: &mut PgConnection| {
            // A failing statement of the body's own, its error swallowed.
            let failed = sqlx::query("SELECT 1/0").execute(conn).await;
            assert!(failed.is_err());
            Ok::<_, Rejected>("charged".to_owned())
        })
        .await;
    let committed = tx.commit().await;
    let row = state(&gate, &id).await;
    assert_eq!(row, None, "the transaction rolled back");
    assert!(
        answer.is_err() || committed.is_err(),
        "told Ok ({answer:?}) and committed Ok ({committed:?}), yet nothing was recorded \
         (row {row:?}) and a retry runs again"
    );
}

/// The outcome cache (feature `cache`) and the transaction: a success
/// settled inside a transaction that then rolls back must not be answered
/// from the cache ("An outcome cache changes none of these answers").
#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_gate_forgets_nothing_a_rolled_back_transaction_undid() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone())
        .await
        .with_cache(idem::cache::OutcomeCache::builder().build());
    let id = Identity::new("rt_cache_tx").part(1);

    let mut tx = pool.begin().await.expect("begin");
    let first = gate
        .guard(&id)
        .tx(&mut tx)
        .replay()
        .run(async |_: &mut PgConnection| Ok::<_, Rejected>("rolled back".to_owned()))
        .await;
    assert_eq!(first.expect("ran"), "rolled back");
    tx.rollback().await.expect("rollback");
    let retry = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>("ran again".to_owned()) })
        .await;
    assert_eq!(retry.expect("the retry runs"), "ran again");
    // Now settled on the pool: cached, and answered so inside a transaction.
    let mut tx = pool.begin().await.expect("begin");
    let dup = gate
        .guard(&id)
        .tx(&mut tx)
        .replay()
        .run(async |_: &mut PgConnection| Ok::<_, Rejected>("x".to_owned()))
        .await;
    tx.commit().await.expect("commit");
    assert_eq!(dup.expect("replayed"), "ran again");

    // A batch with repeats answers the same with a cache.
    let mut batch: Batch<u32> = Batch::new();
    let item = |n: u32| Identity::new("rt_cache_batch").part(n);
    batch.push(1, item(1)).push(2, item(1)).push(3, item(2));
    let answers = gate
        .guard_batch(batch)
        .replay()
        .run(|n| async move { Ok::<_, Rejected>(n) })
        .await;
    let values: Vec<u32> = answers.into_iter().map(|a| a.expect("ok")).collect();
    assert_eq!(values, [1, 1, 3]);
}

/// "A detached body that panics holds its claim in doubt (`body_panicked`)
/// and the panic is resumed in its caller, if the caller is still waiting."
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_detached_body_that_panics_is_held_in_doubt_and_resumed() {
    let gate = testing::gate().await;
    let detached = Detached::new();
    let id = Identity::new("rt_detached_panic").part(1);
    let key = id.clone();
    let panicked = AssertUnwindSafe(
        gate.guard(&id)
            .replay()
            .run_detached(&detached, async move {
                if key.part_count() > 0 {
                    panic!("the detached body panicked");
                }
                Ok::<u32, Rejected>(1)
            }),
    )
    .catch_unwind()
    .await;
    assert!(panicked.is_err(), "the panic is resumed in the caller");
    detached.shutdown(Duration::from_secs(5)).await;
    assert_eq!(state(&gate, &id).await.as_deref(), Some("in_doubt"));
    let retry = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<u32, Rejected>(2) })
        .await;
    assert!(matches!(retry, Err(Rejected::InDoubt)), "{retry:?}");
}

/// A `wait` longer than the holder's lease: the waiter "takes its slot"
/// once the lease runs out (a takeover), or, with
/// `on_expiry(InDoubt)`, is told it is in doubt; it never runs while the
/// lease holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_outlasting_a_lease_takes_over_or_finds_it_in_doubt() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let short = Duration::from_secs(1);

    let taken = Identity::new("rt_wait_lease").part("take_over");
    let _abandoned = gate.guard(&taken).lease(short).claim().await.expect("won");
    let started = std::time::Instant::now();
    let answer = gate
        .guard(&taken)
        .lease(short)
        .wait(Duration::from_secs(10))
        .run(counted(&runs, "taken over"))
        .await;
    assert_eq!(answer.expect("the waiter takes it over"), "taken over");
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "not before the lease ran out: {:?}",
        started.elapsed()
    );

    let doubted = Identity::new("rt_wait_lease").part("in_doubt");
    let _abandoned = gate
        .guard(&doubted)
        .lease(short)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    let answer = gate
        .guard(&doubted)
        .wait(Duration::from_secs(10))
        .lease(short)
        .on_expiry(OnExpiry::InDoubt)
        .run(counted(&runs, "x"))
        .await;
    assert!(matches!(answer, Err(Rejected::InDoubt)), "{answer:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Half the racers in transactions, half on the pool, at one instant: one
/// body runs in all (the pool's duplicates wait on the uncommitted row,
/// then hear its outcome).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_race_between_transactions_and_the_pool_runs_one_body() {
    let pool = testing::pool_with(RACERS as u32 * 2 + 2).await;
    let gate = testing::gate_on(pool.clone()).await;
    let id = Identity::new("rt_mixed_race").part(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = tokio::sync::Barrier::new(RACERS);
    let answers = futures_util::future::join_all((0..RACERS).map(|n| {
        let (gate, pool, id, runs, barrier) = (&gate, &pool, &id, &runs, &barrier);
        async move {
            barrier.wait().await;
            if n % 2 == 0 {
                let mut tx = pool.begin().await.expect("begin");
                let answer = gate
                    .guard(id)
                    .tx(&mut tx)
                    .replay()
                    .run(async |_: &mut PgConnection| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, Rejected>("one".to_owned())
                    })
                    .await;
                tx.commit().await.expect("commit");
                answer
            } else {
                gate.guard(id)
                    .replay()
                    .wait(Duration::from_secs(10))
                    .run(counted(runs, "one"))
                    .await
            }
        }
    }))
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{answers:?}");
    // A pooled duplicate waits (its `wait`, or the uncommitted row's lock)
    // and gets the value. A duplicate in a transaction has no `wait`: when
    // a pooled racer won, it finds a committed `pending` row and is refused
    // `InFlight` at once (the tx docs' "duplicates already wait" is about
    // duplicates of a claim made in a transaction).
    for (n, answer) in answers.iter().enumerate() {
        let in_tx = n % 2 == 0;
        assert!(
            matches!(answer, Ok(v) if v == "one")
                || (in_tx && matches!(answer, Err(Rejected::InFlight))),
            "racer {n} (in a transaction: {in_tx}): {answers:?}"
        );
    }
}

#[idempotent(key = "key", action = "rt_cmp_conn", tx = conn, replay)]
async fn attr_tx_on_a_connection(
    gate: &Gate,
    conn: &mut PgConnection,
    key: u32,
) -> Result<u32, Rejected> {
    Ok(key)
}

/// The attribute's `tx` takes "a `&mut Transaction<'_, Postgres>` or
/// `&mut PgConnection`": the connection form answers as the guard by hand
/// does, on the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_attributes_tx_on_a_connection_is_the_guards() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let mut tx = pool.begin().await.expect("begin");
    assert_eq!(
        attr_tx_on_a_connection(&gate, &mut tx, 7)
            .await
            .expect("ran"),
        7
    );
    tx.commit().await.expect("commit");
    let mut tx = pool.begin().await.expect("begin");
    let by_hand = gate
        .guard(&Identity::new("rt_cmp_conn").part(7u32))
        .tx(&mut tx)
        .replay()
        .run(async |_: &mut PgConnection| Ok::<u32, Rejected>(0))
        .await;
    tx.commit().await.expect("commit");
    assert_eq!(by_hand.expect("replayed the attribute's value"), 7);
}
