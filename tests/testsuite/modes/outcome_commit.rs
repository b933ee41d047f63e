//! `outcome_commit = "async"`: settle and release commit with
//! `synchronous_commit = off`, for their own transaction only. A trigger
//! records the setting each settle (UPDATE) and release (DELETE) commits
//! under. With a lease or inside the caller's transaction the option does
//! not compile (tests/ui).

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::sqlx::{self, PgPool};
use idem::testing::race;
use idem::{Gate, Identity, OutcomeCommit, Rejected, idempotent};
use idem_test_support::{JobError, schemas};

/// A gate on a fresh schema whose `idem_records` logs, for every UPDATE and
/// DELETE, the `synchronous_commit` in force.
pub(crate) async fn logged_gate() -> (Gate, PgPool) {
    // One connection: what one statement sets, the next would inherit.
    let (_schema, pool) = schemas::fresh_schema(1).await;
    let gate = Gate::connect(pool.clone()).await.expect("set up");
    sqlx::raw_sql(
        "CREATE TABLE commit_log (n serial, op text, synchronous_commit text);
         CREATE FUNCTION log_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO commit_log (op, synchronous_commit)
             VALUES (TG_OP, current_setting('synchronous_commit'));
             RETURN NULL;
         END $$;
         CREATE TRIGGER log_commit AFTER UPDATE OR DELETE ON idem_records
             FOR EACH ROW EXECUTE FUNCTION log_commit();",
    )
    .execute(&pool)
    .await
    .expect("install the logging trigger");
    (gate, pool)
}

/// The log so far, oldest first, then cleared.
pub(crate) async fn take_log(pool: &PgPool) -> Vec<(String, String)> {
    let log = sqlx::query_as("SELECT op, synchronous_commit FROM commit_log ORDER BY n")
        .fetch_all(pool)
        .await
        .expect("read the log");
    sqlx::query("TRUNCATE commit_log")
        .execute(pool)
        .await
        .expect("clear the log");
    log
}

pub(crate) fn entry(op: &str, setting: &str) -> (String, String) {
    (op.to_owned(), setting.to_owned())
}

/// Claims `id`, committing its outcome as `commit` says (the default, no
/// option, for `Durable`), then settles or releases it.
async fn claim_and_record(
    gate: &Gate,
    id: u64,
    commit: OutcomeCommit,
    fail: bool,
) -> Result<(), Rejected> {
    let id = Identity::new("pay").part(id);
    let claim = match commit {
        OutcomeCommit::Async => gate.guard(&id).outcome_commit(commit).claim().await?,
        _ => gate.guard(&id).claim().await?,
    };
    if fail {
        claim.release().await
    } else {
        claim.settle().await
    }
}

/// Settles claim `id` and releases claim `id + 1`, both under `commit`:
/// one UPDATE and one DELETE for the log, in that order.
async fn settle_one_and_release_the_next(gate: &Gate, id: u64, commit: OutcomeCommit) {
    claim_and_record(gate, id, commit, false)
        .await
        .expect("settle");
    claim_and_record(gate, id + 1, commit, true)
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_outcomes_commit_without_waiting_and_leave_the_connection_as_it_was() {
    let (gate, pool) = logged_gate().await;
    let (durable, async_commit) = (OutcomeCommit::Durable, OutcomeCommit::Async);

    settle_one_and_release_the_next(&gate, 1, durable).await;
    assert_eq!(
        take_log(&pool).await,
        [entry("UPDATE", "on"), entry("DELETE", "on")],
        "the default commits durably"
    );

    settle_one_and_release_the_next(&gate, 3, async_commit).await;
    assert_eq!(
        take_log(&pool).await,
        [entry("UPDATE", "off"), entry("DELETE", "off")],
        "async settle and release commit with synchronous_commit off"
    );

    // The setting was the statement's own transaction's: the pool's one
    // connection is back to the server's default.
    let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .expect("show");
    assert_eq!(setting, "on");

    // The outcomes hold like any other: settled is refused, released runs.
    assert!(matches!(
        claim_and_record(&gate, 3, async_commit, false).await,
        Err(Rejected::AlreadyDone)
    ));
    claim_and_record(&gate, 4, async_commit, false)
        .await
        .expect("the released action runs again");
}

#[idempotent(key = "order", outcome_commit = "async")]
async fn pay(gate: &Gate, order: u64, runs: &AtomicUsize) -> Result<u64, JobError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(order)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_option_races_like_the_plain_gate() {
    let (gate, pool) = logged_gate().await;
    let runs = AtomicUsize::new(0);
    let report = race(8, || pay(&gate, 7, &runs)).await;
    report.assert_exactly_once();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(take_log(&pool).await, [entry("UPDATE", "off")]);
    assert!(matches!(
        pay(&gate, 7, &runs).await,
        Err(JobError::Rejected(Rejected::AlreadyDone))
    ));
}
