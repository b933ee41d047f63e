//! What a claim's holder is told and the outcome cache across stores (issue
//! 25, items 11, 12 and 19), against a real PostgreSQL.
//!
//! - A holder whose outcome somebody else recorded (a reconciler or an
//!   operator resolved its claim, an earlier holder's late success settled
//!   it, its lease ran out into doubt) is told so, and every duplicate
//!   hears the same story: the recorded one.
//! - One outcome cache shared by gates on two stores (two databases, two
//!   schemas) never answers one from the other.
//!
//! A claim in the caller's transaction (items 20 and 21) is the builder's
//! `tx`, whose types keep its connection discipline (`guard.rs`, and the
//! `tests/ui/guard/` cases).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::cache::OutcomeCache;
use idem::operations::{self, Resolved, Resolver, Slot};
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, PgPool};
use idem::testing;
use idem::testing::GateEvent;
use idem::{Disposition, Gate, Identity, OnExpiry, Outcome, Rejected};
use idem_test_support::fault_proxy::{Proxy, Statement};
use idem_test_support::rows;
use tokio::sync::Notify;

/// `result`'s refusal, if it is one.
fn refusal<T: std::fmt::Debug>(result: &Result<T, Rejected>) -> &Rejected {
    match result {
        Err(rejected) => rejected,
        Ok(value) => panic!("expected a refusal, got Ok({value:?})"),
    }
}

/// The slot of `id` in `gate`'s scope, as the operators' API takes it.
fn slot<'a>(gate: &'a Gate, address: &'a str) -> Slot<'a> {
    Slot::new(gate.account_name(), gate.namespace_name(), address)
}

// ---------------------------------------------------------------------------
// Item 11: whoever did not write the recorded outcome is told so.
// ---------------------------------------------------------------------------

/// A slow holder's claim is resolved as succeeded (with the probe's value)
/// while its body runs; the body then returns another value. The holder is
/// told its outcome was not recorded, and every replay (fired at once) gets
/// the probe's value: one story.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_whose_claim_was_resolved_meanwhile_is_told_and_replays_agree() {
    let gate = testing::gate().await;
    let id = Identity::new("h11_resolved").part("ord_1");
    let address = id.address();
    let resolved = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let holder = {
        let (gate, id, resolved, started) = (
            gate.clone(),
            id.clone(),
            Arc::clone(&resolved),
            Arc::clone(&started),
        );
        tokio::spawn(async move {
            gate.guard(&id)
                .replay()
                .run(async {
                    started.notify_one();
                    // A slow body: it finishes only after the resolution.
                    resolved.notified().await;
                    Ok::<_, Rejected>("the holder's value".to_owned())
                })
                .await
        })
    };
    started.notified().await;
    let by = Resolver::new("reconciled");
    let outcome = operations::resolve_as(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Succeeded(Some(r#""the probe's value""#)),
        by,
    )
    .await
    .expect("resolved");
    assert!(matches!(outcome, Resolved::Changed { .. }), "{outcome:?}");
    resolved.notify_one();
    let told = holder.await.expect("the holder's task");
    assert_eq!(
        refusal(&told).reason(),
        "not_recorded",
        "the holder must hear that the recorded outcome is not its own: {told:?}"
    );
    assert!(
        refusal(&told).to_string().contains("resolved"),
        "the message says who recorded what: {told:?}"
    );

    let ran = AtomicUsize::new(0);
    let replays = testing::race(4, || async {
        gate.guard(&id)
            .replay()
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Rejected>("a duplicate's value".to_owned())
            })
            .await
    })
    .await;
    assert_eq!(ran.load(Ordering::SeqCst), 0, "no duplicate runs the body");
    assert_eq!(replays.replayed(), 4, "every duplicate is handed the value");
}

/// The same through the reconciler: a slow holder's pending claim (no lease:
/// nothing renews it) is resolved by a probe (`pending_older_than`); the
/// holder's late success is told it was not recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_whose_pending_claim_a_reconciler_resolved_is_told() {
    use idem::reconcile::{Reconciler, Verdict};

    let gate = testing::gate().await;
    let action = testing::unique_name("h11_reconciled");
    let id = Identity::new(&action).part("ord_2");
    let slow = gate.claim(&id).await.expect("won");
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .pending_older_than(Duration::from_millis(1))
        .probe(action.as_str(), |_doubt| async {
            Verdict::succeeded_with(&"probed".to_owned()).unwrap_or(Verdict::Unknown)
        });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 1, "{pass:?}");
    let late = slow.settle().await;
    assert_eq!(refusal(&late).reason(), "not_recorded", "{late:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("success")
    );
}

/// An earlier holder's late success settles the claim that took its
/// expired lease over: the new holder's own success was not recorded, and
/// it is told so (on main it was told `Ok`, the slot holding the earlier
/// holder's value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_row_an_earlier_holders_late_success_settled_is_told() {
    let gate = testing::gate().await;
    let id = Identity::new("h11_late_over").part("ord_3");
    let stale = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("first holder");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = gate
        .guard(&id)
        .lease(Duration::from_millis(150))
        .claim()
        .await
        .expect("taken over");
    let late = stale.settle().await;
    assert_eq!(refusal(&late).reason(), "lease_lost", "{late:?}");
    let own = current.settle().await;
    assert_eq!(
        refusal(&own).reason(),
        "not_recorded",
        "the slot records the earlier holder's success, not this one's: {own:?}"
    );
}

/// A settle carrying the value to replay commits and its reply is lost:
/// the retried settle finds the success under its own fence, written by
/// itself (not resolved, not an earlier holder's late success), and the
/// holder is told `Ok` with its value, as every replay is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_whose_reply_was_lost_is_still_its_own_outcome() {
    let proxy = Proxy::start().await;
    let pool = crate::support::proxy::pool_through(&proxy).await;
    let gate = testing::gate_on(pool).await;
    let id = Identity::new("h11_lost_reply").part(1);
    assert!(proxy.lose_next_reply(Statement::Settle));
    let first = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>("mine".to_owned()) })
        .await;
    assert_eq!(
        proxy
            .take_lost_replies()
            .into_iter()
            .map(|lost| lost.statement)
            .collect::<Vec<_>>(),
        [Statement::Settle],
        "the settle's reply was lost"
    );
    assert_eq!(first.expect("the holder's own outcome"), "mine");
    let again = gate
        .guard(&id)
        .replay()
        .run(async { Ok::<_, Rejected>("again".to_owned()) })
        .await;
    assert_eq!(again.expect("replayed"), "mine");
}

// ---------------------------------------------------------------------------
// Item 12: a late failure on a claim its lease turned in doubt.
// ---------------------------------------------------------------------------

/// A claim whose lease ran out under `on_expiry = "in_doubt"`, turned in
/// doubt by a duplicate.
async fn expired_into_doubt(gate: &Gate, id: &Identity) -> idem::Claim {
    let slow = gate
        .guard(id)
        .lease(Duration::from_millis(150))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("won");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let duplicate = gate
        .guard(id)
        .lease(Duration::from_millis(150))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await;
    assert!(matches!(duplicate, Err(Rejected::InDoubt)), "{duplicate:?}");
    slow
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_failure_on_a_claim_its_lease_turned_in_doubt_is_told_it_was_not_recorded() {
    let gate = testing::gate().await;
    for (part, disposition) in [
        ("keep", Disposition::Keep),
        ("release", Disposition::Release),
        ("in_doubt", Disposition::InDoubt),
    ] {
        let id = Identity::new("h12_late_failure").part(part);
        let slow = expired_into_doubt(&gate, &id).await;
        let (late, events) = testing::observe(slow.dispose(disposition)).await;
        assert_eq!(
            refusal(&late).reason(),
            "not_recorded",
            "a late {disposition:?} must hear the slot is held in doubt: {late:?}"
        );
        assert!(
            refusal(&late).to_string().contains("in doubt"),
            "the message says what the slot records: {late:?}"
        );
        assert!(
            matches!(events[..], [GateEvent::Unrecorded(_)]),
            "the event says nothing was recorded: {events:?}"
        );
        assert_eq!(
            rows::row_state(&gate, &id.address()).await.as_deref(),
            Some("in_doubt"),
            "the slot stays held in doubt"
        );
    }
}

// ---------------------------------------------------------------------------
// Item 19: one cache, two stores.
// ---------------------------------------------------------------------------

/// The test server's connect options, on `database`.
fn options_for(database: &str) -> PgConnectOptions {
    let options: PgConnectOptions = testing::database_url().parse().expect("DATABASE_URL");
    options.database(database)
}

async fn pool_on(options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("connect")
}

/// Runs `id` on `gate`, counting the runs of its body in `ran`.
async fn run_counted(gate: &Gate, id: &Identity, ran: &AtomicUsize) -> Result<(), Rejected> {
    gate.run(id, async {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cache_shared_by_gates_on_two_databases_answers_each_from_its_own() {
    let admin = testing::pool_with(1).await;
    let database = testing::unique_name("idem_second_store");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&admin)
        .await
        .expect("create the second database");
    let cache = OutcomeCache::builder().ttl(Duration::from_secs(60)).build();
    let account = testing::unique_name("shared");
    let first = testing::gate()
        .await
        .account(&account)
        .with_cache(cache.clone());
    let second_pool = pool_on(options_for(&database)).await;
    let second = Gate::connect(second_pool.clone())
        .await
        .expect("a gate on the second database")
        .account(&account)
        .with_cache(cache);
    let id = Identity::new("h19_charge").part("ord_1");
    let ran = AtomicUsize::new(0);
    run_counted(&first, &id, &ran)
        .await
        .expect("runs in the first store");
    let second_run = run_counted(&second, &id, &ran).await;
    let ran_in_second = rows::row_state(&second, &id.address()).await;
    second_pool.close().await;
    let _dropped = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&admin)
        .await;
    assert!(
        second_run.is_ok(),
        "the second database never ran the action: it was answered from the first's \
         outcome: {second_run:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2, "once in each store");
    assert_eq!(ran_in_second.as_deref(), Some("success"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cache_shared_by_gates_on_two_schemas_answers_each_from_its_own() {
    let admin = testing::pool_with(1).await;
    let cache = OutcomeCache::builder().ttl(Duration::from_secs(60)).build();
    let account = testing::unique_name("shared");
    let (mut schemas, mut gates) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        // In the database DATABASE_URL names (the partitioned run's and
        // Citus's included), each schema with idem's table of its own.
        let (schema, pool) = idem_test_support::schemas::fresh_schema(2).await;
        let gate = Gate::connect(pool)
            .await
            .expect("a gate in the schema")
            .account(&account)
            .with_cache(cache.clone());
        schemas.push(schema);
        gates.push(gate);
    }
    let id = Identity::new("h19_charge").part("ord_2");
    let ran = AtomicUsize::new(0);
    let results = [
        run_counted(&gates[0], &id, &ran).await,
        run_counted(&gates[1], &id, &ran).await,
    ];
    for gate in &gates {
        gate.pool().close().await;
    }
    for schema in &schemas {
        let _dropped = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&admin)
            .await;
    }
    assert!(
        results.iter().all(Result::is_ok),
        "each schema runs the action once: {results:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// Two gates on one store (two pools, one database) still share what the
/// cache learned: the store's identity is the same however it is reached.
/// The second gate's pool goes through a proxy that is then cut, so only
/// the cache can answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cache_shared_by_gates_on_one_store_answers_both() {
    let cache = OutcomeCache::builder().ttl(Duration::from_secs(60)).build();
    let first = testing::gate().await.with_cache(cache.clone());
    let proxy = Proxy::start().await;
    let second = testing::gate_on(proxy.pool(2).await)
        .await
        .account(first.account_name())
        .with_cache(cache);
    let id = Identity::new("h19_same_store").part("ord_3");
    let ran = AtomicUsize::new(0);
    run_counted(&first, &id, &ran).await.expect("runs once");
    proxy.cut().await;
    let answered = run_counted(&second, &id, &ran).await;
    assert!(
        matches!(answered, Err(Rejected::AlreadyDone)),
        "the same store is answered from the cache, with no round trip: {answered:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}
