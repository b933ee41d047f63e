//! What pruning millions of settled claims costs, the old way (one `DELETE`)
//! against the batched walk `idem prune` now takes, measured in one
//! process against the same PostgreSQL, each while a gate serves calls.
//!
//! ```text
//! cargo run -p idem-bench --release --bin prune_bench -- --into BENCHMARKS.md
//! ```
//!
//! It loads `--rows` settled successes (over 1,000 accounts, a third of
//! them in a namespace) plus 1% pending and 1% in-doubt claims into a
//! throwaway schema, then, for each way of pruning, with the table loaded
//! afresh and vacuumed:
//!
//! - wall time; WAL written (`pg_wal_lsn_diff` of `pg_current_wal_lsn()`
//!   before and after, so every writer's WAL in that window, the gate's
//!   included); the longest statement, which is the longest any pruned
//!   row stays locked;
//! - the throughput of `Gate::run` with a no-op body, four at a time, in an
//!   account of its own, while the prune runs, as a ratio to the same
//!   workload with no prune running (measured first, in the same run), and
//!   its p99 latency.
//!
//! Both prunes must delete exactly the settled rows, and leave the pending
//! and in-doubt ones: the run fails otherwise. The figures are noisy on a
//! small shared machine (two cores here): compare ratios within one run.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use hdrhistogram::Histogram;
use idem::operations::{PruneFilter, Pruning};
use idem::sqlx::{self, PgPool};
use idem::{Gate, Identity, Rejected};
use idem_test_support::database;

/// Measures `idem prune` in batches against one `DELETE`.
#[derive(Debug, Parser)]
struct Flags {
    /// Settled claims to load (and prune) for each way.
    #[arg(long, default_value_t = 5_000_000)]
    rows: i64,
    /// Claims a batch reads at most.
    #[arg(long, default_value_t = 10_000)]
    batch_size: u32,
    /// How long the gate's workload runs alone, for its baseline.
    #[arg(long, default_value = "10")]
    baseline_seconds: u64,
    /// Write the report between the prune markers of this file (e.g.
    /// BENCHMARKS.md) rather than only printing it.
    #[arg(long, value_name = "FILE")]
    into: Option<std::path::PathBuf>,
}

// This program writes its own pair of markers (`splice::PRUNE`).
use idem_bench::splice;

/// Concurrent gate calls.
const CONCURRENCY: usize = 4;

use idem_bench::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let flags = Flags::parse();
    if let Some(path) = &flags.into {
        splice::check(path, splice::PRUNE)?;
    }
    let database = database::find().await.map_err(|e| e.to_string())?;
    let admin = database.pool(2).await?;
    let schema = idem::testing::unique_name("idem_prune_bench");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await?;
    let outcome = run(&database.url, &schema, &flags).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&admin)
        .await?;
    outcome
}

async fn run(url: &str, schema: &str, flags: &Flags) -> Result<(), BoxError> {
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.options([("search_path", schema)]))
        .await?;
    let gate = Gate::connect(pool.clone()).await?.account("bench_load");
    let batch_size = NonZeroU32::new(flags.batch_size).ok_or("--batch-size must be at least 1")?;

    println!(
        "# prune: {} settled claims, batches of {batch_size}",
        flags.rows
    );
    let baseline = workload(&gate, 0, async {
        tokio::time::sleep(Duration::from_secs(flags.baseline_seconds)).await;
        Ok::<_, BoxError>(Measured::default())
    })
    .await?;
    println!(
        "baseline: gate {:.0} calls/s, p99 {:?}",
        baseline.calls_per_second, baseline.p99
    );

    let cut_off = SystemTime::now() - Duration::from_secs(3_600);
    let filter = PruneFilter::new(cut_off);

    let load_started = Instant::now();
    load(&pool, flags.rows).await?;
    println!("loaded in {:.1?}", load_started.elapsed());
    let one = workload(
        &gate,
        1,
        measure(&pool, async {
            let started = Instant::now();
            let deleted = idem::__internal::prune_in_one_statement(&pool, &filter).await?;
            Ok((deleted, started.elapsed(), 1))
        }),
    )
    .await?;
    check(&pool, flags.rows, one.prune.deleted).await?;
    println!("one statement: {one:?}");

    let load_started = Instant::now();
    load(&pool, flags.rows).await?;
    println!("loaded in {:.1?}", load_started.elapsed());
    let batched = workload(
        &gate,
        2,
        measure(&pool, async {
            let mut pruning = Pruning::new(&filter, batch_size);
            let mut deleted = 0;
            let mut longest = Duration::ZERO;
            let mut batches = 0;
            loop {
                let started = Instant::now();
                let Some(batch) = pruning.next_batch(&pool).await? else {
                    break;
                };
                longest = longest.max(started.elapsed());
                deleted += batch;
                batches += 1;
            }
            Ok((deleted, longest, batches))
        }),
    )
    .await?;
    check(&pool, flags.rows, batched.prune.deleted).await?;
    println!("batched: {batched:?}");

    let server: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await?;
    let report = report(flags, batch_size, &server, &baseline, &one, &batched);
    println!("\n{report}");
    if let Some(path) = &flags.into {
        splice::write(path, splice::PRUNE, &report)?;
        println!("written into {}", path.display());
    }
    pool.close().await;
    Ok(())
}

/// What one prune did.
#[derive(Debug, Default)]
struct Measured {
    deleted: u64,
    wall: Duration,
    wal_bytes: i64,
    /// The longest batch (its window read and its `DELETE`): no row stays
    /// locked longer.
    longest_statement: Duration,
    /// Batches (one for the single `DELETE`).
    statements: u64,
}

/// Runs `prune`, noting the WAL written meanwhile (by every writer).
async fn measure(
    pool: &PgPool,
    prune: impl Future<Output = Result<(u64, Duration, u64), BoxError>>,
) -> Result<Measured, BoxError> {
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    let (deleted, longest_statement, statements) = prune.await?;
    let wall = started.elapsed();
    let wal_bytes: i64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::int8")
            .bind(lsn)
            .fetch_one(pool)
            .await?;
    Ok(Measured {
        deleted,
        wall,
        wal_bytes,
        longest_statement,
        statements,
    })
}

/// The gate's workload while `during` runs.
#[derive(Debug)]
struct Workload {
    prune: Measured,
    calls_per_second: f64,
    p99: Duration,
}

/// Runs `during` while `CONCURRENCY` tasks call `Gate::run` with a no-op
/// body, each call a new identity (a claim and a settle), until it ends.
async fn workload(
    gate: &Gate,
    round: u64,
    during: impl Future<Output = Result<Measured, BoxError>>,
) -> Result<Workload, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..CONCURRENCY as u64 {
        let gate = gate.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
            let mut n = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = Identity::new("prune_bench").part(round).part(task).part(n);
                let started = Instant::now();
                gate.run(&id, async { Ok::<_, Rejected>(()) }).await?;
                latencies
                    .record(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX))?;
            }
            Ok::<_, BoxError>(latencies)
        }));
    }
    let started = Instant::now();
    let prune = during.await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut all = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    for task in tasks {
        all.add(task.await??)?;
    }
    Ok(Workload {
        prune: prune?,
        calls_per_second: all.len() as f64 / elapsed.as_secs_f64(),
        p99: Duration::from_micros(all.value_at_quantile(0.99)),
    })
}

/// Loads `rows` settled successes (2024-01-01) over 1,000 accounts, a third
/// of them in a namespace, plus 1% pending and 1% in doubt, in chunks; then
/// vacuums and analyzes, as a table that has lived would be.
async fn load(pool: &PgPool, rows: i64) -> Result<(), BoxError> {
    const CHUNK: i64 = 500_000;
    let mut from = 1;
    while from <= rows {
        let to = (from + CHUNK - 1).min(rows);
        sqlx::query(
            "INSERT INTO idem_records \
                 (account, kind, address, namespace, state, identity, created_at, settled_at) \
             SELECT 'acct_' || (g % 1000), 'claim', 'claim_' || lpad(to_hex(g), 24, '0'), \
                    CASE WHEN g % 3 = 0 THEN 'live' END, 'success', '\\x00'::bytea, \
                    timestamptz '2024-01-01', timestamptz '2024-01-01' \
             FROM generate_series($1::int8, $2::int8) AS g",
        )
        .bind(from)
        .bind(to)
        .execute(pool)
        .await?;
        from = to + 1;
    }
    sqlx::query(
        "INSERT INTO idem_records \
             (account, kind, address, namespace, state, identity, created_at, settled_at) \
         SELECT 'acct_' || (g % 1000), 'claim', 'claim_' || lpad(to_hex(g), 24, '0'), \
                CASE WHEN g % 3 = 0 THEN 'live' END, \
                CASE WHEN g % 2 = 0 THEN 'pending' ELSE 'in_doubt' END, '\\x00'::bytea, \
                timestamptz '2024-01-01', \
                CASE WHEN g % 2 = 0 THEN NULL ELSE timestamptz '2024-01-01' END \
         FROM generate_series($1::int8 + 1, $1::int8 + $1::int8 / 50) AS g",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::raw_sql("VACUUM ANALYZE idem_records")
        .execute(pool)
        .await?;
    Ok(())
}

/// Fails unless exactly the settled rows went, and every pending and
/// in-doubt one stayed.
async fn check(pool: &PgPool, rows: i64, deleted: u64) -> Result<(), BoxError> {
    let left: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM idem_records \
         WHERE account LIKE 'acct\\_%' GROUP BY state ORDER BY state",
    )
    .fetch_all(pool)
    .await?;
    let expected = vec![
        ("in_doubt".to_owned(), rows / 100),
        ("pending".to_owned(), rows / 100),
    ];
    if u64::try_from(rows).ok() != Some(deleted) || left != expected {
        return Err(
            format!("pruned {deleted} of {rows}, left {left:?} (expected {expected:?})").into(),
        );
    }
    // Two statements: VACUUM cannot run in the implicit transaction of a
    // multi-statement query.
    sqlx::raw_sql("DELETE FROM idem_records WHERE account LIKE 'acct\\_%'")
        .execute(pool)
        .await?;
    sqlx::raw_sql("VACUUM idem_records").execute(pool).await?;
    Ok(())
}

/// The markdown block for BENCHMARKS.md.
fn report(
    flags: &Flags,
    batch_size: NonZeroU32,
    server: &str,
    baseline: &Workload,
    one: &Workload,
    batched: &Workload,
) -> String {
    use std::fmt::Write as _;
    let mib = |bytes: i64| bytes as f64 / (1024.0 * 1024.0);
    let ratio = |w: &Workload| w.calls_per_second / baseline.calls_per_second;
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "PostgreSQL {server}, {} settled claims over 1,000 accounts (a third in a namespace) \
         plus 2% pending and in doubt; the gate's workload: `Gate::run`, no-op body, \
         {CONCURRENCY} at a time; prune_bench {build} build.\n",
        flags.rows
    );
    let _ = writeln!(
        out,
        "| prune | wall | WAL | longest batch (row locks held) | batches | gate calls/s (ratio to none) | gate p99 |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| none (baseline, {} s) | | | | | {:.0} (1.00) | {:.1?} |",
        flags.baseline_seconds, baseline.calls_per_second, baseline.p99
    );
    for (name, w) in [
        ("one `DELETE` (the old way)".to_owned(), one),
        (format!("batches of {batch_size} (`idem prune`)"), batched),
    ] {
        let _ = writeln!(
            out,
            "| {name} | {:.1?} | {:.0} MiB | {:.1?} | {} | {:.0} ({:.2}) | {:.1?} |",
            w.prune.wall,
            mib(w.prune.wal_bytes),
            w.prune.longest_statement,
            w.prune.statements,
            w.calls_per_second,
            ratio(w),
            w.p99,
        );
    }
    let _ = writeln!(
        out,
        "\nBatches against one `DELETE`: wall time x{:.2}, WAL x{:.2}, longest time a row \
         stays locked x{:.4}.",
        batched.prune.wall.as_secs_f64() / one.prune.wall.as_secs_f64(),
        batched.prune.wal_bytes as f64 / one.prune.wal_bytes.max(1) as f64,
        batched.prune.longest_statement.as_secs_f64() / one.prune.longest_statement.as_secs_f64(),
    );
    out
}
