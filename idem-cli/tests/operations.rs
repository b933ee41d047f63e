//! `idem migrate`, `idem claims list | show | release | resolve` and `idem prune`
//! against a real PostgreSQL, each in a schema of its own.

mod common;

use common::{assert_contains, idem, idem_in, on_citus};
use idem::testing::unique_name;
use idem_runtime::__internal::{INDEX_WITHIN_NAMESPACE, INDEX_WITHOUT_NAMESPACE};
use idem_runtime::Identity;
use idem_runtime::schema::SCHEMA_VERSION;
use idem_test_support::connections::connect;
use idem_test_support::schemas::{create_schemas, drop_schemas, ident, run_sql};
use serde_json::Value;
use sqlx::PgConnection;

/// The index of open claims (schema version 9), as `idem migrate` prints it.
const OPEN_CLAIMS_INDEX: &str = "INDEX idem_records_open_claims (account, state, created_at, address) \
     WHERE kind = 'claim' AND state IS DISTINCT FROM 'success'";

#[tokio::test]
async fn migrate_sets_up_verifies_and_reports_what_is_missing() {
    let mut conn = connect().await;
    let schema = unique_name("idem_migrate");
    create_schemas(&mut conn, &[&schema]).await;

    let run = idem_in(&schema, "migrate --check").expect_code(1);
    assert!(
        run.stdout
            .starts_with("idem's schema cannot enforce one claim per identity")
    );
    assert_contains(&run.stdout, "table idem_records does not exist");

    let expected = format!(
        "idem schema version {SCHEMA_VERSION} is in place: {schema}.idem_records\n  \
         layout: plain (not partitioned)\n  \
         present: {INDEX_WITHOUT_NAMESPACE}\n  present: {INDEX_WITHIN_NAMESPACE}\n  \
         present: {OPEN_CLAIMS_INDEX}\n"
    );
    assert_eq!(idem_in(&schema, "migrate").expect_code(0).stdout, expected);
    assert_eq!(
        idem_in(&schema, "migrate").expect_code(0).stdout,
        expected,
        "idempotent"
    );
    let report = idem_in(&schema, "migrate --check --format json")
        .expect_code(0)
        .json();
    assert_eq!(report["version"], SCHEMA_VERSION);
    assert_eq!(report["table"], format!("{schema}.idem_records"));
    assert_eq!(report["layout"], "plain (not partitioned)");
    assert_eq!(report["problems"], serde_json::json!([]));
    assert_eq!(report["open_claims_index_present"], true);

    // Without the index of open claims the schema still passes, and the
    // report says it is absent and what that costs.
    run_sql(
        &mut conn,
        &format!("DROP INDEX {}.idem_records_open_claims", ident(&schema)),
    )
    .await;
    let run = idem_in(&schema, "migrate --check").expect_code(0);
    assert_contains(&run.stdout, &format!("  absent: {OPEN_CLAIMS_INDEX}\n"));
    assert_contains(&run.stdout, "read the whole table");

    // A plain table is never re-partitioned: refused, nothing changed.
    let run = idem_in(&schema, "migrate --partitions 16").expect_code(1);
    assert_contains(&run.stderr, "already exists, plain (not partitioned)");
    assert_contains(&run.stderr, "Nothing was changed");

    run_sql(
        &mut conn,
        &format!(
            "DROP INDEX {}.idem_records_unique_without_namespace",
            ident(&schema)
        ),
    )
    .await;
    // set_up sees the current version and changes nothing; verify still fails.
    let run = idem_in(&schema, "migrate").expect_code(1);
    assert_contains(
        &run.stdout,
        &format!("missing unique index: {INDEX_WITHOUT_NAMESPACE}"),
    );

    let run = idem(&["migrate", "--schema", "no such schema"]).expect_code(2);
    assert_contains(&run.stderr, "schema \"no such schema\" does not exist");

    drop_schemas(&mut conn, &[&schema]).await;
}

/// One claim row to insert.
struct Row<'a> {
    account: &'a str,
    namespace: Option<&'a str>,
    identity: Identity,
    state: &'a str,
    age_seconds: f64,
    settled_at: Option<&'a str>,
}

impl<'a> Row<'a> {
    /// A claim of `identity` in `account`, no namespace, pending, made ten
    /// minutes ago; a test sets what it is about with `..Row::new(..)`.
    fn new(account: &'a str, identity: Identity) -> Row<'a> {
        Row {
            account,
            namespace: None,
            identity,
            state: "pending",
            age_seconds: 600.0,
            settled_at: None,
        }
    }
}

/// Seconds in a day, for [`Row::age_seconds`].
const DAY: f64 = 86_400.0;

async fn insert(conn: &mut PgConnection, row: Row<'_>) -> String {
    let address = row.identity.address();
    sqlx::query(
        "INSERT INTO idem_records \
             (account, kind, address, namespace, state, identity, created_at, settled_at) \
         VALUES ($1, 'claim', $2, $3, $4, $5, now() - make_interval(secs => $6), $7::timestamptz)",
    )
    .bind(row.account)
    .bind(&address)
    .bind(row.namespace)
    .bind(row.state)
    .bind(row.identity.canonical())
    .bind(row.age_seconds)
    .bind(row.settled_at)
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("cannot insert a claim: {e}"));
    address
}

async fn count(conn: &mut PgConnection, address: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE address = $1")
        .bind(address)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn addresses(listed: &Value) -> Vec<&str> {
    listed
        .as_array()
        .map(|all| all.iter().filter_map(|c| c["address"].as_str()).collect())
        .unwrap_or_default()
}

/// `text` with an age of ten minutes and up to nine seconds read as ten
/// minutes: the age is read when the command runs, on a busy server (a
/// Citus cluster on two cores) a few seconds after the claim was written.
fn ten_minutes_old(text: &str) -> String {
    (1..=9).fold(text.to_owned(), |text, late| {
        text.replace(&format!("created 10m0{late}s ago"), "created 10m00s ago")
    })
}

/// Sets idem's table up in `schema` for the claims tests: distributed by
/// account when the server is a Citus coordinator (so that the Citus run
/// proves every command against a distributed table), else plain.
async fn migrate_for_claims(conn: &mut PgConnection, schema: &str) {
    let command = if on_citus(conn).await {
        "migrate --distributed"
    } else {
        "migrate"
    };
    idem_in(schema, command).expect_code(0);
}

#[tokio::test]
async fn claims_are_listed_shown_released_and_pruned() {
    let mut conn = connect().await;
    let schema = unique_name("idem_claims");
    create_schemas(&mut conn, &[&schema]).await;

    let run = idem_in(&schema, "claims list").expect_code(2);
    assert_contains(&run.stderr, "run `idem migrate` to create it");

    migrate_for_claims(&mut conn, &schema).await;
    run_sql(&mut conn, &format!("SET search_path = {}", ident(&schema))).await;
    let charge = |order: &str, cents: i64| Identity::new("charge").part(order).part(cents);
    let pending = insert(
        &mut conn,
        Row {
            age_seconds: 7_200.0,
            ..Row::new("acme", charge("ord_1", 4_999))
        },
    )
    .await;
    let settled = insert(
        &mut conn,
        Row {
            state: "success",
            age_seconds: 3.0 * DAY,
            settled_at: Some("2024-01-10T00:00:00Z"),
            ..Row::new("acme", charge("ord_2", 100))
        },
    )
    .await;
    let same_address_live = insert(
        &mut conn,
        Row {
            namespace: Some("live"),
            age_seconds: 60.0,
            ..Row::new("acme", charge("ord_1", 4_999))
        },
    )
    .await;
    assert_eq!(same_address_live, pending);
    let refund = insert(
        &mut conn,
        Row {
            state: "success",
            age_seconds: 10.0 * DAY,
            settled_at: Some("2024-03-01T00:00:00Z"),
            ..Row::new("globex", Identity::new("refund").part("r_9"))
        },
    )
    .await;
    let long = insert(
        &mut conn,
        Row {
            age_seconds: 5.0,
            ..Row::new("acme", Identity::new("charge").part("x".repeat(200)))
        },
    )
    .await;

    // list: newest first, as a table.
    let run = idem_in(&schema, "claims list").expect_code(0);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "ACCOUNT  NAMESPACE  ADDRESS                         STATE    AGE     SETTLED               IDENTITY"
    );
    let order: Vec<&str> = lines[1..]
        .iter()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(order, [&long, &pending, &pending, &settled, &refund]);
    assert!(
        lines[1].ends_with('…'),
        "a long identity is cut: {}",
        lines[1]
    );
    assert!(lines[3].starts_with("acme     -          "), "{}", lines[3]);
    assert!(
        lines[3].ends_with(r#"pending  2h00m   -                     charge ["ord_1", 4999]"#),
        "{}",
        lines[3]
    );
    assert_contains(
        lines[4],
        "success  3d00h   2024-01-10T00:00:00Z  charge [\"ord_2\", 100]",
    );

    // list: filters, JSON.
    let listed = idem_in(
        &schema,
        "claims list --state pending --older-than 10m --format json",
    )
    .expect_code(0)
    .json();
    assert_eq!(addresses(&listed), [pending.as_str()]);
    let claim = &listed[0];
    assert_eq!(claim["account"], "acme");
    assert_eq!(claim["namespace"], Value::Null);
    assert_eq!(claim["action"], "charge");
    assert_eq!(
        claim["identity"],
        r#"Identity { action: "charge", parts: ["ord_1", 4999], absent: false }"#
    );
    assert_eq!(claim["address_matches_identity"], true);
    assert!(
        claim["age_seconds"]
            .as_i64()
            .is_some_and(|age| age >= 7_200)
    );
    assert_eq!(claim["settled_at"], Value::Null);
    assert!(claim["other_columns"].get("fence").is_some(), "{claim}");

    let listed = idem_in(&schema, "claims list --account globex --format json")
        .expect_code(0)
        .json();
    assert_eq!(addresses(&listed), [refund.as_str()]);
    assert_eq!(listed[0]["settled_at"], "2024-03-01T00:00:00Z");
    assert_eq!(listed[0]["action"], "refund");

    let live = idem_in(&schema, "claims list --namespace live --format json")
        .expect_code(0)
        .json();
    assert_eq!(live.as_array().map(Vec::len), Some(1));
    assert_eq!(live[0]["namespace"], "live");
    let without = idem_in(&schema, "claims list --no-namespace --format json")
        .expect_code(0)
        .json();
    assert_eq!(without.as_array().map(Vec::len), Some(4));
    let limited = idem_in(&schema, "claims list --limit 2 --format json")
        .expect_code(0)
        .json();
    assert_eq!(addresses(&limited), [long.as_str(), pending.as_str()]);
    let none = idem_in(&schema, "claims list --account nobody").expect_code(0);
    assert_eq!(none.stdout, "no claims match\n");

    // show: an address in two scopes needs a scope.
    let run = idem_in(&schema, &format!("claims show {pending}")).expect_code(2);
    assert_contains(
        &run.stderr,
        &format!("address {pending} is claimed in 2 scopes"),
    );
    assert_contains(
        &run.stderr,
        "  account acme, no namespace\n  account acme, namespace live\n",
    );
    assert_contains(
        &run.stderr,
        "--account and --namespace NAME (or --no-namespace)",
    );

    let run = idem_in(
        &schema,
        &format!("claims show {pending} --account acme --no-namespace"),
    )
    .expect_code(0);
    for field in [
        format!("address:          {pending}\n"),
        "namespace:        (none)\n".to_owned(),
        "state:            pending\n".to_owned(),
        "identity:         Identity { action: \"charge\", parts: [\"ord_1\", 4999], absent: false }\n".to_owned(),
        "address_check:    the address is the digest of the identity\n".to_owned(),
        "settled_at:       -\n".to_owned(),
    ] {
        assert_contains(&run.stdout, &field);
    }
    assert!(
        run.stdout.contains("\nfence:"),
        "later schema columns are shown:\n{}",
        run.stdout
    );
    let shown = idem_in(
        &schema,
        &format!("claims show {pending} --namespace live --format json"),
    )
    .expect_code(0)
    .json();
    assert_eq!(shown["namespace"], "live");

    // show lists the claim's steps, in its scope only: two on the claim
    // without a namespace (one recorded, one cut off), none on its twin
    // in live. The first is named "ship" (its identity, as a step's row
    // keeps it: an identity and the name's field); the second's identity
    // is no step's, so it has no name to show.
    run_sql(
        &mut conn,
        &format!(
            "INSERT INTO {schema}.idem_records \
                 (account, kind, address, namespace, state, identity, fence, created_at, \
                  settled_at, claim_address, output_json) \
             VALUES ('acme', 'step', 'step_000000000000000000000001', NULL, 'success', \
                     '\\x6964656d0161000000000000000663686172676570000000000000000473686970', \
                     3, timestamptz '2024-05-01T12:00:00Z', timestamptz '2024-05-01T12:00:01Z', \
                     '{pending}', '{{\"receipt\":\"r_1\"}}'), \
                    ('acme', 'step', 'step_000000000000000000000002', NULL, 'pending', '\\x00', \
                     3, timestamptz '2024-05-01T12:00:02Z', NULL, '{pending}', NULL)",
            schema = ident(&schema),
        ),
    )
    .await;
    let run = idem_in(
        &schema,
        &format!("claims show {pending} --account acme --no-namespace"),
    )
    .expect_code(0);
    assert_contains(
        &run.stdout,
        "steps:            2\n\
         \x20 \"ship\"  step_000000000000000000000001  success  fence 3  \
         begun 2024-05-01T12:00:00Z  recorded 2024-05-01T12:00:01Z  value 17 bytes\n\
         \x20 (unreadable)  step_000000000000000000000002  pending  fence 3  \
         begun 2024-05-01T12:00:02Z  recorded -  no value\n",
    );
    assert!(
        !run.stdout.contains("r_1"),
        "no value is shown:\n{}",
        run.stdout
    );
    let shown = idem_in(
        &schema,
        &format!("claims show {pending} --account acme --no-namespace --format json"),
    )
    .expect_code(0)
    .json();
    assert_eq!(shown["address"], pending.as_str());
    let steps = shown["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), 2, "{shown}");
    assert_eq!(steps[0]["name"], "ship");
    assert_eq!(steps[1]["name"], Value::Null);
    assert_eq!(steps[0]["address"], "step_000000000000000000000001");
    assert_eq!(steps[0]["state"], "success");
    assert_eq!(steps[0]["fence"], 3);
    assert_eq!(steps[0]["settled_at"], "2024-05-01T12:00:01Z");
    assert_eq!(steps[0]["output_bytes"], 17);
    assert_eq!(steps[1]["state"], "pending");
    assert_eq!(steps[1]["settled_at"], Value::Null);
    assert_eq!(steps[1]["output_bytes"], Value::Null);
    let twin = idem_in(
        &schema,
        &format!("claims show {pending} --namespace live --format json"),
    )
    .expect_code(0)
    .json();
    assert_eq!(twin["steps"], serde_json::json!([]));
    let run = idem_in(&schema, &format!("claims show {pending} --namespace live")).expect_code(0);
    assert_contains(&run.stdout, "steps:            none\n");

    let run = idem_in(&schema, "claims show claim_000000000000000000000000").expect_code(1);
    assert_contains(
        &run.stderr,
        "no claim has address claim_000000000000000000000000",
    );
    let run = idem(&["claims", "show", "Claim X", "--schema", &schema]).expect_code(2);
    assert_contains(&run.stderr, "is not a claim address");

    // release: never a settled claim, never without --yes.
    let run = idem_in(&schema, &format!("claims release {settled} --yes")).expect_code(1);
    assert_contains(
        &run.stderr,
        "it is settled (success since 2024-01-10T00:00:00Z)",
    );
    assert_contains(&run.stderr, "idem never releases a settled claim");
    assert_eq!(count(&mut conn, &settled).await, 1);

    let release_pending = format!("claims release {pending} --account acme --no-namespace");
    let run = idem_in(&schema, &release_pending).expect_code(2);
    assert_contains(
        &run.stderr,
        &format!(
            "would release pending claim {pending} (account acme, no namespace): charge [\"ord_1\", 4999], created 2h00m ago."
        ),
    );
    assert_contains(&run.stderr, "Re-run with --yes");
    assert_eq!(count(&mut conn, &pending).await, 2);

    let run = idem_in(&schema, &format!("{release_pending} --yes")).expect_code(0);
    assert_eq!(
        run.stdout,
        format!(
            "released pending claim {pending} (account acme, no namespace): charge [\"ord_1\", 4999], created 2h00m ago\n"
        )
    );
    assert_eq!(
        count(&mut conn, &pending).await,
        1,
        "the claim in namespace live stays"
    );
    let left = idem_in(&schema, &format!("claims show {pending} --format json"))
        .expect_code(0)
        .json();
    assert_eq!(left["namespace"], "live");

    // prune: only settled claims, only before the date, only with --yes.
    let run = idem_in(&schema, "prune --settled-before 2024-02-01").expect_code(2);
    assert_contains(
        &run.stderr,
        "would delete 1 settled claim (settled before 2024-02-01T00:00:00Z, or past their window, in every account).",
    );
    assert_contains(
        &run.stderr,
        "Gates with a local outcome cache may keep refusing retries of a pruned action",
    );
    assert_eq!(count(&mut conn, &settled).await, 1);
    let run = idem_in(&schema, "prune --settled-before 2024-02-01 --yes").expect_code(0);
    assert_eq!(
        run.stdout,
        "deleted 1 settled claim (settled before 2024-02-01T00:00:00Z, or past their window, in every account)\n\
         Gates with a local outcome cache may keep refusing retries of a pruned action from it \
         for up to their cache's TTL.\n"
    );
    assert_eq!(count(&mut conn, &settled).await, 0);
    assert_eq!(count(&mut conn, &refund).await, 1);
    // --expired alone takes only slots past their window: none here, and
    // the claims kept for ever stay.
    let run = idem_in(&schema, "prune --expired --yes").expect_code(0);
    assert_contains(
        &run.stdout,
        "deleted 0 settled claims (past their window, in every account)",
    );
    assert_eq!(count(&mut conn, &refund).await, 1);
    // A success past the window in which its value is kept: the dry run
    // says it would be compacted, the prune compacts it, its slot stays.
    sqlx::query(
        "UPDATE idem_records SET value_kept_for = '1 second', \
             settled_at = now() - interval '1 hour' WHERE address = $1",
    )
    .bind(&refund)
    .execute(&mut conn)
    .await
    .expect("give the refund a value window, long past");
    let run = idem_in(&schema, "prune --expired --dry-run").expect_code(0);
    assert_contains(
        &run.stdout,
        "would compact 1 claim past the window in which its value is kept",
    );
    let run = idem_in(&schema, "prune --expired --yes").expect_code(0);
    assert_contains(
        &run.stdout,
        "compacted 1 claim past the window in which its value is kept: its slot still \
         refuses duplicates",
    );
    assert_eq!(count(&mut conn, &refund).await, 1, "its slot stays");
    let shown = idem_in(&schema, &format!("claims show {refund} --account globex"))
        .expect_code(0)
        .stdout;
    assert_contains(&shown, "compacted past its value's window");
    assert_contains(
        &shown,
        "its settle: a compacted claim keeps no creation time",
    );
    // Neither a cut-off nor --expired: a usage error, nothing deleted.
    let run = idem_in(&schema, "prune --yes").expect_code(2);
    assert_contains(&run.stderr, "--settled-before");

    let pruned = idem_in(
        &schema,
        "prune --settled-before 2024-12-31T00:00:00+02:00 --account acme --yes --format json",
    )
    .expect_code(0)
    .json();
    assert_eq!(
        pruned,
        serde_json::json!({
            "deleted": 0,
            "compacted": 0,
            "settled_before": "2024-12-30T22:00:00Z",
            "account": "acme",
            // One per lane (no namespace, a namespace, steps whose claim
            // is gone) for the one account.
            "batches": 3,
            "batch_size": 10_000,
        })
    );
    assert_eq!(count(&mut conn, &refund).await, 1, "another account");
    assert_eq!(
        count(&mut conn, &long).await,
        1,
        "pending claims are never pruned"
    );

    let run = idem_in(&schema, "prune --settled-before yesterday --yes").expect_code(2);
    assert_contains(&run.stderr, "write YYYY-MM-DD");

    run_sql(&mut conn, "RESET search_path").await;
    drop_schemas(&mut conn, &[&schema]).await;
}

/// Inserts a claim of `charge(order)` in account acme, no namespace, made
/// ten minutes ago.
async fn claim(conn: &mut PgConnection, order: &str, state: &str) -> String {
    let identity = Identity::new("charge").part(order);
    insert(
        conn,
        Row {
            state,
            ..Row::new("acme", identity)
        },
    )
    .await
}

/// Holds the claim at `address` (account acme, no namespace) in `state`,
/// saying why, as the runtime does when it leaves `pending` without a
/// success.
async fn hold(conn: &mut PgConnection, address: &str, state: &str, reason: &str) {
    // The settle time is computed here: Citus refuses now() inside a CASE
    // of an UPDATE on a distributed table.
    let settled_at = (state == "failed").then(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64())
    });
    sqlx::query(
        "UPDATE idem_records SET state = $2, state_reason = $3, settled_at = to_timestamp($4) \
         WHERE account = 'acme' AND kind = 'claim' AND address = $1 AND namespace IS NULL",
    )
    .bind(address)
    .bind(state)
    .bind(reason)
    .bind(settled_at)
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("cannot hold the claim {state}: {e}"));
}

/// A claim's state, reason, output and whether it was resolved, as stored.
async fn stored(
    conn: &mut PgConnection,
    address: &str,
) -> Option<(String, Option<String>, Option<String>, bool)> {
    sqlx::query_as(
        "SELECT state, state_reason, output_json, resolved_at IS NOT NULL \
         FROM idem_records WHERE address = $1",
    )
    .bind(address)
    .fetch_optional(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn claims_in_doubt_are_listed_shown_and_resolved_by_hand() {
    let mut conn = connect().await;
    let schema = unique_name("idem_resolve");
    create_schemas(&mut conn, &[&schema]).await;
    migrate_for_claims(&mut conn, &schema).await;
    run_sql(&mut conn, &format!("SET search_path = {}", ident(&schema))).await;
    let timed_out = claim(&mut conn, "ord_timeout", "pending").await;
    let declined = claim(&mut conn, "ord_declined", "pending").await;
    let lost = claim(&mut conn, "ord_lost", "pending").await;
    let stale = claim(&mut conn, "ord_stale", "pending").await;
    let settled = claim(&mut conn, "ord_settled", "success").await;
    hold(&mut conn, &timed_out, "in_doubt", "body_in_doubt").await;
    hold(&mut conn, &declined, "in_doubt", "lease_expired").await;
    hold(&mut conn, &lost, "failed", "kept_failure").await;

    // list and show: the new states, and how a claim got there.
    let listed = idem_in(&schema, "claims list --state in_doubt --format json")
        .expect_code(0)
        .json();
    let mut in_doubt = addresses(&listed);
    in_doubt.sort_unstable();
    let mut expected = [timed_out.as_str(), declined.as_str()];
    expected.sort_unstable();
    assert_eq!(in_doubt, expected);
    let failed = idem_in(&schema, "claims list --state failed --format json")
        .expect_code(0)
        .json();
    assert_eq!(addresses(&failed), [lost.as_str()]);
    assert_eq!(failed[0]["state_reason"], "kept_failure");
    assert!(failed[0]["fence"].as_i64().is_some(), "{failed}");

    let run = idem_in(&schema, &format!("claims show {timed_out}")).expect_code(0);
    for field in [
        "state:            in_doubt\n",
        "state_reason:     body_in_doubt\n",
        "\nfence:            ",
    ] {
        assert_contains(&run.stdout, field);
    }
    assert_eq!(run.stdout.matches("\nfence:").count(), 1, "{}", run.stdout);

    // resolve: one of --succeeded, --failed, --release; --output is JSON,
    // and only with --succeeded.
    let resolve = |rest: &str| idem_in(&schema, &format!("claims resolve {timed_out} {rest}"));
    let run = resolve("--yes").expect_code(2);
    assert_contains(&run.stderr, "--succeeded");
    let run = resolve("--failed --output 1").expect_code(2);
    assert_contains(
        &run.stderr,
        "'--failed' cannot be used with '--output <JSON>'",
    );
    let run = idem(&[
        "claims",
        "resolve",
        &timed_out,
        "--succeeded",
        "--output",
        "{receipt: r_1}",
        "--yes",
        "--schema",
        &schema,
    ])
    .expect_code(2);
    assert_contains(&run.stderr, "--output must be JSON");

    // Without --yes: what it would do, and nothing done.
    let run = resolve(r#"--succeeded --output {"receipt":"r_1"}"#).expect_code(2);
    assert_contains(
        &ten_minutes_old(&run.stderr),
        &format!(
            "would resolve in_doubt claim {timed_out} (account acme, no namespace): \
             charge [\"ord_timeout\"], created 10m00s ago, fence "
        ),
    );
    assert_contains(
        &run.stderr,
        "(body_in_doubt): as a success, replaying {\"receipt\":\"r_1\"}.\n\
         Retries will not run the action again",
    );
    assert_contains(&run.stderr, "Re-run with --yes");
    assert_eq!(
        stored(&mut conn, &timed_out).await,
        Some(("in_doubt".into(), Some("body_in_doubt".into()), None, false))
    );

    // --succeeded: a success, with the output to replay.
    let run =
        resolve(r#"--succeeded --output {"receipt":"r_1"} --account acme --yes"#).expect_code(0);
    assert_eq!(
        ten_minutes_old(&run.stdout),
        format!(
            "resolved in_doubt claim {timed_out} (account acme, no namespace): \
             charge [\"ord_timeout\"], created 10m00s ago: now success; retries get its outcome\n\
             Gates with a local outcome cache never hold a claim pending or in doubt: they see \
             this resolution at their next call.\n"
        )
    );
    assert_eq!(
        stored(&mut conn, &timed_out).await,
        Some((
            "success".into(),
            Some("operator".into()),
            Some(r#"{"receipt":"r_1"}"#.into()),
            true
        ))
    );
    // Never over a success: refused, and why.
    let run = resolve("--release --yes").expect_code(1);
    assert_contains(&run.stderr, "it succeeded (settled 2");
    assert_contains(&run.stderr, "a success is kept forever");
    let run = idem_in(&schema, &format!("claims resolve {settled} --failed --yes")).expect_code(1);
    assert_contains(&run.stderr, "a success is kept forever");
    assert_eq!(
        stored(&mut conn, &settled).await.map(|row| row.0),
        Some("success".into())
    );

    // --failed, in JSON: what it was, what it is.
    let resolved = idem_in(
        &schema,
        &format!("claims resolve {declined} --failed --yes --format json"),
    )
    .expect_code(0)
    .json();
    assert_eq!(resolved["resolution"], "failed");
    assert_eq!(resolved["state_before"], "in_doubt");
    assert_eq!(resolved["state_after"], "failed");
    assert_eq!(resolved["claim"]["address"], declined.as_str());
    assert_eq!(resolved["claim"]["state_reason"], "lease_expired");
    assert_eq!(
        stored(&mut conn, &declined).await,
        Some(("failed".into(), Some("operator".into()), None, true))
    );
    // A kept failure is resolved already.
    let run = idem_in(&schema, &format!("claims resolve {lost} --release --yes")).expect_code(1);
    assert_contains(&run.stderr, "it is a kept failure, already resolved");
    assert_eq!(count(&mut conn, &lost).await, 1);

    // --release of a stale pending claim: deleted, the next retry runs.
    let run = idem_in(&schema, &format!("claims resolve {stale} --release --yes")).expect_code(0);
    assert!(
        run.stdout
            .starts_with(&format!("resolved pending claim {stale} "))
            && run
                .stdout
                .contains("released; the next retry runs the action\n"),
        "{}",
        run.stdout
    );
    assert_eq!(count(&mut conn, &stale).await, 0);

    // release refuses a claim in doubt and points at resolve.
    let held = claim(&mut conn, "ord_held", "pending").await;
    hold(&mut conn, &held, "in_doubt", "body_in_doubt").await;
    let run = idem_in(&schema, &format!("claims release {held} --yes")).expect_code(1);
    assert_contains(&run.stderr, "it is in doubt (body_in_doubt)");
    assert_contains(&run.stderr, &format!("idem claims resolve {held}"));
    assert_eq!(count(&mut conn, &held).await, 1);

    // A claim made with on_expiry = "in_doubt" whose lease ran out is in
    // doubt in all but its state (no retry looked yet): release refuses it
    // too. One whose lease is still live is released as any pending claim.
    // The lease's end is computed here, as `hold` computes its time (Citus).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    for (order, lease_seconds, released) in
        [("ord_vanished", -60.0, false), ("ord_live", 3_600.0, true)]
    {
        let address = claim(&mut conn, order, "pending").await;
        sqlx::query(
            "UPDATE idem_records SET expires_in_doubt = true, lease_expires_at = to_timestamp($2) \
             WHERE account = 'acme' AND kind = 'claim' AND address = $1 AND namespace IS NULL",
        )
        .bind(&address)
        .bind(now + lease_seconds)
        .execute(&mut conn)
        .await
        .expect("mark the claim made with on_expiry = in_doubt");
        let command = format!("claims release {address} --yes");
        if released {
            idem_in(&schema, &command).expect_code(0);
            assert_eq!(count(&mut conn, &address).await, 0, "{order}");
        } else {
            let run = idem_in(&schema, &command).expect_code(1);
            assert_contains(
                &run.stderr,
                "its lease ran out under on_expiry = \"in_doubt\"",
            );
            assert_contains(&run.stderr, &format!("idem claims resolve {address}"));
            assert_eq!(count(&mut conn, &address).await, 1, "{order}");
        }
    }

    let run = idem_in(
        &schema,
        "claims resolve claim_000000000000000000000000 --failed --yes",
    )
    .expect_code(1);
    assert_contains(&run.stderr, "no claim has address");

    run_sql(&mut conn, "RESET search_path").await;
    drop_schemas(&mut conn, &[&schema]).await;
}

#[tokio::test]
async fn migrate_partitions_a_new_table_by_account_and_reports_the_layout() {
    let mut conn = connect().await;
    let schema = unique_name("idem_partitions");
    create_schemas(&mut conn, &[&schema]).await;

    let run = idem_in(&schema, "migrate --partitions 8").expect_code(0);
    assert_contains(
        &run.stdout,
        "  layout: partitioned by HASH (account) into 8 partitions\n",
    );
    // The same layout again only verifies; another count is refused.
    idem_in(&schema, "migrate --partitions 8").expect_code(0);
    let run = idem_in(&schema, "migrate --partitions 4").expect_code(1);
    assert_contains(&run.stderr, "into 4 partitions");
    // Out of range, and with --check: usage errors, said by the parser.
    let run = idem_in(&schema, "migrate --partitions 0").expect_code(2);
    assert_contains(&run.stderr, "--partitions");
    let run = idem_in(&schema, "migrate --check --partitions 8").expect_code(2);
    assert_contains(&run.stderr, "cannot be used with");
    let report = idem_in(&schema, "migrate --check --format json")
        .expect_code(0)
        .json();
    assert_eq!(
        report["layout"],
        "partitioned by HASH (account) into 8 partitions"
    );

    drop_schemas(&mut conn, &[&schema]).await;
}

#[tokio::test]
async fn migrate_distributed_needs_a_citus_coordinator_and_reports_the_layout() {
    let mut conn = connect().await;
    let schema = unique_name("idem_distributed");
    create_schemas(&mut conn, &[&schema]).await;

    if on_citus(&mut conn).await {
        let run = idem_in(&schema, "migrate --distributed").expect_code(0);
        assert_contains(
            &run.stdout,
            "  layout: distributed by Citus on account (hash) into ",
        );
        // Again: only verifies.
        idem_in(&schema, "migrate --distributed").expect_code(0);
    } else {
        // Without Citus: refused, saying what is missing, and nothing made.
        let run = idem_in(&schema, "migrate --distributed").expect_code(1);
        assert_contains(&run.stderr, "no citus extension");
        assert_contains(&run.stderr, "set_up_partitioned");
        let absent: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NULL")
            .bind(format!("{}.idem_records", ident(&schema)))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(absent, "a refused set-up creates nothing");
    }
    // Either way: one layout at a time, and --check changes nothing.
    let run = idem_in(&schema, "migrate --distributed --partitions 8").expect_code(2);
    assert_contains(&run.stderr, "cannot be used with");
    let run = idem_in(&schema, "migrate --check --distributed").expect_code(2);
    assert_contains(&run.stderr, "cannot be used with");

    drop_schemas(&mut conn, &[&schema]).await;
}

#[tokio::test]
async fn claims_list_says_when_it_stopped_at_its_limit_and_counts_them_all() {
    let mut conn = connect().await;
    let schema = unique_name("idem_limit");
    create_schemas(&mut conn, &[&schema]).await;
    migrate_for_claims(&mut conn, &schema).await;
    run_sql(&mut conn, &format!("SET search_path = {}", ident(&schema))).await;
    for order in 0..101 {
        let address = claim(&mut conn, &format!("ord_{order}"), "pending").await;
        hold(&mut conn, &address, "in_doubt", "body_in_doubt").await;
    }

    // The default limit (100) is reached: said on stderr, with the total and
    // how to see them all; stdout stays the list (JSON stays a JSON array).
    let run = idem_in(&schema, "claims list --state in_doubt").expect_code(0);
    assert_eq!(run.stdout.lines().count(), 1 + 100, "{}", run.stdout);
    assert_contains(&run.stderr, "showing 100 of 101 claims");
    assert_contains(&run.stderr, "--limit 101");
    let run = idem_in(&schema, "claims list --state in_doubt --format json").expect_code(0);
    assert_eq!(addresses(&run.json()).len(), 100);
    assert_contains(&run.stderr, "showing 100 of 101 claims");
    // All of them: nothing to say.
    let run = idem_in(&schema, "claims list --state in_doubt --limit 101").expect_code(0);
    assert_eq!(run.stdout.lines().count(), 1 + 101);
    assert_eq!(run.stderr, "");

    // The count alone, to watch.
    let run = idem_in(&schema, "claims list --state in_doubt --count").expect_code(0);
    assert_eq!(run.stdout, "101\n");
    let run = idem_in(
        &schema,
        "claims list --state in_doubt --count --format json",
    )
    .expect_code(0);
    assert_eq!(run.json(), serde_json::json!({ "count": 101 }));
    let run = idem_in(&schema, "claims list --state failed --count").expect_code(0);
    assert_eq!(run.stdout, "0\n");

    run_sql(&mut conn, "RESET search_path").await;
    drop_schemas(&mut conn, &[&schema]).await;
}

#[tokio::test]
async fn claims_list_older_than_measures_a_claim_in_doubt_from_when_it_went_in_doubt() {
    use idem::Gate;
    use idem_test_support::ChargeError;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let mut conn = connect().await;
    let schema = unique_name("idem_doubt_age");
    create_schemas(&mut conn, &[&schema]).await;
    migrate_for_claims(&mut conn, &schema).await;
    let options: PgConnectOptions = idem::testing::database_url()
        .parse::<PgConnectOptions>()
        .unwrap_or_else(|e| panic!("{e}"))
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let gate = Gate::connect(pool).await.unwrap_or_else(|e| panic!("{e}"));

    // Claimed, then in doubt three seconds later, when its body timed out.
    let id = Identity::new("charge").part("ord_slow");
    let outcome: Result<(), ChargeError> = gate
        .guard(&id)
        .disposition(ChargeError::disposition)
        .run(async {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            Err(ChargeError::Timeout)
        })
        .await;
    assert!(matches!(outcome, Err(ChargeError::Timeout)), "{outcome:?}");

    // Created more than 2 s ago, in doubt for less: not listed yet.
    let listed = idem_in(
        &schema,
        "claims list --state in_doubt --older-than 2s --format json",
    )
    .expect_code(0)
    .json();
    assert_eq!(
        addresses(&listed),
        Vec::<&str>::new(),
        "measured from created_at"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let listed = idem_in(
        &schema,
        "claims list --state in_doubt --older-than 2s --format json",
    )
    .expect_code(0)
    .json();
    assert_eq!(addresses(&listed), vec![id.address().as_str()]);
    gate.pool().close().await;
    drop_schemas(&mut conn, &[&schema]).await;
}

#[tokio::test]
async fn names_with_control_characters_are_escaped_in_text_and_json_stays_json() {
    let mut conn = connect().await;
    let schema = unique_name("idem_escape");
    create_schemas(&mut conn, &[&schema]).await;
    migrate_for_claims(&mut conn, &schema).await;
    run_sql(&mut conn, &format!("SET search_path = {}", ident(&schema))).await;
    let hostile = "acme\u{1b}[2J\rroot\u{202e}";
    let address = insert(
        &mut conn,
        Row {
            namespace: Some("live\n"),
            ..Row::new(
                hostile,
                Identity::new("charge\u{7}\u{1b}]0;x").part("ord\n1"),
            )
        },
    )
    .await;

    for command in [
        "claims list".to_owned(),
        format!("claims show {address}"),
        format!("claims release {address}"),
    ] {
        let run = idem_in(&schema, &command);
        for text in [&run.stdout, &run.stderr] {
            let raw: Vec<char> = text
                .chars()
                .filter(|c| (c.is_control() && *c != '\n') || *c == '\u{202e}')
                .collect();
            assert!(raw.is_empty(), "{command}: raw {raw:?} in:\n{text}");
        }
        let said = format!("{}{}", run.stdout, run.stderr);
        assert_contains(&said, r"acme\u{1b}[2J\u{d}root\u{202e}");
    }
    let run = idem_in(&schema, "claims list").expect_code(0);
    assert_contains(&run.stdout, r"live\u{a}");
    assert_contains(&run.stdout, r"charge\u{7}\u{1b}]0;x");

    let listed = idem_in(&schema, "claims list --format json")
        .expect_code(0)
        .json();
    assert_eq!(listed[0]["account"], hostile);
    assert_eq!(listed[0]["namespace"], "live\n");
    assert_eq!(listed[0]["action"], "charge\u{7}\u{1b}]0;x");

    run_sql(&mut conn, "RESET search_path").await;
    drop_schemas(&mut conn, &[&schema]).await;
}

/// A step's name often carries request data (`format!("charge-{item}")`):
/// `claims show` prints it quoted and escaped, never a terminal escape or a
/// line break that would forge a line of its own.
#[tokio::test]
async fn step_names_with_control_characters_are_escaped_in_show() {
    let gate = idem::testing::gate().await;
    let id = Identity::new("show_escape").part(1);
    let hostile = "ship\u{1b}[2J\n  \"forged\"  step_000000000000000000000000  success\u{202e}";
    let ran: Result<(), idem::Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step(hostile, async { Ok::<u8, idem::Rejected>(1) }).await?;
            Ok(())
        })
        .await;
    ran.expect("the body ran its step");
    let address = id.address();
    let run = idem(&["claims", "show", &address, "--account", gate.account_name()]).expect_code(0);
    let raw: Vec<char> = run
        .stdout
        .chars()
        .filter(|c| (c.is_control() && *c != '\n') || *c == '\u{202e}')
        .collect();
    assert!(raw.is_empty(), "printed raw {raw:?}:\n{}", run.stdout);
    let step_lines = run.stdout.lines().filter(|l| l.contains("step_")).count();
    assert_eq!(step_lines, 1, "one step, one line:\n{}", run.stdout);
}
