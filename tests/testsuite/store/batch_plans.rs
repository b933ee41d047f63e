//! Every batch statement probes the partial unique index once per address,
//! even when the statistics lie: taken while the table held only other
//! accounts' usage events (no claim at all), or never taken (autovacuum has
//! not come by), then 60,000 claims arrive in one account (a new tenant, a
//! backfill, a first deployment). The plan is
//! read with `EXPLAIN`, as a custom plan (the parameters known) and as a
//! generic one (what a statement prepared by sqlx becomes after a few runs).
//!
//! A control proves the trap is set: the same settle written the obvious
//! way, with `account = $1` beside the join, is planned as a scan of the
//! whole account here. If it ever is not, the data no longer fool the
//! planner and the test says so, instead of passing for nothing.
//!
//! Like `index_use`, it needs a PostgreSQL (`DATABASE_URL`, or the local
//! default), sets the schema up in a schema of its own, and drops it after.

use idem::sqlx;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Executor, PgConnection, Postgres, Row};

use super::batch::{self, PerEngine};
use super::scratch::Scratch;
use super::{Engine, catalog, ordered};

const ACCOUNT: &str = "hot";
const NAMESPACE: &str = "live";
const BATCH: usize = 100;

/// The statement the batch settle would be, written the obvious way.
const OBVIOUS_SETTLE: &str = "UPDATE idem_records r SET state = 'success', settled_at = now() \
     FROM unnest($2::text[], $4::bigint[], $5::text[]) AS item(address, fence, output) \
     WHERE r.account = $1 AND r.kind = 'claim' AND r.address = item.address \
       AND r.namespace IS NULL AND $3::text IS NULL \
       AND r.state = 'pending' AND r.fence = item.fence \
     RETURNING r.address";

/// What the planner is told about the table.
#[derive(Debug, Clone, Copy)]
enum Statistics {
    /// Taken while the table held only other accounts' usage events.
    Stale,
    /// Never taken (autovacuum has not come by yet): the indexes, built on
    /// an empty table, say they hold nothing.
    Never,
}

/// The scratch schema, with `statistics` that say the account holds no
/// claim while it holds 60,000 (half in a namespace). Autovacuum is off
/// for the table, so they stay wrong.
async fn lying(statistics: Statistics) -> Scratch {
    let mut scratch = Scratch::new("idem_batch_plans").await;
    let conn = &mut scratch.conn;
    catalog::set_up(&mut *conn)
        .await
        .expect("set the schema up");
    conn.execute(
        "ALTER TABLE idem_records SET (autovacuum_enabled = false); \
         INSERT INTO idem_records \
           (account, kind, address, namespace, state, identity, meter, quantity, occurred_at) \
         SELECT 'tenant_' || (i % 50), 'meter_event', 'event_' || md5(i::text), \
                CASE WHEN i % 2 = 0 THEN 'test' END, 'recorded', '\\x00', 'api_calls', 1, now() \
         FROM generate_series(1, 2000) AS i",
    )
    .await
    .expect("load the other accounts' events");
    if let Statistics::Stale = statistics {
        conn.execute("ANALYZE idem_records")
            .await
            .expect("take the statistics");
    }
    conn.execute(
        "INSERT INTO idem_records (account, kind, address, namespace, state, identity) \
         SELECT 'hot', 'claim', 'claim_' || md5('hot' || i), \
                CASE WHEN i % 2 = 0 THEN 'live' END, 'pending', '\\x00' \
         FROM generate_series(1, 60000) AS i",
    )
    .await
    .expect("load the claims");
    scratch
}

/// `BATCH` addresses of the hot account in `namespace`, and their fences.
async fn batch_of(conn: &mut PgConnection, namespace: Option<&str>) -> (Vec<String>, Vec<i64>) {
    let rows = sqlx::query(
        "SELECT address, fence FROM idem_records \
         WHERE account = 'hot' AND namespace IS NOT DISTINCT FROM $1 \
         ORDER BY fence LIMIT $2",
    )
    .bind(namespace)
    .bind(i64::try_from(BATCH).expect("a small batch"))
    .fetch_all(&mut *conn)
    .await
    .expect("pick a batch");
    rows.iter()
        .map(|row| (row.get::<String, _>("address"), row.get::<i64, _>("fence")))
        .unzip()
}

/// The batch statements over existing rows, by name, with what each binds
/// after `$1` account, `$2` addresses, `$3` namespace.
fn statements() -> Vec<(&'static str, &'static PerEngine, Extra)> {
    vec![
        ("lookup", &batch::LOOKUP_BATCH, Extra::Output),
        ("settle", &batch::SETTLE_BATCH.durable, Extra::FencesOutputs),
        (
            "settle async",
            &batch::SETTLE_BATCH.asynchronous,
            Extra::FencesOutputs,
        ),
        ("release", &batch::RELEASE_BATCH.durable, Extra::Fences),
        (
            "release async",
            &batch::RELEASE_BATCH.asynchronous,
            Extra::Fences,
        ),
        ("keep", &batch::KEEP_BATCH.durable, Extra::FencesReason),
        (
            "keep async",
            &batch::KEEP_BATCH.asynchronous,
            Extra::FencesReason,
        ),
        (
            "hold in doubt",
            &batch::HOLD_IN_DOUBT_BATCH,
            Extra::FencesReason,
        ),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Extra {
    Output,
    Fences,
    FencesOutputs,
    FencesReason,
}

fn bound<'q>(
    text: &'q str,
    namespace: Option<&'q str>,
    addresses: &'q [String],
    fences: &'q [i64],
    extra: Extra,
) -> Query<'q, Postgres, PgArguments> {
    let query = sqlx::query(AssertSqlSafe(text))
        .bind(ACCOUNT)
        .bind(addresses)
        .bind(namespace);
    let outputs: Vec<Option<String>> = vec![None; addresses.len()];
    match extra {
        Extra::Output => query.bind(true),
        Extra::Fences => query.bind(fences),
        Extra::FencesOutputs => query.bind(fences).bind(outputs),
        Extra::FencesReason => query.bind(fences).bind("kept_failure"),
    }
}

/// The plan of `text`, as lines.
async fn plan(
    conn: &mut PgConnection,
    text: &str,
    namespace: Option<&str>,
    addresses: &[String],
    fences: &[i64],
    extra: Extra,
) -> Vec<String> {
    let explain = format!("EXPLAIN {text}");
    bound(&explain, namespace, addresses, fences, extra)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|error| panic!("EXPLAIN {text}: {error}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Why a plan is not one index probe per address, if it is not: a nested
/// loop over the list whose inner side looks each address up on the full
/// key of a partial unique index (and, for an update or a delete, fetches
/// the row it found by its `ctid`).
fn not_probing(lines: &[String], modifies: bool) -> Option<&'static str> {
    let has = |needle: &str| lines.iter().any(|line| line.contains(needle));
    if has("Seq Scan") {
        return Some("it scans the table");
    }
    if has("Hash Join") || has("Merge Join") || has("Hash Semi Join") {
        return Some("it joins the list to a scan of the account");
    }
    if has("Bitmap Heap Scan") {
        return Some("it scans a whole partial index");
    }
    if !has("Nested Loop") {
        return Some("it is not a nested loop over the list");
    }
    let probes = lines.iter().any(|line| {
        line.contains("Index Cond:")
            && line.contains("(account = ")
            && line.contains("(kind = ")
            && line.contains("(address = item")
    });
    if !probes {
        return Some("it does not look each address up on the index's full key");
    }
    // `ctid = item.row_ctid`, or the other way round (PostgreSQL 18).
    let by_ctid = lines
        .iter()
        .any(|line| line.contains("TID Cond:") && line.contains("item.row_ctid"));
    if modifies && !by_ctid {
        return Some("it does not fetch the rows it found by ctid");
    }
    None
}

/// How a statement prepared by sqlx may be planned: as a custom plan (the
/// parameters known), and as a generic one (what it becomes after a few
/// runs).
const PLAN_CACHE_MODES: [&str; 2] = ["force_custom_plan", "force_generic_plan"];

/// Plans the statements that follow as `plan_cache_mode` says.
async fn planned_as(conn: &mut PgConnection, plan_cache_mode: &str) {
    conn.execute(AssertSqlSafe(format!(
        "SET plan_cache_mode = {plan_cache_mode}"
    )))
    .await
    .expect("set plan_cache_mode");
}

/// The plans of every batch statement (and of the control) under
/// `statistics`: what falls short.
async fn shortfalls(statistics: Statistics) -> Vec<String> {
    let mut scratch = lying(statistics).await;
    let conn = &mut scratch.conn;
    let mut failures = Vec::new();

    // The trap is set: the obvious statement scans the whole account.
    let (addresses, fences) = batch_of(&mut *conn, None).await;
    let obvious = plan(
        &mut *conn,
        OBVIOUS_SETTLE,
        None,
        &addresses,
        &fences,
        Extra::FencesOutputs,
    )
    .await;
    if not_probing(&obvious, true).is_none() {
        failures.push(format!(
            "control ({statistics:?}): the obvious settle probes per address under these \
             statistics, so this test proves nothing; make them lie harder:\n{}",
            obvious.join("\n")
        ));
    }

    for plan_cache_mode in PLAN_CACHE_MODES {
        planned_as(&mut *conn, plan_cache_mode).await;
        for namespace in [None, Some(NAMESPACE)] {
            let (addresses, fences) = batch_of(&mut *conn, namespace).await;
            for (name, statement, extra) in statements() {
                let text = statement.text(Engine::PostgreSQL, namespace);
                let lines = plan(&mut *conn, text, namespace, &addresses, &fences, extra).await;
                let modifies = !matches!(extra, Extra::Output);
                if let Some(why) = not_probing(&lines, modifies) {
                    failures.push(format!(
                        "{name} ({namespace:?}, {statistics:?}, {plan_cache_mode}): {why}:\n{}",
                        lines.join("\n")
                    ));
                }
            }
        }
    }
    scratch.drop().await;
    failures
}

#[tokio::test]
async fn every_batch_statement_probes_the_index_per_address_when_the_statistics_are_stale() {
    let failures = shortfalls(Statistics::Stale).await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test]
async fn every_batch_statement_probes_the_index_per_address_before_any_statistics() {
    let failures = shortfalls(Statistics::Never).await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test]
async fn the_batch_claim_is_an_insert_arbitrated_by_the_partial_unique_indexes() {
    let mut scratch = Scratch::new("idem_batch_claim_plan").await;
    let conn = &mut scratch.conn;
    catalog::set_up(&mut *conn)
        .await
        .expect("set the schema up");
    let explain = format!("EXPLAIN {}", batch::CLAIM_BATCH);
    let lines: Vec<String> = sqlx::query(AssertSqlSafe(explain))
        .bind(ACCOUNT)
        .bind(vec!["claim_a".to_owned()])
        .bind(None::<&str>)
        .bind(vec![vec![0_u8]])
        .bind(vec![None::<Vec<u8>>])
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(None::<bool>)
        .fetch_all(&mut *conn)
        .await
        .expect("EXPLAIN the batch claim")
        .iter()
        .map(|row| row.get(0))
        .collect();
    scratch.drop().await;
    let shown = lines.join("\n");
    // `ON CONFLICT DO NOTHING` names no index: both partial unique
    // indexes arbitrate it, as they do the one-row claim.
    assert!(shown.contains("Conflict Resolution: NOTHING"), "{shown}");
    assert!(!shown.contains("Seq Scan"), "{shown}");
    assert!(
        shown.contains("Sort Key: item.address"),
        "the batch is inserted in address order:\n{shown}"
    );
}

/// Why the plan of a claim over new rows reads more than each event's own
/// row (and entity, and holder) by its address, if it does: every scan of
/// the table is an index probe on an address (what the CTEs' results are
/// joined by is theirs to choose: they hold the batch, not the table).
fn reads_the_account(lines: &[String]) -> Option<&'static str> {
    for (n, line) in lines.iter().enumerate() {
        if !line.contains(" on idem_records") {
            continue;
        }
        if line.contains("Seq Scan") {
            return Some("it scans the table");
        }
        if line.contains("Bitmap") {
            return Some("it scans a whole partial index");
        }
        let probe = lines.get(n + 1).is_some_and(|cond| {
            cond.contains("Index Cond:")
                && cond.contains("(account = ")
                && cond.contains("(address = ")
        });
        if line.contains("Index") && !probe {
            return Some("it reads an index without an address: the whole account");
        }
    }
    let own_rows = lines
        .iter()
        .any(|line| line.contains("Index Cond:") && line.contains("(address = item.address)"));
    if !own_rows {
        return Some("it does not look each event's own row up on the index's full key");
    }
    None
}

/// The plan of `text`, the batch claim of ordered events, for `BATCH` new
/// events of as many new entities, and as many events already claimed.
async fn ordered_plan(conn: &mut PgConnection, text: &str, namespace: Option<&str>) -> Vec<String> {
    let (mut addresses, _) = batch_of(&mut *conn, namespace).await;
    addresses.extend((0..BATCH).map(|n| format!("claim_new_{n}")));
    let items = addresses.len();
    let entities: Vec<String> = (0..items).map(|n| format!("entity_{n}")).collect();
    let orders: Vec<i64> = (0..items).map(|n| n as i64).collect();
    let bytes = vec![vec![0_u8]; items];
    let explain = format!("EXPLAIN {text}");
    sqlx::query(AssertSqlSafe(explain))
        .bind(ACCOUNT)
        .bind(&addresses)
        .bind(namespace)
        .bind(&bytes)
        .bind(vec![None::<Vec<u8>>; items])
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(None::<bool>)
        .bind(&entities)
        .bind(&bytes)
        .bind(&orders)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|error| panic!("EXPLAIN the ordered batch claim: {error}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The ordered batch claim with each event's own row looked for the
/// obvious way, `NOT EXISTS`: the control.
fn obvious_ordered_claim(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let obvious = text
        .replace(
            "LEFT JOIN LATERAL (SELECT true AS found FROM",
            "WHERE NOT EXISTS (SELECT FROM",
        )
        .replace("LIMIT 1) AS own ON true WHERE own.found IS NULL", ")");
    assert_ne!(obvious, text, "the control no longer matches the statement");
    obvious
}

/// The ordered batch claim's plans under `statistics`: what falls short.
async fn ordered_shortfalls(statistics: Statistics) -> Vec<String> {
    let mut scratch = lying(statistics).await;
    let conn = &mut scratch.conn;
    let mut failures = Vec::new();
    let control = obvious_ordered_claim(ordered::CLAIM_ORDERED_BATCH.for_namespace(None));
    let obvious = ordered_plan(&mut *conn, &control, None).await;
    if let Statistics::Never = statistics
        && reads_the_account(&obvious).is_none()
    {
        failures.push(format!(
            "control ({statistics:?}): NOT EXISTS probes per event under these statistics, so \
             this test proves nothing; make them lie harder:\n{}",
            obvious.join("\n")
        ));
    }
    for plan_cache_mode in PLAN_CACHE_MODES {
        planned_as(&mut *conn, plan_cache_mode).await;
        for namespace in [None, Some(NAMESPACE)] {
            let text = ordered::CLAIM_ORDERED_BATCH.for_namespace(namespace);
            let lines = ordered_plan(&mut *conn, text, namespace).await;
            if let Some(why) = reads_the_account(&lines) {
                failures.push(format!(
                    "ordered claim ({namespace:?}, {statistics:?}, {plan_cache_mode}): {why}:\n{}",
                    lines.join("\n")
                ));
            }
        }
    }
    scratch.drop().await;
    failures
}

#[tokio::test]
async fn the_ordered_batch_claim_reads_only_its_events_rows_when_the_statistics_lie() {
    let mut failures = ordered_shortfalls(Statistics::Stale).await;
    failures.extend(ordered_shortfalls(Statistics::Never).await);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
