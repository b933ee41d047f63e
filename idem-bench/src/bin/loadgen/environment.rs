//! The machine, the server and its settings, read at start: the figures of
//! a run mean little without them, and ratios hold only within one run.

use std::fmt::Write as _;
use std::fs;
use std::str::FromStr;
use std::time::{Duration, Instant};

use idem::sqlx::postgres::PgConnectOptions;
use idem::sqlx::{self, PgPool};

use crate::BoxError;
use crate::flags::Flags;

/// The server settings that decide what a commit costs, and how much fits
/// in memory.
const SETTINGS: &[&str] = &[
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "full_page_writes",
    "wal_level",
    "wal_buffers",
    "wal_compression",
    "commit_delay",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "autovacuum",
];

/// A markdown list describing the run's command, machine and server.
pub async fn describe(admin: &PgPool, flags: &Flags) -> Result<String, BoxError> {
    let mut out = String::new();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut command = "cargo run -p idem-bench --release --bin loadgen".to_owned();
    if !args.is_empty() {
        write!(command, " -- {}", args.join(" "))?;
    }
    writeln!(out, "- command: `{command}`")?;
    writeln!(out, "- machine: {}", machine())?;
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    if !load.is_empty() {
        writeln!(out, "- load average at start: {}", load.join(" "))?;
    }

    let url = flags.database_url();
    let options = PgConnectOptions::from_str(&url)?;
    let (version, others): (String, i64) = sqlx::query_as(
        "SELECT version(), (SELECT count(*) FROM pg_stat_activity \
                            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())",
    )
    .fetch_one(admin)
    .await?;
    writeln!(
        out,
        "- server: {version}, at {}:{}",
        options.get_host(),
        options.get_port()
    )?;
    writeln!(out, "- other client connections at start: {others}")?;
    let settings: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT name, current_setting(name, true) FROM unnest($1::text[]) AS name")
            .bind(SETTINGS)
            .fetch_all(admin)
            .await?;
    let settings: Vec<String> = settings
        .into_iter()
        .map(|(name, value)| format!("{name}={}", value.as_deref().unwrap_or("?")))
        .collect();
    writeln!(out, "- server settings: {}", settings.join(", "))?;
    let (round_trip, commit) = probe(admin).await?;
    writeln!(
        out,
        "- measured at start (median of {PROBES}): round trip (`SELECT 1`) {:.3} ms, \
         durable commit (one-row autocommitted `INSERT`) {:.3} ms",
        round_trip.as_secs_f64() * 1e3,
        commit.as_secs_f64() * 1e3
    )?;
    writeln!(
        out,
        "- client: tokio multi-thread runtime, {} workers; sqlx pools sized per run, \
         ping on acquire: {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        flags.ping_on_acquire
    )?;
    writeln!(
        out,
        "- each run: {:.1} s warm-up (discarded), {:.1} s measured; pool = min(concurrency, {}), \
         slow body: {} ms with pool = min(concurrency, {}); CHECKPOINT before each run: {}",
        flags.warmup.as_secs_f64(),
        flags.measured.as_secs_f64(),
        flags.max_pool,
        flags.slow_body_ms,
        flags.slow_pool,
        flags.checkpoint
    )?;
    let layout = idem::schema::layout(admin)
        .await?
        .map_or_else(|| "missing".to_owned(), |layout| layout.to_string());
    writeln!(out, "- idem_records: {layout}")?;
    Ok(out)
}

/// Samples per probe.
const PROBES: usize = 51;

/// The two costs every ratio of the report is made of: a round trip, and a
/// commit that waits for the WAL flush. Their proportion on a machine
/// decides how far apart designs with different statement and commit
/// counts land there.
async fn probe(admin: &PgPool) -> Result<(Duration, Duration), BoxError> {
    let mut conn = admin.acquire().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS commit_probe (at timestamptz NOT NULL DEFAULT now())")
        .execute(&mut *conn)
        .await?;
    let mut round_trips = Vec::with_capacity(PROBES);
    let mut commits = Vec::with_capacity(PROBES);
    for _ in 0..PROBES {
        let began = Instant::now();
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        round_trips.push(began.elapsed());
        let began = Instant::now();
        sqlx::query("INSERT INTO commit_probe DEFAULT VALUES")
            .execute(&mut *conn)
            .await?;
        commits.push(began.elapsed());
    }
    Ok((median(round_trips), median(commits)))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Cores, CPU model, memory and kernel, from /proc (blank where absent).
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = field(&cpuinfo, "model name").unwrap_or("unknown CPU");
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = field(&meminfo, "MemTotal")
        .and_then(|kb| kb.trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("unknown".to_owned(), |kb| {
            format!("{:.1} GiB", kb / 1024.0 / 1024.0)
        });
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores ({model}), {memory} memory, Linux {}",
        kernel.trim()
    )
}

/// The value of the first `name: value` line.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim())
    })
}
