//! The command line, as clap types. No behaviour lives here.

use std::num::NonZeroU32;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idem_runtime::operations::ClaimState;
use jiff::Timestamp;

use crate::output::Format;
use crate::prune::parse_batch_size;
use crate::timestamps::{parse_duration, parse_instant};

/// Audit PostgreSQL for unique constraints that enforce nothing on NULL, and
/// operate idem's claims.
///
/// Exit status: 0 done (or nothing found); 1 findings, schema problems, no
/// such claim, or a refused release or resolution; 2 usage, connection or
/// database errors, and destructive commands run without --yes; 130 a prune
/// stopped by Ctrl-C.
#[derive(Debug, Parser)]
#[command(name = "idem", version, max_term_width = 100)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Find unique indexes and constraints that let duplicates through NULL.
    ///
    /// Reports every unique index or unique constraint with a key column or
    /// expression that can be NULL in a row it covers, with one sentence on
    /// the duplicates it accepts, its severity, a query counting the rows
    /// either fix would reject today, and two fixes with the lock each
    /// takes: NULLS NOT DISTINCT (PostgreSQL 15+; for a constraint also a
    /// form built CONCURRENTLY) and a split into partial unique indexes (any
    /// version).
    ///
    /// Severity: hole (rows with a NULL key get in however equal they are),
    /// inert (the table's CHECK constraints leave a NULL key in every row:
    /// the index rejects nothing at all), covered (other unique indexes
    /// reject every duplicate it lets through: informational, no fix).
    /// Exits 1 when there is a hole or an inert index, 0 when there is none
    /// (covered findings included), 2 when it cannot run: it can gate CI.
    Audit(AuditArgs),
    /// Set up idem's schema (idempotent), then verify it.
    Migrate(MigrateArgs),
    /// Inspect, release and resolve idem's claims.
    #[command(subcommand)]
    Claims(ClaimsCommand),
    /// Delete settled claims: a retry of their actions will then run again.
    ///
    /// Only successes settled before --settled-before are deleted: never a
    /// pending claim, a claim in doubt, or a kept failure (which refuses its
    /// retries forever). They go in batches of --batch-size, each its own
    /// transaction, so locks are held briefly and WAL is written evenly;
    /// progress goes to stderr (a bar on a terminal, else a line every 5 s).
    /// Ctrl-C finishes the batch under way and exits 130; a lost
    /// connection is retried (--retries), then the command stops, exit 2.
    /// Either way every finished batch is deleted and none is half-done:
    /// run the same command again to prune the rest.
    ///
    /// Example: idem prune --settled-before 2024-05-01 --dry-run, then
    /// idem prune --settled-before 2024-05-01 --yes --pause 20ms
    Prune(PruneArgs),
    /// Serve the operator console: the claims in a browser.
    ///
    /// Pages: the overview (open claims by account, state and action;
    /// pending past a threshold; in doubt, oldest first; the schema), the
    /// claims filtered and paged, each claim (identity, fence, lineage,
    /// steps), and idem audit's findings. Read-only unless --allow-writes,
    /// which lets operators resolve and release claims, each after a
    /// confirmation, through the same operation as `idem claims resolve`.
    ///
    /// It listens on loopback only unless given a token of at least 128
    /// random bits (32 hex digits, or 22 letters and digits): export
    /// IDEM_CONSOLE_TOKEN=$(openssl rand -hex 32), then --listen
    /// 0.0.0.0:8080; open the console once at /?token=SECRET and the
    /// browser keeps it. Every write attempt, refused or not, is logged to
    /// stderr with who made it. Stops at Ctrl-C.
    Console(ConsoleArgs),
}

impl Command {
    /// The database URL it was given (`--database-url` or `DATABASE_URL`):
    /// what every message is cleared of passwords against.
    pub fn database_url(&self) -> Option<&str> {
        let database = match self {
            Command::Audit(args) => &args.database,
            Command::Migrate(args) => &args.table.database,
            Command::Claims(ClaimsCommand::List(args)) => &args.table.database,
            Command::Claims(
                ClaimsCommand::Show(ShowArgs { claim, .. })
                | ClaimsCommand::Release(ReleaseArgs { claim, .. })
                | ClaimsCommand::Resolve(ResolveArgs { claim, .. }),
            ) => &claim.table.database,
            Command::Prune(args) => &args.table.database,
            Command::Console(args) => &args.table.database,
        };
        database.database_url.as_deref()
    }

    /// The format its output is in: text, unless `--format json`.
    pub fn format(&self) -> Format {
        let format = match self {
            Command::Audit(args) => &args.format,
            Command::Migrate(args) => &args.format,
            Command::Claims(ClaimsCommand::List(args)) => &args.format,
            Command::Claims(ClaimsCommand::Show(args)) => &args.format,
            Command::Claims(ClaimsCommand::Release(args)) => &args.format,
            Command::Claims(ClaimsCommand::Resolve(args)) => &args.format,
            Command::Prune(args) => &args.format,
            Command::Console(_) => return Format::Text,
        };
        format.format
    }
}

/// `idem console`.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// The address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Let operators resolve and release claims (each asks to confirm).
    #[arg(long)]
    pub allow_writes: bool,
    /// The token every request must present: required to listen beyond
    /// loopback; at least 128 random bits (openssl rand -hex 32). Prefer
    /// the environment variable: a flag shows in `ps`.
    #[arg(
        long,
        env = "IDEM_CONSOLE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

/// `--database-url`, on every subcommand.
#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// The PostgreSQL to use, e.g. postgres://app@localhost:5432/app.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<String>,
}

/// Where idem's own table is, for the commands that work on it:
/// `--database-url` and `--schema`.
#[derive(Debug, Args)]
pub struct TableArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The schema that holds idem_records (default: the connection's search_path).
    #[arg(long, value_name = "SCHEMA")]
    pub schema: Option<String>,
}

/// `--format`.
#[derive(Debug, Args)]
pub struct FormatArgs {
    /// text for people, json for scripts.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// `idem audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// A schema to audit; repeat for several (default: every schema but
    /// pg_catalog, information_schema, pg_toast* and pg_temp*).
    #[arg(long = "schema", value_name = "SCHEMA")]
    pub schemas: Vec<String>,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// `idem migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Only verify: change nothing (for a role without DDL rights, or CI).
    #[arg(long, conflicts_with_all = ["partitions", "distributed"])]
    pub check: bool,
    /// Create idem_records hash-partitioned on account into N partitions
    /// (1 to 1024; 16 suits most). Only where the table does not exist yet:
    /// an existing table is never re-partitioned, and a different layout is
    /// an error that changes nothing.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub partitions: Option<u16>,
    /// On a Citus coordinator: create idem_records distributed by account
    /// (Citus's citus.shard_count shards), or distribute an empty one. A
    /// table holding rows is never moved at start-up: the error says how.
    #[arg(long, conflicts_with = "partitions")]
    pub distributed: bool,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// `idem claims ...`.
#[derive(Debug, Subcommand)]
pub enum ClaimsCommand {
    /// List claims, newest first.
    List(ListArgs),
    /// Show every field of one claim, and its steps (idem::step): each
    /// one's address, state, fence, times and the size of its value.
    Show(ShowArgs),
    /// Delete a pending claim, so the next retry of its action runs.
    ///
    /// Only for a claim whose invocation is gone (crashed, killed, cancelled):
    /// if it is still running, it loses its claim and a retry may run the
    /// action a second time. Settled claims are never released.
    Release(ReleaseArgs),
    /// Settle a claim in doubt (or a stale pending one) by hand, once you
    /// know what happened: it succeeded, it failed, or nothing happened.
    ///
    /// --succeeded keeps the slot forever as a success (with --output, the
    /// value a replaying action returns to its retries); --failed keeps it
    /// as a definite failure (retries are refused); --release deletes it
    /// (the next retry runs the action). Only a claim that is in doubt or
    /// pending is resolved, and only while its fence is the one shown:
    /// never a success, never a kept failure.
    Resolve(ResolveArgs),
}

/// Which account and namespace a claim lives in.
#[derive(Debug, Args)]
pub struct ScopeArgs {
    /// Only this account.
    #[arg(long, value_name = "ACCOUNT")]
    pub account: Option<String>,
    /// Only this namespace.
    #[arg(long, value_name = "NAMESPACE", conflicts_with = "no_namespace")]
    pub namespace: Option<String>,
    /// Only claims without a namespace.
    #[arg(long)]
    pub no_namespace: bool,
}

/// The one claim `show`, `release` and `resolve` act on: its address, where
/// idem's table is, and the scope that picks it when the address is claimed
/// in several.
///
/// Flattened after a command's own flags and before `--format`, so that
/// `--help` lists the connection and scope options in between, as it always
/// has (the address is positional wherever it is declared).
#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// The claim's address (claim_ followed by 24 hex digits).
    pub address: String,
    #[command(flatten)]
    pub table: TableArgs,
    #[command(flatten)]
    pub scope: ScopeArgs,
}

/// `--state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Claimed, outcome not recorded yet (running, or crashed).
    Pending,
    /// Settled: the action succeeded.
    Success,
    /// The outcome is unknown: held until a reconciler or `claims resolve`
    /// settles it.
    #[value(name = "in_doubt")]
    InDoubt,
    /// A definite failure, kept: retries are refused.
    Failed,
}

impl From<StateArg> for ClaimState {
    fn from(state: StateArg) -> ClaimState {
        match state {
            StateArg::Pending => ClaimState::Pending,
            StateArg::Success => ClaimState::Success,
            StateArg::InDoubt => ClaimState::InDoubt,
            StateArg::Failed => ClaimState::Failed,
        }
    }
}

/// `idem claims list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub table: TableArgs,
    #[command(flatten)]
    pub scope: ScopeArgs,
    /// Only claims in this state. A holder that vanished under
    /// `on_expiry = "in_doubt"` leaves its claim `pending`, its lease run
    /// out, until a retry turns it `in_doubt`: find those with `--state
    /// pending --older-than` the lease (`claims show` prints
    /// `lease_expires_at`).
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only claims older than this, e.g. 10m, 2h, 3days: claims in doubt
    /// by how long they have been in doubt, others by when they were
    /// claimed.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// At most this many claims, newest first; when more match, a line on
    /// stderr says how many.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Print only how many claims match (all of them, whatever --limit).
    #[arg(long)]
    pub count: bool,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// `idem claims show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub claim: ClaimArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// `idem claims release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Really release it; without this, only say what would be released.
    #[arg(long)]
    pub yes: bool,
    #[command(flatten)]
    pub claim: ClaimArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// `idem claims resolve`.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("resolution")
        .required(true)
        .args(["succeeded", "failed", "release"])
))]
pub struct ResolveArgs {
    /// The action's effect happened: keep the slot as a success.
    #[arg(long)]
    pub succeeded: bool,
    /// With --succeeded: the value to replay to retries, as JSON (what the
    /// action would have returned), e.g. '{"receipt":"r_1"}'.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["failed", "release"])]
    pub output: Option<String>,
    /// It definitely failed: keep the slot as failed; retries are refused.
    #[arg(long)]
    pub failed: bool,
    /// Nothing happened: delete the claim, so the next retry runs the action.
    #[arg(long)]
    pub release: bool,
    /// Really resolve it; without this, only say what would be done.
    #[arg(long)]
    pub yes: bool,
    #[command(flatten)]
    pub claim: ClaimArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// `idem prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Delete claims settled before this: YYYY-MM-DD (midnight UTC) or an
    /// RFC 3339 instant such as 2024-05-01T12:00:00Z. Their slots open
    /// again: a retry of one of them runs. A claim whose action keeps its
    /// slot for a window (`keep_slot_for`) is deleted only once its window
    /// is over, whatever this says.
    #[arg(long, value_name = "DATE", value_parser = parse_instant, required_unless_present = "expired")]
    pub settled_before: Option<Timestamp>,
    /// Delete the claims whose slot's window (`keep_slot_for`) is over:
    /// their slots are open already. Every prune deletes them; with this
    /// alone, nothing else (claims kept for ever stay).
    #[arg(long)]
    pub expired: bool,
    /// Only this account.
    #[arg(long, value_name = "ACCOUNT")]
    pub account: Option<String>,
    /// Really delete; without this, only count what would be deleted.
    #[arg(long)]
    pub yes: bool,
    /// Only count what would be deleted, per account, and exit 0.
    #[arg(long, conflicts_with = "yes")]
    pub dry_run: bool,
    /// Claims a batch covers, about (each batch is its own transaction: its
    /// locks and WAL are bounded by this).
    #[arg(long, value_name = "N", default_value = "10000", value_parser = parse_batch_size)]
    pub batch_size: NonZeroU32,
    /// Pause between batches, e.g. 50ms, to leave room for the workload and
    /// for replicas to keep up.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub pause: Duration,
    /// Times a batch is tried again after the connection or the server is
    /// lost (pauses of 0.25 s, doubling, up to 8 s) before stopping.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub retries: u32,
    #[command(flatten)]
    pub table: TableArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `--state` takes a state as the store spells it (and as `claims list`
    /// prints it), so the two spellings must not drift apart.
    #[test]
    fn each_state_argument_is_spelled_as_the_state_is_stored() {
        for argument in StateArg::value_variants() {
            let name = argument
                .to_possible_value()
                .map(|value| value.get_name().to_owned());
            let state = ClaimState::from(*argument);
            assert_eq!(name.as_deref(), Some(state.as_str()));
            assert_eq!(ClaimState::parse(state.as_str()), Some(state));
        }
    }
}
