//! What a transaction that holds vacuum back does to the gate.
//!
//! ```text
//! cargo run -p idem-bench --release --bin held_vacuum -- --minutes 10
//! ```
//!
//! A steady load of new claims through the gate (`gate.guard(&id).run` of
//! a no-op body, `--concurrency` at once, no pause between calls) runs in
//! a throwaway database for a minute alone, then beside a `REPEATABLE READ`
//! transaction that read `idem_records` once and is left open for
//! `--minutes`: its snapshot keeps every row version the gate's settles
//! leave behind from being removed, by autovacuum or by pruning a page.
//! Then the transaction ends, and the load goes on for `--after-minutes`
//! while autovacuum catches up.
//!
//! Every `--window` seconds it prints the window's throughput, p50 and p99,
//! the dead and live tuples the statistics count for `idem_records`, the
//! table's size, and how many times autovacuum has finished on it. The
//! verdict compares the last window with the snapshot held against the
//! first one: throughput at least 0.8×, p99 at most 2×.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use idem::sqlx::{self, Connection, PgPool};
use idem::{Gate, Identity, Rejected};
use idem_bench::BoxError;
use idem_test_support::database;
use tokio::sync::Mutex;

/// Measures the gate beside a transaction that holds vacuum back.
#[derive(Debug, Parser)]
struct Flags {
    /// How long the transaction stays open.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// How long the load runs alone first.
    #[arg(long, default_value_t = 60)]
    before_seconds: u64,
    /// How long the load goes on after the transaction ends.
    #[arg(long, default_value_t = 3)]
    after_minutes: u64,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seconds per reported window.
    #[arg(long, default_value_t = 30)]
    window: u64,
}

/// What the workers measured since the window began.
struct Window {
    calls: u64,
    latency: Histogram<u64>,
}

impl Window {
    fn new() -> Result<Window, BoxError> {
        Ok(Window {
            calls: 0,
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }
}

/// One reported window.
#[derive(Debug, Clone, Copy)]
struct Figures {
    calls_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let flags = Flags::parse();
    let database = database::find().await.map_err(|e| e.to_string())?;
    eprintln!("database: {}", database.describe());
    let pool = database.pool(u32::try_from(flags.concurrency)? + 2).await?;
    let gate = Gate::connect(pool.clone()).await?;
    let report = measure(&flags, &database.url, &pool, &gate).await?;
    println!("{report}");
    Ok(())
}

async fn stats(pool: &PgPool) -> Result<(i64, i64, i64, i64, i64), BoxError> {
    let row: (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), \
                pg_relation_size('idem_records'), \
                pg_indexes_size('idem_records'), coalesce(autovacuum_count, 0) \
         FROM pg_stat_user_tables WHERE relid = 'idem_records'::regclass",
    )
    .fetch_one(pool)
    .await?;
    Ok(row)
}

async fn measure(flags: &Flags, url: &str, pool: &PgPool, gate: &Gate) -> Result<String, BoxError> {
    let window = Arc::new(Mutex::new(Window::new()?));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..flags.concurrency {
        let (gate, window, stop, next) = (
            gate.clone(),
            Arc::clone(&window),
            Arc::clone(&stop),
            Arc::clone(&next),
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let id = Identity::new("held_vacuum").part(n);
                let began = Instant::now();
                let ran = gate.guard(&id).run(async { Ok::<(), Rejected>(()) }).await;
                let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                if ran.is_ok() {
                    let mut window = window.lock().await;
                    window.calls += 1;
                    let _ = window.latency.record(micros.max(1));
                }
            }
        }));
    }
    let (autovacuum,): (String,) = sqlx::query_as("SHOW autovacuum").fetch_one(pool).await?;
    let (naptime,): (String,) = sqlx::query_as("SHOW autovacuum_naptime")
        .fetch_one(pool)
        .await?;
    let mut out = format!(
        "autovacuum = {autovacuum} (naptime {naptime}); {} calls at once, windows of {} s; a \
         REPEATABLE READ transaction holds its snapshot for {} min\n\n\
         | phase | at s | calls/s | p50 ms | p99 ms | dead tuples | live tuples | heap MiB | indexes MiB | autovacuums |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        flags.concurrency, flags.window, flags.minutes
    );
    let began = Instant::now();
    let take = async |phase: &str, out: &mut String| -> Result<Figures, BoxError> {
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(flags.window)).await;
        let taken = {
            let mut window = window.lock().await;
            std::mem::replace(&mut *window, Window::new()?)
        };
        let seconds = started.elapsed().as_secs_f64();
        let figures = Figures {
            calls_per_second: taken.calls as f64 / seconds,
            p50_ms: taken.latency.value_at_quantile(0.50) as f64 / 1000.0,
            p99_ms: taken.latency.value_at_quantile(0.99) as f64 / 1000.0,
        };
        let (dead, live, heap, indexes, autovacuums) = stats(pool).await?;
        let line = format!(
            "| {phase} | {:.0} | {:.0} | {:.2} | {:.2} | {dead} | {live} | {:.1} | {:.1} | \
             {autovacuums} |",
            began.elapsed().as_secs_f64(),
            figures.calls_per_second,
            figures.p50_ms,
            figures.p99_ms,
            heap as f64 / 1_048_576.0,
            indexes as f64 / 1_048_576.0,
        );
        eprintln!("{line}");
        out.push_str(&line);
        out.push('\n');
        Ok(figures)
    };
    for _ in 0..flags.before_seconds.div_ceil(flags.window) {
        take("alone", &mut out).await?;
    }
    // The transaction that holds vacuum back: a snapshot taken by a read of
    // the table, kept by REPEATABLE READ until the transaction ends.
    let mut holder = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM idem_records")
        .execute(&mut holder)
        .await?;
    let mut held = Vec::new();
    for _ in 0..(flags.minutes * 60).div_ceil(flags.window) {
        held.push(take("held", &mut out).await?);
    }
    sqlx::raw_sql("COMMIT").execute(&mut holder).await?;
    let released_at = began.elapsed().as_secs_f64();
    for _ in 0..(flags.after_minutes * 60).div_ceil(flags.window) {
        take("after", &mut out).await?;
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await?;
    }
    let (Some(first), Some(last)) = (held.first(), held.last()) else {
        return Ok(out);
    };
    let throughput = last.calls_per_second / first.calls_per_second;
    let p99 = last.p99_ms / first.p99_ms;
    out.push_str(&format!(
        "\nThe snapshot was released at {released_at:.0} s. Last window held ÷ first: \
         throughput {throughput:.2}× (goal ≥ 0.8×: {}), p99 {p99:.2}× (goal ≤ 2×: {}).\n",
        if throughput >= 0.8 { "met" } else { "missed" },
        if p99 <= 2.0 { "met" } else { "missed" },
    ));
    Ok(out)
}
