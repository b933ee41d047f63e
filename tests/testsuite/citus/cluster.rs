//! idem on a Citus cluster: what only a distributed `idem_records` can get
//! wrong. Races whose accounts live on both workers, a transaction that
//! claims on two workers, metering batches spread over shards, the
//! set-up's refusals and concurrency, and verification of every shard
//! placement.
//!
//! These need `DATABASE_URL` to be a Citus coordinator whose `idem_records`
//! is distributed by account: `scripts/test-citus` starts such a cluster,
//! runs the whole suite against it, then these (`--ignored`). Plain
//! `cargo test` shows them as ignored, never as passed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use idem::meter::Event;
use idem::schema::{self, Layout};
use idem::sqlx::{self, PgPool, Row};
use idem::{Error, Gate, Identity, Rejected, SchemaProblem, testing};
use idem_test_support::{JobError, citus, schemas};

/// The coordinator the suite runs against, checked to be one.
async fn coordinator(connections: u32) -> PgPool {
    let pool = testing::pool_with(connections).await;
    let layout = schema::layout(&pool).await.expect("read the layout");
    assert!(
        layout
            .as_ref()
            .is_some_and(Layout::is_distributed_by_account),
        "DATABASE_URL={} must be a Citus coordinator with idem_records distributed by account \
         (scripts/test-citus sets one up); the layout is {layout:?}",
        testing::database_url()
    );
    pool
}

/// `per_worker` new account names for each worker, by where Citus places
/// each candidate's shard: `host:port` -> accounts.
async fn accounts_by_worker(pool: &PgPool, per_worker: usize) -> BTreeMap<String, Vec<String>> {
    let prefix = testing::unique_name("citus");
    let mut by_worker: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in 0..10_000 {
        let account = format!("{prefix}_{n}");
        let node = citus::worker_of(pool, &account)
            .await
            .expect("where the account's shard is");
        let accounts = by_worker.entry(node).or_default();
        if accounts.len() < per_worker {
            accounts.push(account);
        }
        if by_worker.len() >= 2 && by_worker.values().all(|a| a.len() == per_worker) {
            return by_worker;
        }
    }
    panic!("no two workers among the shards' placements: {by_worker:?}");
}

/// How many claim rows of `accounts` each worker holds, counted in the
/// shards themselves.
async fn rows_by_worker(pool: &PgPool, accounts: &[String]) -> BTreeMap<String, i64> {
    let list = accounts
        .iter()
        .map(|a| format!("''{a}''"))
        .collect::<Vec<_>>()
        .join(", ");
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT c.nodename || ':' || c.nodeport AS node, sum(r.result::bigint)::bigint AS claims \
         FROM run_command_on_shards('idem_records', \
              'SELECT count(*) FROM %s WHERE kind = ''claim'' AND account IN ({list})') r \
         JOIN citus_shards c ON c.shardid = r.shardid \
         WHERE r.success GROUP BY 1"
    )))
    .fetch_all(pool)
    .await
    .expect("count the rows on each worker");
    rows.iter()
        .map(|row| (row.get("node"), row.get("claims")))
        .collect()
}

#[derive(Default)]
struct Ledger(AtomicUsize);

impl Ledger {
    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn the_distributed_table_passes_verification_on_every_placement() {
    let pool = coordinator(2).await;
    assert_eq!(schema::verify(&pool).await.expect("verify"), None);
    let layout = schema::layout(&pool).await.expect("layout");
    assert!(
        matches!(layout, Some(Layout::Distributed { shards, .. }) if shards >= 2),
        "{layout:?}"
    );
}

/// 48 invocations at once per identity, for accounts on both workers, all
/// racing together: each body runs once, and the rows are on both workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn forty_eight_way_races_across_accounts_on_both_workers_run_each_body_once() {
    let pool = coordinator(16).await;
    let by_worker = accounts_by_worker(&pool, 3).await;
    let accounts: Vec<String> = by_worker.values().flatten().cloned().collect();
    let gate = Gate::connect(pool.clone()).await.expect("gate");
    for round in 0..3 {
        let ledgers: Vec<Ledger> = accounts.iter().map(|_| Ledger::default()).collect();
        let races = accounts.iter().zip(&ledgers).map(|(account, ledger)| {
            let gate = gate.account(account);
            let id = Identity::new("citus_race").part(round);
            async move {
                testing::race(48, || {
                    gate.run(&id, async {
                        ledger.0.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, JobError>(())
                    })
                })
                .await
            }
        });
        for (report, (account, ledger)) in join_all(races)
            .await
            .iter()
            .zip(accounts.iter().zip(&ledgers))
        {
            report.assert_exactly_once();
            assert_eq!(ledger.runs(), 1, "round {round}, {account}: {report}");
        }
    }
    let spread = rows_by_worker(&pool, &accounts).await;
    assert_eq!(spread.len(), 2, "claims on both workers: {spread:?}");
    for (worker, accounts) in &by_worker {
        assert_eq!(
            spread.get(worker).copied(),
            Some(3 * i64::try_from(accounts.len()).expect("few")),
            "{worker} holds its accounts' 3 rounds of claims: {spread:?}"
        );
    }
}

/// One transaction claims in an account on each worker: both commit
/// together, or (rolled back) neither is held and both run afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn a_transaction_claiming_on_two_workers_commits_or_rolls_back_both() {
    let pool = coordinator(4).await;
    let gate = Gate::connect(pool.clone()).await.expect("gate");
    let gates: Vec<Gate> = accounts_by_worker(&pool, 1)
        .await
        .values()
        .flatten()
        .map(|account| gate.account(account))
        .collect();
    for commit in [false, true] {
        let id = Identity::new("citus_tx").part(u8::from(commit));
        let mut tx = pool.begin().await.expect("begin");
        for on_worker in &gates {
            let claim = on_worker.guard(&id).tx(&mut tx).claim().await;
            let settled = claim.expect("claimed in the transaction").settle(&mut tx);
            settled.await.expect("settled in it");
        }
        if commit {
            tx.commit().await.expect("a two-worker commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        let again = join_all(
            gates
                .iter()
                .map(|g| g.run(&id, async { Ok::<_, JobError>(()) })),
        );
        for outcome in again.await {
            let expected = if commit {
                // Committed on both workers: done on both.
                matches!(outcome, Err(JobError::Rejected(Rejected::AlreadyDone)))
            } else {
                // Rolled back on both: free on both.
                outcome.is_ok()
            };
            assert!(expected, "committed: {commit}, then {outcome:?}");
        }
    }
}

/// An ordered event's claim on Citus is said in statements Citus routes
/// whole to the account's worker (one task, no subplan run on the
/// coordinator), in both namespace forms; and events of entities in
/// accounts on both workers, each entity's delivered all at once, run one
/// at a time, never older after newer, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn ordered_events_are_claimed_by_routed_statements_on_both_workers() {
    use idem::__internal::store::ordered;
    let pool = coordinator(16).await;
    let by_worker = accounts_by_worker(&pool, 2).await;
    let accounts: Vec<String> = by_worker.values().flatten().cloned().collect();
    let account = accounts[0].as_str();
    for namespace in [None, Some("ordered")] {
        let explained = [
            (
                "take_entity_routed",
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "EXPLAIN (COSTS OFF) {}",
                    ordered::TAKE_ENTITY_ROUTED.for_namespace(namespace)
                )))
                .bind(account)
                .bind("claim_event")
                .bind(namespace)
                .bind(true)
                .bind("claim_entity")
                .bind(b"entity".as_slice())
                .bind(7_i64),
            ),
            (
                "create_entity_routed",
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "EXPLAIN (COSTS OFF) {}",
                    ordered::CREATE_ENTITY_ROUTED.for_namespace(namespace)
                )))
                .bind(account)
                .bind("claim_event")
                .bind(namespace)
                .bind("claim_entity")
                .bind(b"entity".as_slice())
                .bind(7_i64),
            ),
            (
                "claim_event_routed",
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "EXPLAIN (COSTS OFF) {}",
                    ordered::CLAIM_EVENT_ROUTED.for_namespace(namespace)
                )))
                .bind(account)
                .bind("claim_event")
                .bind(namespace)
                .bind(b"event".as_slice())
                .bind(None::<&[u8]>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<bool>)
                .bind("claim_entity")
                .bind(7_i64),
            ),
        ];
        for (name, explain) in explained {
            let plan: Vec<String> = explain
                .fetch_all(&pool)
                .await
                .unwrap_or_else(|error| panic!("{name}: explain: {error}"))
                .iter()
                .map(|row| row.get(0))
                .collect();
            let plan = plan.join("\n");
            assert!(
                plan.contains("Task Count: 1") && !plan.contains("Subplan"),
                "{name} ({namespace:?}) is not routed to one worker:\n{plan}"
            );
        }
    }

    let gate = Gate::connect(pool.clone()).await.expect("gate");
    let events: [(&str, u64); 6] = [("a", 1), ("b", 2), ("c", 2), ("d", 3), ("e", 4), ("f", 5)];
    let deliveries = accounts.iter().flat_map(|account| {
        let gate = gate.account(account);
        let subscription = Identity::new("citus_subscription").part("sub_1");
        let applied = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(&str, u64)>::new()));
        let inside = std::sync::Arc::new(AtomicUsize::new(0));
        events.iter().chain(events.iter()).map(move |(key, order)| {
            let (gate, subscription, applied, inside) = (
                gate.clone(),
                subscription.clone(),
                applied.clone(),
                inside.clone(),
            );
            let event = Identity::new("citus_subscription_event").part(*key);
            async move {
                loop {
                    let result = gate
                        .guard(&event)
                        .ordered(&subscription, *order)
                        .run(async {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two at once");
                            applied.lock().unwrap().push((*key, *order));
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            Ok::<(), Rejected>(())
                        })
                        .await;
                    match result {
                        Err(Rejected::InFlight) => {
                            tokio::time::sleep(Duration::from_millis(5)).await
                        }
                        Ok(()) | Err(Rejected::AlreadyDone | Rejected::Superseded) => {
                            return applied.clone();
                        }
                        Err(other) => panic!("{key} at {order}: {other:?}"),
                    }
                }
            }
        })
    });
    let logs = join_all(deliveries).await;
    for log in logs.iter().step_by(2 * events.len()) {
        let applied = log.lock().unwrap().clone();
        assert!(
            applied.windows(2).all(|pair| pair[0].1 <= pair[1].1),
            "the entity moved back: {applied:?}"
        );
        assert_eq!(
            applied.last().map(|(_, order)| *order),
            Some(5),
            "{applied:?}"
        );
        let keys: std::collections::BTreeSet<&str> = applied.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys.len(), applied.len(), "an event ran twice: {applied:?}");
    }
}

/// Batches for accounts on both workers, recorded at once and re-sent:
/// every event stored once, every re-send deduplicated, totals exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn metering_batches_over_both_workers_store_each_event_once() {
    let pool = coordinator(8).await;
    let by_worker = accounts_by_worker(&pool, 2).await;
    let gate = Gate::connect(pool.clone()).await.expect("gate");
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let events: Vec<Event> = (0..100_i64)
        .map(|n| Event::new(n, "api_calls", n + 1, start + Duration::from_secs(n as u64)))
        .collect();
    let accounts: Vec<&String> = by_worker.values().flatten().collect();
    for attempt in 0..2 {
        let reports = join_all(accounts.iter().flat_map(|account| {
            let meter = gate.account(account).meter();
            let events = &events;
            // Two senders of the same batch per account, at once.
            [meter.clone(), meter].map(|meter| async move { meter.record(events).await })
        }))
        .await;
        let inserted: usize = reports
            .iter()
            .map(|r| r.as_ref().expect("recorded").inserted)
            .sum();
        let deduplicated: usize = reports
            .iter()
            .map(|r| r.as_ref().expect("recorded").deduplicated)
            .sum();
        let expected_new = if attempt == 0 {
            100 * accounts.len()
        } else {
            0
        };
        assert_eq!(inserted, expected_new, "attempt {attempt}");
        assert_eq!(inserted + deduplicated, 200 * accounts.len());
    }
    for account in &accounts {
        let total = gate
            .account(account)
            .meter()
            .total("api_calls", start..start + Duration::from_secs(1_000))
            .await
            .expect("total");
        assert_eq!((total.quantity, total.events), ((1..=100).sum(), 100));
    }
}

/// Set up in a schema of its own: four processes at once all succeed and
/// leave one distributed table; a plain table holding rows is refused,
/// unchanged, with the SQL to distribute it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn distributed_set_up_is_concurrent_safe_and_never_moves_rows() {
    let _ = coordinator(1).await;
    let (schema_name, pool) = schemas::fresh_schema(6).await;
    let results = join_all((0..4).map(|_| schema::set_up_distributed(&pool))).await;
    for result in &results {
        assert!(result.is_ok(), "{result:?}");
    }
    let layout = schema::layout(&pool).await.expect("layout");
    assert!(
        layout
            .as_ref()
            .is_some_and(Layout::is_distributed_by_account),
        "{layout:?}"
    );
    assert_eq!(schema::verify(&pool).await.expect("verify"), None);

    let (plain_schema, plain) = schemas::fresh_schema(2).await;
    schema::set_up(&plain).await.expect("a plain table");
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity) \
         VALUES ('a', 'claim', 'claim_0', 'success', '\\x00')",
    )
    .execute(&plain)
    .await
    .expect("a row");
    let refused = schema::set_up_distributed(&plain).await;
    let Err(Error::Setup(message)) = &refused else {
        panic!("a plain table with rows is refused: {refused:?}");
    };
    assert!(
        message.contains("create_distributed_table('idem_records', 'account')"),
        "says how: {message}"
    );
    assert_eq!(
        schema::layout(&plain).await.expect("layout"),
        Some(Layout::Plain),
        "nothing was changed"
    );
    drop_schemas(&[&schema_name, &plain_schema], [pool, plain]).await;
}

/// A table Citus already distributes, at an earlier version, migrates to
/// the current one in place: every `CREATE INDEX` of a later version is
/// sent on to each shard (a script of several statements holding a bare
/// `CREATE INDEX` was refused there, "cannot insert multiple commands into
/// a prepared statement"), the row stays where it was, and the index of
/// open claims is on every placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn a_distributed_table_of_an_earlier_version_migrates_on_every_shard() {
    let _ = coordinator(1).await;
    let (schema_name, pool) = distributed_at_version(6).await;

    schema::set_up_distributed(&pool)
        .await
        .expect("a distributed table migrates");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM idem_schema_version")
        .fetch_one(&pool)
        .await
        .expect("the version");
    assert_eq!(version, schema::SCHEMA_VERSION);
    assert_eq!(schema::verify(&pool).await.expect("verify"), None);
    let state: String = sqlx::query_scalar("SELECT state FROM idem_records")
        .fetch_one(&pool)
        .await
        .expect("the claim is still there");
    assert_eq!(state, "in_doubt");
    assert_open_claims_index_on_every_placement(&pool).await;
    drop_schemas(&[&schema_name], [pool]).await;
}

/// A schema of its own whose `idem_records`, at schema version `version`,
/// Citus distributes by account, with a claim in doubt in it.
async fn distributed_at_version(version: i32) -> (String, PgPool) {
    let (schema_name, pool) = schemas::fresh_schema(2).await;
    for migration in idem::__internal::MIGRATIONS
        .iter()
        .filter(|m| m.version <= version)
    {
        sqlx::raw_sql(sqlx::AssertSqlSafe(migration.sql))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("version {}: {e}", migration.version));
    }
    sqlx::raw_sql(
        "SELECT create_distributed_table('idem_records', 'account'); \
         INSERT INTO idem_records (account, kind, address, state, identity) \
         VALUES ('acme', 'claim', 'claim_0', 'in_doubt', '\\x00')",
    )
    .execute(&pool)
    .await
    .unwrap_or_else(|e| panic!("distribute the version {version} table, with a claim: {e}"));
    (schema_name, pool)
}

/// Every shard placement of `idem_records` has a valid index of open
/// claims.
async fn assert_open_claims_index_on_every_placement(pool: &PgPool) {
    let placements: Vec<(bool, String)> = sqlx::query_as(
        "SELECT success, result FROM run_command_on_placements('idem_records', \
           $$SELECT count(*) FROM pg_index WHERE indrelid = to_regclass('%s') AND indisvalid \
               AND strpos(pg_get_expr(indpred, indrelid), 'DISTINCT FROM') > 0$$)",
    )
    .fetch_all(pool)
    .await
    .expect("the indexes of every placement");
    assert!(!placements.is_empty());
    assert!(
        placements.iter().all(|(ok, count)| *ok && count == "1"),
        "each placement has the index of open claims: {placements:?}"
    );
}

/// docs/operations.md's recipe on Citus: `CREATE INDEX CONCURRENTLY` on
/// the coordinator builds the index of open claims on every shard, and the
/// migration to version 9 then keeps it (the same index) and records its
/// version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn the_concurrent_recipe_on_the_coordinator_builds_every_shard_s_and_the_migration_keeps_it()
{
    let _ = coordinator(1).await;
    let (schema_name, pool) = distributed_at_version(8).await;
    sqlx::raw_sql(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_open_claims
            ON idem_records (account, state, created_at, address)
            WHERE kind = 'claim' AND state IS DISTINCT FROM 'success';",
    )
    .execute(&pool)
    .await
    .expect("the recipe, as docs/operations.md gives it");
    assert_open_claims_index_on_every_placement(&pool).await;
    let index_oid = || async {
        sqlx::query_scalar::<_, i64>("SELECT to_regclass('idem_records_open_claims')::oid::int8")
            .fetch_one(&pool)
            .await
            .expect("the index's oid")
    };
    let built = index_oid().await;

    schema::set_up_distributed(&pool)
        .await
        .expect("the migration");
    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM idem_schema_version")
        .fetch_one(&pool)
        .await
        .expect("the version");
    assert_eq!(version, schema::SCHEMA_VERSION);
    assert_eq!(
        index_oid().await,
        built,
        "the index built by the recipe is kept"
    );
    assert!(
        schema::status(&pool)
            .await
            .expect("status")
            .open_claims_index_present
    );
    assert_open_claims_index_on_every_placement(&pool).await;
    drop_schemas(&[&schema_name], [pool]).await;
}

/// An index missing on one shard placement (dropped on its worker, behind
/// Citus's back) is named at start-up, shard and worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn an_index_missing_on_one_placement_is_named_at_start_up() {
    let _ = coordinator(1).await;
    let (schema_name, pool) = schemas::fresh_schema(2).await;
    schema::set_up_distributed(&pool).await.expect("set up");
    let placement = sqlx::query(
        "SELECT shardid, shard_name, nodename, nodeport FROM citus_shards \
         WHERE table_name = 'idem_records'::regclass ORDER BY shardid LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .expect("a placement");
    let shard: i64 = placement.get("shardid");
    let port: i32 = placement.get("nodeport");
    let host: String = placement.get("nodename");
    let worker = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            schemas::options_in(&schema_name)
                .host(&host)
                .port(u16::try_from(port).expect("a port")),
        )
        .await
        .expect("connect to the worker");
    let mut conn = worker.acquire().await.expect("a worker connection");
    for statement in [
        "SET citus.enable_manual_changes_to_shards TO on".to_owned(),
        format!("DROP INDEX idem_records_unique_without_namespace_{shard}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
            .expect("drop the index on one placement");
    }
    drop(conn);
    worker.close().await;
    let problems = schema::verify(&pool)
        .await
        .expect("verify")
        .expect("a problem");
    let named = problems.problems.iter().any(|problem| {
        matches!(problem, SchemaProblem::Distribution { detail }
            if detail.contains(&format!("shard {shard} on {host}:{port}"))
                && detail.contains("WHERE namespace IS NULL"))
    });
    assert!(named, "{problems}");
    let refused = Gate::connect(pool.clone()).await;
    assert!(matches!(refused, Err(Error::Schema(_))), "{refused:?}");
    drop_schemas(&[&schema_name], [pool]).await;
}

async fn drop_schemas<const N: usize>(names: &[&str], pools: [PgPool; N]) {
    for pool in pools {
        pool.close().await;
    }
    let admin = testing::pool_with(1).await;
    let mut conn = admin.acquire().await.expect("a connection");
    schemas::drop_schemas(&mut conn, names).await;
}

/// A gate connected to a worker instead of the coordinator refuses to
/// start, and says to connect to the coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Citus coordinator: scripts/test-citus runs it"]
async fn a_gate_connected_to_a_worker_refuses_to_start() {
    let pool = coordinator(1).await;
    let worker = sqlx::query(
        "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive \
         ORDER BY nodeid LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .expect("a worker");
    let port: i32 = worker.get("nodeport");
    let host: String = worker.get("nodename");
    let on_worker = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            schemas::options_in("public")
                .host(&host)
                .port(u16::try_from(port).expect("a port")),
        )
        .await
        .expect("connect to the worker");
    let refused = Gate::connect_without_setup(on_worker.clone()).await;
    let Err(Error::Schema(problems)) = &refused else {
        panic!("a worker is refused: {refused:?}");
    };
    assert!(
        problems
            .to_string()
            .contains("connect idem to the coordinator"),
        "{problems}"
    );
    let set_up = schema::set_up_distributed(&on_worker).await;
    assert!(
        matches!(&set_up, Err(Error::Setup(message)) if message.contains("not the coordinator")),
        "{set_up:?}"
    );
    on_worker.close().await;
}
