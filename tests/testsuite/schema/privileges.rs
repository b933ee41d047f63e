//! Least privilege: a run-time role with only the grants of
//! `idem-runtime/sql/grants.sql` claims, settles, releases, takes over
//! leases and meters, and cannot drop, alter or empty the table; each of
//! those grants is needed. With `idem-runtime/sql/row_level_security.sql`,
//! a role mapped to one account can neither see, change nor claim
//! another's rows.
//!
//! Each test works in a schema of its own and creates its own login roles
//! (trust authentication on 127.0.0.1, as the test server has), and drops
//! both at the end, even when it fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use idem::meter::Event;
use idem::sqlx::postgres::PgPoolOptions;
use idem::sqlx::{self, PgPool};
use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::{rows, schemas};

const GRANTS_SQL: &str = include_str!("../../../idem-runtime/sql/grants.sql");
const ROW_LEVEL_SECURITY_SQL: &str =
    include_str!("../../../idem-runtime/sql/row_level_security.sql");

/// `sql` with psql's `:"name"` variables replaced by quoted identifiers, as
/// `psql -v name=value` would.
fn with_variables(sql: &str, variables: &[(&str, &str)]) -> String {
    variables.iter().fold(sql.to_owned(), |sql, (name, value)| {
        let quoted = format!("\"{}\"", value.replace('"', "\"\""));
        sql.replace(&format!(":\"{name}\""), &quoted)
    })
}

/// A schema with idem set up by its owner (this test's superuser), and
/// login roles made for the test; all dropped when this is.
struct Sandbox {
    schema: String,
    owner: PgPool,
    roles: Vec<String>,
}

impl Sandbox {
    async fn new() -> Sandbox {
        let (schema, owner) = schemas::fresh_schema(2).await;
        Gate::connect(owner.clone())
            .await
            .expect("set idem up as the owner");
        Sandbox {
            schema,
            owner,
            roles: Vec::new(),
        }
    }

    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.owner)
            .await
            .unwrap_or_else(|e| panic!("{sql}\nfailed: {e}"));
    }

    /// A new login role with the run-time grants of grants.sql.
    async fn runtime_role(&mut self) -> String {
        let role = testing::unique_name("idem_rt");
        self.execute(&format!("CREATE ROLE \"{role}\" LOGIN")).await;
        self.roles.push(role.clone());
        let grants = with_variables(
            GRANTS_SQL,
            &[("idem_role", &role), ("idem_schema", &self.schema)],
        );
        self.execute(&grants).await;
        role
    }

    /// A pool that logs in as `role`, with `search_path` set to the schema.
    async fn pool_as(&self, role: &str) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(schemas::options_in(&self.schema).username(role))
            .await
            .unwrap_or_else(|e| panic!("log in as {role}: {e}"))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Async work in Drop: on a thread of its own, so it runs even when
        // the test is unwinding.
        let statements = std::iter::once(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .chain(
                self.roles
                    .iter()
                    .map(|role| format!("DROP ROLE IF EXISTS \"{role}\"")),
            )
            .collect::<Vec<_>>();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the clean-up");
            runtime.block_on(async {
                let admin = testing::pool_with(1).await;
                for statement in statements {
                    if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
                        .execute(&admin)
                        .await
                    {
                        eprintln!("clean-up: {statement}: {error}");
                    }
                }
                admin.close().await;
            });
        });
        let _ = cleanup.join();
    }
}

/// The SQLSTATE of a failed statement.
async fn sqlstate(pool: &PgPool, sql: &str) -> Option<String> {
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
    {
        Ok(_) => None,
        Err(sqlx::Error::Database(error)) => error.code().map(|code| code.into_owned()),
        Err(other) => Some(format!("not a database error: {other}")),
    }
}

const INSUFFICIENT_PRIVILEGE: &str = "42501";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_only_the_run_time_grants_claims_settles_and_releases() {
    let mut sandbox = Sandbox::new().await;
    let role = sandbox.runtime_role().await;
    let pool = sandbox.pool_as(&role).await;

    // No DDL when the schema is current: this role could not run any.
    let gate = Gate::connect(pool.clone())
        .await
        .expect("Gate::connect as the run-time role")
        .account("acme");
    Gate::connect_without_setup(pool.clone())
        .await
        .expect("Gate::connect_without_setup as the run-time role");

    let runs = AtomicUsize::new(0);
    let body = |ok: bool| {
        let runs = &runs;
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if ok { Ok(()) } else { Err(Rejected::InFlight) }
        }
    };
    let settled = Identity::new("charge").part(1);
    gate.run(&settled, body(true))
        .await
        .expect("claim and settle");
    let again = gate.run(&settled, body(true)).await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
    let failed = Identity::new("charge").part(2);
    let _ = gate.run(&failed, body(false)).await;
    assert_eq!(
        rows::row_state(&gate, &failed.address()).await,
        None,
        "released"
    );

    let claim = gate
        .claim(&Identity::new("by_hand").part(1))
        .await
        .expect("claim");
    claim.release().await.expect("release by hand");
    let claim = gate
        .claim(&Identity::new("by_hand").part(1))
        .await
        .expect("claim again");
    claim.settle().await.expect("settle by hand");

    // A lease that ran out is taken over: UPDATE and nextval on the fence.
    let leased = Identity::new("leased").part(1);
    let first = gate
        .guard(&leased)
        .lease(Duration::from_millis(50))
        .claim()
        .await
        .expect("leased claim");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let second = gate
        .guard(&leased)
        .lease(Duration::from_millis(50))
        .claim()
        .await
        .expect("take over");
    assert!(second.fence() > first.fence());
    second.settle().await.expect("settle the takeover");
    drop(first);

    let report = gate
        .meter()
        .record(&[Event::new("req_1", "api_calls", 2, SystemTime::now())])
        .await
        .expect("meter");
    assert_eq!(report.inserted, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // ... and nothing else.
    for forbidden in [
        "DROP TABLE idem_records",
        "ALTER TABLE idem_records ADD COLUMN mischief text",
        "ALTER TABLE idem_records DROP CONSTRAINT idem_records_claim_state",
        "DROP INDEX idem_records_unique_without_namespace",
        "TRUNCATE idem_records",
        "CREATE TABLE idem_records_copy (id int)",
        "ALTER SEQUENCE idem_records_fence_seq RESTART",
        "SELECT setval('idem_records_fence_seq', 1)",
        "INSERT INTO idem_schema_version (version, description) VALUES (99, 'x')",
    ] {
        assert_eq!(
            sqlstate(&pool, forbidden).await.as_deref(),
            Some(INSUFFICIENT_PRIVILEGE),
            "the run-time role may not: {forbidden}"
        );
    }
    pool.close().await;
}

/// Promise (operations.md, "The wake-up listener"): the wake-up across
/// processes needs no grant beyond the run-time ones: a role with only
/// those marks the claim it waits on, listens on `idem_landed` and
/// notifies it, and its waiter is answered when its holder in another
/// pool (another process) settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_only_the_run_time_grants_is_woken_across_processes() {
    let mut sandbox = Sandbox::new().await;
    let role = sandbox.runtime_role().await;
    let holder = Gate::connect(sandbox.pool_as(&role).await)
        .await
        .expect("the holder's gate as the run-time role");
    let waiter = Gate::connect(sandbox.pool_as(&role).await)
        .await
        .expect("the waiter's gate as the run-time role");
    let id = Identity::new("charge").part("woken");
    let claim = holder.claim(&id).await.expect("the holder claims");
    let waited = tokio::spawn({
        let (waiter, id) = (waiter.clone(), id.clone());
        async move {
            waiter
                .guard(&id)
                .wait(Duration::from_secs(30))
                .run(async { Ok::<_, Rejected>(()) })
                .await
        }
    });
    // The waiter marked the claim, and listens as the role.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (marked, listening): (bool, i64) = sqlx::query_as(
            "SELECT coalesce((SELECT awaited FROM idem_records WHERE address = $1), false), \
                    (SELECT count(*) FROM pg_stat_activity \
                      WHERE usename = $2 AND application_name LIKE '%idem wake-up%')",
        )
        .bind(id.address())
        .bind(&role)
        .fetch_one(&sandbox.owner)
        .await
        .expect("look at the claim and the listener");
        if marked && listening == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run-time role's waiter did not mark its claim ({marked}) and listen \
             ({listening} listeners)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    claim.settle().await.expect("the holder settles");
    let answered = waited.await.expect("the waiter's task");
    assert!(
        matches!(answered, Err(Rejected::AlreadyDone)),
        "{answered:?}"
    );
    // What the holder's wake-up and the listener send, as the role.
    let pool = sandbox.pool_as(&role).await;
    // (The notification first: a connection that listens is handed every
    // notification after, which a plain query does not expect.)
    for statement in [
        "SELECT pg_notify('idem_landed', 'claim_x')",
        "LISTEN idem_landed",
    ] {
        assert_eq!(
            sqlstate(&pool, statement).await,
            None,
            "the run-time role may: {statement}"
        );
    }
    pool.close().await;
}

/// The first of connect, claim and settle (or release) that fails on
/// `pool`, and why; `"nothing"` when all succeed.
async fn first_failure(pool: &PgPool, n: usize, release: bool) -> (&'static str, String) {
    let gate = match Gate::connect(pool.clone()).await {
        Ok(gate) => gate.account("acme"),
        Err(error) => return ("connect", error.to_string()),
    };
    let claim = match gate.claim(&Identity::new("needed").part(n)).await {
        Ok(claim) => claim,
        Err(rejected) => return ("claim", rejected.to_string()),
    };
    let (step, outcome) = if release {
        ("release", claim.release().await)
    } else {
        ("settle", claim.settle().await)
    };
    match outcome {
        Ok(()) => ("nothing", format!("{step} succeeded")),
        Err(rejected) => (step, rejected.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_run_time_grant_is_needed() {
    let mut sandbox = Sandbox::new().await;
    let role = sandbox.runtime_role().await;
    let schema = sandbox.schema.clone();
    let on = |object: &str| format!("{schema}.{object}");
    // Each grant, and what fails without it.
    let cases = [
        (format!("USAGE ON SCHEMA {schema}"), "connect"),
        (
            format!("SELECT ON {}", on("idem_schema_version")),
            "connect",
        ),
        (
            format!("USAGE ON SEQUENCE {}", on("idem_records_fence_seq")),
            "claim",
        ),
        (format!("INSERT ON {}", on("idem_records")), "claim"),
        (format!("SELECT ON {}", on("idem_records")), "claim"),
        (format!("UPDATE ON {}", on("idem_records")), "settle"),
        (format!("DELETE ON {}", on("idem_records")), "release"),
    ];
    for (n, (grant, needed_for)) in cases.iter().enumerate() {
        sandbox
            .execute(&format!("REVOKE {grant} FROM \"{role}\""))
            .await;
        let pool = sandbox.pool_as(&role).await;
        let failure = first_failure(&pool, n, *needed_for == "release").await;
        assert_eq!(failure.0, *needed_for, "without {grant}: {}", failure.1);
        // Without USAGE on the schema, idem's tables are not found at all,
        // so Gate::connect takes the schema for unset and fails at its DDL
        // ("no schema has been selected to create in"); otherwise the
        // statement that lacks its grant is denied.
        let expected = if grant.starts_with("USAGE ON SCHEMA") {
            "no schema has been selected"
        } else {
            "permission denied"
        };
        assert!(
            failure.1.contains(expected),
            "without {grant}: {}",
            failure.1
        );
        pool.close().await;
        sandbox
            .execute(&format!("GRANT {grant} TO \"{role}\""))
            .await;
    }
}

/// A sandbox with row-level security and two roles, each mapped to its own
/// account.
async fn two_tenants() -> (Sandbox, [(String, String); 2]) {
    let mut sandbox = Sandbox::new().await;
    let rls = with_variables(ROW_LEVEL_SECURITY_SQL, &[("idem_schema", &sandbox.schema)]);
    sandbox.execute(&rls).await;
    sandbox.execute(&rls).await; // idempotent
    let mut tenants = Vec::new();
    for account in ["acme", "globex"] {
        let role = sandbox.runtime_role().await;
        sandbox
            .execute(&format!(
                "INSERT INTO idem_account_roles (role_name, account) VALUES ('{role}', '{account}')"
            ))
            .await;
        tenants.push((role, account.to_owned()));
    }
    let tenants: [(String, String); 2] = tenants.try_into().expect("two tenants");
    (sandbox, tenants)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_scoped_to_one_account_cannot_see_release_or_claim_another_s() {
    let (sandbox, [(acme_role, acme), (_, globex)]) = two_tenants().await;
    // globex's claims, made by the owner: one settled, one in flight.
    let owner_gate = Gate::connect(sandbox.owner.clone())
        .await
        .expect("owner gate");
    let done = Identity::new("charge").part(1);
    let in_flight = Identity::new("charge").part(2);
    owner_gate
        .account(&globex)
        .run(&done, async { Ok::<_, Rejected>(()) })
        .await
        .expect("globex settles");
    let held = owner_gate
        .account(&globex)
        .claim(&in_flight)
        .await
        .expect("globex holds a claim");

    let pool = sandbox.pool_as(&acme_role).await;
    let gate = Gate::connect(pool.clone())
        .await
        .expect("connect as acme's role");

    // Its own account works as ever, through the policy.
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    };
    gate.account(&acme)
        .run(&done, body())
        .await
        .expect("acme claims and settles");
    let failing = Identity::new("charge").part(3);
    let _ = gate
        .account(&acme)
        .run(&failing, async { Err::<(), _>(Rejected::InFlight) })
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // globex's rows: invisible, untouchable.
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE account = $1")
        .bind(&globex)
        .fetch_one(&pool)
        .await
        .expect("select");
    assert_eq!(seen, 0, "acme's role sees globex's claims");
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .expect("select");
    assert_eq!(all, 1, "acme's role sees exactly acme's one settled claim");
    for statement in [
        "DELETE FROM idem_records WHERE account = $1",
        "UPDATE idem_records SET state = 'success' WHERE account = $1",
    ] {
        let touched = sqlx::query(sqlx::AssertSqlSafe(statement))
            .bind(&globex)
            .execute(&pool)
            .await
            .expect("runs, touching nothing")
            .rows_affected();
        assert_eq!(touched, 0, "{statement}");
    }

    // Claiming in globex, on a settled slot, a held slot or a free one: the
    // policy refuses the insert before any conflict is looked for, so the
    // body never runs; and the refusal is the request's, never an outage.
    let fresh = Identity::new("charge").part(4);
    for id in [&done, &in_flight, &fresh] {
        let result = gate.account(&globex).run(id, body()).await;
        let Err(rejected @ Rejected::StoreRefused { source, .. }) = &result else {
            panic!("a claim in another tenant's account must be refused, got {result:?}");
        };
        assert!(
            source.to_string().contains("row-level security"),
            "{rejected}"
        );
    }
    let metered = gate
        .account(&globex)
        .meter()
        .record(&[Event::new("req_1", "api_calls", 1, SystemTime::now())])
        .await;
    assert!(
        metered.is_err(),
        "metering into another account: {metered:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "no body ran in globex's account"
    );

    // The owner sees globex exactly as it was, and still resolves it.
    assert_eq!(
        rows::row_state(&owner_gate.account(&globex), &done.address())
            .await
            .as_deref(),
        Some("success")
    );
    held.release()
        .await
        .expect("the owner releases globex's claim");
    pool.close().await;
}

/// A policy on anything but the unique key's columns can hide the row an
/// insert conflicts with. Here each role sees only the claims it made (a
/// `created_by` column defaulting to `current_user`): the same expression
/// for reads and writes, and yet a second role's claim on a slot the first
/// holds conflicts with a row it cannot see. PostgreSQL reports the
/// conflict (nothing inserted), the gate's lookup finds nothing, it retries,
/// and refuses `InFlight`: the body never runs. (The shipped policy is keyed
/// on `account`, a column of the unique key, so a new row it lets through
/// is one whose conflicts it shows; see row_level_security.sql.)
///
/// Returns the sandbox, the second role's pool and its gate (account
/// `acme`), and the identity whose slot the first role holds.
async fn hidden_conflict() -> (Sandbox, PgPool, Gate, Identity) {
    let mut sandbox = Sandbox::new().await;
    sandbox
        .execute(
            "ALTER TABLE idem_records ADD COLUMN created_by name NOT NULL DEFAULT current_user; \
             ALTER TABLE idem_records ENABLE ROW LEVEL SECURITY; \
             CREATE POLICY own_rows ON idem_records \
                 USING (created_by = current_user) WITH CHECK (created_by = current_user)",
        )
        .await;
    let first = sandbox.runtime_role().await;
    let second = sandbox.runtime_role().await;
    let id = Identity::new("charge").part(1);
    let first_pool = sandbox.pool_as(&first).await;
    let first_gate = Gate::connect(first_pool.clone())
        .await
        .expect("connect as the first role");
    let held = first_gate
        .account("acme")
        .claim(&id)
        .await
        .expect("the first role claims");
    drop(held); // its body is "running": the slot stays pending
    first_pool.close().await;
    let pool = sandbox.pool_as(&second).await;
    let gate = Gate::connect(pool.clone())
        .await
        .expect("connect as the second role")
        .account("acme");
    (sandbox, pool, gate, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_row_hidden_by_a_policy_is_refused_in_flight_never_run() {
    let (_sandbox, pool, gate, id) = hidden_conflict().await;
    let runs = AtomicUsize::new(0);
    let result = gate
        .run(&id, async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Rejected>(())
        })
        .await;
    assert!(matches!(result, Err(Rejected::InFlight)), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must never run");
    pool.close().await;
}

/// The same hidden conflict with `wait`: the waiter must give up when its
/// wait is over. Today it does not: the gate's claim loop retries a slot
/// that looks freed (the insert conflicts, the lookup finds nothing)
/// without bound and without pause when a wait is set, so the call spins
/// on the database until cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_on_a_hidden_conflict_gives_up_when_its_wait_is_over() {
    let (_sandbox, pool, gate, id) = hidden_conflict().await;
    let result = tokio::time::timeout(
        Duration::from_secs(3),
        gate.guard(&id).wait(Duration::from_millis(300)).claim(),
    )
    .await;
    let Ok(result) = result else {
        panic!(
            "a claim with wait = 300ms was still retrying after 3 s: the freed-slot retry in \
             Gate::acquire ignores the wait deadline"
        );
    };
    assert!(matches!(result, Err(Rejected::InFlight)), "{result:?}");
    pool.close().await;
}
