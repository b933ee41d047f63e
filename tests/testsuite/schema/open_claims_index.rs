//! Schema version 9, `idem_records_open_claims`, attacked: the promises
//! of docs/operations.md ("Set-up and migrations", the console's "On
//! millions of claims", the reconciler), docs/design-decisions.md ("An
//! index of the open claims, and the settles it costs") and the CHANGELOG,
//! each as a test that passes when the promise holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::operations::{self, ClaimState, ListFilter, NamespaceFilter, ScopeFilter};
use idem::schema::SCHEMA_VERSION;
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, AssertSqlSafe, PgPool};
use idem::{Gate, Identity, Rejected};
use idem_test_support::{ChargeError, schemas};

use super::{DEFINED, exec, open_claims_indexes};
use crate::support::doubt::in_doubt as hold_in_doubt;

/// The statement docs/operations.md gives, character for character.
const DOC_RECIPE: &str = "CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_open_claims
    ON idem_records (account, state, created_at, address)
    WHERE kind = 'claim' AND state IS DISTINCT FROM 'success';";

fn options(search_path: &str) -> PgConnectOptions {
    schemas::options_in(search_path)
}

/// A pool of `n` connections whose search_path is `search_path`: another
/// "process".
async fn pool_in(search_path: &str, n: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(n)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options(search_path))
        .await
        .expect("connect")
}

/// A schema at version 8 exactly, as the previous release left it.
async fn v8_schema(n: u32) -> (String, PgPool) {
    let (name, pool) = schemas::fresh_schema(n).await;
    for migration in idem::__internal::MIGRATIONS
        .iter()
        .filter(|m| m.version <= 8)
    {
        exec(&pool, migration.sql).await;
    }
    (name, pool)
}

/// Turns a schema at version 9 back into version 8's shape: no index of
/// open claims, versions 9 and later not recorded.
async fn back_to_v8(pool: &PgPool) {
    exec(
        pool,
        "DROP INDEX IF EXISTS idem_records_open_claims; \
         DELETE FROM idem_schema_version WHERE version >= 9",
    )
    .await;
}

async fn max_version(pool: &PgPool) -> i32 {
    sqlx::query_scalar("SELECT max(version) FROM idem_schema_version")
        .fetch_one(pool)
        .await
        .expect("read the version")
}

/// `n` settled claims of account `account`, made by hand (addresses
/// `claim_<prefix><i>`).
async fn seed(pool: &PgPool, account: &str, prefix: &str, n: i64, state: &str) {
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity, settled_at) \
         SELECT $1, 'claim', 'claim_' || $2 || i, $3, '\\x00', \
                CASE WHEN $3 = 'success' THEN now() END \
         FROM generate_series(1, $4) AS i",
    )
    .bind(account)
    .bind(prefix)
    .bind(state)
    .bind(n)
    .execute(pool)
    .await
    .expect("seed rows");
}

// ---------------------------------------------------------------------
// 1. The documented CONCURRENTLY recipe, then the migration: "the
//    migration then finds it and only records its version".
// ---------------------------------------------------------------------

/// The recipe followed exactly, then `Gate::connect`: the index is kept
/// (same oid), version 9 recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_then_connect_keeps_the_index_and_records_9() {
    let (schema, pool) = v8_schema(2).await;
    seed(&pool, "acme", "s", 5_000, "success").await;
    seed(&pool, "acme", "d", 20, "in_doubt").await;
    exec(&pool, DOC_RECIPE).await;
    let before = open_claims_indexes(&pool).await;
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(before[0].1.ends_with(DEFINED), "{before:?}");

    Gate::connect(pool_in(&schema, 1).await)
        .await
        .expect("migrate to 9");
    let after = open_claims_indexes(&pool).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].0, before[0].0, "the index was built again");
    assert!(after[0].2, "valid");
    assert_eq!(max_version(&pool).await, SCHEMA_VERSION);
}

/// The point of the recipe is not to block writers. With the index built
/// concurrently, the migration is said to "only record its version"; yet
/// the script still issues `CREATE INDEX IF NOT EXISTS`, which takes a
/// SHARE lock on `idem_records` before it looks at the name. A writer's
/// open transaction (a claim made in the caller's transaction, `tx`)
/// then makes the migration wait, and every claim and settle queues behind
/// the migration's lock request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipe_then_migration_does_not_block_writers_behind_a_long_transaction() {
    let (schema, pool) = schemas::fresh_schema(3).await;
    let gate = Gate::connect(pool.clone()).await.expect("set up");
    back_to_v8(&pool).await;
    seed(&pool, "acme", "s", 2_000, "success").await;
    exec(&pool, DOC_RECIPE).await; // the recipe: built without blocking anyone

    // A service of the previous release: one call claims in its caller's
    // transaction, which is still open.
    let mut tx = pool.begin().await.expect("begin");
    let in_tx = Identity::new("charge").part("in_tx");
    let held = gate
        .guard(&in_tx)
        .tx(&mut tx)
        .claim()
        .await
        .expect("claim in the caller's transaction");

    // Another process migrates (the recipe's next step), and an ordinary
    // claim and settle runs, both while that transaction is open. Blocked
    // behind it, either would wait until it ends: the bounds are only
    // there to fail rather than hang.
    let waiting_on_the_table = |pool: PgPool| async move {
        let waiting: Vec<(String, String)> = sqlx::query_as(
            "SELECT l.mode, left(a.query, 80) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE NOT l.granted AND l.relation = to_regclass('idem_records')",
        )
        .fetch_all(&pool)
        .await
        .expect("read pg_locks");
        waiting
    };
    let migrator = pool_in(&schema, 1).await;
    let migration = tokio::time::timeout(Duration::from_secs(30), Gate::connect(migrator)).await;
    let after_migration = waiting_on_the_table(pool.clone()).await;
    let writer = gate.clone();
    let ordinary = tokio::time::timeout(Duration::from_secs(30), async move {
        writer
            .guard(&Identity::new("charge").part("ordinary"))
            .run(async { Ok::<(), ChargeError>(()) })
            .await
    })
    .await;
    let after_ordinary = waiting_on_the_table(pool.clone()).await;

    held.settle(&mut tx).await.expect("settle in tx");
    tx.commit().await.expect("commit");
    assert!(
        matches!(migration, Ok(Ok(_))),
        "the migration of a schema whose index was built first waited for a writer's \
         transaction, or failed: {:?} (waiting on idem_records: {after_migration:?})",
        migration.map(|r| r.map(drop))
    );
    assert!(
        matches!(ordinary, Ok(Ok(()))),
        "an ordinary claim and settle waited behind the migration, which was to \
         'only record its version' (waiting on idem_records: {after_ordinary:?})"
    );
    assert_eq!(max_version(&pool).await, SCHEMA_VERSION);
}

// ---------------------------------------------------------------------
// 2. A failed or invalid concurrent build, and indexes of that name
//    defined any other way.
// ---------------------------------------------------------------------

/// A concurrent build cancelled half way (statement_timeout) leaves an
/// invalid index; the migration drops it and builds it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_concurrent_build_is_built_again() {
    let (schema, pool) = v8_schema(2).await;
    seed(&pool, "acme", "s", 200_000, "success").await;
    seed(&pool, "acme", "d", 10, "in_doubt").await;
    // Interrupted as an operator's statement_timeout would: on one
    // connection, the SET and then the build, each its own statement.
    let builder = pool_in(&schema, 1).await;
    let mut conn = builder.acquire().await.expect("a connection");
    sqlx::raw_sql("SET statement_timeout = '20ms'")
        .execute(&mut *conn)
        .await
        .expect("set");
    let cancelled = sqlx::raw_sql(AssertSqlSafe(DOC_RECIPE.to_owned()))
        .execute(&mut *conn)
        .await;
    drop(conn);
    // Whether it failed or not, fall back to a certain failure.
    if cancelled.is_ok() {
        exec(&pool, "DROP INDEX idem_records_open_claims").await;
        exec(&pool, "UPDATE idem_records SET address = 'claim_dup' WHERE address IN ('claim_d1','claim_d2')").await;
        let failed = sqlx::raw_sql(
            "CREATE UNIQUE INDEX CONCURRENTLY idem_records_open_claims ON idem_records (address) \
             WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        )
        .execute(&pool)
        .await;
        assert!(failed.is_err());
    }
    let left = open_claims_indexes(&pool).await;
    assert_eq!(left.len(), 1);
    assert!(!left[0].2, "an invalid index is left: {left:?}");
    Gate::connect(pool_in(&schema, 1).await)
        .await
        .expect("migrate");
    let after = open_claims_indexes(&pool).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(
        after[0].1.ends_with(DEFINED) && after[0].2 && !after[0].3,
        "{after:?}"
    );
}

/// Indexes of that name on `idem_records` defined any other way: each is
/// dropped and built as the migration defines it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_definition_of_that_name_is_built_again() {
    let wrong = [
        "CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) WHERE kind = 'claim' AND state <> 'success'",
        "CREATE INDEX idem_records_open_claims ON idem_records (account, created_at, state, address) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        "CREATE UNIQUE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        "CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) INCLUDE (fence) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        "CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at DESC, address) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        "CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address)",
        "CREATE INDEX idem_records_open_claims ON idem_records (account COLLATE \"C\", state, created_at, address) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        "CREATE INDEX idem_records_open_claims ON idem_records USING hash (account) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
        "CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) WHERE kind = 'claim' AND state IS DISTINCT FROM 'success' AND account <> 'x'",
    ];
    for definition in wrong {
        let (schema, pool) = v8_schema(1).await;
        seed(&pool, "acme", "d", 3, "in_doubt").await;
        exec(&pool, definition).await;
        Gate::connect(pool_in(&schema, 1).await)
            .await
            .unwrap_or_else(|e| panic!("{definition}: {e}"));
        let after = open_claims_indexes(&pool).await;
        assert_eq!(after.len(), 1, "{definition}: {after:?}");
        assert!(
            after[0].1.ends_with(DEFINED) && after[0].2 && !after[0].3,
            "{definition} was kept: {after:?}"
        );
        assert_eq!(max_version(&pool).await, SCHEMA_VERSION);
    }
}

/// An index of that name on another table of the same schema (an old copy
/// of the table, say `idem_records_archive`, renamed away with its
/// indexes) is "an index of that name defined any other way": the
/// migration must still leave `idem_records` with its index of open
/// claims, or not record version 9. It refuses, naming the index that
/// holds the name and what to do, and changes nothing; once that index is
/// renamed, it migrates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_of_that_name_on_another_table_is_not_taken_for_it() {
    let (schema, pool) = v8_schema(1).await;
    exec(
        &pool,
        "CREATE TABLE idem_records_archive (LIKE idem_records); \
         CREATE INDEX idem_records_open_claims ON idem_records_archive \
             (account, state, created_at, address) \
             WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
    )
    .await;
    let refused = Gate::connect(pool_in(&schema, 1).await).await;
    let message = match &refused {
        Err(error) => format!("{error} {error:?}"),
        Ok(_) => String::new(),
    };
    let version = max_version(&pool).await;
    let on_table = open_claims_indexes(&pool).await;
    assert!(
        version < 9 || on_table.len() == 1,
        "version {version} is recorded, yet idem_records has no index of open claims: \
         the one of that name on idem_records_archive was taken for it"
    );
    assert!(
        message.contains("an index of idem_records_archive") && message.contains("Rename it"),
        "refused, naming what holds the name and what to do: {message}"
    );
    assert_eq!(version, 8, "nothing was changed");

    exec(
        &pool,
        "ALTER INDEX idem_records_open_claims RENAME TO idem_records_archive_open_claims",
    )
    .await;
    Gate::connect(pool_in(&schema, 1).await)
        .await
        .expect("migrates once the name is free");
    assert_eq!(max_version(&pool).await, SCHEMA_VERSION);
    assert_eq!(open_claims_indexes(&pool).await.len(), 1);
}

/// Two schemas on one search_path ("app, then the shared one"): migrating
/// the first must not drop, or wait on, an index of that name that belongs
/// to the second schema's own `idem_records`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_schema_s_index_on_the_search_path_is_left_alone() {
    // The second schema: idem at version 9, its index written by its
    // operator with `<>` (or left invalid by a build of theirs).
    let (other, other_pool) = schemas::fresh_schema(1).await;
    Gate::connect(other_pool.clone())
        .await
        .expect("set up other");
    exec(
        &other_pool,
        "DROP INDEX idem_records_open_claims; \
         CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) \
         WHERE kind = 'claim' AND state <> 'success'",
    )
    .await;
    let other_before = open_claims_indexes(&other_pool).await;
    assert_eq!(other_before.len(), 1);

    // This schema, at version 8, migrated through a search_path that also
    // names the other one.
    let (mine, _mine_pool) = v8_schema(1).await;
    let both = pool_in(&format!("{mine},{other}"), 1).await;
    Gate::connect(both.clone()).await.expect("migrate mine");

    let mine_after = open_claims_indexes(&pool_in(&mine, 1).await).await;
    assert_eq!(mine_after.len(), 1, "{mine_after:?}");
    let other_after = open_claims_indexes(&other_pool).await;
    assert_eq!(
        other_after.iter().map(|r| r.0).collect::<Vec<_>>(),
        other_before.iter().map(|r| r.0).collect::<Vec<_>>(),
        "migrating {mine} dropped (or rebuilt) {other}'s index: {other_before:?} -> {other_after:?}"
    );
}

// ---------------------------------------------------------------------
// 3. Migrating while gates work, and many migrators at once.
// ---------------------------------------------------------------------

/// Gates claiming and settling at a barrier while another process
/// migrates 8 -> 9: every body runs once, nothing is lost, the migration
/// finishes, the index is there and valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gates_work_through_a_migration_each_body_once() {
    const WORKERS: usize = 6;
    const KEYS: i64 = 60;
    let (schema, pool) = schemas::fresh_schema(WORKERS as u32).await;
    let gate = Gate::connect(pool.clone()).await.expect("set up");
    back_to_v8(&pool).await;
    seed(&pool, "acme", "s", 100_000, "success").await;
    seed(&pool, "acme", "d", 50, "in_doubt").await;

    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let barrier = Arc::new(tokio::sync::Barrier::new(WORKERS + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let (gate, runs, barrier) = (gate.clone(), runs.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            for i in 0..KEYS {
                let key = (i + worker as i64 * 7) % KEYS;
                let identity = Identity::new("charge").part(key);
                let runs = runs.clone();
                let outcome: Result<(), ChargeError> = gate
                    .guard(&identity)
                    .run(async move {
                        *runs.lock().unwrap().entry(key).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok(())
                    })
                    .await;
                match outcome {
                    Ok(())
                    | Err(ChargeError::Rejected(Rejected::InFlight))
                    | Err(ChargeError::Rejected(Rejected::AlreadyDone)) => {}
                    Err(other) => panic!("key {key}: {other:?}"),
                }
            }
        });
    }
    let migrator = pool_in(&schema, 1).await;
    let b = barrier.clone();
    let migration = tokio::spawn(async move {
        b.wait().await;
        let started = Instant::now();
        Gate::connect(migrator).await.map(|_| started.elapsed())
    });
    while let Some(done) = tasks.join_next().await {
        done.expect("no worker panicked");
    }
    let took = migration
        .await
        .expect("no panic")
        .expect("the migration finishes");
    let runs = runs.lock().unwrap().clone();
    for key in 0..KEYS {
        assert_eq!(
            runs.get(&key),
            Some(&1),
            "key {key} ran {:?} times",
            runs.get(&key)
        );
        let again: Result<(), ChargeError> = gate
            .guard(&Identity::new("charge").part(key))
            .run(async { Ok(()) })
            .await;
        assert!(
            matches!(again, Err(ChargeError::Rejected(Rejected::AlreadyDone))),
            "key {key}: {again:?}"
        );
    }
    let index = open_claims_indexes(&pool).await;
    assert!(
        index.len() == 1 && index[0].2 && index[0].1.ends_with(DEFINED),
        "{index:?}"
    );
    assert_eq!(max_version(&pool).await, SCHEMA_VERSION);
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        open, 50,
        "the in-doubt rows are all still there (migration took {took:?})"
    );
}

/// Ten processes migrating 8 -> 9 at once: all succeed, one index, valid,
/// version 9 recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_processes_migrate_8_to_9_at_once() {
    const PROCESSES: usize = 10;
    let (schema, pool) = v8_schema(1).await;
    seed(&pool, "acme", "s", 20_000, "success").await;
    let barrier = Arc::new(tokio::sync::Barrier::new(PROCESSES));
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..PROCESSES {
        let (schema, barrier) = (schema.clone(), barrier.clone());
        starts.spawn(async move {
            let own = pool_in(&schema, 1).await;
            barrier.wait().await;
            let r = Gate::connect(own.clone()).await.map(drop);
            own.close().await;
            r
        });
    }
    while let Some(started) = starts.join_next().await {
        started.expect("no panic").expect("every process migrates");
    }
    let index = open_claims_indexes(&pool).await;
    assert!(index.len() == 1 && index[0].2, "{index:?}");
    let nines: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_schema_version WHERE version = 9")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(nines, 1);
}

// ---------------------------------------------------------------------
// 4. The partitioned layout and its recipe (ON ONLY + ATTACH PARTITION).
// ---------------------------------------------------------------------

const COLUMNS_AND_PREDICATE: &str = "(account, state, created_at, address) \
     WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'";

/// A partitioned table at version 8: set up, then the index and version 9
/// taken away.
async fn partitioned_v8(partitions: u16) -> (String, PgPool) {
    let (schema, pool) = schemas::fresh_schema(2).await;
    idem::schema::set_up_partitioned(&pool, partitions)
        .await
        .expect("partitioned");
    Gate::connect(pool.clone()).await.expect("set up");
    back_to_v8(&pool).await;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() \
         AND indexdef LIKE '%IS DISTINCT FROM%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "the partitions' indexes went with the parent's");
    (schema, pool)
}

/// The recipe as docs/operations.md writes it, step by step, on a
/// partitioned table; the migration then keeps that index.
/// The partitioned recipe of docs/operations.md: the index `ON ONLY` the
/// partitioned table (what `after_parent` then sees), then each of
/// `partitions` built concurrently and attached.
async fn partitioned_recipe<T, F: std::future::Future<Output = T>>(
    pool: &PgPool,
    partitions: std::ops::Range<u16>,
    after_parent: impl FnOnce() -> F,
) -> T {
    exec(
        pool,
        &format!(
            "CREATE INDEX idem_records_open_claims ON ONLY idem_records {COLUMNS_AND_PREDICATE}"
        ),
    )
    .await;
    let seen = after_parent().await;
    for p in partitions {
        exec(
            pool,
            &format!(
                "CREATE INDEX CONCURRENTLY idem_records_p{p}_open_claims ON idem_records_p{p} {COLUMNS_AND_PREDICATE}"
            ),
        )
        .await;
        exec(
            pool,
            &format!("ALTER INDEX idem_records_open_claims ATTACH PARTITION idem_records_p{p}_open_claims"),
        )
        .await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_recipe_as_written_then_migration_keeps_it() {
    const N: u16 = 4;
    let (schema, pool) = partitioned_v8(N).await;
    seed(&pool, "acme", "s", 2_000, "success").await;
    seed(&pool, "other", "d", 20, "in_doubt").await;
    let parent = partitioned_recipe(&pool, 0..N, || async {
        let parent = open_claims_indexes(&pool).await;
        assert_eq!(parent.len(), 1);
        assert!(!parent[0].2, "ON ONLY: invalid, and empty");
        parent
    })
    .await;
    let attached = open_claims_indexes(&pool).await;
    assert!(
        attached[0].2,
        "valid once the last is attached: {attached:?}"
    );

    Gate::connect(pool_in(&schema, 1).await)
        .await
        .expect("migrate");
    let after = open_claims_indexes(&pool).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].0, parent[0].0, "built again: {after:?}");
    assert!(after[0].2);
    assert_eq!(max_version(&pool).await, SCHEMA_VERSION);
    let valid_children: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits h JOIN pg_index i ON i.indexrelid = h.inhrelid \
         WHERE h.inhparent = to_regclass('idem_records_open_claims') AND i.indisvalid",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(valid_children, i64::from(N));
}

/// The recipe interrupted half way (two partitions of four attached): the
/// migration finds an invalid index, drops it and builds it on every
/// partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_recipe_half_done_is_built_again() {
    const N: u16 = 4;
    let (schema, pool) = partitioned_v8(N).await;
    seed(&pool, "other", "d", 20, "in_doubt").await;
    partitioned_recipe(&pool, 0..2, || async {}).await;
    Gate::connect(pool_in(&schema, 1).await)
        .await
        .expect("migrate");
    let after = open_claims_indexes(&pool).await;
    assert!(
        after.len() == 1 && after[0].2 && after[0].1.ends_with(DEFINED),
        "{after:?}"
    );
    let valid_children: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits h JOIN pg_index i ON i.indexrelid = h.inhrelid \
         WHERE h.inhparent = to_regclass('idem_records_open_claims') AND i.indisvalid",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(valid_children, i64::from(N));
}

// ---------------------------------------------------------------------
// 5. The index dropped: every reader still answers; nothing verifies it;
//    a later migration does not build it again.
// ---------------------------------------------------------------------

async fn console_get(router: &axum::Router, uri: &str) -> (http::StatusCode, String) {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let request = http::Request::builder()
        .uri(uri)
        .header(http::header::HOST, "127.0.0.1:8080")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_index_every_reader_still_answers_and_nothing_rebuilds_it() {
    let (schema, pool) = schemas::fresh_schema(2).await;
    let gate = Gate::connect(pool.clone())
        .await
        .expect("set up")
        .account("acme");
    exec(&pool, "DROP INDEX idem_records_open_claims").await;
    seed(&pool, "acme", "s", 3_000, "success").await;
    let doubts: Vec<Identity> = (0..3)
        .map(|i| Identity::new("charge").part(i as i64))
        .collect();
    for id in &doubts {
        hold_in_doubt(&gate, id).await;
    }

    // Nothing verifies it, nothing rebuilds it.
    assert!(idem::schema::verify(&pool).await.unwrap().is_none());
    Gate::connect(pool_in(&schema, 1).await)
        .await
        .expect("connect again");
    idem::schema::set_up(&pool).await.expect("idem migrate");
    assert!(
        open_claims_indexes(&pool).await.is_empty(),
        "a later migration built it again"
    );

    // idem claims list --state in_doubt, and --count.
    let filter = ListFilter::new()
        .scope(
            ScopeFilter::new()
                .account("acme")
                .namespace(NamespaceFilter::Any),
        )
        .state(ClaimState::InDoubt);
    assert_eq!(operations::count(&pool, &filter).await.unwrap(), 3);
    assert_eq!(operations::list(&pool, &filter).await.unwrap().len(), 3);
    let all = ListFilter::new().state(ClaimState::InDoubt);
    assert_eq!(operations::count(&pool, &all).await.unwrap(), 3);

    // The gauges.
    let sample = idem::metrics::Gauges::new(pool.clone(), Duration::from_secs(600))
        .sample_once()
        .await
        .expect("gauges");
    assert_eq!(sample.in_doubt, 3, "{sample:?}");
    let sample = idem::metrics::Gauges::new(pool.clone(), Duration::from_secs(600))
        .account("acme")
        .sample_once()
        .await
        .expect("gauges of one account");
    assert_eq!(sample.in_doubt, 3, "{sample:?}");

    // The console.
    let router = idem::console::Console::new(pool.clone())
        .behind_your_auth()
        .router();
    let (status, page) = console_get(&router, "/claims?state=in_doubt").await;
    assert_eq!(status, 200, "{page}");
    for id in &doubts {
        assert!(
            page.contains(&id.address()),
            "{} missing from the list",
            id.address()
        );
    }
    let (status, page) = console_get(&router, "/?account=acme").await;
    assert_eq!(status, 200, "{page}");
    for id in &doubts {
        assert!(
            page.contains(&id.address()),
            "{} missing from the overview",
            id.address()
        );
    }

    // The reconciler.
    let reconciler = idem::reconcile::Reconciler::new(pool.clone())
        .account("acme")
        .probe("charge", |_| {
            std::future::ready(idem::reconcile::Verdict::succeeded())
        });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 3, "{pass:?}");
    assert_eq!(operations::count(&pool, &filter).await.unwrap(), 0);
}

/// "a later migration does not build it again" - for users who run their
/// own migrations with `idem::schema::SCHEMA_SQL`, which the docs offer as
/// the equivalent of `Gate::connect`'s set-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_index_is_not_built_again_by_schema_sql() {
    let (_, pool) = schemas::fresh_schema(1).await;
    exec(&pool, idem::schema::SCHEMA_SQL).await;
    exec(&pool, "DROP INDEX idem_records_open_claims").await;
    exec(&pool, idem::schema::SCHEMA_SQL).await; // the next deploy's migration run
    assert!(
        open_claims_indexes(&pool).await.is_empty(),
        "applying SCHEMA_SQL again built the dropped index again (a blocking CREATE INDEX)"
    );
}

// ---------------------------------------------------------------------
// 6. Which statements read the index: none by address; every listing.
// ---------------------------------------------------------------------

/// idx_scan of `index` in `schema`, after the statistics of closed
/// backends have been flushed (waits until `other_index`'s count stops
/// changing).
async fn idx_scan(admin: &PgPool, schema: &str, index: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(idx_scan), 0)::int8 FROM pg_stat_all_indexes \
         WHERE schemaname = $1 AND indexrelname = $2",
    )
    .bind(schema)
    .bind(index)
    .fetch_one(admin)
    .await
    .expect("read idx_scan")
}

async fn settle_stats(admin: &PgPool, schema: &str) {
    let mut last = -1;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = idx_scan(admin, schema, "idem_records_unique_without_namespace").await;
        if now == last && now > 0 {
            return;
        }
        last = now;
    }
}

/// Every kind of call the gate makes by address, many times over on one
/// connection (so generic plans are used too).
async fn gate_workload(gate: &Gate, round: &str) {
    for i in 0..8_i64 {
        let id = |what: &str| Identity::new("charge").part(round).part(what).part(i);
        let ok: Result<(), ChargeError> = gate.guard(&id("ok")).run(async { Ok(()) }).await;
        ok.expect("success");
        let dup: Result<(), ChargeError> = gate.guard(&id("ok")).run(async { Ok(()) }).await;
        assert!(dup.is_err());
        let rel: Result<(), ChargeError> = gate
            .guard(&id("release"))
            .disposition(ChargeError::disposition)
            .run(async { Err(ChargeError::Invalid) })
            .await;
        assert!(matches!(rel, Err(ChargeError::Invalid)));
        let keep: Result<(), ChargeError> = gate
            .guard(&id("keep"))
            .disposition(ChargeError::disposition)
            .run(async { Err(ChargeError::Declined) })
            .await;
        assert!(matches!(keep, Err(ChargeError::Declined)));
        hold_in_doubt(gate, &id("doubt")).await;
        let refused: Result<(), ChargeError> = gate.guard(&id("doubt")).run(async { Ok(()) }).await;
        assert!(refused.is_err());
        let leased: Result<(), ChargeError> = gate
            .guard(&id("lease"))
            .lease(Duration::from_secs(30))
            .run(async { Ok(()) })
            .await;
        leased.expect("leased");
        let replayed: Result<i64, ChargeError> = gate
            .guard(&id("replay"))
            .replay()
            .run(async { Ok(7) })
            .await;
        replayed.expect("replay");
        let scope = ScopeFilter::new()
            .account(gate.account_name())
            .namespace(NamespaceFilter::Any);
        operations::find(gate.pool(), &id("ok").address(), &scope)
            .await
            .expect("find by address");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_by_address_reads_the_index_of_open_claims() {
    let admin = idem::testing::pool_with(1).await;
    // (label, open claims of the hot account, successes, analyse?)
    let shapes = [
        ("empty, unanalysed", 0_i64, 0_i64, false),
        ("many open of one account, unanalysed", 20_000, 3, false),
        ("many open of one account, analysed", 20_000, 3, true),
        ("few successes, many open, analysed", 5_000, 10, true),
    ];
    let mut broken = Vec::new();
    for (label, open, successes, analyse) in shapes {
        let (schema, setup) = schemas::fresh_schema(1).await;
        Gate::connect(setup.clone()).await.expect("set up");
        seed(&setup, "hot", "o", open, "in_doubt").await;
        seed(&setup, "hot", "s", successes, "success").await;
        if analyse {
            exec(&setup, "ANALYZE idem_records").await;
        }
        setup.close().await;
        settle_stats(&admin, &schema).await;
        let before = idx_scan(&admin, &schema, "idem_records_open_claims").await;

        let pool = pool_in(&schema, 1).await;
        let gate = Gate::connect_without_setup(pool.clone())
            .await
            .expect("connect")
            .account("hot");
        gate_workload(&gate, "a").await;
        gate_workload(&gate, "b").await;
        pool.close().await;
        settle_stats(&admin, &schema).await;
        let after = idx_scan(&admin, &schema, "idem_records_open_claims").await;
        if after != before {
            broken.push(format!(
                "{label}: {} scans of the open-claims index",
                after - before
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "statements by address read the index: {broken:?}"
    );
}

/// Each reader the docs name reads the index, on a table of successes
/// with statistics taken: the reconciler's pass, `idem claims list
/// --state` (and --count), the gauges, the console's list of one state.
/// A reader the docs say reads the index of open claims, over five claims
/// in doubt of the account `acme`.
#[derive(Debug, Clone, Copy)]
enum Reader {
    /// `claims list --state in_doubt`, every account.
    ListInDoubt,
    /// `claims list --state in_doubt --count --account acme`.
    CountInDoubtOfAcme,
    /// The gauges of every account.
    Gauges,
    /// The gauges of `acme`.
    GaugesOfAcme,
    /// A reconciler's pass.
    ReconcilerPass,
    /// The console's `/claims?state=in_doubt`.
    ConsoleList,
}

impl Reader {
    const ALL: [Reader; 6] = [
        Reader::ListInDoubt,
        Reader::CountInDoubtOfAcme,
        Reader::Gauges,
        Reader::GaugesOfAcme,
        Reader::ReconcilerPass,
        Reader::ConsoleList,
    ];

    /// Reads, and checks it read the five claims in doubt.
    async fn read(self, pool: PgPool) {
        match self {
            Reader::ListInDoubt => {
                let f = ListFilter::new().state(ClaimState::InDoubt);
                assert_eq!(operations::list(&pool, &f).await.unwrap().len(), 5);
            }
            Reader::CountInDoubtOfAcme => {
                let f = ListFilter::new()
                    .scope(ScopeFilter::new().account("acme"))
                    .state(ClaimState::InDoubt);
                assert_eq!(operations::count(&pool, &f).await.unwrap(), 5);
            }
            Reader::Gauges | Reader::GaugesOfAcme => {
                let gauges = idem::metrics::Gauges::new(pool, Duration::from_secs(600));
                let gauges = match self {
                    Reader::GaugesOfAcme => gauges.account("acme"),
                    _ => gauges,
                };
                assert_eq!(gauges.sample_once().await.unwrap().in_doubt, 5);
            }
            Reader::ReconcilerPass => {
                let r = idem::reconcile::Reconciler::new(pool).probe("charge", |_| {
                    std::future::ready(idem::reconcile::Verdict::Unknown)
                });
                let pass = r.reconcile_once().await.unwrap();
                assert_eq!(pass.probed, 5, "{pass:?}");
            }
            Reader::ConsoleList => {
                let router = idem::console::Console::new(pool)
                    .behind_your_auth()
                    .router();
                let (status, _) = console_get(&router, "/claims?state=in_doubt").await;
                assert_eq!(status, 200);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_named_reader_reads_the_index() {
    let admin = idem::testing::pool_with(1).await;
    let (schema, setup) = schemas::fresh_schema(1).await;
    let gate = Gate::connect(setup.clone())
        .await
        .expect("set up")
        .account("acme");
    seed(&setup, "acme", "s", 50_000, "success").await;
    seed(&setup, "other", "s", 50_000, "success").await;
    for i in 0..5_i64 {
        hold_in_doubt(&gate, &Identity::new("charge").part(i)).await;
    }
    exec(&setup, "ANALYZE idem_records").await;
    setup.close().await;

    let mut not_using = Vec::new();
    for reader in Reader::ALL {
        settle_stats(&admin, &schema).await;
        let before = idx_scan(&admin, &schema, "idem_records_open_claims").await;
        let pool = pool_in(&schema, 1).await;
        reader.read(pool.clone()).await;
        pool.close().await;
        // Wait for the reader's backend's statistics.
        let mut after = before;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            after = idx_scan(&admin, &schema, "idem_records_open_claims").await;
            if after > before {
                break;
            }
        }
        if after == before {
            not_using.push(reader);
        }
    }
    assert!(
        not_using.is_empty(),
        "these readers did not read the index: {not_using:?}"
    );
}

// ---------------------------------------------------------------------
// 7. A run-time role without DDL rights, after the migration; hostile
//    account names in the lists the index serves.
// ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_role_connects_after_the_migration() {
    const GRANTS_SQL: &str = include_str!("../../../idem-runtime/sql/grants.sql");
    let (schema, pool) = v8_schema(1).await;
    exec(&pool, DOC_RECIPE).await;
    Gate::connect(pool.clone())
        .await
        .expect("the owner migrates");
    let role = idem::testing::unique_name("idem_rt9");
    exec(&pool, &format!("CREATE ROLE \"{role}\" LOGIN")).await;
    let grants = GRANTS_SQL
        .replace(":\"idem_role\"", &format!("\"{role}\""))
        .replace(":\"idem_schema\"", &format!("\"{schema}\""));
    exec(&pool, &grants).await;
    let result = async {
        let runtime = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options(&schema).username(&role))
            .await
            .expect("log in as the run-time role");
        let gate = Gate::connect(runtime.clone()).await?;
        let id = Identity::new("charge").part("rt");
        let ran: Result<(), ChargeError> = gate.guard(&id).run(async { Ok(()) }).await;
        ran.expect("claim and settle as the run-time role");
        hold_in_doubt(&gate, &Identity::new("charge").part("rt_doubt")).await;
        let f = ListFilter::new().state(ClaimState::InDoubt);
        assert_eq!(operations::count(&runtime, &f).await?, 1);
        runtime.close().await;
        Ok::<(), idem::Error>(())
    }
    .await;
    exec(
        &pool,
        &format!("DROP SCHEMA \"{schema}\" CASCADE; DROP ROLE \"{role}\""),
    )
    .await;
    result.expect("the run-time role works after the migration");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_account_names_list_exactly_their_own_open_claims() {
    let (_, pool) = schemas::fresh_schema(2).await;
    let gate = Gate::connect(pool.clone()).await.expect("set up");
    let long = "é".repeat(512); // 1024 bytes, the most an account may be
    let accounts: Vec<String> = vec![
        "acme".into(),
        "acme ".into(),
        "ACME".into(),
        "a'c\"me".into(),
        "%".into(),
        "_".into(),
        "a\\b".into(),
        "\u{202e}emca".into(),
        "a\tb\nc".into(),
        long.clone(),
        "x".repeat(1024),
    ];
    for (n, account) in accounts.iter().enumerate() {
        let g = gate.account(account);
        for k in 0..=n as i64 {
            hold_in_doubt(&g, &Identity::new("charge").part(k)).await;
        }
        let ok: Result<(), ChargeError> = g
            .guard(&Identity::new("charge").part("ok"))
            .run(async { Ok(()) })
            .await;
        ok.expect("success");
    }
    exec(&pool, "ANALYZE idem_records").await;
    for (n, account) in accounts.iter().enumerate() {
        let f = ListFilter::new()
            .scope(ScopeFilter::new().account(account.as_str()))
            .state(ClaimState::InDoubt)
            .limit(500);
        let rows = operations::list(&pool, &f).await.expect("list");
        assert_eq!(rows.len(), n + 1, "{account:?}");
        assert!(rows.iter().all(|r| &r.account == account), "{account:?}");
        assert_eq!(operations::count(&pool, &f).await.unwrap(), n as u64 + 1);
        let s = idem::metrics::Gauges::new(pool.clone(), Duration::from_secs(600))
            .account(account.as_str())
            .sample_once()
            .await
            .expect("gauges");
        assert_eq!(s.in_doubt, n as u64 + 1, "{account:?}");
    }
}
