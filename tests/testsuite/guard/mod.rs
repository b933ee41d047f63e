//! Guarding by hand with the builder (`Gate::guard`, `Gate::guard_batch`):
//! every end of it, raced at the same instant against a real PostgreSQL.
//!
//! - On the pool, `run`, `run_detached`, `claim` and `claim_or_replay` let
//!   exactly one of a race through; replay hands every later duplicate the
//!   kept value without running; a disposition holds what it says.
//! - After `tx`, the claim and its outcome commit or roll back with the
//!   caller's transaction (a rollback frees the slot), and a duplicate in
//!   another transaction waits for the first, then hears its outcome.
//! - A batch guard keeps and replays values item by item.
//!
//! The combinations that must not compile are in `tests/ui/guard/`.

// Each promise of the guard's docs attacked (races, faults, misuse,
// hostile input), and the attribute against the same guard by hand.
mod documented_promises;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::batch::Batch;
use idem::sqlx::{AssertSqlSafe, PgConnection};
use idem::testing;
use idem::{ClaimOrReplay, Detached, Disposition, Fingerprint, Identity, Rejected};

use crate::support::bodies::counted;

const RACERS: usize = 8;

/// A body's error: a refusal, a definite decline, or its own database
/// write failing.
#[derive(Debug)]
enum Failure {
    Rejected(#[allow(dead_code, reason = "read in failure messages, through Debug")] Rejected),
    Declined,
    Database(
        #[allow(dead_code, reason = "read in failure messages, through Debug")] idem::sqlx::Error,
    ),
}

impl From<Rejected> for Failure {
    fn from(rejected: Rejected) -> Self {
        Failure::Rejected(rejected)
    }
}

impl From<idem::sqlx::Error> for Failure {
    fn from(error: idem::sqlx::Error) -> Self {
        Failure::Database(error)
    }
}
const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_lets_exactly_one_of_a_race_through_and_replays_it_to_the_rest() {
    let gate = testing::gate_on(testing::pool_with(RACERS as u32 + 2).await).await;
    let id = Identity::new("guard_run").part("ord_1");
    let runs = Arc::new(AtomicUsize::new(0));

    let report = testing::race(RACERS, || {
        gate.guard(&id)
            .lease(LEASE)
            .replay()
            .run(counted(&runs, "receipt"))
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Every later duplicate is handed the kept value, and runs nothing.
    for _ in 0..3 {
        let again = gate
            .guard(&id)
            .lease(LEASE)
            .replay()
            .run(counted(&runs, "other"))
            .await;
        assert_eq!(again.expect("replayed"), "receipt");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Without replay the same slot is refused as done.
    let plain = gate.guard(&id).run(counted(&runs, "other")).await;
    assert!(matches!(plain, Err(Rejected::AlreadyDone)), "{plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_detached_lets_exactly_one_of_a_race_through() {
    let gate = testing::gate_on(testing::pool_with(RACERS as u32 + 2).await).await;
    let detached = Detached::new();
    let id = Identity::new("guard_detached").part("ord_1");
    let runs = Arc::new(AtomicUsize::new(0));

    let report = testing::race(RACERS, || {
        gate.guard(&id)
            .run_detached(&detached, counted(&runs, "receipt"))
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    detached.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_lets_exactly_one_of_a_race_win_and_its_settle_closes_the_slot() {
    let gate = testing::gate_on(testing::pool_with(RACERS as u32 + 2).await).await;
    let id = Identity::new("guard_claim").part("ord_1");

    let barrier = tokio::sync::Barrier::new(RACERS);
    let claims = futures_util::future::join_all((0..RACERS).map(|_| async {
        barrier.wait().await;
        gate.guard(&id).lease(LEASE).claim().await
    }))
    .await;
    let (won, refused): (Vec<_>, Vec<_>) = claims.into_iter().partition(Result::is_ok);
    assert_eq!(won.len(), 1, "exactly one claim wins: {refused:?}");
    for refusal in &refused {
        assert!(matches!(refusal, Err(Rejected::InFlight)), "{refusal:?}");
    }
    let claim = won.into_iter().next().expect("one").expect("won");
    claim.settle().await.expect("settled");
    let later = gate.guard(&id).claim().await;
    assert!(matches!(later, Err(Rejected::AlreadyDone)), "{later:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_or_replay_hands_the_value_a_settled_claim_kept() {
    let gate = testing::gate().await;
    let id = Identity::new("guard_claim_or_replay").part("ord_1");

    let ClaimOrReplay::Won(claim) = gate
        .guard(&id)
        .replay()
        .claim_or_replay::<String>()
        .await
        .expect("the first claim wins")
    else {
        panic!("nothing was kept yet");
    };
    claim
        .settle_value(&"receipt".to_owned())
        .await
        .expect("settled");

    match gate.guard(&id).replay().claim_or_replay::<String>().await {
        Ok(ClaimOrReplay::Replayed(value)) => assert_eq!(value, "receipt"),
        other => panic!("expected the kept value, got {other:?}"),
    }
    // A value that no longer reads back as the asked type is refused as
    // done, never handed over half-read.
    let wrong = gate.guard(&id).replay().claim_or_replay::<u64>().await;
    assert!(matches!(wrong, Err(Rejected::AlreadyDone)), "{wrong:?}");
    // A plain claim of the same slot is refused as done.
    let plain = gate.guard(&id).claim().await;
    assert!(matches!(plain, Err(Rejected::AlreadyDone)), "{plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disposition_keeps_a_definite_failure_and_holds_a_doubtful_one() {
    let gate = testing::gate().await;
    let classify = |error: &Failure| match error {
        Failure::Declined => Disposition::Keep,
        _ => Disposition::InDoubt,
    };

    let kept = Identity::new("guard_disposed").part("kept");
    let first: Result<(), Failure> = gate
        .guard(&kept)
        .disposition(classify)
        .run(async { Err(Failure::Declined) })
        .await;
    assert!(matches!(first, Err(Failure::Declined)), "{first:?}");
    let again = gate.guard(&kept).run(async { Ok::<_, Rejected>(()) }).await;
    assert!(matches!(again, Err(Rejected::AlreadyFailed)), "{again:?}");

    let doubtful = Identity::new("guard_disposed").part("in_doubt");
    let _: Result<(), Failure> = gate
        .guard(&doubtful)
        .disposition(classify)
        .run(async { Err(Failure::Rejected(Rejected::InFlight)) })
        .await;
    let again = gate
        .guard(&doubtful)
        .run(async { Ok::<_, Rejected>(()) })
        .await;
    assert!(matches!(again, Err(Rejected::InDoubt)), "{again:?}");

    // Without a disposition a failure releases the slot: the retry runs.
    let released = Identity::new("guard_disposed").part("released");
    let _: Result<(), Failure> = gate
        .guard(&released)
        .run(async { Err(Failure::Declined) })
        .await;
    let again = gate
        .guard(&released)
        .run(async { Ok::<_, Rejected>(()) })
        .await;
    assert!(again.is_ok(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fingerprint_that_differs_is_refused_as_a_reused_key() {
    let gate = testing::gate().await;
    let id = Identity::new("guard_fingerprint").part("ord_1");
    let paid = |cents: i64| Fingerprint::new().part(cents);

    let first = gate
        .guard(&id)
        .fingerprint(paid(500))
        .replay()
        .run(async { Ok::<_, Rejected>(1) })
        .await;
    assert_eq!(first.expect("ran"), 1);
    let same = gate
        .guard(&id)
        .fingerprint(paid(500))
        .replay()
        .run(async { Ok::<_, Rejected>(2) })
        .await;
    assert_eq!(same.expect("replayed"), 1);
    let other = gate
        .guard(&id)
        .fingerprint(paid(700))
        .replay()
        .run(async { Ok::<_, Rejected>(3) })
        .await;
    assert!(matches!(other, Err(Rejected::KeyReused)), "{other:?}");
}

/// A counter table of this test's own, for writes that must commit or roll
/// back with the claim.
async fn counter_table(pool: &idem::sqlx::PgPool) -> String {
    let table = testing::unique_name("guard_writes");
    idem::sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (n int NOT NULL)"
    )))
    .execute(pool)
    .await
    .expect("create the test's table");
    table
}

async fn count(pool: &idem::sqlx::PgPool, table: &str) -> i64 {
    idem::sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_transaction_the_claim_commits_or_rolls_back_with_the_callers_writes() {
    let pool = testing::pool().await;
    let gate = testing::gate_on(pool.clone()).await;
    let table = counter_table(&pool).await;
    let id = Identity::new("guard_tx").part("ord_1");
    let write = |table: String| {
        async move |conn: &mut PgConnection| {
            idem::sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES (1)")))
                .execute(conn)
                .await?;
            Ok::<_, Failure>("credited".to_owned())
        }
    };

    // Rolled back: neither the write nor the claim happened; the retry runs.
    let mut tx = pool.begin().await.expect("begin");
    let rolled = gate
        .guard(&id)
        .tx(&mut tx)
        .replay()
        .run(write(table.clone()))
        .await;
    assert_eq!(rolled.expect("ran"), "credited");
    tx.rollback().await.expect("rollback");
    assert_eq!(count(&pool, &table).await, 0);

    let mut tx = pool.begin().await.expect("begin");
    let committed = gate
        .guard(&id)
        .tx(&mut tx)
        .replay()
        .run(write(table.clone()))
        .await;
    assert_eq!(committed.expect("ran again"), "credited");
    tx.commit().await.expect("commit");
    assert_eq!(count(&pool, &table).await, 1);

    // Committed: a duplicate, in a transaction or not, is handed the value.
    let mut tx = pool.begin().await.expect("begin");
    let again = gate
        .guard(&id)
        .tx(&mut tx)
        .replay()
        .run(write(table.clone()))
        .await;
    assert_eq!(again.expect("replayed"), "credited");
    tx.commit().await.expect("commit");
    let pooled = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Failure>("not run".to_owned()) })
        .await;
    assert_eq!(pooled.expect("replayed"), "credited");
    assert_eq!(count(&pool, &table).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_won_in_a_transaction_is_recorded_there_and_a_duplicate_waits_for_it() {
    let pool = testing::pool_with(4).await;
    let gate = testing::gate_on(pool.clone()).await;
    let id = Identity::new("guard_tx_claim").part("ord_1");

    // Won and released in a committed transaction: the slot is free again.
    let mut tx = pool.begin().await.expect("begin");
    let claim = gate.guard(&id).tx(&mut tx).claim().await.expect("won");
    claim.release(&mut tx).await.expect("released");
    tx.commit().await.expect("commit");

    let mut first = pool.begin().await.expect("begin");
    let claim = gate
        .guard(&id)
        .tx(&mut first)
        .claim()
        .await
        .expect("won after the release");

    // A duplicate in another transaction waits on the uncommitted claim...
    let duplicate = {
        let (gate, pool, id) = (gate.clone(), pool.clone(), id.clone());
        tokio::spawn(async move {
            let mut second = pool.begin().await.expect("begin");
            let answer = gate.guard(&id).tx(&mut second).claim().await.map(|_| ());
            second.rollback().await.expect("rollback");
            answer
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !duplicate.is_finished(),
        "the duplicate must wait for the first transaction"
    );

    // ...and hears the outcome it committed.
    claim.settle(&mut first).await.expect("settled");
    first.commit().await.expect("commit");
    let answer = duplicate.await.expect("the duplicate's task");
    assert!(matches!(answer, Err(Rejected::AlreadyDone)), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_transactions_raced_at_once_exactly_one_body_runs() {
    let pool = testing::pool_with(RACERS as u32 + 2).await;
    let gate = testing::gate_on(pool.clone()).await;
    let table = counter_table(&pool).await;
    let id = Identity::new("guard_tx_race").part("ord_1");

    let report = testing::race(RACERS, || {
        let (gate, pool, id, table) = (&gate, &pool, &id, &table);
        async move {
            let mut tx = pool.begin().await?;
            let answer = gate
                .guard(id)
                .tx(&mut tx)
                .run(async |conn: &mut PgConnection| {
                    idem::sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES (1)")))
                        .execute(conn)
                        .await?;
                    Ok::<_, Failure>(())
                })
                .await;
            tx.commit().await?;
            answer
        }
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(count(&pool, &table).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_guard_keeps_and_replays_each_items_value() {
    let gate = testing::gate().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let batch = || -> Batch<u64> {
        (1..=4)
            .map(|n| (n, Identity::new("guard_batch").part(n)))
            .collect()
    };
    let body = |runs: Arc<AtomicUsize>| {
        move |n: u64| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(n * 10)
            }
        }
    };

    let first = gate
        .guard_batch(batch())
        .replay()
        .run(body(Arc::clone(&runs)))
        .await;
    let values: Vec<u64> = first.into_iter().map(|r| r.expect("ran")).collect();
    assert_eq!(values, [10, 20, 30, 40]);
    let again = gate
        .guard_batch(batch())
        .replay()
        .run(body(Arc::clone(&runs)))
        .await;
    let values: Vec<u64> = again.into_iter().map(|r| r.expect("replayed")).collect();
    assert_eq!(values, [10, 20, 30, 40]);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "the replayed batch ran nothing"
    );

    // A classified failure is kept item by item.
    let failing: Batch<u64> = (1..=2)
        .map(|n| (n, Identity::new("guard_batch_kept").part(n)))
        .collect();
    let _ = gate
        .guard_batch(failing)
        .disposition(|_: &Failure| Disposition::Keep)
        .run(|_| async { Err::<(), _>(Failure::Declined) })
        .await;
    let retry: Batch<u64> = (1..=2)
        .map(|n| (n, Identity::new("guard_batch_kept").part(n)))
        .collect();
    let answers = gate
        .guard_batch(retry)
        .run(|_| async { Ok::<(), Rejected>(()) })
        .await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(Rejected::AlreadyFailed))),
        "{answers:?}"
    );
}
