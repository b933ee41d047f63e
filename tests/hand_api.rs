//! What a claim's holder is told, the outcome cache across stores, and the
//! hand-written API's connection discipline (issue 25, items 11, 12, 19, 20
//! and 21), against a real PostgreSQL.
//!
//! - A holder whose outcome somebody else recorded (a reconciler or an
//!   operator resolved its claim, an earlier holder's late success settled
//!   it, its lease ran out into doubt) is told so, and every duplicate
//!   hears the same story: the recorded one.
//! - One outcome cache shared by gates on two stores (two databases, two
//!   schemas) never answers one from the other.
//! - A claim in the caller's transaction refuses what it cannot honour (a
//!   lease, a wait, failing open) before any statement, and its outcome
//!   methods on the pool fail at once, naming the `_in` method to call,
//!   instead of waiting forever on the caller's own open transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::cache::OutcomeCache;
use idem::operations::{self, Resolution, Resolved, Resolver, Slot};
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, PgPool};
use idem::testing;
use idem::{Disposition, Gate, GateEvent, Identity, Mode, OnExpiry, OnUnavailable, Rejected};
use idem_test_support::fault_proxy::{Proxy, Statement};
use idem_test_support::rows;
use tokio::sync::Notify;

/// Long enough that only a call that waits (on a lock, on a transaction)
/// reaches it: it tells a hang from an answer, and measures no speed.
const HANG: Duration = Duration::from_secs(20);

/// `result`'s refusal, if it is one.
fn refusal<T: std::fmt::Debug>(result: &Result<T, Rejected>) -> &Rejected {
    match result {
        Err(rejected) => rejected,
        Ok(value) => panic!("expected a refusal, got Ok({value:?})"),
    }
}

/// The slot of `id` in `gate`'s scope, as the operators' API takes it.
fn slot<'a>(gate: &'a Gate, address: &'a str) -> Slot<'a> {
    Slot {
        account: gate.account_name(),
        namespace: gate.namespace_name(),
        address,
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
    let schemas = [
        testing::unique_name("idem_store_a"),
        testing::unique_name("idem_store_b"),
    ];
    let cache = OutcomeCache::builder().ttl(Duration::from_secs(60)).build();
    let account = testing::unique_name("shared");
    let mut gates = Vec::new();
    for schema in &schemas {
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .expect("create the schema");
        let options = options_for("postgres").options([("search_path", schema.as_str())]);
        let gate = Gate::connect(pool_on(options).await)
            .await
            .expect("a gate in the schema")
            .account(&account)
            .with_cache(cache.clone());
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

