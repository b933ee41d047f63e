//! The load generator's flags. The defaults are the full run of
//! BENCHMARKS.md; every knob that makes a run shorter or smaller is a flag,
//! so a quick check and the full run are the same program.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::bench_db::TableLayout;

/// Where the tests' PostgreSQL answers when `DATABASE_URL` is not set.
const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// What the gate costs per call, against the floor and the alternatives,
/// in one run against one PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version)]
pub struct Flags {
    /// Seconds measured for each scenario at each concurrency.
    #[arg(long = "seconds", value_name = "SECONDS", default_value = "10", value_parser = positive_seconds)]
    pub measured: Duration,

    /// Seconds run and discarded before measuring (fills the pool's
    /// connections and their prepared-statement caches).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = seconds)]
    pub warmup: Duration,

    /// Concurrency levels: workers issuing operations back to back.
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = [1u32, 4, 16, 64],
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub concurrency: Vec<u32>,

    /// Settled rows in `idem_records` for the history group, one run of it
    /// per size; `0` alone skips the group.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000u64, 5_000_000])]
    pub prefill: Vec<u64>,

    /// Only these scenarios: a group (`noop`), a name in every group
    /// (`gate`), or one scenario (`noop/gate`). Baselines left out leave
    /// their ratios blank. `--list` shows them all.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,

    /// Largest pool for the groups without a slow body: the pool is sized to
    /// the concurrency, up to this.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pool: u32,

    /// Largest pool for the slow-body group: fewer connections than
    /// workers, so holding one across the body costs what it costs.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub slow_pool: u32,

    /// Milliseconds the slow body sleeps (an external call).
    #[arg(long, default_value_t = 5)]
    pub slow_body_ms: u64,

    /// Messages per `gate.guard_batch` in the batch group: one operation of
    /// its batch scenario is this many new identities.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch_size: u64,

    /// Settled identities the duplicates group refuses, round robin.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub duplicates: u64,

    /// sqlx's liveness ping (one extra round trip) each time a pooled
    /// connection is handed out; `true` is sqlx's default.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub ping_on_acquire: bool,

    /// `CHECKPOINT` before each run, so every run starts at the same point
    /// of the checkpoint cycle (needs superuser or pg_checkpoint). Right
    /// after a checkpoint, the first change to each page writes a full page
    /// image to the WAL: the worst case for large tables.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub checkpoint: bool,

    /// Lay idem_records out hash-partitioned on account into this many
    /// partitions (`idem migrate --partitions N`), instead of one table. The
    /// hand-written floor writes to the same table, so ratios stay fair.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub partitions: Option<u16>,

    /// Run the Citus comparison instead of the matrix: the core scenarios
    /// against this Citus coordinator (`idem_records` distributed by
    /// `idem::schema::set_up_distributed`) and against `DATABASE_URL`, one
    /// PostgreSQL, in the same run. `--into` then writes between the file's
    /// Citus report markers.
    #[arg(long, value_name = "URL")]
    pub citus_url: Option<String>,

    /// Settled rows laid down in `idem_records` on both servers before the
    /// Citus comparison measures anything.
    #[arg(long, value_name = "ROWS", default_value_t = 1_000_000)]
    pub citus_rows: u64,

    /// Accounts the Citus comparison spreads its rows and operations over,
    /// on both servers: `idem_records` is distributed by account, so these
    /// spread over the shards and the workers.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub citus_accounts: u32,

    /// Measures every run this many times, the whole plan over again each
    /// round (so the rounds of one run are spread over the whole run, and
    /// a drift in the machine meets every scenario). Each ratio is divided
    /// within a round and reported as the median of the rounds' ratios,
    /// with their range; a target whose rounds disagree is not judged.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub rounds: u32,

    /// Run River side by side instead of the matrix: River's Rust client
    /// (`riverqueue`) against idem on the same PostgreSQL, pair by pair
    /// (`river::scenarios`). `--into` then writes between the file's River
    /// report markers.
    #[arg(long, conflicts_with = "citus_url")]
    pub river: bool,

    /// Jobs River's duplicate scenario re-inserts (and idem identities the
    /// gate refuses), round robin.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub river_duplicates: u64,

    /// Jobs per `insert_many` (and keys per `gate.guard_batch` and per
    /// hand-written batch claim).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub river_batch: u64,

    /// The schema every table of the run lives in: dropped if it exists,
    /// created afresh, dropped again at the end.
    #[arg(long, default_value = "idem_bench", value_parser = plain_identifier)]
    pub schema: String,

    /// Leave the schema and its rows behind for inspection.
    #[arg(long)]
    pub keep_schema: bool,

    /// Also write the report (markdown) to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Also write the report into this markdown file, in place of whatever
    /// stands between its two marker lines (see `splice`): how
    /// BENCHMARKS.md gets its report, unedited. Checked before the run.
    #[arg(long, value_name = "FILE")]
    pub into: Option<PathBuf>,

    /// List the selected scenarios and what each costs by construction, then
    /// exit without touching the database.
    #[arg(long)]
    pub list: bool,
}

impl Flags {
    /// `DATABASE_URL`, else the tests' default server.
    pub fn database_url(&self) -> String {
        std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
    }

    /// How idem's table is laid out on one PostgreSQL: `--partitions`, else
    /// one table.
    pub fn table_layout(&self) -> TableLayout {
        self.partitions
            .map_or(TableLayout::Plain, TableLayout::Partitioned)
    }

    /// What the slow body sleeps.
    pub fn slow_body(&self) -> Duration {
        Duration::from_millis(self.slow_body_ms)
    }

    /// The history sizes to run, smallest first, so each pre-fill only adds
    /// the rows the previous one lacked.
    pub fn history_sizes(&self) -> Vec<u64> {
        let mut sizes: Vec<u64> = self.prefill.iter().copied().filter(|&r| r > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }
}

/// A duration in (fractional) seconds, 0 or more.
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(value)
        .map_err(|_| format!("{text:?} is not a duration in seconds (0 or more)"))
}

/// A duration in seconds that is not zero.
fn positive_seconds(text: &str) -> Result<Duration, String> {
    let duration = seconds(text)?;
    if duration.is_zero() {
        return Err("must be more than 0 seconds".to_owned());
    }
    Ok(duration)
}

/// A schema name that is safe to write into DDL as it is.
fn plain_identifier(text: &str) -> Result<String, String> {
    let mut bytes = text.bytes();
    let plain = bytes
        .next()
        .is_some_and(|first| first.is_ascii_lowercase() || first == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && text.len() <= 63;
    if !plain {
        return Err("must be a plain identifier: [a-z_][a-z0-9_]*, at most 63 bytes".to_owned());
    }
    Ok(text.to_owned())
}
