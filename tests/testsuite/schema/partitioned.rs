//! The opt-in partitioned layout: `idem_records` hash-partitioned on
//! `account`. Set-up, verification, and races across partitions, against a
//! real PostgreSQL. (CI also runs the whole race suite against a partitioned
//! database: scripts/test-partitioned.)

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use idem::meter::Event;
use idem::schema::{self, Layout};
use idem::sqlx::{self, PgPool};
use idem::testing::race;
use idem::{Error, Gate, Identity, Rejected, SchemaProblem};
use idem_test_support::schemas;

async fn partitioned(partitions: u16, max_connections: u32) -> (String, PgPool, Gate) {
    let (name, pool) = schemas::fresh_schema(max_connections).await;
    schema::set_up_partitioned(&pool, partitions)
        .await
        .unwrap_or_else(|e| panic!("partitioned set-up: {e}"));
    let gate = Gate::connect(pool.clone())
        .await
        .unwrap_or_else(|e| panic!("a gate starts on the partitioned table: {e}"));
    (name, pool, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_partition_carries_both_partial_unique_indexes() {
    let (schema_name, pool, _gate) = partitioned(16, 2).await;
    assert_eq!(
        schema::layout(&pool).await.expect("layout"),
        Some(Layout::Partitioned {
            key: "HASH (account)".to_owned(),
            partitions: 16
        })
    );
    // Each partition's own unique indexes, as the catalog defines them.
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid) \
         FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid \
         JOIN pg_index i ON i.indrelid = c.oid \
         WHERE h.inhparent = to_regclass('idem_records') AND i.indisunique AND i.indisvalid \
         ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .expect("read the partitions' indexes");
    let partitions: BTreeSet<&str> = rows.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(partitions.len(), 16, "{rows:#?}");
    for partition in partitions {
        let definitions: Vec<&str> = rows
            .iter()
            .filter(|(p, _)| p == partition)
            .map(|(_, d)| d.as_str())
            .collect();
        let expected = [
            format!(
                "ON {schema_name}.{partition} USING btree (account, kind, address) \
                 WHERE (namespace IS NULL)"
            ),
            format!(
                "ON {schema_name}.{partition} USING btree (account, kind, address, namespace) \
                 WHERE (namespace IS NOT NULL)"
            ),
        ];
        for wanted in &expected {
            assert!(
                definitions.iter().any(|d| d.ends_with(wanted.as_str())),
                "{partition} lacks a unique index {wanted}: {definitions:#?}"
            );
        }
    }
}

/// Version 9's index of open claims is on the partitioned table, so on
/// every partition, and valid on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_partition_carries_the_index_of_open_claims() {
    let (_name, pool, _gate) = partitioned(8, 2).await;
    let rows: Vec<(String, bool)> = sqlx::query_as(
        "SELECT c.relname::text, i.indisvalid \
         FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid \
         JOIN pg_index i ON i.indrelid = c.oid \
         WHERE h.inhparent = to_regclass('idem_records') \
           AND pg_get_indexdef(i.indexrelid) LIKE \
               '%(account, state, created_at, address) WHERE ((kind = ''claim''::text) \
AND (state IS DISTINCT FROM ''success''::text))' \
         ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("read the partitions' indexes");
    assert_eq!(rows.len(), 8, "{rows:#?}");
    assert!(rows.iter().all(|(_, valid)| *valid), "{rows:#?}");
}

/// Columns (name, type, NOT NULL, default) and constraints (name,
/// definition) of `idem_records` in the pool's schema.
async fn shape(
    pool: &PgPool,
) -> (
    Vec<(String, String, bool, Option<String>)>,
    Vec<(String, String)>,
) {
    let columns = sqlx::query_as(
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                pg_get_expr(d.adbin, d.adrelid) \
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attrelid = to_regclass('idem_records') AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("read the columns");
    let constraints = sqlx::query_as(
        "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE conrelid = to_regclass('idem_records') ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("read the constraints");
    (columns, constraints)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitioned_table_has_exactly_the_plain_table_s_columns_and_constraints() {
    let (_plain_schema, plain) = schemas::fresh_schema(1).await;
    schema::set_up(&plain).await.expect("plain set-up");
    let (_name, partitioned, _gate) = partitioned(4, 1).await;
    let (plain_columns, plain_constraints) = shape(&plain).await;
    let (columns, constraints) = shape(&partitioned).await;
    assert_eq!(columns, plain_columns, "columns drifted apart");
    assert_eq!(constraints, plain_constraints, "constraints drifted apart");
    assert!(plain_columns.len() >= 15 && plain_constraints.len() >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_at_once_create_one_partitioned_table() {
    let (_name, pool) = schemas::fresh_schema(10).await;
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let pool = pool.clone();
        starts.spawn(async move {
            schema::set_up_partitioned(&pool, 8).await?;
            Gate::connect(pool).await.map(|_| ())
        });
    }
    while let Some(started) = starts.join_next().await {
        started
            .expect("set-up task")
            .unwrap_or_else(|e| panic!("a concurrent set-up failed: {e}"));
    }
    assert_eq!(
        schema::layout(&pool).await.expect("layout"),
        Some(Layout::Partitioned {
            key: "HASH (account)".to_owned(),
            partitions: 8
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_table_is_never_repartitioned() {
    // A plain table stays plain, and nothing changes.
    let (_name, plain) = schemas::fresh_schema(1).await;
    Gate::connect(plain.clone()).await.expect("plain set-up");
    let Err(Error::Setup(why)) = schema::set_up_partitioned(&plain, 16).await else {
        panic!("partitioning over a plain table must be refused");
    };
    assert!(
        why.contains("plain (not partitioned)") && why.contains("Nothing was changed"),
        "{why}"
    );
    assert_eq!(
        schema::layout(&plain).await.expect("layout"),
        Some(Layout::Plain)
    );

    // Another partition count is refused the same way; the same count, or a
    // plain set-up, just verifies and migrates.
    let (_name, pool, _gate) = partitioned(4, 1).await;
    let Err(Error::Setup(why)) = schema::set_up_partitioned(&pool, 8).await else {
        panic!("re-partitioning must be refused");
    };
    assert!(
        why.contains("into 4 partitions") && why.contains("into 8 partitions"),
        "{why}"
    );
    schema::set_up_partitioned(&pool, 4)
        .await
        .expect("same layout");
    schema::set_up(&pool)
        .await
        .expect("plain set-up on a partitioned table");
    assert!(matches!(
        schema::set_up_partitioned(&pool, 0).await,
        Err(Error::Setup(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_partition_is_named_at_start_up() {
    let (_name, pool, _gate) = partitioned(4, 1).await;
    sqlx::query("ALTER TABLE idem_records DETACH PARTITION idem_records_p2")
        .execute(&pool)
        .await
        .expect("detach a partition");
    let Err(Error::Schema(problems)) = Gate::connect_without_setup(pool.clone()).await else {
        panic!("a gate must not start with accounts that have no partition");
    };
    let [SchemaProblem::Partitions { detail }] = problems.problems.as_slice() else {
        panic!("one problem, the partitions: {problems}");
    };
    assert!(
        detail.contains("remainders [2] of modulus 4") && detail.contains("PARTITION OF"),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_in_many_accounts_across_partitions_each_run_once() {
    let (_name, pool, gate) = partitioned(16, 8).await;
    for account in 0..24 {
        let gate = gate.account(format!("tenant-{account}"));
        let live = gate.namespace("live");
        for (scoped, label) in [(&gate, "no namespace"), (&live, "namespace live")] {
            let ran = AtomicUsize::new(0);
            let report = race(8, || async {
                scoped
                    .run(&Identity::new("charge").part("order-1"), async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Rejected>(())
                    })
                    .await
            })
            .await;
            report.assert_exactly_once();
            assert_eq!(ran.load(Ordering::SeqCst), 1, "tenant-{account}, {label}");
        }
    }
    // The accounts landed in several partitions, each row in one.
    let used: i64 = sqlx::query_scalar("SELECT count(DISTINCT tableoid) FROM idem_records")
        .fetch_one(&pool)
        .await
        .expect("count partitions used");
    assert!(
        used > 4,
        "24 accounts hashed into only {used} of 16 partitions"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE state = 'success'")
        .fetch_one(&pool)
        .await
        .expect("count rows");
    assert_eq!(rows, 48, "one settled row per account and namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metering_deduplicates_on_a_partitioned_table() {
    let (_name, _pool, gate) = partitioned(4, 4).await;
    let meter = gate.account("tenant-a").meter();
    let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let events = [
        Event::new("e1", "api_calls", 3, at),
        Event::new("e2", "api_calls", 4, at),
    ];
    let first = meter.record(&events).await.expect("record");
    let again = meter.record(&events).await.expect("re-send");
    assert_eq!(
        (first.inserted, again.inserted),
        (2, 0),
        "{first:?} {again:?}"
    );
    assert_eq!(again.deduplicated, 2, "{again:?}");
    let total = meter
        .total("api_calls", at..at + Duration::from_secs(1))
        .await
        .expect("total");
    assert_eq!((total.quantity, total.events), (7, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_partitioned_table_migrates_its_claim_states_on_every_partition() {
    let (_name, pool, gate) = partitioned(4, 2).await;
    gate.run(&Identity::new("settled").part(1), async {
        Ok::<_, Rejected>(())
    })
    .await
    .expect("a settled claim");
    // Back to version 4's shape: its claim states, without the columns
    // versions 5 and 6 add, and without either recorded.
    sqlx::raw_sql(
        "ALTER TABLE idem_records DROP CONSTRAINT idem_records_claim_state; \
         ALTER TABLE idem_records ADD CONSTRAINT idem_records_claim_state \
           CHECK (kind <> 'claim' OR state IN ('pending', 'success')); \
         ALTER TABLE idem_records DROP COLUMN state_reason, DROP COLUMN resolved_at, \
           DROP COLUMN in_doubt_since; \
         DELETE FROM idem_schema_version WHERE version >= 5;",
    )
    .execute(&pool)
    .await
    .expect("make the table version 4's");

    Gate::connect(pool.clone())
        .await
        .expect("connect migrates the partitioned table to the current version");
    let settled: Vec<String> = sqlx::query_scalar("SELECT state FROM idem_records")
        .fetch_all(&pool)
        .await
        .expect("read the rows");
    assert_eq!(settled, ["success"], "the settled claim is untouched");
    // Every partition carries the new CHECK: one account per partition
    // would be slow to find, so the check is the catalog's.
    let checks: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.conrelid::regclass::text, pg_get_constraintdef(c.oid) FROM pg_constraint c \
         WHERE c.conname = 'idem_records_claim_state' \
           AND (c.conrelid = to_regclass('idem_records') \
                OR c.conrelid IN (SELECT inhrelid FROM pg_inherits \
                                  WHERE inhparent = to_regclass('idem_records')))",
    )
    .fetch_all(&pool)
    .await
    .expect("read the CHECKs");
    assert_eq!(
        checks.len(),
        5,
        "the table and its 4 partitions: {checks:#?}"
    );
    for (table, check) in &checks {
        assert!(
            check.contains("in_doubt") && check.contains("failed"),
            "{table}: {check}"
        );
    }
    for account in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        sqlx::query(
            "INSERT INTO idem_records (account, kind, address, state, identity) \
             VALUES ($1, 'claim', 'claim_held', 'in_doubt', '\\x00')",
        )
        .bind(account)
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("account {account}: in_doubt is a claim state: {e}"));
    }
}

/// On the partitioned table, an operator's in-doubt hold races the holders
/// of claims in many accounts (so many partitions): each stale claim is
/// held exactly once from pending, in its own account only, and a live
/// lease is never held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_doubt_holds_across_partitions_act_once_per_claim_and_never_over_a_live_lease() {
    use idem::operations::{self, ClaimState, Resolved, Slot};
    use idem::{Disposition, Outcome};

    let (_name, pool, gate) = partitioned(8, 8).await;
    let id = Identity::new("charge").part("same key in every account");
    let address = id.address();
    let mut stale = Vec::new();
    for account in 0..6u32 {
        let gate = gate.account(format!("acct_{account}"));
        let claim = gate
            .guard(&id)
            .lease(Duration::from_millis(if account.is_multiple_of(2) {
                30
            } else {
                60_000
            }))
            .claim()
            .await
            .expect("claim");
        stale.push((gate, claim, account.is_multiple_of(2)));
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(stale.len() * 3));
    let mut resolvers = tokio::task::JoinSet::new();
    for (gate, _, expired) in &stale {
        for _ in 0..3 {
            let (pool, account, address, barrier, expired) = (
                pool.clone(),
                gate.account_name().to_owned(),
                address.clone(),
                barrier.clone(),
                *expired,
            );
            resolvers.spawn(async move {
                barrier.wait().await;
                let resolved = operations::resolve(
                    &pool,
                    Slot::new(&account, None, &address),
                    Outcome::Failed(Disposition::InDoubt),
                )
                .await
                .expect("resolve");
                (account, expired, resolved)
            });
        }
    }
    let mut held = std::collections::HashMap::<String, usize>::new();
    while let Some(done) = resolvers.join_next().await {
        let (account, expired, resolved) = done.expect("no panic");
        match resolved {
            Resolved::Changed { before, .. } => {
                assert!(expired, "{account}: held over a live lease");
                if before.state == ClaimState::Pending {
                    *held.entry(account).or_default() += 1;
                }
            }
            Resolved::LeaseLive(_) => assert!(!expired, "{account}"),
            other => panic!("{account}: {other:?}"),
        }
    }
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(held.values().all(|n| *n == 1), "{held:?}");
    let states: Vec<(String, String)> = sqlx::query_as(
        "SELECT account, state FROM idem_records WHERE kind = 'claim' ORDER BY account",
    )
    .fetch_all(&pool)
    .await
    .expect("read");
    for (account, state) in states {
        let n: usize = account
            .trim_start_matches("acct_")
            .parse()
            .expect("an account");
        let expected = if n.is_multiple_of(2) {
            "in_doubt"
        } else {
            "pending"
        };
        assert_eq!(state, expected, "{account}");
    }
}
