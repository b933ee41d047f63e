//! `idem audit` against the fixture schema (tests/fixtures/audit.sql) on a
//! real PostgreSQL: every case judged by name, one finding's text in full,
//! both fixes applied and proven to close the holes, and the exit statuses.

mod common;

use std::collections::BTreeSet;

use common::{assert_contains, idem, idem_with};
use idem::testing::{database_url, unique_name};
use idem_test_support::connections::connect;
use idem_test_support::schemas::{create_schemas, drop_schemas, ident, run_sql};
use serde_json::Value;
use sqlx::PgConnection;

const FIXTURE: &str = include_str!("fixtures/audit.sql");
/// The case that needs PostgreSQL 15+, loaded only there.
const FIXTURE_15: &str = include_str!("fixtures/audit_nulls_not_distinct.sql");

/// Every case that must be reported.
const HOLES: &[&str] = &[
    "hole_single_nullable",
    "hole_partial_or",
    "hole_partial_unrelated",
    "hole_expression_over_nullable",
    "hole_strict_function_may_return_null",
    "hole_unique_constraint",
    "hole_composite_one_nullable",
    "hole_composite_all_nullable",
    "hole_deferrable_constraint",
    "hole_ordered_collated",
    "Hole Quoted \"Names\"",
    "hole_keyword_column",
    "hole_partitioned",
    "hole_referenced_by_foreign_key",
    "hole_materialized_view",
    "hole_four_nullable_keys",
    "hole_second_schema",
    "hole_check_lets_null_pass",
];

/// Every unique index or constraint that must not be reported, idem's own
/// included.
const SAFE: &[&str] = &[
    "users_pkey",
    "refs_pkey",
    "codes_pkey",
    "safe_not_null",
    "safe_partial_is_not_null",
    "safe_partial_and",
    "safe_partial_strict_comparison",
    "safe_partial_in_list",
    "safe_partial_or_every_branch",
    "safe_nulls_not_distinct",
    "safe_expression_over_not_null",
    "safe_coalesce_with_constant",
    "safe_expression_excluded_by_predicate",
    "safe_unique_constraint_not_null",
    "safe_include_nullable",
    "safe_second_schema",
    "safe_check_not_null",
    "tokens_pkey",
    "idem_records_unique_without_namespace",
    "idem_records_unique_within_namespace",
    "idem_schema_version_pkey",
];

/// The fixture, loaded into two new schemas (the second one's name has
/// capitals and spaces), with idem's own schema added to the first.
struct Fixture {
    conn: PgConnection,
    main: String,
    other: String,
    /// The server knows NULLS NOT DISTINCT (PostgreSQL 15+).
    nulls_not_distinct: bool,
}

impl Fixture {
    async fn load() -> Fixture {
        let mut conn = connect().await;
        let main = unique_name("idem_audit");
        let other = format!("Audit Other {}", unique_name("x"));
        create_schemas(&mut conn, &[&main, &other]).await;
        let sql = FIXTURE
            .replace(":\"main\"", &ident(&main))
            .replace(":\"other\"", &ident(&other));
        run_sql(&mut conn, &sql).await;
        let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let nulls_not_distinct = version >= 150_000;
        if nulls_not_distinct {
            run_sql(&mut conn, &FIXTURE_15.replace(":\"main\"", &ident(&main))).await;
        }
        run_sql(&mut conn, "RESET search_path").await;
        idem(&["migrate", "--schema", &main]).expect_code(0);
        Fixture {
            conn,
            main,
            other,
            nulls_not_distinct,
        }
    }

    /// How many unique indexes and constraints the fixture has.
    fn checked(&self) -> usize {
        if self.nulls_not_distinct { 34 } else { 33 }
    }

    fn audit(&self, extra: &[&str]) -> common::Run {
        let mut args = vec!["audit", "--schema", &self.main, "--schema", &self.other];
        args.extend_from_slice(extra);
        idem(&args)
    }

    async fn remove(mut self) {
        drop_schemas(&mut self.conn, &[&self.main, &self.other]).await;
    }
}

fn names(findings: &Value) -> BTreeSet<String> {
    findings
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {findings}"))
        .iter()
        .map(|f| f["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn finding<'a>(findings: &'a Value, name: &str) -> &'a Value {
    findings
        .as_array()
        .and_then(|all| all.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no finding named {name}"))
}

fn nullable(finding: &Value) -> Vec<&str> {
    finding["nullable_columns"]
        .as_array()
        .map(|cols| cols.iter().filter_map(|c| c["column"].as_str()).collect())
        .unwrap_or_default()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn every_fixture_case_is_judged_as_expected() {
    let fixture = Fixture::load().await;
    let (main, other) = (fixture.main.as_str(), fixture.other.as_str());
    let findings = fixture.audit(&["--format", "json"]).expect_code(1).json();

    let expected: BTreeSet<String> = HOLES.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        names(&findings),
        expected,
        "findings differ from the fixture's holes"
    );
    for safe in SAFE {
        assert!(!names(&findings).contains(*safe), "{safe} was reported");
    }
    assert_eq!(
        findings.as_array().map(Vec::len),
        Some(HOLES.len()),
        "a case reported twice"
    );

    let f = finding(&findings, "hole_single_nullable");
    assert_eq!(
        (f["schema"].as_str(), f["table"].as_str()),
        (Some(main), Some("users"))
    );
    assert_eq!(f["kind"], "index");
    assert_eq!(strings(&f["key_columns"]), ["email"]);
    assert_eq!(nullable(f), ["email"]);
    assert_eq!(
        strings(&f["nullable_columns"][0]["why"]),
        ["email allows NULL"]
    );
    assert_eq!(f["predicate"], Value::Null);

    let f = finding(&findings, "hole_partial_or");
    assert_eq!(f["predicate"], "handle IS NOT NULL OR archived");
    assert_eq!(nullable(f), ["handle"]);

    let f = finding(&findings, "hole_partial_unrelated");
    assert_eq!(f["predicate"], "deleted_at IS NULL");
    assert_eq!(nullable(f), ["email"]);

    let f = finding(&findings, "hole_expression_over_nullable");
    assert_eq!(nullable(f), ["lower(email)"]);
    assert_eq!(
        strings(&f["nullable_columns"][0]["why"]),
        ["email allows NULL"]
    );

    let f = finding(&findings, "hole_strict_function_may_return_null");
    assert_eq!(nullable(f), ["(profile ->> 'email'::text)"]);
    assert_eq!(
        strings(&f["nullable_columns"][0]["why"]),
        ["jsonb_object_field_text(jsonb, text) may return NULL (not known never to)"]
    );

    let f = finding(&findings, "hole_unique_constraint");
    assert_eq!(f["kind"], "constraint");
    assert_eq!(strings(&f["key_columns"]), ["account_id", "external_ref"]);
    assert_eq!(nullable(f), ["external_ref"]);
    assert_eq!(f["definition"], "UNIQUE (account_id, external_ref)");
    assert_eq!(
        strings(&f["fix"]["nulls_not_distinct"]),
        [format!(
            "ALTER TABLE {main}.refs DROP CONSTRAINT hole_unique_constraint, ADD CONSTRAINT \
             hole_unique_constraint UNIQUE NULLS NOT DISTINCT (account_id, external_ref);"
        )]
    );

    let f = finding(&findings, "hole_composite_one_nullable");
    assert_eq!(
        strings(&f["key_columns"]),
        ["account_id", "kind", "external_ref"]
    );
    assert_eq!(nullable(f), ["external_ref"]);

    let f = finding(&findings, "hole_composite_all_nullable");
    assert_eq!(nullable(f), ["a", "b"]);
    assert_eq!(strings(&f["fix"]["partial_indexes"]).len(), 4 + 1);

    let f = finding(&findings, "hole_deferrable_constraint");
    assert_eq!(f["kind"], "constraint");
    assert!(
        strings(&f["fix"]["nulls_not_distinct"])[0]
            .ends_with("(code) DEFERRABLE INITIALLY DEFERRED;")
    );
    assert_eq!(f["notes"].as_array().map(Vec::len), Some(2));

    let f = finding(&findings, "hole_ordered_collated");
    assert_eq!(nullable(f), ["code"]);
    assert!(
        strings(&f["fix"]["nulls_not_distinct"])[0].contains(
            "USING btree (code COLLATE pg_catalog.\"POSIX\" pg_catalog.text_pattern_ops DESC, id) \
             NULLS NOT DISTINCT;"
        ),
        "{f}"
    );

    let f = finding(&findings, "Hole Quoted \"Names\"");
    assert_eq!(f["table"], "Order Items");
    assert_eq!(nullable(f), ["\"Client \"\"Ref\"\"\""]);
    assert_eq!(
        strings(&f["fix"]["nulls_not_distinct"]),
        [
            format!(
                "CREATE UNIQUE INDEX CONCURRENTLY \"Hole Quoted \"\"Names\"\"_nnd\" ON \
                 {main}.\"Order Items\" USING btree (\"Order Id\", \"Client \"\"Ref\"\"\") \
                 NULLS NOT DISTINCT;"
            ),
            format!("DROP INDEX CONCURRENTLY {main}.\"Hole Quoted \"\"Names\"\"\";"),
            format!(
                "ALTER INDEX {main}.\"Hole Quoted \"\"Names\"\"_nnd\" RENAME TO \
                 \"Hole Quoted \"\"Names\"\"\";"
            ),
        ]
    );

    let f = finding(&findings, "hole_keyword_column");
    assert_eq!(nullable(f), ["\"select\""]);

    let f = finding(&findings, "hole_partitioned");
    assert_eq!(f["table"], "events");
    assert!(
        strings(&f["fix"]["nulls_not_distinct"])[0]
            .starts_with("CREATE UNIQUE INDEX hole_partitioned_nnd ON"),
        "no CONCURRENTLY on a partitioned table: {f}"
    );
    let on_events = findings.as_array().map_or(0, |all| {
        all.iter()
            .filter(|f| f["table"].as_str().is_some_and(|t| t.starts_with("events")))
            .count()
    });
    assert_eq!(
        on_events, 1,
        "the partitions' indexes are not reported again"
    );

    let f = finding(&findings, "hole_referenced_by_foreign_key");
    assert_eq!(strings(&f["fix"]["partial_indexes"]).len(), 0);
    assert!(
        f["fix"]["partial_indexes_omitted"]
            .as_str()
            .is_some_and(|w| w.contains("foreign key"))
    );

    let f = finding(&findings, "hole_materialized_view");
    assert_eq!(f["table"], "user_emails");

    let f = finding(&findings, "hole_four_nullable_keys");
    assert_eq!(nullable(f), ["a", "b", "c", "d"]);
    assert!(
        f["fix"]["partial_indexes_omitted"]
            .as_str()
            .is_some_and(|w| w.contains("16 partial indexes"))
    );

    let f = finding(&findings, "hole_second_schema");
    assert_eq!(f["schema"].as_str(), Some(other));
    assert!(strings(&f["fix"]["partial_indexes"])[1].contains(&format!(
        "ON {}.invoices USING btree (series) WHERE number IS NULL;",
        ident(other)
    )));

    fixture.remove().await;
}

#[tokio::test]
async fn the_text_report_shows_each_finding_with_its_fixes() {
    let fixture = Fixture::load().await;
    let run = fixture.audit(&[]).expect_code(1);
    let main = &fixture.main;
    let header = format!("{main}.refs: unique index hole_composite_one_nullable\n");
    let start = run
        .stdout
        .find(&header)
        .unwrap_or_else(|| panic!("no block for hole_composite_one_nullable:\n{}", run.stdout));
    let block = run.stdout[start..]
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .replace(main.as_str(), "app");
    // On servers before 15, the heading says the first fix is not for them.
    let unavailable = if fixture.nulls_not_distinct {
        String::new()
    } else {
        format!(
            " (not on this server, PostgreSQL {})",
            server_version(&run.stdout)
        )
    };
    assert_eq!(
        block,
        format!(
            "\
app.refs: unique index hole_composite_one_nullable
  definition:   CREATE UNIQUE INDEX hole_composite_one_nullable ON app.refs USING btree (account_id, kind, external_ref)
  nullable:     external_ref allows NULL
  duplicates:   Any number of rows where external_ref is NULL are accepted, even with the same (account_id, kind), because NULLs never equal each other.
  fix for PostgreSQL 15+, NULLS NOT DISTINCT{unavailable}:
    CREATE UNIQUE INDEX CONCURRENTLY hole_composite_one_nullable_nnd ON app.refs USING btree (account_id, kind, external_ref) NULLS NOT DISTINCT;
    DROP INDEX CONCURRENTLY app.hole_composite_one_nullable;
    ALTER INDEX app.hole_composite_one_nullable_nnd RENAME TO hole_composite_one_nullable;
  fix for any version, one partial unique index per NULL pattern:
    CREATE UNIQUE INDEX CONCURRENTLY hole_composite_one_nullable_n0 ON app.refs USING btree (account_id, kind, external_ref) WHERE external_ref IS NOT NULL;
    CREATE UNIQUE INDEX CONCURRENTLY hole_composite_one_nullable_n1 ON app.refs USING btree (account_id, kind) WHERE external_ref IS NULL;
    DROP INDEX CONCURRENTLY app.hole_composite_one_nullable;"
        )
    );
    assert_contains(
        &run.stdout,
        "  nullable:     lower(email), because email allows NULL\n",
    );
    assert_contains(
        &run.stdout,
        &format!(
            "\n18 of the {} unique indexes and constraints in schemas {main}, {} let duplicates \
             through NULL.\n",
            fixture.checked(),
            ident(&fixture.other)
        ),
    );
    assert_contains(&run.stdout, "Before you apply a fix:\n");
    assert_eq!(
        run.stdout
            .contains("NULLS NOT DISTINCT exists only from PostgreSQL 15 on"),
        !fixture.nulls_not_distinct,
        "the advice says when the server is too old for NULLS NOT DISTINCT:\n{}",
        run.stdout
    );
    fixture.remove().await;
}

/// Runs `statements` one at a time, outside any transaction, as the report
/// says to.
async fn apply(conn: &mut PgConnection, statements: &[&str]) {
    for statement in statements {
        run_sql(conn, statement).await;
    }
}

/// Inserts two "Order Items" rows that differ only by a NULL: accepted while
/// the hole is open.
async fn insert_null_twins(conn: &mut PgConnection, main: &str) -> Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO {}.\"Order Items\" (\"Order Id\", \"Client \"\"Ref\"\"\", \"select\") \
         VALUES (1, NULL, 'x'), (1, NULL, 'y')",
        ident(main)
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .map(|_| ())
}

#[tokio::test]
async fn the_split_fixes_close_every_hole_they_are_offered_for() {
    let mut fixture = Fixture::load().await;
    let main = fixture.main.clone();
    insert_null_twins(&mut fixture.conn, &main)
        .await
        .unwrap_or_else(|e| panic!("the hole should let both rows in: {e}"));
    run_sql(
        &mut fixture.conn,
        &format!("DELETE FROM {}.\"Order Items\"", ident(&main)),
    )
    .await;

    let findings = fixture.audit(&["--format", "json"]).expect_code(1).json();
    for f in findings.as_array().into_iter().flatten() {
        apply(&mut fixture.conn, &strings(&f["fix"]["partial_indexes"])).await;
    }

    let left = fixture.audit(&["--format", "json"]).expect_code(1).json();
    assert_eq!(
        names(&left),
        BTreeSet::from([
            "hole_four_nullable_keys".to_owned(),
            "hole_referenced_by_foreign_key".to_owned()
        ]),
        "only the findings without a split remain"
    );
    let refused = insert_null_twins(&mut fixture.conn, &main).await;
    assert!(
        refused.as_ref().is_err_and(
            |e| e.as_database_error().and_then(|d| d.code()).as_deref() == Some("23505")
        ),
        "the split must make the NULL twins collide: {refused:?}"
    );
    fixture.remove().await;
}

/// The version in the text report's "(not on this server, PostgreSQL x)".
fn server_version(report: &str) -> &str {
    let marker = "(not on this server, PostgreSQL ";
    let start = report
        .find(marker)
        .map(|i| i + marker.len())
        .unwrap_or_else(|| panic!("the report names no server version:\n{report}"));
    let end = report[start..]
        .find("):")
        .unwrap_or_else(|| panic!("unterminated version:\n{report}"));
    &report[start..start + end]
}

#[tokio::test]
async fn the_nulls_not_distinct_fixes_close_every_hole_and_keep_the_names() {
    let mut fixture = Fixture::load().await;
    let findings = fixture.audit(&["--format", "json"]).expect_code(1).json();
    for f in findings.as_array().into_iter().flatten() {
        assert_eq!(
            f["fix"]["nulls_not_distinct_supported"], fixture.nulls_not_distinct,
            "the JSON says whether this server can run the NULLS NOT DISTINCT fix"
        );
    }
    if !fixture.nulls_not_distinct {
        // Before PostgreSQL 15 the statements cannot run: the report says so
        // (checked above and in the text test); the split is checked below.
        fixture.remove().await;
        return;
    }
    for f in findings.as_array().into_iter().flatten() {
        // Its note says: drop the foreign keys first. The fix itself is
        // checked on every other case.
        if f["name"] != "hole_referenced_by_foreign_key" {
            apply(&mut fixture.conn, &strings(&f["fix"]["nulls_not_distinct"])).await;
        }
    }
    let left = fixture.audit(&["--format", "json"]).expect_code(1).json();
    assert_eq!(
        names(&left),
        BTreeSet::from(["hole_referenced_by_foreign_key".to_owned()])
    );

    let renamed: Vec<(String, bool)> = sqlx::query_as(
        "SELECT c.relname::text, i.indnullsnotdistinct FROM pg_index i \
         JOIN pg_class c ON c.oid = i.indexrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname IN ('hole_single_nullable', 'Hole Quoted \"Names\"') \
         ORDER BY 1",
    )
    .bind(&fixture.main)
    .fetch_all(&mut fixture.conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        renamed,
        [
            ("Hole Quoted \"Names\"".to_owned(), true),
            ("hole_single_nullable".to_owned(), true)
        ]
    );
    let main = fixture.main.clone();
    assert!(insert_null_twins(&mut fixture.conn, &main).await.is_err());
    fixture.remove().await;
}

#[tokio::test]
async fn a_clean_schema_exits_zero_and_errors_exit_two_saying_what_to_do() {
    let mut conn = connect().await;
    let clean = unique_name("idem_audit_clean");
    create_schemas(&mut conn, &[&clean]).await;
    idem(&["migrate", "--schema", &clean]).expect_code(0);

    let run = idem(&["audit", "--schema", &clean]).expect_code(0);
    assert_eq!(
        run.stdout,
        format!(
            "No NULL holes: none of the 2 unique indexes and constraints in schema {clean} lets \
             duplicates through NULL.\n"
        )
    );
    let run = idem(&["audit", "--schema", &clean, "--format", "json"]).expect_code(0);
    assert_eq!(run.json(), serde_json::json!([]));

    let run = idem(&["audit", "--schema", &clean, "--schema", "no such schema"]).expect_code(2);
    assert_contains(&run.stderr, "no schema named no such schema");
    assert!(run.stdout.is_empty());

    let run = idem_with(
        &[
            "audit",
            "--database-url",
            "postgres://app:hunter2@127.0.0.1:1/app",
        ],
        None,
    )
    .expect_code(2);
    assert_contains(
        &run.stderr,
        "cannot connect to PostgreSQL at postgres://app:***@127.0.0.1:1/app",
    );
    assert_contains(&run.stderr, "pg_isready");
    assert!(!run.stderr.contains("hunter2"));

    let run = idem_with(&["audit"], None).expect_code(2);
    assert_contains(
        &run.stderr,
        "no database to connect to: pass --database-url",
    );

    // DATABASE_URL is the default for --database-url.
    idem_with(&["audit", "--schema", &clean], Some(&database_url())).expect_code(0);

    drop_schemas(&mut conn, &[&clean]).await;
}
