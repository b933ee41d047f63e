//! `idem audit` against the fixture schema (tests/fixtures/audit.sql) on a
//! real PostgreSQL: every case judged by name and severity, one finding's
//! text in full, both fixes (and the non-blocking form) applied and proven to
//! close the holes, the count of rows a fix would reject, the upserts a split
//! breaks, the covered and inert cases proven with real rows, and the exit
//! statuses.

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

/// Every case that must be reported as a hole.
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
    "hole_check_lets_null_pass",
    "hole_near_miss_post",
    "hole_near_miss_comment",
    "hole_cover_predicate_too_narrow",
];

/// Every case that must be reported as inert: it rejects no row at all.
const INERT: &[&str] = &["inert_exactly_one_null", "inert_num_nonnulls"];

/// Every case that must be reported as covered: other unique indexes reject
/// the duplicates it lets through. Informational: no fix, exit status 0.
const COVERED: &[&str] = &[
    "covered_by_primary_key",
    "covered_post",
    "covered_comment",
    "covered_second_schema",
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
    "shipments_pkey",
    "tags_pkey",
    "safe_unscoped_tag",
    "payouts_pkey",
    "attachments_pkey",
    "mentions_pkey",
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
        if self.nulls_not_distinct { 43 } else { 42 }
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

/// `names` and every covered case.
fn with_covered(names: &[&str]) -> BTreeSet<String> {
    names
        .iter()
        .chain(COVERED)
        .map(|s| (*s).to_owned())
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

    let expected: BTreeSet<String> = HOLES
        .iter()
        .chain(INERT)
        .chain(COVERED)
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(
        names(&findings),
        expected,
        "findings differ from the fixture's cases"
    );
    for safe in SAFE {
        assert!(!names(&findings).contains(*safe), "{safe} was reported");
    }
    assert_eq!(
        findings.as_array().map(Vec::len),
        Some(expected.len()),
        "a case reported twice"
    );
    for (names, severity) in [(HOLES, "hole"), (INERT, "inert"), (COVERED, "covered")] {
        for name in names {
            assert_eq!(finding(&findings, name)["severity"], severity, "{name}");
        }
    }
    for name in COVERED {
        let f = finding(&findings, name);
        assert_eq!(strings(&f["fix"]["nulls_not_distinct"]).len(), 0, "{f}");
        assert_eq!(strings(&f["fix"]["partial_indexes"]).len(), 0, "{f}");
        assert_eq!(f["changes"], "", "{f}");
        assert_eq!(f["conflicts_sql"], "", "{f}");
    }

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
            "USING btree (code COLLATE pg_catalog.\"POSIX\" pg_catalog.text_pattern_ops DESC, \
             label) NULLS NOT DISTINCT;"
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

    let f = finding(&findings, "covered_second_schema");
    assert_eq!(f["schema"].as_str(), Some(other));
    assert_eq!(
        f["severity_reason"],
        "Every duplicate it lets through is rejected by safe_second_schema: no two rows equal \
         in (series, number), NULLs included, both get in."
    );
    assert!(
        finding(&findings, "covered_by_primary_key")["severity_reason"]
            .as_str()
            .is_some_and(|r| r.contains("rejected by users_pkey")),
        "the primary key covers it"
    );
    assert_eq!(
        finding(&findings, "covered_post")["severity_reason"],
        "Together with covered_comment, no two rows equal in (owner_id, post_id, comment_id), \
         NULLs included, both get in: where a key of this index is NULL, the table's CHECK \
         constraints keep comment_id present, and covered_comment rejects the duplicates. Rows \
         equal in this index's keys alone but not in comment_id still get in."
    );

    let f = finding(&findings, "inert_exactly_one_null");
    assert_eq!(
        f["severity_reason"],
        "No row can have warehouse_id and store_id both present (the table's CHECK constraints \
         or the index predicate rule it out), so this index never compares two rows: it rejects \
         no row at all."
    );
    assert_eq!(
        strings(&f["fix"]["partial_indexes"]),
        [
            format!(
                "CREATE UNIQUE INDEX CONCURRENTLY inert_exactly_one_null_n10 ON {main}.shipments \
                 USING btree (store_id) WHERE warehouse_id IS NULL AND store_id IS NOT NULL;"
            ),
            format!(
                "CREATE UNIQUE INDEX CONCURRENTLY inert_exactly_one_null_n01 ON {main}.shipments \
                 USING btree (warehouse_id) WHERE warehouse_id IS NOT NULL AND store_id IS NULL;"
            ),
            format!("DROP INDEX CONCURRENTLY {main}.inert_exactly_one_null;"),
        ],
        "no index for both present or both NULL: no row can match them"
    );

    // Every count query runs (quoted names, keywords, collations, expression
    // keys, a partitioned table, a materialized view) and finds nothing in
    // the empty fixture.
    let mut fixture = fixture;
    for f in findings.as_array().into_iter().flatten() {
        if f["severity"] != "covered" {
            assert_eq!(conflicting_groups(&mut fixture.conn, f).await, 0, "{f}");
        }
    }
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
  severity:     hole
  changes:      Either fix rejects rows the table accepts today: rows equal in (account_id, kind, external_ref) with NULL in the same keys. Building the new index fails while such rows exist; count their groups first (0 means the fix applies):
    SELECT count(*) AS conflicting_groups FROM (SELECT 1 FROM app.refs GROUP BY account_id, kind, external_ref HAVING count(*) > 1) AS conflicts;
  fix for PostgreSQL 15+, NULLS NOT DISTINCT{unavailable}:
    -- lock: SHARE UPDATE EXCLUSIVE: reads and writes go on while the index builds (CONCURRENTLY cannot run inside a transaction block: run each statement on its own); DROP INDEX CONCURRENTLY and the RENAME take the same lock
    CREATE UNIQUE INDEX CONCURRENTLY hole_composite_one_nullable_nnd ON app.refs USING btree (account_id, kind, external_ref) NULLS NOT DISTINCT;
    DROP INDEX CONCURRENTLY app.hole_composite_one_nullable;
    ALTER INDEX app.hole_composite_one_nullable_nnd RENAME TO hole_composite_one_nullable;
  fix for any version, one partial unique index per NULL pattern:
    -- lock: SHARE UPDATE EXCLUSIVE: reads and writes go on while the index builds (CONCURRENTLY cannot run inside a transaction block: run each statement on its own); DROP INDEX CONCURRENTLY takes the same lock
    CREATE UNIQUE INDEX CONCURRENTLY hole_composite_one_nullable_n0 ON app.refs USING btree (account_id, kind, external_ref) WHERE external_ref IS NOT NULL;
    CREATE UNIQUE INDEX CONCURRENTLY hole_composite_one_nullable_n1 ON app.refs USING btree (account_id, kind) WHERE external_ref IS NULL;
    DROP INDEX CONCURRENTLY app.hole_composite_one_nullable;
  note: Upserts: after the split, INSERT ... ON CONFLICT (account_id, kind, external_ref) fail (\"there is no unique or exclusion constraint matching the ON CONFLICT specification\"): no index matches those keys without a predicate any more. Name the index for rows without NULL instead, ON CONFLICT (account_id, kind, external_ref) WHERE external_ref IS NOT NULL, or use the NULLS NOT DISTINCT fix, which keeps ON CONFLICT (account_id, kind, external_ref) working."
        )
    );
    assert_contains(
        &run.stdout,
        "  nullable:     lower(email), because email allows NULL\n",
    );
    assert_contains(
        &run.stdout,
        &format!(
            "\n22 of the {} unique indexes and constraints in schemas {main}, {} let duplicates \
             through NULL. 4 more let NULL rows through, but other unique indexes reject every \
             duplicate (covered: informational, they do not fail the audit).\n",
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
        with_covered(&["hole_four_nullable_keys", "hole_referenced_by_foreign_key"]),
        "only the findings without a split remain, and the covered ones, which have no fix"
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
        with_covered(&["hole_referenced_by_foreign_key"])
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

/// Runs `sql` on `conn`, returning what PostgreSQL said.
async fn try_sql(conn: &mut PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .map(|_| ())
}

/// The SQLSTATE of a failed statement.
fn sqlstate(result: &Result<(), sqlx::Error>) -> Option<String> {
    result
        .as_ref()
        .err()
        .and_then(|e| e.as_database_error())
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// Runs a finding's count query.
async fn conflicting_groups(conn: &mut PgConnection, finding: &Value) -> i64 {
    let sql = finding["conflicts_sql"]
        .as_str()
        .unwrap_or_else(|| panic!("no conflicts_sql: {finding}"));
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.trim_end_matches(';').to_owned()))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

#[tokio::test]
async fn an_inert_index_rejects_nothing_and_the_count_query_finds_what_its_fix_would_reject() {
    let mut fixture = Fixture::load().await;
    let shipments = format!("{}.shipments", ident(&fixture.main));
    // Inert: the index lets equal rows in, as many as one likes.
    run_sql(
        &mut fixture.conn,
        &format!(
            "INSERT INTO {shipments} VALUES (1, NULL, 7), (2, NULL, 7), (3, NULL, 7), \
             (4, 5, NULL), (5, 6, NULL)"
        ),
    )
    .await;
    let findings = fixture.audit(&["--format", "json"]).expect_code(1).json();
    let f = finding(&findings, "inert_exactly_one_null");
    assert!(
        f["changes"]
            .as_str()
            .is_some_and(|c| c.starts_with("Either fix rejects rows the table accepts today")),
        "{f}"
    );
    assert_eq!(
        f["conflicts_sql"],
        format!(
            "SELECT count(*) AS conflicting_groups FROM (SELECT 1 FROM {}.shipments GROUP BY \
             warehouse_id, store_id HAVING count(*) > 1) AS conflicts;",
            fixture.main
        )
    );
    assert_eq!(
        conflicting_groups(&mut fixture.conn, f).await,
        1,
        "three rows (NULL, 7) are one group"
    );

    // The fix fails on those rows, as the count said it would.
    let split = strings(&f["fix"]["partial_indexes"]);
    let failed = try_sql(&mut fixture.conn, split[0]).await;
    assert_eq!(sqlstate(&failed).as_deref(), Some("23505"), "{failed:?}");
    // A failed CREATE INDEX CONCURRENTLY leaves an invalid index behind.
    run_sql(
        &mut fixture.conn,
        &format!(
            "DROP INDEX {}.inert_exactly_one_null_n10",
            ident(&fixture.main)
        ),
    )
    .await;
    run_sql(
        &mut fixture.conn,
        &format!("DELETE FROM {shipments} WHERE id IN (2, 3)"),
    )
    .await;
    assert_eq!(conflicting_groups(&mut fixture.conn, f).await, 0);
    apply(&mut fixture.conn, &split).await;
    let refused = try_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {shipments} VALUES (9, NULL, 7)"),
    )
    .await;
    assert_eq!(sqlstate(&refused).as_deref(), Some("23505"), "{refused:?}");
    fixture.remove().await;
}

#[tokio::test]
async fn covered_indexes_really_reject_their_duplicates_and_the_near_miss_does_not() {
    let mut fixture = Fixture::load().await;
    let main = ident(&fixture.main);
    // covered_post lets (owner 1, no post) through twice, but the CHECK
    // makes comment_id present there and covered_comment rejects the twin.
    run_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {main}.attachments VALUES (1, 1, NULL, 5)"),
    )
    .await;
    let twin = try_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {main}.attachments VALUES (2, 1, NULL, 5)"),
    )
    .await;
    assert_eq!(sqlstate(&twin).as_deref(), Some("23505"), "{twin:?}");
    // The near miss: both targets NULL, and both constraints let the twin in.
    run_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {main}.mentions VALUES (1, 1, NULL, NULL), (2, 1, NULL, NULL)"),
    )
    .await;
    // The other near miss: unscoped twins with ids below 1 get in.
    run_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {main}.tags VALUES (-1, 'x', NULL), (-2, 'x', NULL)"),
    )
    .await;
    // covered_second_schema: the partial index rejects twins without a number.
    let other = ident(&fixture.other);
    run_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {other}.invoices VALUES (1, 'A', NULL)"),
    )
    .await;
    let twin = try_sql(
        &mut fixture.conn,
        &format!("INSERT INTO {other}.invoices VALUES (2, 'A', NULL)"),
    )
    .await;
    assert_eq!(sqlstate(&twin).as_deref(), Some("23505"), "{twin:?}");

    // Covered findings alone do not fail the audit: a schema with only
    // attachments exits 0 and says why.
    let alone = unique_name("idem_audit_covered");
    create_schemas(&mut fixture.conn, &[&alone]).await;
    run_sql(
        &mut fixture.conn,
        &format!(
            "CREATE TABLE {}.attachments (LIKE {main}.attachments INCLUDING ALL)",
            ident(&alone)
        ),
    )
    .await;
    let run = idem(&["audit", "--schema", &alone]).expect_code(0);
    assert_contains(
        &run.stdout,
        &format!(
            "No NULL holes: none of the 2 unique indexes and constraints in schema {alone} lets \
             duplicates through NULL. 2 of them let NULL rows through, but other unique indexes \
             reject every duplicate (covered: informational, they do not fail the audit).\n"
        ),
    );
    assert_contains(
        &run.stdout,
        "  severity:     covered (informational): Together with",
    );
    assert_contains(&run.stdout, "  no fix needed\n");
    assert!(
        !run.stdout.contains("Before you apply a fix"),
        "{}",
        run.stdout
    );
    drop_schemas(&mut fixture.conn, &[&alone]).await;
    fixture.remove().await;
}

/// `INSERT ... ON CONFLICT (account_id, kind, external_ref) DO NOTHING` into
/// refs.
fn upsert(main: &str, target: &str) -> String {
    format!(
        "INSERT INTO {}.refs (account_id, kind, code, external_ref) VALUES (1, 'k', 'c', 'x') \
         ON CONFLICT {target} DO NOTHING",
        ident(main)
    )
}

#[tokio::test]
async fn the_split_breaks_upserts_naming_the_keys_as_warned_and_nulls_not_distinct_does_not() {
    let mut fixture = Fixture::load().await;
    let main = fixture.main.clone();
    let findings = fixture.audit(&["--format", "json"]).expect_code(1).json();
    let f = finding(&findings, "hole_composite_one_nullable");
    assert_eq!(f["kind"], "index");
    let warning = strings(&f["notes"])
        .into_iter()
        .find(|n| n.starts_with("Upserts:"))
        .unwrap_or_else(|| panic!("no upsert warning for a plain index: {f}"));
    assert_contains(
        warning,
        "INSERT ... ON CONFLICT (account_id, kind, external_ref) fail",
    );
    let keys = "(account_id, kind, external_ref)";
    let for_rows_without_null = "(account_id, kind, external_ref) WHERE external_ref IS NOT NULL";
    assert_contains(warning, &format!("ON CONFLICT {for_rows_without_null}"));
    run_sql(&mut fixture.conn, &upsert(&main, keys)).await;

    if fixture.nulls_not_distinct {
        apply(&mut fixture.conn, &strings(&f["fix"]["nulls_not_distinct"])).await;
        run_sql(&mut fixture.conn, &upsert(&main, keys)).await;
    }
    apply(&mut fixture.conn, &strings(&f["fix"]["partial_indexes"])).await;
    let broken = try_sql(&mut fixture.conn, &upsert(&main, keys)).await;
    assert_eq!(
        sqlstate(&broken).as_deref(),
        Some("42P10"),
        "no unique or exclusion constraint matching: {broken:?}"
    );
    run_sql(&mut fixture.conn, &upsert(&main, for_rows_without_null)).await;
    fixture.remove().await;
}

#[tokio::test]
async fn the_constraint_fix_without_blocking_keeps_the_constraint_and_closes_the_hole() {
    let mut fixture = Fixture::load().await;
    let main = fixture.main.clone();
    let findings = fixture.audit(&["--format", "json"]).expect_code(1).json();
    let f = finding(&findings, "hole_unique_constraint");
    let table = format!("{main}.refs");
    assert_eq!(
        strings(&f["fix"]["nulls_not_distinct_without_blocking"]),
        [
            format!(
                "CREATE UNIQUE INDEX CONCURRENTLY hole_unique_constraint_nnd ON {table} USING \
                 btree (account_id, external_ref) NULLS NOT DISTINCT;"
            ),
            format!(
                "ALTER TABLE {table} DROP CONSTRAINT hole_unique_constraint, ADD CONSTRAINT \
                 hole_unique_constraint UNIQUE USING INDEX hole_unique_constraint_nnd;"
            ),
        ]
    );
    let locks = &f["fix"]["locks"];
    assert!(
        locks["nulls_not_distinct"]
            .as_str()
            .is_some_and(|l| l.starts_with("ACCESS EXCLUSIVE for the whole ALTER TABLE")),
        "{locks}"
    );
    assert!(
        locks["nulls_not_distinct_without_blocking"]
            .as_str()
            .is_some_and(|l| l.starts_with("SHARE UPDATE EXCLUSIVE")
                && l.contains("cannot run inside a transaction block")),
        "{locks}"
    );
    // An index's fix is built CONCURRENTLY already; a partitioned table's
    // cannot be, and says what it blocks.
    let index = finding(&findings, "hole_single_nullable");
    assert_eq!(
        strings(&index["fix"]["nulls_not_distinct_without_blocking"]).len(),
        0
    );
    assert!(
        finding(&findings, "hole_partitioned")["fix"]["locks"]["partial_indexes"]
            .as_str()
            .is_some_and(|l| l.contains("writes wait")),
    );
    let text = fixture.audit(&[]).expect_code(1).stdout;
    assert_contains(
        &text,
        "  the same without blocking reads and writes (PostgreSQL 15+):\n    -- lock: SHARE UPDATE \
         EXCLUSIVE",
    );

    if !fixture.nulls_not_distinct {
        // Before 15 the statements cannot run; the report says so (see the
        // text test). The split is applied in its own test.
        fixture.remove().await;
        return;
    }
    let deferrable = finding(&findings, "hole_deferrable_constraint");
    for finding in [f, deferrable] {
        apply(
            &mut fixture.conn,
            &strings(&finding["fix"]["nulls_not_distinct_without_blocking"]),
        )
        .await;
    }
    let constraints: Vec<(String, String, bool, bool, bool)> = sqlx::query_as(
        "SELECT con.conname::text, ic.relname::text, i.indnullsnotdistinct, con.condeferrable, \
                con.condeferred \
         FROM pg_constraint con \
         JOIN pg_index i ON i.indexrelid = con.conindid \
         JOIN pg_class ic ON ic.oid = con.conindid \
         JOIN pg_namespace n ON n.oid = con.connamespace \
         WHERE n.nspname = $1 AND con.contype = 'u' \
           AND con.conname IN ('hole_unique_constraint', 'hole_deferrable_constraint') \
         ORDER BY 1",
    )
    .bind(&main)
    .fetch_all(&mut fixture.conn)
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        constraints,
        [
            (
                "hole_deferrable_constraint".to_owned(),
                "hole_deferrable_constraint".to_owned(),
                true,
                true,
                true
            ),
            (
                "hole_unique_constraint".to_owned(),
                "hole_unique_constraint".to_owned(),
                true,
                false,
                false
            ),
        ],
        "the constraints are back, on NULLS NOT DISTINCT indexes of their own name"
    );
    let twins = try_sql(
        &mut fixture.conn,
        &format!(
            "INSERT INTO {}.refs (account_id, kind, code) VALUES (1, 'a', 'a'), (1, 'b', 'b')",
            ident(&main)
        ),
    )
    .await;
    assert_eq!(sqlstate(&twins).as_deref(), Some("23505"), "{twins:?}");
    let left = fixture.audit(&["--format", "json"]).expect_code(1).json();
    assert!(!names(&left).contains("hole_unique_constraint"));
    assert!(!names(&left).contains("hole_deferrable_constraint"));
    fixture.remove().await;
}
