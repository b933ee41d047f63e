//! Defects where a body ran twice, a success was lost, or the caller was
//! misled (issue 13), each pinned by a test that failed before its fix.
//! Faults on the wire (replies lost after commit) are in
//! `tests/testsuite/faults/lost_replies.rs`; the random search for the rest is
//! `tests/testsuite/history/mod.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::sqlx;
use idem::testing;
use idem::{Gate, Identity, OnUnavailable, Rejected, idempotent};
use idem_test_support::rows::RowTrigger;
use idem_test_support::{JobError, rows, schemas};
use serde::{Deserialize, Serialize};

fn refusal<T: std::fmt::Debug>(result: &Result<T, JobError>) -> &Rejected {
    match result {
        Err(JobError::Rejected(rejected)) => rejected,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Counts the bodies that ran.
#[derive(Default)]
struct Runs(AtomicUsize);

impl Runs {
    fn run(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

// ------------------------------------- 1. a value the store cannot hold

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Note {
    text: String,
}

/// serde_json writes `\u0000` for NUL, which `jsonb` refuses: the stored
/// form must hold any value serde_json can write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_value_holding_nul_is_settled_and_replayed() {
    let gate = testing::gate().await;
    let id = Identity::new("nul_value").part(1);
    let runs = Runs::default();
    let note = Note {
        text: "before\0after \u{1}\u{fffd} \\u0000".into(),
    };
    let body = || async {
        runs.run();
        Ok::<_, JobError>(note.clone())
    };
    let first = gate.guard(&id).replay().run(body()).await;
    assert_eq!(first.expect("the body's value"), note);
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "the success is recorded"
    );
    let again = gate.guard(&id).replay().run(body()).await;
    assert_eq!(again.expect("replayed"), note, "byte for byte");
    assert_eq!(runs.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_lease_a_value_holding_nul_never_lets_the_body_run_twice() {
    let gate = testing::gate().await;
    let id = Identity::new("nul_value_leased").part(1);
    let runs = Runs::default();
    let body = || async {
        runs.run();
        Ok::<_, JobError>(Note { text: "\0".into() })
    };
    gate.guard(&id)
        .lease(Duration::from_millis(200))
        .replay()
        .run(body())
        .await
        .expect("the body's value");
    // Past the lease: were the claim still pending, this would take it over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .replay()
        .run(body())
        .await;
    assert_eq!(again.expect("replayed").text, "\0");
    assert_eq!(runs.count(), 1, "the body ran once");
}

/// A value the store refuses for any reason (here: larger than PostgreSQL
/// takes in one field, 1 GB) settles without it: the success is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_store_refuses_settles_without_it_and_the_success_is_kept() {
    let gate = testing::gate().await;
    let id = Identity::new("refused_value").part(1);
    // A trigger refuses any stored output, as a value too large would be.
    let trigger = RowTrigger::install(
        gate.pool(),
        &testing::unique_name("refuse_output"),
        "BEFORE UPDATE",
        &format!(
            "IF NEW.account = '{account}' AND (to_jsonb(NEW) ->> 'output_json') IS NOT NULL THEN \
               RAISE EXCEPTION 'value too large' USING ERRCODE = '54000'; END IF; \
             IF NEW.account = '{account}' AND (to_jsonb(NEW) ->> 'output') IS NOT NULL THEN \
               RAISE EXCEPTION 'value too large' USING ERRCODE = '54000'; END IF; \
             RETURN NEW;",
            account = gate.account_name()
        ),
    )
    .await;
    let runs = Runs::default();
    let body = || async {
        runs.run();
        Ok::<_, JobError>(Note { text: "big".into() })
    };
    let first = gate
        .guard(&id)
        .lease(Duration::from_millis(300))
        .replay()
        .run(body())
        .await;
    let again = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        gate.guard(&id)
            .lease(Duration::from_millis(300))
            .replay()
            .run(body())
            .await
    }
    .await;
    trigger.remove(gate.pool()).await;
    assert_eq!(first.expect("the body's value").text, "big");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "settled without the value"
    );
    assert!(
        matches!(refusal(&again), Rejected::AlreadyDone),
        "no value to replay: {again:?}"
    );
    assert_eq!(runs.count(), 1, "the lease never expired into a second run");
}

// ---------------------------------------- 2. extend without a lease

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_a_claim_without_a_lease_never_makes_it_expirable() {
    let gate = testing::gate().await;
    let id = Identity::new("extend_unleased").part(1);
    let claim = gate.claim(&id).await.expect("claimed without a lease");
    claim
        .extend(Duration::from_millis(10))
        .await
        .expect("nothing to extend is not an error");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let duplicate = gate.claim(&id).await;
    assert!(
        matches!(duplicate, Err(Rejected::InFlight)),
        "a claim without a lease holds until resolved: {duplicate:?}"
    );
    claim.settle().await.expect("the holder settles");
}

// ----------------------- 3. errors of the request are not outages

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_database_cannot_hold_is_refused_and_never_fails_open() {
    let gate = testing::gate().await;
    let runs = Runs::default();
    for lease in [Duration::MAX, Duration::ZERO] {
        let id = Identity::new("huge_lease").part(lease.as_secs());
        let result = gate
            .guard(&id)
            .lease(lease)
            .on_unavailable(OnUnavailable::Run)
            .run(async {
                runs.run();
                Ok::<_, JobError>(())
            })
            .await;
        let rejected = refusal(&result);
        assert_eq!(rejected.reason(), "invalid_option", "{rejected}");
        assert!(!rejected.is_retryable());
        let message = rejected.to_string();
        assert!(message.contains("lease"), "{message}");
        assert!(message.contains("did not run"), "{message}");
    }
    assert_eq!(runs.count(), 0, "the body never ran unguarded");
    // The longest lease, from the attribute and from the guard, is one the
    // database holds.
    longest_lease(&gate, 1)
        .await
        .expect("lease = \"100y\" claims and settles");
    gate.guard(&Identity::new("max_lease").part(1))
        .lease(idem::MAX_LEASE)
        .run(async { Ok::<_, JobError>(()) })
        .await
        .expect("idem::MAX_LEASE claims and settles");

    // Claim::extend checks the same bounds, and changes nothing.
    let id = Identity::new("huge_extension").part(1);
    let claim = gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .claim()
        .await
        .expect("claimed");
    let extended = claim.extend(Duration::MAX).await;
    assert!(
        matches!(&extended, Err(r) if r.reason() == "invalid_option"),
        "{extended:?}"
    );
    claim.settle().await.expect("still ours");
}

#[idempotent(key = "job", lease = "100y")]
async fn longest_lease(gate: &Gate, job: u32) -> Result<u32, JobError> {
    Ok(job)
}

/// A role that may read idem_records but not write it.
async fn read_only_gate() -> (Gate, String) {
    let admin = testing::pool_with(1).await;
    let role = testing::unique_name("idem_ro");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN; GRANT SELECT ON idem_records TO {role}; \
         GRANT USAGE ON SEQUENCE idem_records_fence_seq TO {role}; \
         GRANT SELECT ON idem_schema_version TO {role};"
    )))
    .execute(&admin)
    .await
    .expect("create a read-only role");
    let options = schemas::options_in("public").username(&role);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("connect as the read-only role");
    let gate = Gate::connect_without_setup(pool)
        .await
        .expect("a read-only role passes verification")
        .account(testing::unique_name("ro"));
    (gate, role)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_is_an_error_of_the_request_that_never_fails_open() {
    let (gate, role) = read_only_gate().await;
    let runs = Runs::default();
    let id = Identity::new("no_insert").part(1);
    let result = gate
        .guard(&id)
        .on_unavailable(OnUnavailable::Run)
        .run(async {
            runs.run();
            Ok::<_, JobError>(())
        })
        .await;
    let rejected = refusal(&result).clone();
    gate.pool().close().await;
    let admin = testing::pool_with(1).await;
    // Two transactions: Citus refuses role DDL in a transaction that has
    // already touched every shard (the REVOKE).
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "REVOKE ALL ON idem_records, idem_records_fence_seq, idem_schema_version FROM {role}"
    )))
    .execute(&admin)
    .await
    .expect("revoke the role's grants");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(&admin)
        .await
        .expect("drop the role");
    assert_eq!(runs.count(), 0, "permission denied is not an outage");
    assert_eq!(rejected.reason(), "store_refused", "{rejected}");
    assert!(!rejected.is_retryable());
    let message = rejected.to_string();
    assert!(message.contains("did not run"), "{message}");
    assert!(message.contains("GRANT"), "says what to fix: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_an_error_of_the_request_not_an_outage() {
    let (schema, pool) = schemas::fresh_schema(2).await;
    let gate = Gate::connect(pool).await.expect("set up in its own schema");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {schema}.idem_records"
    )))
    .execute(gate.pool())
    .await
    .expect("drop the table under the gate");
    let runs = Runs::default();
    let result = gate
        .guard(&Identity::new("gone").part(1))
        .on_unavailable(OnUnavailable::Run)
        .run(async {
            runs.run();
            Ok::<_, JobError>(())
        })
        .await;
    let rejected = refusal(&result);
    assert_eq!(rejected.reason(), "store_refused", "{rejected}");
    assert!(
        rejected.to_string().contains("idem migrate"),
        "says how to fix it: {rejected}"
    );
    assert_eq!(runs.count(), 0);
}

// ----------------------------- 4. what became of a claim, truthfully

/// A claim of `id`, under `lease` if there is one.
async fn claim_leased(
    gate: &Gate,
    id: &Identity,
    lease: Option<Duration>,
) -> Result<idem::Claim, Rejected> {
    match lease {
        Some(lease) => gate.guard(id).lease(lease).claim().await,
        None => gate.guard(id).claim().await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_released_by_an_operator_and_claimed_anew_is_lost_not_a_lost_lease() {
    let gate = testing::gate().await;
    let id = Identity::new("operator_release").part(1);
    for lease in [None, Some(Duration::from_secs(60))] {
        let id = id.clone().part(lease.is_some());
        let first = claim_leased(&gate, &id, lease).await.expect("first holder");
        // What `idem claims release` does.
        rows::delete_row(&gate, &id.address()).await;
        let second = claim_leased(&gate, &id, lease).await.expect("claimed anew");
        let late = first.settle().await;
        assert!(
            matches!(late, Err(Rejected::ClaimLost { .. })),
            "lease {lease:?}: {late:?}"
        );
        // The first holder's success settled the second's row: the slot
        // records it, not the second's, and the second is told so (both
        // bodies ran).
        let own = second.settle().await;
        assert!(
            matches!(&own, Err(Rejected::NotRecorded { recorded, .. }) if recorded.contains("earlier holder")),
            "lease {lease:?}: {own:?}"
        );
    }
}

/// An operator released the claim and a colliding identity (same address,
/// another identity) claimed the slot: this holder's release has nothing
/// left to delete, so it happened; it is not a lost claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_colliding_identity_took_the_slot_reports_released() {
    let gate = testing::gate().await;
    let id = Identity::new("release_collided").part(1);
    let claim = gate.claim(&id).await.expect("claimed");
    rows::delete_row(&gate, &id.address()).await;
    let colliding = Identity::new("other");
    rows::plant_row(&gate, &id.address(), "pending", colliding.canonical()).await;
    let released = claim.release().await;
    assert!(released.is_ok(), "the release happened: {released:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("pending"),
        "the other identity's claim is untouched"
    );
}

// --------------------- 5. a stale holder learns, and its success stays

#[idempotent(key = "job", action = "stale_holder", lease = "300ms")]
async fn leased(gate: &Gate, job: u32, pause: Duration, fail: bool) -> Result<u32, JobError> {
    tokio::time::sleep(pause).await;
    if fail { Err(JobError::Failed) } else { Ok(job) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_is_told_lease_lost_and_its_success_is_never_forgotten() {
    let gate = testing::gate().await;
    // The first holder outlives its lease; the second takes over, then fails.
    let stale = leased(&gate, 7, Duration::from_millis(900), false);
    let taker = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        leased(&gate, 7, Duration::from_millis(600), true).await
    };
    let (stale, taker) = tokio::join!(stale, taker);
    assert!(
        matches!(refusal(&stale), Rejected::LeaseLost { .. }),
        "the stale holder learns it was fenced off: {stale:?}"
    );
    assert!(matches!(taker, Err(JobError::Failed)), "{taker:?}");
    let id = Identity::new("stale_holder").part(7_u32);
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success"),
        "the first body's success is recorded, though the new holder failed"
    );
    let retry = leased(&gate, 7, Duration::ZERO, false).await;
    assert!(
        matches!(refusal(&retry), Rejected::AlreadyDone),
        "no third run: {retry:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_gate_run_a_stale_holder_is_told_lease_lost_too() {
    let gate = testing::gate().await;
    let id = Identity::new("stale_run").part(1);
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(200))
        .run(async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok::<_, JobError>("first")
        });
    let taker = async {
        tokio::time::sleep(Duration::from_millis(350)).await;
        gate.guard(&id)
            .lease(Duration::from_millis(200))
            .run(async { Ok::<_, JobError>("second") })
            .await
    };
    let (stale, taker) = tokio::join!(stale, taker);
    assert_eq!(taker.expect("the new holder ran"), "second");
    assert!(
        matches!(refusal(&stale), Rejected::LeaseLost { .. }),
        "{stale:?}"
    );
}

// ------------------------------ 8. replays and names, both directions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_stored_with_a_fingerprint_never_replays_to_a_caller_without_one() {
    let gate = testing::gate().await;
    // The payload fingerprinted, or no fingerprint at all.
    let (with, without) = (Some(4_999), None);
    for (first, second) in [(with, without), (without, with)] {
        let id = Identity::new("fingerprint_both_ways").part(first == with);
        fingerprinted(&gate, &id, first)
            .replay()
            .run(async { Ok::<_, JobError>(1_u32) })
            .await
            .expect("first run");
        let duplicate = fingerprinted(&gate, &id, second)
            .replay()
            .run(async { Ok::<_, JobError>(2_u32) })
            .await;
        assert!(
            matches!(refusal(&duplicate), Rejected::AlreadyDone),
            "{first:?} then {second:?}: {duplicate:?}"
        );
    }
}

/// The guard of `id`, with `payload`'s fingerprint if there is one.
fn fingerprinted<'a>(gate: &'a Gate, id: &'a Identity, payload: Option<i32>) -> idem::Guard<'a> {
    match payload {
        Some(payload) => gate
            .guard(id)
            .fingerprint(idem::Fingerprint::new().part(payload)),
        None => gate.guard(id),
    }
}

#[idempotent(key = "job")]
async fn r#move(gate: &Gate, job: u32) -> Result<u32, JobError> {
    Ok(job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_identifier_s_action_is_its_name_without_r_hash() {
    let gate = testing::gate().await;
    r#move(&gate, 1).await.expect("ran");
    let plain = Identity::new("move").part(1_u32);
    assert_eq!(
        rows::row_state(&gate, &plain.address()).await.as_deref(),
        Some("success"),
        "the action is \"move\""
    );
}
