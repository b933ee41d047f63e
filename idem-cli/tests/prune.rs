//! `idem prune` in batches against a real PostgreSQL, each test in a schema
//! of its own: what it deletes and what it never touches (pending, in
//! doubt, kept failures, usage events, successes settled after the cut-off)
//! on a plain, a hash-partitioned and (under Citus) a distributed table;
//! `--dry-run`; and stopping part-way, by Ctrl-C and by a lost connection,
//! with every finished batch deleted and a second run finishing the job.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Run, assert_contains, idem, idem_in, on_citus};
use idem::testing::{database_url, unique_name};
use idem_test_support::connections::connect;
use idem_test_support::fault_proxy::{Proxy, Statement};
use idem_test_support::schemas::{create_schemas, drop_schemas, ident, run_sql};
use sqlx::PgConnection;

/// The cut-off every test prunes with.
const CUT_OFF: &str = "2024-03-01";

/// Claims per (address, namespace) group: the planted table holds
/// `3 * GROUPS` claims, one per group in each of no namespace, `live` and
/// `test` (the same address in all three), and half of them prunable.
const GROUPS: i64 = 1_000;

/// What [`plant`] puts in the table: the prunable claims, and what must
/// survive every prune.
const PRUNABLE: i64 = 3 * GROUPS / 2;

/// Fills `schema`'s idem_records with `3 * GROUPS` claims over seven
/// accounts, in both lanes, in every state, plus usage events:
///
/// | n % 10 | state | settled |
/// |---|---|---|
/// | 0-4 | success | 2024-01-01 (prunable) |
/// | 5 | success | 2024-06-01, after the cut-off |
/// | 6 | pending | never |
/// | 7 | in_doubt | 2024-01-01 |
/// | 8 | failed (kept) | 2024-01-01 |
/// | 9 | success | exactly at the cut-off (kept: strictly before prunes) |
///
/// where n = the group + 0, 1 or 2 for no namespace, `live`, `test`.
async fn plant(conn: &mut PgConnection, schema: &str) {
    run_sql(
        conn,
        &format!(
            "INSERT INTO {schema}.idem_records \
                 (account, kind, address, namespace, state, identity, created_at, settled_at) \
             SELECT 'acct_' || (g % 7), 'claim', 'claim_' || lpad(to_hex(g), 24, '0'), ns.name, \
                    (ARRAY['success', 'success', 'success', 'success', 'success', 'success', \
                           'pending', 'in_doubt', 'failed', 'success'])[(g + ns.k) % 10 + 1], \
                    '\\x00'::bytea, timestamptz '2023-12-01', \
                    (ARRAY[timestamptz '2024-01-01', '2024-01-01', '2024-01-01', '2024-01-01', \
                           '2024-01-01', '2024-06-01', NULL, '2024-01-01', '2024-01-01', \
                           '2024-03-01T00:00:00Z'])[(g + ns.k) % 10 + 1] \
             FROM generate_series(1, {GROUPS}) AS g, \
                  (VALUES (NULL::text, 0), ('live', 1), ('test', 2)) AS ns(name, k); \
             INSERT INTO {schema}.idem_records \
                 (account, kind, address, namespace, state, identity, meter, quantity, \
                  occurred_at) \
             SELECT 'acct_' || (g % 7), 'meter_event', 'claim_' || lpad(to_hex(g), 24, '0'), \
                    NULL, 'recorded', '\\x00'::bytea, 'api_calls', 1, timestamptz '2024-01-01' \
             FROM generate_series(1, 100) AS g",
            schema = ident(schema),
        ),
    )
    .await;
}

/// Rows by kind and state (and whether prunable), to compare before and
/// after: `(kind, state, prunable, count)`.
async fn census(conn: &mut PgConnection, schema: &str) -> Vec<(String, String, bool, i64)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT kind, state, \
                (kind = 'claim' AND state = 'success' AND settled_at < '{CUT_OFF}T00:00:00Z') \
                    AS prunable, \
                count(*) \
         FROM {}.idem_records GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        ident(schema)
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("count the rows: {e}"))
}

/// The census with the prunable rows gone: what every complete prune must
/// leave.
fn without_prunable(census: &[(String, String, bool, i64)]) -> Vec<(String, String, bool, i64)> {
    census
        .iter()
        .filter(|(_, _, prunable, _)| !prunable)
        .cloned()
        .collect()
}

async fn prunable_left(conn: &mut PgConnection, schema: &str) -> i64 {
    census(conn, schema)
        .await
        .iter()
        .filter(|(_, _, prunable, _)| *prunable)
        .map(|(_, _, _, count)| count)
        .sum()
}

/// A fresh schema with idem's table set up by `migrate` (`migrate_args`)
/// and planted.
async fn planted(conn: &mut PgConnection, prefix: &str, migrate_args: &str) -> String {
    let schema = unique_name(prefix);
    create_schemas(conn, &[&schema]).await;
    idem_in(&schema, migrate_args).expect_code(0);
    plant(conn, &schema).await;
    schema
}

#[tokio::test]
async fn batches_delete_exactly_the_settled_successes_before_the_cut_off_on_every_layout() {
    let mut conn = connect().await;
    let layouts: &[&str] = if on_citus(&mut conn).await {
        &["migrate --distributed"]
    } else {
        &["migrate", "migrate --partitions 4"]
    };
    for &layout in layouts {
        let schema = planted(&mut conn, "idem_prune", layout).await;
        let before = census(&mut conn, &schema).await;
        assert_eq!(prunable_left(&mut conn, &schema).await, PRUNABLE);

        // --dry-run counts, per account, and deletes nothing.
        let counted = idem_in(
            &schema,
            &format!("prune --settled-before {CUT_OFF} --dry-run --format json"),
        )
        .expect_code(0)
        .json();
        assert_eq!(counted["would_delete"], PRUNABLE, "{layout}");
        let accounts = counted["accounts"].as_array().expect("accounts");
        assert_eq!(accounts.len(), 7, "{layout}: {counted}");
        let per_account: i64 = accounts
            .iter()
            .map(|a| a["claims"].as_i64().expect("claims"))
            .sum();
        assert_eq!(per_account, PRUNABLE, "{layout}");
        let text = idem_in(
            &schema,
            &format!("prune --settled-before {CUT_OFF} --dry-run --account acct_3"),
        )
        .expect_code(0);
        assert_contains(
            &text.stdout,
            "settled claims (settled before 2024-03-01T00:00:00Z, or past their window, in account acct_3); nothing \
             was deleted\nACCOUNT  CLAIMS\nacct_3 ",
        );
        assert_eq!(census(&mut conn, &schema).await, before, "{layout}");

        // One account first: only its claims go.
        let acct_3 = accounts
            .iter()
            .find(|a| a["account"] == "acct_3")
            .and_then(|a| a["claims"].as_u64())
            .expect("acct_3 has prunable claims");
        let pruned = idem_in(
            &schema,
            &format!(
                "prune --settled-before {CUT_OFF} --account acct_3 --yes --batch-size 10 \
                 --format json"
            ),
        )
        .expect_code(0)
        .json();
        assert_eq!(pruned["deleted"], acct_3, "{layout}");
        assert_eq!(
            prunable_left(&mut conn, &schema).await,
            PRUNABLE - i64::try_from(acct_3).expect("fits"),
            "{layout}"
        );

        // Then the rest, in batches of an odd size that splits the three
        // claims at one address across batches.
        let run = idem_in(
            &schema,
            &format!("prune --settled-before {CUT_OFF} --yes --batch-size 97 --format json"),
        )
        .expect_code(0);
        let pruned = run.json();
        assert_eq!(
            pruned["deleted"].as_u64(),
            Some(PRUNABLE as u64 - acct_3),
            "{layout}"
        );
        // About 97 claims a batch: by index entries (PostgreSQL 12, 13,
        // Citus) or by heap pages at the rows a page holds (14 and later).
        assert!(
            pruned["batches"].as_u64() >= Some(3 * GROUPS as u64 / 97 / 2),
            "{layout}: {pruned}"
        );
        assert_eq!(pruned["batch_size"], 97);
        // Not a terminal: one plain progress line at the end.
        assert_contains(&run.stderr, "idem: pruned ");
        assert_contains(&run.stderr, " rows/s");
        assert_eq!(
            census(&mut conn, &schema).await,
            without_prunable(&before),
            "{layout}: pending, in doubt, failed, usage events and later successes all survive"
        );

        // Nothing left: a second run deletes nothing.
        let again =
            idem_in(&schema, &format!("prune --settled-before {CUT_OFF} --yes")).expect_code(0);
        assert_contains(&again.stdout, "deleted 0 settled claims");
        drop_schemas(&mut conn, &[&schema]).await;
    }
}

#[tokio::test]
async fn bad_batch_sizes_are_refused_saying_what_fits() {
    for bad in ["0", "1000001", "ten"] {
        let run = idem(&["prune", "--settled-before", CUT_OFF, "--batch-size", bad]);
        let run = run.expect_code(2);
        assert_contains(&run.stderr, bad);
        assert_contains(&run.stderr, "e.g. 10000");
    }
    let run = idem(&["prune", "--settled-before", CUT_OFF, "--yes", "--dry-run"]).expect_code(2);
    assert_contains(&run.stderr, "cannot be used with");
}

/// Runs `idem ARGS` in the background with `DATABASE_URL` set to `url`.
fn spawn_idem(args: &[&str], url: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("DATABASE_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run idem: {e}"))
}

/// Waits for `child` (off the async runtime, which runs the fault proxy).
async fn finished(child: std::process::Child) -> Run {
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("the waiting thread")
        .unwrap_or_else(|e| panic!("wait for idem: {e}"));
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The number after `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> i64 {
    let (_, rest) = text
        .split_once(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"));
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_between_batches_and_the_same_command_finishes_the_job() {
    let mut conn = connect().await;
    let layout = if on_citus(&mut conn).await {
        "migrate --distributed"
    } else {
        "migrate"
    };
    let schema = planted(&mut conn, "idem_prune_sigint", layout).await;
    let before = census(&mut conn, &schema).await;

    // 3000 claims in batches of 50, 100 ms apart: six seconds, stopped at one.
    let args = [
        "prune",
        "--settled-before",
        CUT_OFF,
        "--yes",
        "--batch-size",
        "50",
        "--pause",
        "100ms",
        "--schema",
        &schema,
    ];
    let child = spawn_idem(&args, &database_url());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -INT");
    let run = finished(child).await.expect_code(130);
    assert_contains(&run.stderr, "interrupted: pruned ");
    assert_contains(
        &run.stderr,
        "every finished batch is deleted, none is half-done",
    );
    assert_contains(&run.stderr, "Run the same command again to prune the rest.");
    let said = number_after(&run.stderr, "interrupted: pruned ");
    let left = prunable_left(&mut conn, &schema).await;
    assert!(0 < said && said < PRUNABLE, "{said} of {PRUNABLE}");
    assert_eq!(
        left,
        PRUNABLE - said,
        "exactly what it said it deleted is gone"
    );

    // The same command, again, to the end.
    let again = idem(&args).expect_code(0);
    assert_eq!(number_after(&again.stdout, "deleted "), left);
    assert_eq!(census(&mut conn, &schema).await, without_prunable(&before));
    drop_schemas(&mut conn, &[&schema]).await;
}

/// `url` with its host and port replaced by the proxy's.
fn through(url: &str, proxy: &Proxy) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (credentials, host_and_after) = match rest.rsplit_once('@') {
        Some((credentials, after)) => (format!("{credentials}@"), after),
        None => (String::new(), rest),
    };
    let path = host_and_after
        .find(['/', '?'])
        .map_or("", |at| &host_and_after[at..]);
    format!("{scheme}://{credentials}127.0.0.1:{}{path}", proxy.port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_retried_and_a_lost_database_stops_saying_how_far_it_got() {
    let mut conn = connect().await;
    let layout = if on_citus(&mut conn).await {
        "migrate --distributed"
    } else {
        "migrate"
    };
    let schema = planted(&mut conn, "idem_prune_lost", layout).await;
    let before = census(&mut conn, &schema).await;
    let mut proxy = Proxy::start().await;
    let url = through(&database_url(), &proxy);
    let args = |schema: &str, retries: &str| -> Vec<String> {
        let line = format!(
            "prune --settled-before {CUT_OFF} --yes --batch-size 50 --pause 50ms \
             --retries {retries} --schema {schema}"
        );
        line.split_whitespace().map(str::to_owned).collect()
    };

    // The first batch's DELETE has its reply lost with the connection; an
    // outage of a second and a half follows later. Both are tried again,
    // and the prune ends complete. (A batch is a transaction, its claims'
    // steps deleted with them, so the DELETE's lost reply is before the
    // commit: the batch rolled back and runs again. A reply lost after a
    // commit, which the outage may cause, is never counted twice.)
    assert!(proxy.lose_next_reply(Statement::Release));
    let owned = args(&schema, "5");
    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
    let child = spawn_idem(&refs, &url);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.cut_for(Duration::from_millis(1_500)).await;
    let run = finished(child).await.expect_code(0);
    assert!(
        !proxy.take_lost_replies().is_empty(),
        "a reply was lost after its commit"
    );
    assert_contains(&run.stderr, "a batch failed");
    assert_contains(&run.stderr, "trying it again");
    let said = number_after(&run.stdout, "deleted ");
    assert!(
        said <= PRUNABLE,
        "no batch whose reply was lost is counted twice: {said}"
    );
    assert_eq!(census(&mut conn, &schema).await, without_prunable(&before));

    drop_schemas(&mut conn, &[&schema]).await;

    // Now the database stays away. One retry, then it stops, saying how far
    // it got; once it is back, the same command finishes.
    let schema = planted(&mut conn, "idem_prune_lost", layout).await;
    let before = census(&mut conn, &schema).await;
    let owned = args(&schema, "1");
    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
    let child = spawn_idem(&refs, &url);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.cut().await;
    let run = finished(child).await.expect_code(2);
    assert_contains(&run.stderr, "Stopped: pruned ");
    assert_contains(
        &run.stderr,
        "It was tried 1 more time(s). Once the database answers again, run the same command \
         again to continue.",
    );
    let said = number_after(&run.stderr, "Stopped: pruned ");
    let left = prunable_left(&mut conn, &schema).await;
    assert!(0 < said && said < PRUNABLE, "{said}");
    assert!(
        left <= PRUNABLE - said,
        "at least what it said is gone: {left} left"
    );
    proxy.resume().await;
    let again = finished(spawn_idem(&refs, &url)).await.expect_code(0);
    assert_eq!(number_after(&again.stdout, "deleted "), left);
    assert_eq!(census(&mut conn, &schema).await, without_prunable(&before));
    drop_schemas(&mut conn, &[&schema]).await;
}

#[tokio::test]
async fn a_refused_batch_is_not_retried_and_stops_saying_to_fix_it() {
    let mut conn = connect().await;
    // A plain table on any engine: what is tested is what the command does
    // with an error of the request, not the layout.
    let schema = planted(&mut conn, "idem_prune_refused", "migrate").await;
    let quoted = ident(&schema);
    run_sql(
        &mut conn,
        &format!(
            "CREATE FUNCTION {quoted}.refuse_deletes() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'deletes are refused here'; END $$; \
             CREATE TRIGGER refuse_deletes BEFORE DELETE ON {quoted}.idem_records \
             FOR EACH ROW EXECUTE FUNCTION {quoted}.refuse_deletes()"
        ),
    )
    .await;
    let run = idem_in(
        &schema,
        &format!("prune --settled-before {CUT_OFF} --yes --retries 5"),
    )
    .expect_code(2);
    assert_contains(&run.stderr, "deletes are refused here");
    assert_contains(&run.stderr, "Stopped: pruned 0 of ~1500 settled claims");
    assert_contains(
        &run.stderr,
        "Fix what the error says, then run the same command again to continue.",
    );
    assert!(
        !run.stderr.contains("trying it again"),
        "an error of the request is not retried:\n{}",
        run.stderr
    );
    assert_eq!(prunable_left(&mut conn, &schema).await, PRUNABLE);
    drop_schemas(&mut conn, &[&schema]).await;
}
