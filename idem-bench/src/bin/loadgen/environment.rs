//! The machine, the server and its settings, read at start: the figures of
//! a run mean little without them, and ratios hold only within one run.

use std::fmt::Write as _;
use std::fs;
use std::str::FromStr;
use std::time::{Duration, Instant};

use idem::sqlx::postgres::PgConnectOptions;
use idem::sqlx::{self, AssertSqlSafe, PgPool};

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
    let mut out = run()?;
    out.push_str(&server(admin, &flags.database_url(), "").await?);
    out.push_str(&client(flags)?);
    writeln!(out, "- idem_records: {}", layout(admin).await?)?;
    Ok(out)
}

/// The same for the Citus comparison: the run, then each server, the
/// cluster's shape and what `idem_records` holds on each, read after the
/// pre-load.
pub async fn describe_citus(
    postgres: &PgPool,
    coordinator: &PgPool,
    citus_url: &str,
    flags: &Flags,
) -> Result<String, BoxError> {
    let mut out = run()?;
    out.push_str(&client(flags)?);
    writeln!(
        out,
        "- every operation and every pre-loaded row belongs to one of {} accounts, \
         round robin, on both servers",
        flags.citus_accounts
    )?;
    out.push_str("- one PostgreSQL:\n");
    out.push_str(&server(postgres, &flags.database_url(), "  ").await?);
    writeln!(
        out,
        "  - idem_records: {}, {} rows at start",
        layout(postgres).await?,
        rows(postgres).await?
    )?;
    out.push_str("- Citus:\n");
    out.push_str(&server(coordinator, citus_url, "  ").await?);
    out.push_str(&cluster(coordinator).await?);
    writeln!(
        out,
        "  - idem_records: {}, {} rows at start",
        layout(coordinator).await?,
        rows(coordinator).await?
    )?;
    Ok(out)
}

/// The command, the machine and its load.
fn run() -> Result<String, BoxError> {
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
    Ok(out)
}

/// One server: its version and address, who else is connected, the
/// settings that decide a commit's cost, the two probes. Each line starts
/// with `indent`.
async fn server(admin: &PgPool, url: &str, indent: &str) -> Result<String, BoxError> {
    let mut out = String::new();
    let options = PgConnectOptions::from_str(url)?;
    let (version, others, tls): (String, i64, bool) = sqlx::query_as(
        "SELECT version(), \
                (SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()), \
                coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
    )
    .fetch_one(admin)
    .await?;
    writeln!(
        out,
        "{indent}- server: {version}, at {}:{}; the client's connections use TLS: {}",
        options.get_host(),
        options.get_port(),
        if tls { "yes" } else { "no" }
    )?;
    writeln!(out, "{indent}- other client connections at start: {others}")?;
    writeln!(
        out,
        "{indent}- server settings: {}",
        settings(admin, SETTINGS).await?
    )?;
    let (round_trip, commit) = probe(admin).await?;
    writeln!(
        out,
        "{indent}- measured at start (median of {PROBES}): round trip (`SELECT 1`) {:.3} ms, \
         durable commit (one-row autocommitted `INSERT` into a table of its own) {:.3} ms",
        round_trip.as_secs_f64() * 1e3,
        commit.as_secs_f64() * 1e3
    )?;
    Ok(out)
}

/// `name=value, ...` for `names`, as the server behind `admin` has them.
async fn settings(admin: &PgPool, names: &[&str]) -> Result<String, BoxError> {
    let settings: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT name, current_setting(name, true) FROM unnest($1::text[]) AS name")
            .bind(names)
            .fetch_all(admin)
            .await?;
    let settings: Vec<String> = settings
        .into_iter()
        .map(|(name, value)| format!("{name}={}", value.as_deref().unwrap_or("?")))
        .collect();
    Ok(settings.join(", "))
}

/// The client's side of every run.
fn client(flags: &Flags) -> Result<String, BoxError> {
    let mut out = String::new();
    writeln!(
        out,
        "- client: tokio multi-thread runtime, {} workers; sqlx pools sized per run, \
         ping on acquire: {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        flags.ping_on_acquire
    )?;
    let pools = if flags.citus_url.is_some() {
        // The comparison has no slow body; its checkpoints reach the workers.
        format!(
            "pool = min(concurrency, {}); CHECKPOINT before each run (on Citus on the \
             coordinator and every worker): {}",
            flags.max_pool, flags.checkpoint
        )
    } else {
        format!(
            "pool = min(concurrency, {}), slow body: {} ms with pool = min(concurrency, {}); \
             CHECKPOINT before each run: {}",
            flags.max_pool, flags.slow_body_ms, flags.slow_pool, flags.checkpoint
        )
    };
    writeln!(
        out,
        "- each run: {:.1} s warm-up (discarded), {:.1} s measured; {pools}",
        flags.warmup.as_secs_f64(),
        flags.measured.as_secs_f64(),
    )?;
    Ok(out)
}

async fn layout(admin: &PgPool) -> Result<String, BoxError> {
    Ok(idem::schema::layout(admin)
        .await?
        .map_or_else(|| "missing".to_owned(), |layout| layout.to_string()))
}

async fn rows(admin: &PgPool) -> Result<String, BoxError> {
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(admin)
        .await?;
    Ok(thousands(rows))
}

/// The Citus settings that decide how a statement reaches its shard.
const CITUS_SETTINGS: &[&str] = &[
    "citus.shard_count",
    "citus.shard_replication_factor",
    "citus.max_cached_conns_per_worker",
    "citus.max_adaptive_executor_pool_size",
    "citus.node_conninfo",
];

/// The cluster behind the coordinator: Citus's version, its settings, and
/// each worker with its shards of `idem_records`, the rows in them, and
/// the settings that decide what its commits cost.
async fn cluster(coordinator: &PgPool) -> Result<String, BoxError> {
    let mut out = String::new();
    let version: String = sqlx::query_scalar("SELECT split_part(citus_version(), ' ', 2)")
        .fetch_one(coordinator)
        .await?;
    writeln!(
        out,
        "  - Citus {version}; coordinator settings: {}",
        settings(coordinator, CITUS_SETTINGS).await?
    )?;
    let workers: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT s.nodename || ':' || s.nodeport, count(*), sum(r.result::bigint)::bigint \
         FROM citus_shards s \
         JOIN run_command_on_shards('idem_records', 'SELECT count(*) FROM %s') r \
           ON r.shardid = s.shardid AND r.success \
         WHERE s.table_name = 'idem_records'::regclass \
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(coordinator)
    .await?;
    let placed: Vec<String> = workers
        .iter()
        .map(|(node, shards, rows)| {
            format!(
                "{node} ({shards} shards, {} rows of idem_records)",
                thousands(*rows)
            )
        })
        .collect();
    writeln!(out, "  - {} workers: {}", workers.len(), placed.join(", "))?;
    // The names are this file's constants, safe to write into SQL.
    let names = SETTINGS
        .iter()
        .map(|name| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let worker_settings: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT nodename || ':' || nodeport, result FROM run_command_on_workers( \
           $command$SELECT string_agg(name || '=' || current_setting(name, true), ', ' \
                                      ORDER BY place) \
                    FROM unnest(ARRAY[{names}]) WITH ORDINALITY AS s(name, place)$command$) \
         ORDER BY 1"
    )))
    .fetch_all(coordinator)
    .await?;
    for (node, settings) in worker_settings {
        writeln!(out, "  - worker {node} settings: {settings}")?;
    }
    Ok(out)
}

/// `1,100,000`.
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (place, digit) in digits.chars().enumerate() {
        if place > 0 && (digits.len() - place).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if n < 0 { format!("-{out}") } else { out }
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
