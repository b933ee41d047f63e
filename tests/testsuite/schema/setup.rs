//! idem's schema: set up idempotently (also by many processes at once), kept
//! in its own version table, and verified at start-up; a gate refuses to
//! start without both partial unique indexes.

use idem::schema::{SCHEMA_SQL, SCHEMA_VERSION};
use idem::sqlx::{self, PgPool};
use idem::{Error, Gate, SchemaProblem};
use idem_test_support::schemas;

use super::{DEFINED, exec, open_claims_indexes};

async fn unique_indexes(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes \
         WHERE schemaname = current_schema() AND tablename = 'idem_records' \
         AND indexdef LIKE 'CREATE UNIQUE%' ORDER BY indexname",
    )
    .fetch_all(pool)
    .await
    .expect("read pg_indexes")
}

/// A fresh schema of two connections with idem's tables, as a gate sets
/// them up.
async fn set_up() -> PgPool {
    let (_, pool) = schemas::fresh_schema(2).await;
    Gate::connect(pool.clone()).await.expect("set up");
    pool
}

fn schema_error(result: Result<Gate, Error>) -> String {
    match result {
        Err(Error::Schema(problems)) => problems.to_string(),
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("the gate started on a schema that cannot enforce uniqueness"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_creates_the_table_both_partial_indexes_and_its_own_version() {
    let (_, pool) = schemas::fresh_schema(2).await;
    Gate::connect(pool.clone())
        .await
        .expect("set up a fresh schema");

    let indexes = unique_indexes(&pool).await;
    assert_eq!(indexes.len(), 2, "exactly two unique indexes: {indexes:?}");
    assert!(
        indexes[0]
            .1
            .ends_with("(account, kind, address, namespace) WHERE (namespace IS NOT NULL)"),
        "{indexes:?}"
    );
    assert!(
        indexes[1]
            .1
            .ends_with("(account, kind, address) WHERE (namespace IS NULL)"),
        "{indexes:?}"
    );

    let version: i32 = sqlx::query_scalar("SELECT max(version) FROM idem_schema_version")
        .fetch_one(&pool)
        .await
        .expect("idem keeps its own version table");
    assert_eq!(version, SCHEMA_VERSION);
    let sqlx_table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
            .fetch_one(&pool)
            .await
            .expect("to_regclass");
    assert_eq!(
        sqlx_table, None,
        "idem must not touch the application's _sqlx_migrations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_up_is_idempotent_and_safe_when_many_processes_start_at_once() {
    const STARTS: usize = 12;
    let (_, pool) = schemas::fresh_schema(STARTS as u32).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(STARTS));
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..STARTS {
        let (pool, barrier) = (pool.clone(), barrier.clone());
        starts.spawn(async move {
            barrier.wait().await;
            Gate::connect(pool).await
        });
    }
    while let Some(started) = starts.join_next().await {
        started
            .expect("no panic")
            .expect("every concurrent set-up succeeds");
    }
    Gate::connect(pool.clone()).await.expect("and again later");
    let versions: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_schema_version")
        .fetch_one(&pool)
        .await
        .expect("count versions");
    assert_eq!(
        versions,
        idem::__internal::MIGRATIONS.len() as i64,
        "each version recorded once"
    );
    assert_eq!(unique_indexes(&pool).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exported_sql_is_enough_for_users_who_run_their_own_migrations() {
    let (_, pool) = schemas::fresh_schema(2).await;
    exec(&pool, SCHEMA_SQL).await;
    exec(&pool, SCHEMA_SQL).await; // idempotent
    Gate::connect_without_setup(pool.clone())
        .await
        .expect("verified, no DDL needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_named() {
    let (schema, pool) = schemas::fresh_schema(2).await;
    let message = schema_error(Gate::connect_without_setup(pool).await);
    assert!(message.contains("idem_records does not exist"), "{message}");
    assert!(
        message.contains(&schema),
        "names the search_path: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_index_is_named_and_the_gate_refuses_to_start() {
    for (dropped, named) in [
        (
            "idem_records_unique_without_namespace",
            "WHERE namespace IS NULL",
        ),
        (
            "idem_records_unique_within_namespace",
            "WHERE namespace IS NOT NULL",
        ),
    ] {
        let pool = set_up().await;
        exec(&pool, &format!("DROP INDEX {dropped}")).await;
        // Gate::connect sees the version is current and only verifies.
        let message = schema_error(Gate::connect(pool).await);
        assert!(
            message.contains("missing unique index") && message.contains(named),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_index_over_the_nullable_namespace_is_recognised_as_the_hole() {
    let pool = set_up().await;
    exec(
        &pool,
        "DROP INDEX idem_records_unique_without_namespace; \
         DROP INDEX idem_records_unique_within_namespace; \
         CREATE UNIQUE INDEX looks_right ON idem_records (account, kind, address, namespace);",
    )
    .await;

    // The hole, shown: two claims of one address without a namespace both insert.
    for _ in 0..2 {
        exec(
            &pool,
            "INSERT INTO idem_records (account, kind, address, state, identity) \
             VALUES ('a', 'claim', 'claim_x', 'pending', '\\x00')",
        )
        .await;
    }

    let Err(Error::Schema(problems)) = Gate::connect(pool).await else {
        panic!("the gate must refuse this schema");
    };
    let message = problems.to_string();
    assert!(
        message.contains("enforces nothing for rows whose namespace is NULL"),
        "{message}"
    );
    assert!(message.contains("looks_right"), "{message}");
    assert_eq!(problems.problems.len(), 2, "{message}");
    assert!(
        problems
            .problems
            .iter()
            .all(|p| matches!(p, SchemaProblem::MissingIndex { .. }))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_predicate_or_a_non_unique_index_is_named() {
    let pool = set_up().await;
    exec(
        &pool,
        "DROP INDEX idem_records_unique_without_namespace; \
         CREATE UNIQUE INDEX wrong_predicate ON idem_records (account, kind, address) \
           WHERE namespace IS NOT NULL; \
         DROP INDEX idem_records_unique_within_namespace; \
         CREATE INDEX not_unique ON idem_records (account, kind, address, namespace) \
           WHERE namespace IS NOT NULL;",
    )
    .await;
    let message = schema_error(Gate::connect(pool).await);
    assert!(
        message.contains("wrong_predicate") && message.contains("its predicate is"),
        "{message}"
    );
    assert!(
        message.contains("not_unique") && message.contains("not unique"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_nullable_column_is_named() {
    let pool = set_up().await;
    exec(
        &pool,
        "ALTER TABLE idem_records ALTER COLUMN state DROP NOT NULL; \
                 ALTER TABLE idem_records DROP COLUMN identity;",
    )
    .await;
    let message = schema_error(Gate::connect(pool).await);
    assert!(
        message.contains("idem_records.state is nullable"),
        "{message}"
    );
    assert!(
        message.contains("idem_records.identity is missing"),
        "{message}"
    );
}

/// A build whose statements read a newer version's columns refuses to
/// start on a table without them (a run-time role's
/// `connect_without_setup` on a schema nobody migrated), rather than
/// failing at each settle after its body ran: a release reads version
/// 12's `entity`, every outcome version 13's `awaited`, every claim
/// version 14's `expires_in_doubt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_without_set_up_refuses_a_schema_older_than_its_statements() {
    for column in ["expires_in_doubt", "awaited", "entity"] {
        let pool = set_up().await;
        exec(
            &pool,
            &format!("ALTER TABLE idem_records DROP COLUMN {column};"),
        )
        .await;
        let message = schema_error(Gate::connect_without_setup(pool).await);
        assert!(
            message.contains(&format!("idem_records.{column} is missing")),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_address_check_and_the_claim_states_are_enforced_by_postgres() {
    let pool = set_up().await;
    for (address, state) in [
        ("Claim_UPPER", "pending"),
        ("claim-dash", "pending"),
        ("", "pending"),
        ("claim_ok", "error"),
        ("claim_ok", "in doubt"),
    ] {
        let inserted = sqlx::query(
            "INSERT INTO idem_records (account, kind, address, state, identity) \
             VALUES ('a', 'claim', $1, $2, '\\x00')",
        )
        .bind(address)
        .bind(state)
        .execute(&pool)
        .await;
        assert!(
            inserted.is_err(),
            "({address:?}, {state:?}) must be refused by a CHECK"
        );
    }
}

/// The states a claim may be stored in since version 5.
const CLAIM_STATES: [&str; 4] = ["pending", "success", "in_doubt", "failed"];

async fn insert_claim(pool: &PgPool, address: &str, state: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity) \
         VALUES ('migrated', 'claim', $1, $2, '\\x00')",
    )
    .bind(address)
    .bind(state)
    .execute(pool)
    .await
    .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_earlier_version_migrates_to_the_current_one_keeping_its_rows() {
    for from in 1..SCHEMA_VERSION {
        let (_, pool) = schemas::fresh_schema(2).await;
        for migration in idem::__internal::MIGRATIONS
            .iter()
            .filter(|m| m.version <= from)
        {
            exec(&pool, migration.sql).await;
        }
        // Rows as a process of that version wrote them: one in flight, one
        // settled, with only the columns version 1 has.
        insert_claim(&pool, "claim_in_flight", "pending")
            .await
            .expect("a pending claim");
        insert_claim(&pool, "claim_settled", "success")
            .await
            .expect("a settled claim");
        // Versions before 5 know no in_doubt state, so their CHECK refuses it.
        if from < 5 {
            let refused = insert_claim(&pool, "claim_early", "in_doubt").await;
            assert!(
                refused.is_err(),
                "version {from} knows no in_doubt state, so its CHECK refuses it"
            );
        }

        Gate::connect(pool.clone())
            .await
            .unwrap_or_else(|e| panic!("connect migrates from version {from}: {e}"));
        let version: i32 = sqlx::query_scalar("SELECT max(version) FROM idem_schema_version")
            .fetch_one(&pool)
            .await
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION, "from version {from}");

        let rows: Vec<(String, String, Option<String>, Option<i64>)> = sqlx::query_as(
            "SELECT address, state, state_reason, \
                    extract(epoch FROM resolved_at)::int8 \
             FROM idem_records ORDER BY address",
        )
        .fetch_all(&pool)
        .await
        .expect("read the migrated rows");
        assert_eq!(
            rows,
            [
                (
                    "claim_in_flight".to_owned(),
                    "pending".to_owned(),
                    None,
                    None
                ),
                ("claim_settled".to_owned(), "success".to_owned(), None, None),
            ],
            "rows migrated from version {from} keep their state, and have no reason"
        );

        for state in CLAIM_STATES {
            insert_claim(&pool, &format!("claim_now_{state}"), state)
                .await
                .unwrap_or_else(|e| panic!("{state} is a claim state once migrated: {e}"));
        }
        for state in ["error", "done", "IN_DOUBT", ""] {
            assert!(
                insert_claim(&pool, "claim_bad_state", state).await.is_err(),
                "{state:?} must still be refused by the CHECK (migrated from version {from})"
            );
        }
        let validated: bool = sqlx::query_scalar(
            "SELECT convalidated FROM pg_constraint \
             WHERE conname = 'idem_records_claim_state' \
               AND conrelid = to_regclass('idem_records')",
        )
        .fetch_one(&pool)
        .await
        .expect("the claim-state CHECK exists once");
        assert!(
            validated,
            "the CHECK holds for every row, old ones included"
        );
        pool.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_migration_runs_again_without_changing_anything() {
    let pool = set_up().await;
    insert_claim(&pool, "claim_held", "in_doubt")
        .await
        .expect("in_doubt is a claim state");
    let latest = idem::__internal::MIGRATIONS
        .last()
        .expect("at least one migration");
    exec(&pool, latest.sql).await;
    let constraints: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_constraint \
         WHERE conname = 'idem_records_claim_state' AND conrelid = to_regclass('idem_records')",
    )
    .fetch_one(&pool)
    .await
    .expect("count the CHECKs");
    assert_eq!(constraints, 1);
    let state: String =
        sqlx::query_scalar("SELECT state FROM idem_records WHERE address = 'claim_held'")
            .fetch_one(&pool)
            .await
            .expect("the row is still there");
    assert_eq!(state, "in_doubt");
}

/// The definition of the index of open claims in the pool's schema, and
/// whether it is valid; `None` when there is none.
async fn open_claims_index(pool: &PgPool) -> Option<(String, bool)> {
    let indexes = open_claims_indexes(pool).await;
    indexes
        .into_iter()
        .next()
        .map(|(_, definition, valid, _)| (definition, valid))
}

/// Version 9's index of open claims, which the statements that list open
/// claims read: created as they spell its predicate. An operator who built
/// it ahead with `CREATE INDEX CONCURRENTLY` (as docs/operations.md says to
/// on a large table) and saw the build fail is left with an invalid index
/// of that name, which `CREATE INDEX IF NOT EXISTS` alone would take for
/// the index; one written by hand may have another predicate. The
/// migration builds either again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_of_open_claims_is_built_and_one_of_its_name_that_is_not_it_built_again() {
    let pool = set_up().await;
    let (definition, valid) = open_claims_index(&pool).await.expect("the index is there");
    assert!(definition.ends_with(DEFINED), "{definition}");
    assert!(valid);

    // A concurrent build that fails (here on duplicates) leaves its index
    // behind, invalid: what an interrupted or failed build leaves.
    exec(&pool, "DROP INDEX idem_records_open_claims").await;
    for address in ["claim_a", "claim_b"] {
        insert_claim(&pool, address, "in_doubt")
            .await
            .expect("an open claim");
    }
    let failed = sqlx::raw_sql(
        "CREATE UNIQUE INDEX CONCURRENTLY idem_records_open_claims ON idem_records (state)",
    )
    .execute(&pool)
    .await;
    assert!(failed.is_err(), "the build must fail: {failed:?}");
    assert_eq!(
        open_claims_index(&pool).await.map(|(_, valid)| valid),
        Some(false),
        "a failed concurrent build leaves an invalid index"
    );
    exec(&pool, "DELETE FROM idem_schema_version WHERE version >= 9").await;

    Gate::connect(pool.clone())
        .await
        .expect("connect migrates to version 9 again");
    let (definition, valid) = open_claims_index(&pool).await.expect("the index is there");
    assert!(definition.ends_with(DEFINED), "built again: {definition}");
    assert!(valid, "built again, valid");

    // One written by hand with `<>` for the predicate is not this index
    // either: settles would be planned on it.
    exec(
        &pool,
        "DROP INDEX idem_records_open_claims; \
         CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) \
         WHERE kind = 'claim' AND state <> 'success'; \
         DELETE FROM idem_schema_version WHERE version >= 9",
    )
    .await;
    Gate::connect(pool.clone())
        .await
        .expect("connect migrates to version 9 again");
    let (definition, valid) = open_claims_index(&pool).await.expect("the index is there");
    assert!(definition.ends_with(DEFINED), "built again: {definition}");
    assert!(valid);

    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE kind = 'claim' \
         AND state IS DISTINCT FROM 'success'",
    )
    .fetch_one(&pool)
    .await
    .expect("count the open claims");
    assert_eq!(open, 2, "no row was lost");
}

/// `schema::status` says whether the index of open claims is there; its
/// absence is not a problem (the gate does not need it), so the schema is
/// still current and a gate still starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_whether_the_index_of_open_claims_is_there() {
    let pool = set_up().await;
    let status = idem::schema::status(&pool).await.expect("status");
    assert!(status.open_claims_index_present, "{status:?}");
    assert!(
        status
            .open_claims_index
            .contains("state IS DISTINCT FROM 'success'"),
        "{status:?}"
    );
    exec(&pool, "DROP INDEX idem_records_open_claims").await;
    let status = idem::schema::status(&pool).await.expect("status");
    assert!(!status.open_claims_index_present, "{status:?}");
    assert!(status.is_current(), "{status:?}");
    Gate::connect(pool.clone())
        .await
        .expect("a gate starts without it");
    // One of that name with another predicate is not it.
    exec(
        &pool,
        "CREATE INDEX idem_records_open_claims ON idem_records (account, state, created_at, address) \
         WHERE kind = 'claim' AND state <> 'success'",
    )
    .await;
    let status = idem::schema::status(&pool).await.expect("status");
    assert!(!status.open_claims_index_present, "{status:?}");
}

// ------------------------- red team: every schema function's error, outage or not

/// Each schema function on `pool`, by name, with what it returned as an
/// `idem::Error` (`None`: it succeeded).
async fn every_schema_function(pool: &PgPool) -> Vec<(&'static str, Option<Error>)> {
    use idem::schema;
    vec![
        ("set_up", schema::set_up(pool).await.err()),
        ("verify", schema::verify(pool).await.err()),
        ("layout", schema::layout(pool).await.err()),
        ("status", schema::status(pool).await.err()),
        (
            "set_up_partitioned",
            schema::set_up_partitioned(pool, 4).await.err(),
        ),
        (
            "set_up_distributed",
            schema::set_up_distributed(pool).await.err(),
        ),
    ]
}

/// A server down is an outage for every schema function: each fails, and
/// `is_outage` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_function_calls_a_server_down_an_outage() {
    use idem::sqlx::postgres::PgPoolOptions;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a port")
        .local_addr()
        .expect("its address")
        .port();
    let pool = PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(500))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{closed}/postgres"))
        .expect("a lazy pool");
    for (function, error) in every_schema_function(&pool).await {
        let error = error.unwrap_or_else(|| panic!("{function} succeeded on a server down"));
        assert!(error.is_outage(), "{function}: {error}");
    }
}

/// A schema missing from the `search_path`, and a role without the right
/// to create there: errors of the request, never outages; the set-ups fail,
/// and the readers say there is no table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_or_a_role_without_rights_is_never_an_outage() {
    use idem::sqlx::postgres::PgPoolOptions;

    // search_path names a schema that does not exist.
    let missing = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(schemas::options_in(&idem::testing::unique_name(
            "no_such_schema",
        )))
        .await
        .expect("connect");
    // A role that may log in and use a fresh schema, and create nothing.
    let (schema, owner) = schemas::fresh_schema(1).await;
    let role = idem::testing::unique_name("idem_norights");
    exec(&owner, &format!("CREATE ROLE \"{role}\" LOGIN")).await;
    exec(
        &owner,
        &format!("GRANT USAGE ON SCHEMA {schema} TO \"{role}\""),
    )
    .await;
    exec(
        &owner,
        &format!("REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC"),
    )
    .await;
    let powerless = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(schemas::options_in(&schema).username(&role))
        .await
        .expect("log in as the role");
    for (place, pool) in [
        ("a missing schema", &missing),
        ("a role without rights", &powerless),
    ] {
        for (function, error) in every_schema_function(pool).await {
            if let Some(error) = &error {
                assert!(!error.is_outage(), "{place}: {function}: {error}");
            }
            match function {
                "set_up" | "set_up_partitioned" | "set_up_distributed" => {
                    assert!(
                        error.is_some(),
                        "{place}: {function} set up nothing and succeeded"
                    )
                }
                _ => assert!(error.is_none(), "{place}: {function} reads: {error:?}"),
            }
        }
        assert!(
            matches!(idem::schema::verify(pool).await, Ok(Some(_))),
            "{place}: verify says the table is missing"
        );
    }
    powerless.close().await;
    exec(&owner, &format!("DROP SCHEMA {schema} CASCADE")).await;
    exec(&owner, &format!("DROP ROLE \"{role}\"")).await;
}

/// A connection configured in a way no retry mends (`sslmode=require`, as
/// managed PostgreSQL services ask, where this build of sqlx has no TLS; or
/// a certificate that cannot be verified) is an error of the request, not
/// an outage: `is_outage` is "worth a retry once it is back", and a retry
/// meets it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_setting_no_retry_mends_is_not_an_outage() {
    use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
    use std::str::FromStr;

    for mode in [PgSslMode::Require, PgSslMode::VerifyFull] {
        let options = PgConnectOptions::from_str(&idem::testing::database_url())
            .expect("the tests' URL")
            .ssl_mode(mode);
        let pool = PgPoolOptions::new()
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(options);
        for (function, error) in every_schema_function(&pool).await {
            let error = error.unwrap_or_else(|| panic!("{mode:?}: {function} succeeded"));
            assert!(
                !error.is_outage(),
                "{mode:?}: {function}: a setting no retry mends is called an outage: {error}"
            );
        }
    }
}
