//! The promises of `idem claims list` and `idem claims resolve`
//! (docs/operations.md "Claims: list, show, release, resolve, prune",
//! `claims list --help`, `claims resolve --help`), against the real binary.

mod common;

use common::{assert_contains, idem, idem_in};
use idem::testing::unique_name;
use idem_runtime::Identity;
use idem_test_support::connections::connect;
use idem_test_support::schemas::{create_schemas, ident, run_sql};
use sqlx::PgConnection;

/// A schema of this test's own, migrated, on the connection's search_path.
async fn schema(conn: &mut PgConnection, prefix: &str) -> String {
    let schema = unique_name(prefix);
    create_schemas(conn, &[&schema]).await;
    idem_in(&schema, "migrate").expect_code(0);
    run_sql(conn, &format!("SET search_path = {}", ident(&schema))).await;
    schema
}

/// Inserts a claim in `state`, made `age` seconds ago; for `in_doubt`, in
/// doubt since `doubt_age` seconds ago.
async fn insert(
    conn: &mut PgConnection,
    account: &str,
    namespace: Option<&str>,
    identity: &Identity,
    state: &str,
    age: f64,
    doubt_age: Option<f64>,
) -> String {
    let address = identity.address();
    sqlx::query(
        "INSERT INTO idem_records \
             (account, kind, address, namespace, state, identity, created_at, settled_at, \
              in_doubt_since, state_reason) \
         VALUES ($1, 'claim', $2, $3, $4, $5, now() - make_interval(secs => $6), \
                 CASE WHEN $4 = 'success' THEN now() END, \
                 now() - make_interval(secs => $7), \
                 CASE WHEN $4 = 'in_doubt' THEN 'body_in_doubt' END)",
    )
    .bind(account)
    .bind(&address)
    .bind(namespace)
    .bind(state)
    .bind(identity.canonical())
    .bind(age)
    .bind(doubt_age)
    .execute(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("cannot insert a claim: {e}"));
    address
}

async fn stored(conn: &mut PgConnection, address: &str) -> Option<(String, Option<String>)> {
    sqlx::query_as("SELECT state, state_reason FROM idem_records WHERE address = $1")
        .bind(address)
        .fetch_optional(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// "`--count` prints only how many match (all of them, whatever --limit)";
/// "`--older-than` measures a claim in doubt from when it went in doubt";
/// "When more match, it says so on stderr ... stdout stays the list (with
/// --format json, still a JSON array)".
#[tokio::test]
async fn claims_list_count_limit_and_older_than_agree_on_claims_in_doubt() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_list").await;
    // Five claimed two days ago, in doubt for two hours; three claimed two
    // days ago, in doubt for a minute; two pending for two days.
    let mut old_doubts = Vec::new();
    for k in 0..5_i64 {
        let id = Identity::new("charge").part(k);
        old_doubts.push(
            insert(
                &mut conn,
                "acme",
                None,
                &id,
                "in_doubt",
                172_800.0,
                Some(7_200.0),
            )
            .await,
        );
    }
    for k in 5..8_i64 {
        let id = Identity::new("charge").part(k);
        insert(
            &mut conn,
            "acme",
            None,
            &id,
            "in_doubt",
            172_800.0,
            Some(60.0),
        )
        .await;
    }
    for k in 8..10_i64 {
        let id = Identity::new("charge").part(k);
        insert(&mut conn, "acme", None, &id, "pending", 172_800.0, None).await;
    }
    let count = |args: &str| {
        idem_in(&schema, &format!("claims list {args} --count"))
            .expect_code(0)
            .stdout
            .trim()
            .to_owned()
    };
    assert_eq!(count("--state in_doubt --limit 1"), "8");
    // --limit 0 is a usage error, not "nothing".
    idem_in(&schema, "claims list --state in_doubt --limit 0").expect_code(2);
    assert_eq!(count("--state in_doubt --older-than 1h"), "5");
    assert_eq!(count("--state in_doubt --older-than 1h --limit 2"), "5");
    assert_eq!(
        count("--older-than 1h"),
        "7",
        "5 in doubt for 2h, 2 pending for 2d"
    );
    let json = idem_in(
        &schema,
        "claims list --state in_doubt --count --format json",
    )
    .expect_code(0);
    assert_eq!(json.json()["count"], 8);

    let listed = idem_in(
        &schema,
        "claims list --state in_doubt --older-than 1h --limit 2 --format json",
    )
    .expect_code(0);
    let array = listed.json();
    assert_eq!(array.as_array().map(Vec::len), Some(2), "{array}");
    assert_contains(&listed.stderr, "2 of 5");
    for claim in array.as_array().unwrap() {
        assert!(
            old_doubts.contains(&claim["address"].as_str().unwrap().to_owned()),
            "{claim}"
        );
    }
    // All of them, with no note.
    let all = idem_in(
        &schema,
        "claims list --state in_doubt --older-than 1h --format json",
    )
    .expect_code(0);
    assert_eq!(all.json().as_array().map(Vec::len), Some(5));
    assert!(!all.stderr.contains(" of "), "{}", all.stderr);
    // An absurd age is not a database error.
    let absurd = idem_in(
        &schema,
        "claims list --state in_doubt --older-than 100000years --count",
    );
    assert_eq!(
        (absurd.code, absurd.stdout.trim()),
        (0, "0"),
        "stderr: {}",
        absurd.stderr
    );
}

/// `claims resolve`: "A pending claim whose lease is live is refused too
/// (exit 1)"; "A claim that succeeded or was kept failed is refused (exit 1)
/// and the message says why"; "without it [--yes], it says what it would do
/// and exits 2"; "`--output` ... as JSON (anything else is refused, exit 2)".
#[tokio::test]
async fn claims_resolve_refuses_a_live_lease_a_success_a_failure_and_bad_output() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_resolve").await;
    let live = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("live"),
        "pending",
        3_600.0,
        None,
    )
    .await;
    sqlx::query(
        "UPDATE idem_records SET lease_expires_at = now() + interval '1 hour' WHERE address = $1",
    )
    .bind(&live)
    .execute(&mut conn)
    .await
    .expect("lease");
    let done = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("done"),
        "success",
        3_600.0,
        None,
    )
    .await;
    let failed = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("failed"),
        "failed",
        3_600.0,
        None,
    )
    .await;
    let doubt = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("doubt"),
        "in_doubt",
        3_600.0,
        Some(60.0),
    )
    .await;

    for how in ["--succeeded", "--failed", "--release"] {
        let run = idem(&[
            "claims", "resolve", &live, how, "--yes", "--schema", &schema,
        ])
        .expect_code(1);
        assert_contains(&run.stderr, "lease is live");
        assert_eq!(
            stored(&mut conn, &live).await.map(|s| s.0).as_deref(),
            Some("pending")
        );
        let run = idem(&[
            "claims", "resolve", &done, how, "--yes", "--schema", &schema,
        ])
        .expect_code(1);
        assert_contains(&run.stderr, "succeeded");
        assert_eq!(
            stored(&mut conn, &done).await.map(|s| s.0).as_deref(),
            Some("success")
        );
        let run = idem(&[
            "claims", "resolve", &failed, how, "--yes", "--schema", &schema,
        ])
        .expect_code(1);
        assert_contains(&run.stderr, "kept failure");
        assert_eq!(
            stored(&mut conn, &failed).await.map(|s| s.0).as_deref(),
            Some("failed")
        );
    }
    // Without --yes: exit 2, nothing changed.
    idem(&[
        "claims",
        "resolve",
        &doubt,
        "--release",
        "--schema",
        &schema,
    ])
    .expect_code(2);
    assert_eq!(
        stored(&mut conn, &doubt).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );
    // Output that is not JSON: exit 2, nothing changed, with or without --yes.
    for output in ["{receipt", "", "'x'", "NaN", "[1,]"] {
        idem(&[
            "claims",
            "resolve",
            &doubt,
            "--succeeded",
            "--output",
            output,
            "--yes",
            "--schema",
            &schema,
        ])
        .expect_code(2);
        assert_eq!(
            stored(&mut conn, &doubt).await.map(|s| s.0).as_deref(),
            Some("in_doubt")
        );
    }
    // --output without --succeeded is not silently dropped.
    let run = idem(&[
        "claims", "resolve", &doubt, "--failed", "--output", "{}", "--yes", "--schema", &schema,
    ]);
    assert_eq!(run.code, 2, "--failed --output accepted: {run:?}");
    // Resolved once; a second resolution is refused (exit 1), never over it.
    idem(&[
        "claims",
        "resolve",
        &doubt,
        "--succeeded",
        "--output",
        "{\"r\":1}",
        "--yes",
        "--schema",
        &schema,
    ])
    .expect_code(0);
    assert_eq!(
        stored(&mut conn, &doubt).await,
        Some(("success".to_owned(), Some("operator".to_owned())))
    );
    idem(&[
        "claims",
        "resolve",
        &doubt,
        "--release",
        "--yes",
        "--schema",
        &schema,
    ])
    .expect_code(1);
    assert_eq!(
        stored(&mut conn, &doubt).await.map(|s| s.0).as_deref(),
        Some("success")
    );
}

fn assert_no_raw_controls(what: &str, text: &str) {
    let raw: Vec<char> = text
        .chars()
        .filter(|c| {
            (c.is_control() && *c != '\n')
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect();
    assert!(raw.is_empty(), "{what} printed raw {raw:?}:\n{text}");
}

/// "Text output escapes control characters and the characters that reorder
/// text (`\n`, `\u{1b}`, `\u{202e}`) in accounts, namespaces and actions,
/// which whoever makes a claim chooses" — in every command that prints a
/// claim, on stdout and stderr; and key parts, which the claimer chooses too.
#[tokio::test]
async fn names_with_control_characters_are_escaped_by_list_show_resolve_and_release() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_escape").await;
    let account = "ac\u{1b}[2Jme\u{202e}";
    let namespace = "li\rve\u{2066}";
    let action = "cha\nrge\u{200f}";
    let doubt_id = Identity::new(action)
        .part("ord\u{1b}]0;pwned\u{7}\u{202e}1")
        .part(1_i64);
    let doubt = insert(
        &mut conn,
        account,
        Some(namespace),
        &doubt_id,
        "in_doubt",
        600.0,
        Some(60.0),
    )
    .await;
    let pending_id = Identity::new(action).part("ord\u{202e}2");
    let pending = insert(
        &mut conn,
        account,
        Some(namespace),
        &pending_id,
        "pending",
        600.0,
        None,
    )
    .await;
    let done_id = Identity::new(action).part("ord\u{202e}3");
    let done = insert(
        &mut conn,
        account,
        Some(namespace),
        &done_id,
        "success",
        600.0,
        None,
    )
    .await;

    let runs = [
        ("list", idem(&["claims", "list", "--schema", &schema])),
        (
            "list in_doubt",
            idem(&[
                "claims", "list", "--state", "in_doubt", "--limit", "1", "--schema", &schema,
            ]),
        ),
        (
            "show",
            idem(&["claims", "show", &doubt, "--schema", &schema]),
        ),
        (
            "resolve without --yes",
            idem(&["claims", "resolve", &doubt, "--failed", "--schema", &schema]),
        ),
        (
            "resolve a success",
            idem(&[
                "claims", "resolve", &done, "--failed", "--yes", "--schema", &schema,
            ]),
        ),
        (
            "resolve",
            idem(&[
                "claims", "resolve", &doubt, "--failed", "--yes", "--schema", &schema,
            ]),
        ),
        (
            "resolve again",
            idem(&[
                "claims", "resolve", &doubt, "--failed", "--yes", "--schema", &schema,
            ]),
        ),
        (
            "release without --yes",
            idem(&["claims", "release", &pending, "--schema", &schema]),
        ),
        (
            "release",
            idem(&["claims", "release", &pending, "--yes", "--schema", &schema]),
        ),
        (
            "release again",
            idem(&["claims", "release", &pending, "--yes", "--schema", &schema]),
        ),
    ];
    for (what, run) in &runs {
        assert_no_raw_controls(&format!("{what} (stdout)"), &run.stdout);
        assert_no_raw_controls(&format!("{what} (stderr)"), &run.stderr);
    }
    // JSON carries them as JSON does.
    let json = idem(&["claims", "list", "--format", "json", "--schema", &schema]).expect_code(0);
    let listed = json.json();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["account"] == account && c["namespace"] == namespace),
        "{listed}"
    );
}

async fn states(conn: &mut PgConnection, address: &str) -> Vec<(String, Option<String>, String)> {
    sqlx::query_as(
        "SELECT account, namespace, state FROM idem_records WHERE address = $1 \
         ORDER BY account, namespace NULLS FIRST",
    )
    .bind(address)
    .fetch_all(conn)
    .await
    .expect("read")
}

/// "An address claimed in several accounts or namespaces asks for
/// `--account` / `--namespace NAME` / `--no-namespace`" (resolve), and a
/// stale pending claim (no lease, or one run out) is resolved: "settles a
/// claim in doubt (or a stale pending one)".
#[tokio::test]
async fn claims_resolve_of_an_address_in_two_accounts_asks_which_and_changes_only_that_one() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_two_acc").await;
    let id = Identity::new("charge").part("shared");
    let address = insert(&mut conn, "acme", None, &id, "in_doubt", 600.0, Some(60.0)).await;
    insert(
        &mut conn,
        "globex",
        None,
        &id,
        "in_doubt",
        600.0,
        Some(60.0),
    )
    .await;
    insert(
        &mut conn,
        "acme",
        Some(""),
        &id,
        "in_doubt",
        600.0,
        Some(60.0),
    )
    .await;
    let run = idem(&[
        "claims",
        "resolve",
        &address,
        "--release",
        "--yes",
        "--schema",
        &schema,
    ]);
    assert_ne!(run.code, 0, "{run:?}");
    assert_contains(&run.stderr, "--account");
    assert_eq!(states(&mut conn, &address).await.len(), 3);
    // acme has it without a namespace and in the namespace "": still two.
    let run = idem(&[
        "claims",
        "resolve",
        &address,
        "--failed",
        "--yes",
        "--account",
        "acme",
        "--schema",
        &schema,
    ]);
    assert_ne!(run.code, 0, "{run:?}");
    idem(&[
        "claims",
        "resolve",
        &address,
        "--failed",
        "--yes",
        "--account",
        "acme",
        "--no-namespace",
        "--schema",
        &schema,
    ])
    .expect_code(0);
    assert_eq!(
        states(&mut conn, &address).await,
        vec![
            ("acme".to_owned(), None, "failed".to_owned()),
            (
                "acme".to_owned(),
                Some(String::new()),
                "in_doubt".to_owned()
            ),
            ("globex".to_owned(), None, "in_doubt".to_owned()),
        ]
    );
    idem(&[
        "claims",
        "resolve",
        &address,
        "--release",
        "--yes",
        "--account",
        "acme",
        "--namespace",
        "",
        "--schema",
        &schema,
    ])
    .expect_code(0);
    assert_eq!(states(&mut conn, &address).await.len(), 2);

    // A stale pending claim: no lease, or a lease run out.
    let stale = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("stale"),
        "pending",
        600.0,
        None,
    )
    .await;
    let expired = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("expired"),
        "pending",
        600.0,
        None,
    )
    .await;
    sqlx::query(
        "UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE address = $1",
    )
    .bind(&expired)
    .execute(&mut conn)
    .await
    .expect("lease");
    idem(&[
        "claims",
        "resolve",
        &stale,
        "--succeeded",
        "--yes",
        "--schema",
        &schema,
    ])
    .expect_code(0);
    idem(&[
        "claims",
        "resolve",
        &expired,
        "--release",
        "--yes",
        "--schema",
        &schema,
    ])
    .expect_code(0);
    assert_eq!(
        stored(&mut conn, &stale).await.map(|s| s.0).as_deref(),
        Some("success")
    );
    assert_eq!(stored(&mut conn, &expired).await, None);
}

/// "Text output escapes control characters ... in accounts, namespaces and
/// actions": also when the identity does not read back (its raw bytes are
/// whatever was written).
#[tokio::test]
async fn a_claim_whose_identity_does_not_read_back_is_printed_escaped() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_garbage").await;
    let address = "claim_00000000000000000000abcd";
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, namespace, state, identity, created_at, \
                                   in_doubt_since, state_reason) \
         VALUES ('acme', 'claim', $1, NULL, 'in_doubt', $2, now() - interval '1 hour', now(), \
                 'body_in_doubt\u{1b}[2J')",
    )
    .bind(address)
    .bind(b"\x1b[2J\xe2\x80\xae\x07 not canonical".as_slice())
    .execute(&mut conn)
    .await
    .expect("insert");
    for args in [
        vec!["claims", "list"],
        vec!["claims", "show", address],
        vec!["claims", "resolve", address, "--failed"],
        vec!["claims", "resolve", address, "--failed", "--yes"],
        vec!["claims", "resolve", address, "--failed", "--yes"],
    ] {
        let mut args = args.clone();
        args.extend(["--schema", &schema]);
        let run = idem(&args);
        assert_no_raw_controls(&format!("{args:?} (stdout)"), &run.stdout);
        assert_no_raw_controls(&format!("{args:?} (stderr)"), &run.stderr);
    }
}

/// `--account` "Only this account", `--namespace` "Only this namespace":
/// names that are LIKE patterns match only themselves, in list, --count and
/// resolve.
#[tokio::test]
async fn account_and_namespace_filters_are_names_not_patterns() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_like").await;
    let id = Identity::new("charge").part("ord_1");
    for (account, namespace) in [
        ("a%", None),
        ("ab", None),
        ("a_", Some("_")),
        ("a\\", Some("%")),
        ("a_", Some("x")),
    ] {
        insert(
            &mut conn,
            account,
            namespace,
            &id,
            "in_doubt",
            600.0,
            Some(60.0),
        )
        .await;
    }
    let count = |args: &[&str]| {
        let mut all = vec!["claims", "list", "--count"];
        all.extend(args);
        all.extend(["--schema", &schema]);
        idem(&all).expect_code(0).stdout.trim().to_owned()
    };
    assert_eq!(count(&["--account", "a%"]), "1");
    assert_eq!(count(&["--account", "a_"]), "2");
    assert_eq!(count(&["--account", "a_", "--namespace", "_"]), "1");
    assert_eq!(count(&["--namespace", "%"]), "1");
    assert_eq!(count(&["--account", "a\\"]), "1");
    assert_eq!(count(&["--account", "a"]), "0");
    let address = id.address();
    idem(&[
        "claims",
        "resolve",
        &address,
        "--failed",
        "--yes",
        "--account",
        "a%",
        "--schema",
        &schema,
    ])
    .expect_code(0);
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE state = 'failed'")
            .fetch_one(&mut conn)
            .await
            .expect("count");
    assert_eq!(failed, 1);
}

/// "Exit status: ... 1 ... no such claim, or a refused release or
/// resolution"; release: "a claim in doubt (use `resolve`)" is refused.
#[tokio::test]
async fn resolve_of_no_claim_and_release_of_a_claim_in_doubt_are_refused_with_exit_1() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_exit").await;
    let nothing = Identity::new("charge").part("none").address();
    let run = idem(&[
        "claims",
        "resolve",
        &nothing,
        "--release",
        "--yes",
        "--schema",
        &schema,
    ]);
    assert_eq!(run.code, 1, "{run:?}");
    let doubt = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("d"),
        "in_doubt",
        600.0,
        Some(60.0),
    )
    .await;
    let run = idem(&["claims", "release", &doubt, "--yes", "--schema", &schema]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_contains(&run.stderr, "resolve");
    assert_eq!(
        stored(&mut conn, &doubt).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );
    // A malformed address is a usage error or no claim, never a database error.
    for address in [
        "claim_XYZ",
        "'; DROP TABLE idem_records; --",
        "",
        "claim_\u{1b}[2J",
    ] {
        let run = idem(&[
            "claims",
            "resolve",
            address,
            "--release",
            "--yes",
            "--schema",
            &schema,
        ]);
        assert!(matches!(run.code, 1 | 2), "{run:?}");
        assert_no_raw_controls("stderr", &run.stderr);
    }
    assert_eq!(
        stored(&mut conn, &doubt).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );
}

/// `claims resolve` (CHANGELOG: operators resolve "exactly once, in the
/// state and at the fence they saw"; `Resolver::expected_state`: "a
/// release of a claim whose outcome became unknown lets a retry run it
/// again"): a pending claim the command found, then turned in doubt at
/// the same fence before its resolution lands (a retry finding its lease
/// run out under `on_expiry = "in_doubt"`), is not released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_never_releases_a_claim_that_turned_in_doubt_after_it_was_read() {
    let mut conn = connect().await;
    let schema = schema(&mut conn, "rt_turned").await;
    let stale = insert(
        &mut conn,
        "acme",
        None,
        &Identity::new("charge").part("turned"),
        "pending",
        600.0,
        None,
    )
    .await;
    // Hold the row's lock: the command reads the claim (no lock), then
    // waits for it at its resolution.
    let mut locker = connect().await;
    run_sql(
        &mut locker,
        &format!("SET search_path = {}", ident(&schema)),
    )
    .await;
    run_sql(&mut locker, "BEGIN").await;
    sqlx::query("SELECT 1 FROM idem_records WHERE address = $1 FOR UPDATE")
        .bind(&stale)
        .execute(&mut locker)
        .await
        .expect("lock the claim");
    let command = {
        let (stale, schema) = (stale.clone(), schema.clone());
        tokio::task::spawn_blocking(move || {
            idem(&[
                "claims",
                "resolve",
                &stale,
                "--release",
                "--yes",
                "--schema",
                &schema,
            ])
        })
    };
    // Long enough for the command to have read the claim pending and to be
    // waiting for the lock.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    sqlx::query(
        "UPDATE idem_records SET state = 'in_doubt', in_doubt_since = now(), \
         lease_expires_at = NULL, state_reason = 'lease_expired' WHERE address = $1",
    )
    .bind(&stale)
    .execute(&mut locker)
    .await
    .expect("turn it in doubt");
    run_sql(&mut locker, "COMMIT").await;
    let run = command.await.expect("the command ran");
    assert_eq!(
        stored(&mut conn, &stale).await.map(|s| s.0).as_deref(),
        Some("in_doubt"),
        "the claim read pending was released in doubt: {run:?}"
    );
}
