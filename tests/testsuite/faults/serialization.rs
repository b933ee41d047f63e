//! Serialization failures (SQLSTATE 40001) and deadlocks (40P01) in the
//! claim path, which distributed engines such as CockroachDB raise routinely
//! and PostgreSQL raises under REPEATABLE READ and SERIALIZABLE.
//!
//! The decision: a claim made on the gate's own pool is one autocommitted
//! statement that PostgreSQL rolled back whole, so the gate tries it again
//! (at once, then after 10 ms and 50 ms) and only then fails closed with
//! `Rejected::Unavailable`. A claim inside the caller's transaction is not
//! retried: the failure aborted that transaction, and only the caller can
//! run it again; it surfaces as `Unavailable` with the 40001 as its source.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, PgPool};
use idem::testing::{self, race};
use idem::{Gate, Identity, Rejected};
use idem_test_support::{rows, schemas};

/// A trigger that makes the first `failures` claim inserts fail with
/// `errcode`, counted by a sequence (which a rollback does not undo).
async fn failing_inserts(pool: &PgPool, errcode: &str, failures: i64) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SEQUENCE idem_test_insert_attempts;
         CREATE FUNCTION idem_test_fail_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('idem_test_insert_attempts') <= {failures} THEN
                 RAISE EXCEPTION 'injected by the test' USING ERRCODE = '{errcode}';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER idem_test_fail_inserts BEFORE INSERT ON idem_records
             FOR EACH ROW EXECUTE FUNCTION idem_test_fail_inserts();"
    )))
    .execute(pool)
    .await
    .expect("install the failing trigger");
}

/// How many inserts the trigger saw.
async fn insert_attempts(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM idem_test_insert_attempts",
    )
    .fetch_one(pool)
    .await
    .expect("read the attempt counter")
}

fn sqlstate(rejected: &Rejected) -> Option<String> {
    match rejected {
        Rejected::Unavailable { source } => match &**source {
            sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
            _ => None,
        },
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_or_deadlock_in_the_claim_is_tried_again() {
    for errcode in ["40001", "40P01"] {
        let (_schema, pool) = schemas::fresh_schema(2).await;
        let gate = Gate::connect(pool.clone()).await.expect("set up");
        failing_inserts(&pool, errcode, 2).await;

        let ran = AtomicUsize::new(0);
        let report = race(1, || async {
            gate.run(&Identity::new("pay").part(1_i64), async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>(())
            })
            .await
        })
        .await;
        report.assert_exactly_once();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "{errcode}: the body runs once"
        );
        assert_eq!(
            insert_attempts(&pool).await,
            3,
            "{errcode}: two failed inserts, then the one that won"
        );
        assert_eq!(report.retried, 2, "{errcode}: {report}");
        assert_eq!(
            rows::row_state(&gate, &Identity::new("pay").part(1_i64).address()).await,
            Some("success".to_owned())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_that_persists_fails_closed() {
    let (_schema, pool) = schemas::fresh_schema(2).await;
    let gate = Gate::connect(pool.clone()).await.expect("set up");
    failing_inserts(&pool, "40001", i64::MAX).await;

    let ran = AtomicUsize::new(0);
    let refused = gate
        .run(&Identity::new("pay").part(1_i64), async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await
        .expect_err("refused");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the body must not run");
    assert_eq!(sqlstate(&refused).as_deref(), Some("40001"), "{refused}");
    assert_eq!(
        insert_attempts(&pool).await,
        4,
        "the first try and three more, then it gives up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_caller_s_transaction_a_serialization_failure_is_the_caller_s_to_retry() {
    let (_schema, pool) = schemas::fresh_schema(2).await;
    let gate = Gate::connect(pool.clone()).await.expect("set up");
    failing_inserts(&pool, "40001", 1).await;
    let id = Identity::new("pay").part(1_i64);

    let mut tx = pool.begin().await.expect("begin");
    let refused = gate
        .guard(&id)
        .tx(&mut tx)
        .claim()
        .await
        .expect_err("the failure aborts the transaction: no retry inside it");
    assert_eq!(sqlstate(&refused).as_deref(), Some("40001"), "{refused}");
    tx.rollback().await.expect("rollback");
    assert_eq!(insert_attempts(&pool).await, 1);

    // The caller retries the whole transaction, which now goes through.
    let mut tx = pool.begin().await.expect("begin");
    let claim = gate
        .guard(&id)
        .tx(&mut tx)
        .claim()
        .await
        .expect("the retried transaction claims");
    claim.settle(&mut tx).await.expect("settle");
    tx.commit().await.expect("commit");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await,
        Some("success".to_owned())
    );
}

/// A pool whose every transaction, autocommitted statements included, runs
/// at `isolation`: where a conflicting claim committed after a statement's
/// snapshot was taken, PostgreSQL answers the claim's insert with 40001
/// rather than letting ON CONFLICT DO NOTHING skip a row it cannot see.
async fn pool_at(isolation: &str, max_connections: u32) -> PgPool {
    let url = testing::database_url();
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"))
        .options([("default_transaction_isolation", isolation)]);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_under_repeatable_read_and_serializable_still_run_once_and_refuse_cleanly() {
    for isolation in ["repeatable read", "serializable"] {
        let gate = testing::gate_on(pool_at(isolation, 8).await).await;
        let mut retried = 0;
        for round in 0..12_i64 {
            let ran = AtomicUsize::new(0);
            let report = race(16, || async {
                gate.run(&Identity::new("pay").part(round), async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Rejected>(())
                })
                .await
            })
            .await;
            report.assert_exactly_once();
            assert_eq!(ran.load(Ordering::SeqCst), 1, "{isolation}, round {round}");
            // Every loser is told why it lost; none is turned away as if the
            // store were down.
            for refusal in report.refusals() {
                assert!(
                    matches!(refusal, Rejected::InFlight | Rejected::AlreadyDone),
                    "{isolation}, round {round}: a loser was refused with {refusal}\n{report}"
                );
            }
            retried += report.retried;
        }
        println!("{isolation}: {retried} claim statements retried over 12 rounds of 16");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_repeatable_read_transaction_a_duplicate_of_a_committed_claim_fails_with_40001() {
    let gate = testing::gate_on(pool_at("repeatable read", 4).await).await;
    let id = Identity::new("pay").part(7_i64);

    let mut first = gate.pool().begin().await.expect("begin");
    let claim = gate
        .guard(&id)
        .tx(&mut first)
        .claim()
        .await
        .expect("first claims");
    claim.settle(&mut first).await.expect("settle");

    let (snapshot_taken, snapshot) = tokio::sync::oneshot::channel();
    let duplicate = tokio::spawn({
        let gate = gate.clone();
        let id = id.clone();
        async move {
            let mut tx = gate.pool().begin().await.expect("begin");
            // Takes the snapshot before the first transaction commits.
            sqlx::query("SELECT 1")
                .execute(&mut *tx)
                .await
                .expect("snapshot");
            let _ = snapshot_taken.send(());
            let result = gate.guard(&id).tx(&mut tx).claim().await;
            tx.rollback().await.expect("rollback");
            result.map(|claim| claim.fence())
        }
    });
    snapshot.await.expect("the duplicate took its snapshot");
    // Let its insert reach the first transaction's row and wait on it (the
    // outcome is the same if it gets there only after the commit).
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    first.commit().await.expect("commit");
    let refused = duplicate
        .await
        .expect("duplicate task")
        .expect_err("the duplicate must not claim a committed slot");
    // Its snapshot cannot see the winner, so PostgreSQL refuses to let it
    // pass over the conflict: a serialization failure, for the caller to
    // retry, which then finds the slot settled.
    assert_eq!(sqlstate(&refused).as_deref(), Some("40001"), "{refused}");
    let mut retry = gate.pool().begin().await.expect("begin");
    let again = gate.guard(&id).tx(&mut retry).claim().await;
    assert!(
        matches!(again, Err(Rejected::AlreadyDone)),
        "the retried transaction sees the settled slot: {again:?}"
    );
    retry.rollback().await.expect("rollback");
}
