//! `idem prune`: deleting settled claims in batches, each its own
//! transaction, through the runtime's [`Pruning`] (which holds every
//! statement); this module decides what to ask, when to stop and what to
//! say.
//!
//! - Without `--yes` (or with `--dry-run`) nothing is deleted: it counts.
//! - Each batch commits on its own, so stopping between two (Ctrl-C, a
//!   connection lost for good) leaves every finished batch deleted and
//!   nothing half-done; running the same command again prunes the rest,
//!   since what it deletes is exactly what still matches.
//! - A batch that fails because the connection or the server went away is
//!   tried again, after a pause that doubles each time, up to `--retries`
//!   times: the pool opens a new connection, and the batch reads its window
//!   again (deleting nothing twice).
//! - Ctrl-C lets the batch under way finish (it is bounded), then stops with
//!   exit status 130; a second Ctrl-C exits at once, and the batch under way
//!   commits or rolls back whole on the server.

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use idem_runtime::operations::{self, PruneFilter, Pruning};
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::watch;

use crate::cli::PruneArgs;
use crate::error::CliError;
use crate::output::{self, Format};
use crate::progress::Progress;

/// What a prune means for gates with a local outcome cache (feature
/// `cache`): they hold settled successes, and answer from them until their
/// time to live runs out, whatever the table says.
pub const PRUNED_AND_CACHES: &str = "Gates with a local outcome cache may keep refusing \
     retries of a pruned action from it for up to their cache's TTL.";

/// The exit status of a prune stopped by Ctrl-C (SIGINT): 128 + 2, as a
/// shell reports a process that SIGINT ended.
pub const INTERRUPTED_EXIT: u8 = 130;

/// The first pause before a failed batch is tried again; each next pause
/// doubles, up to [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// The longest pause between two tries of a batch.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(8);

/// How many settled claims `prune` removed.
#[derive(Debug, Serialize)]
pub struct Pruned {
    /// Claims deleted.
    pub deleted: u64,
    /// Claims compacted: successes past the window in which their value
    /// is kept, whose value, fingerprint and steps were deleted and whose
    /// identity was replaced by a check of it. Their slots stay.
    pub compacted: u64,
    /// The cut-off, RFC 3339 in UTC; null with `--expired` alone (only
    /// claims past their window).
    pub settled_before: Option<String>,
    /// The account pruned, or null for all.
    pub account: Option<String>,
    /// Batches run (each its own transaction).
    pub batches: u64,
    /// About how many claims a batch covered (`--batch-size`).
    pub batch_size: u32,
}

/// What `prune --dry-run` found.
#[derive(Debug, Serialize)]
pub struct WouldPrune {
    /// Claims a prune would delete now.
    pub would_delete: u64,
    /// Claims a prune would compact now (successes past the window in
    /// which their value is kept).
    pub would_compact: u64,
    /// The cut-off, RFC 3339 in UTC; null with `--expired` alone.
    pub settled_before: Option<String>,
    /// The account counted, or null for all.
    pub account: Option<String>,
    /// Per account, largest first.
    pub accounts: Vec<AccountCount>,
}

/// One account's prunable claims.
#[derive(Debug, Serialize)]
pub struct AccountCount {
    /// The account.
    pub account: String,
    /// Its claims a prune would delete.
    pub claims: u64,
}

/// What `idem prune` did: deleted, or counted.
#[derive(Debug)]
pub enum Outcome {
    /// `--yes`: deleted.
    Pruned(Pruned),
    /// `--dry-run`: counted.
    DryRun(WouldPrune),
}

/// The filter and its descriptions, from the command line.
struct Target<'a> {
    filter: PruneFilter<'a>,
    /// `2024-02-01T00:00:00Z`; `None`: only claims past their window.
    before: Option<String>,
    /// "in account acme" / "in every account".
    within: String,
}

impl<'a> Target<'a> {
    fn of(args: &'a PruneArgs) -> Result<Target<'a>, CliError> {
        let account = args.account.as_deref();
        let Some(cut) = args.settled_before else {
            return Ok(Target {
                filter: PruneFilter::expired().account(account),
                before: None,
                within: describe_account(account),
            });
        };
        let before = cut.to_string();
        let settled_before = SystemTime::try_from(cut).map_err(|error| {
            CliError::Usage(format!(
                "{before} is beyond what this system's clock can say ({error})"
            ))
        })?;
        Ok(Target {
            filter: PruneFilter::new(settled_before).account(account),
            before: Some(before),
            within: describe_account(account),
        })
    }
}

/// Runs `idem prune` on `pool`: counts (`--dry-run`, or without `--yes`,
/// which fails with the count), or deletes in batches.
pub async fn prune(pool: &PgPool, args: &PruneArgs) -> Result<Outcome, CliError> {
    let target = Target::of(args)?;
    if args.dry_run {
        return dry_run(pool, &target).await.map(Outcome::DryRun);
    }
    let count = operations::count_prunable(pool, &target.filter)
        .await
        .map_err(CliError::store("count the settled claims"))?;
    if !args.yes {
        return Err(CliError::NeedsConfirmation(format!(
            "would delete {count} settled claim{} ({}, {}).\n\
             A retry of a pruned action runs it again: prune only what can no longer be retried. \
             {PRUNED_AND_CACHES}\n\
             Re-run with --yes to delete them (--dry-run counts them per account).",
            plural(count),
            describe_cut(target.before.as_deref()),
            target.within,
        )));
    }
    let interrupted = on_interrupt();
    let mut pruning = Pruning::new(&target.filter, args.batch_size);
    let mut progress = Progress::new("pruned", count);
    let mut batches = 0;
    loop {
        if *interrupted.borrow() {
            let done = progress.done();
            progress.finish();
            return Err(CliError::Interrupted(format!(
                "interrupted: pruned {done} of ~{count} settled claim{} ({}, {}) \
                 in {batches} batches; every finished batch is deleted, none is half-done.\n\
                 Run the same command again to prune the rest.",
                plural(count),
                describe_cut(target.before.as_deref()),
                target.within,
            )));
        }
        let retries = Retries {
            left: args.retries,
            interrupted: interrupted.clone(),
        };
        let batch = match next_batch(pool, &mut pruning, retries, &progress).await {
            Ok(batch) => batch,
            Err((source, tried)) => {
                let done = progress.done();
                progress.finish();
                let next = if source.is_outage() {
                    format!(
                        "It was tried {tried} more time(s). Once the database answers again, run \
                         the same command again to continue."
                    )
                } else {
                    "Fix what the error says, then run the same command again to continue."
                        .to_owned()
                };
                return Err(CliError::Stopped {
                    doing: "delete a batch of settled claims",
                    source,
                    next,
                    progress: format!(
                        "pruned {done} of ~{count} settled claim{} ({}, {}) in \
                         {batches} batches before stopping; every finished batch is deleted, \
                         none is half-done",
                        plural(count),
                        describe_cut(target.before.as_deref()),
                        target.within,
                    ),
                });
            }
        };
        let Some(deleted) = batch else { break };
        batches += 1;
        progress.advance(deleted);
        if !args.pause.is_zero() {
            pause(args.pause, interrupted.clone()).await;
        }
    }
    let deleted = progress.done();
    progress.finish();
    Ok(Outcome::Pruned(Pruned {
        deleted,
        compacted: pruning.compacted(),
        settled_before: target.before,
        account: args.account.clone(),
        batches,
        batch_size: args.batch_size.get(),
    }))
}

/// Counts what a prune would delete, per account.
async fn dry_run(pool: &PgPool, target: &Target<'_>) -> Result<WouldPrune, CliError> {
    let accounts = operations::count_prunable_by_account(pool, &target.filter)
        .await
        .map_err(CliError::store("count the settled claims"))?;
    let would_compact = operations::count_compactable(pool, &target.filter)
        .await
        .map_err(CliError::store("count the claims to compact"))?;
    Ok(WouldPrune {
        would_delete: accounts.iter().map(|(_, claims)| claims).sum(),
        would_compact,
        settled_before: target.before.clone(),
        account: target.filter.account.map(str::to_owned),
        accounts: accounts
            .into_iter()
            .map(|(account, claims)| AccountCount { account, claims })
            .collect(),
    })
}

/// How many more times a failed batch may be tried, and the Ctrl-C that
/// ends the waiting.
struct Retries {
    left: u32,
    interrupted: watch::Receiver<bool>,
}

/// Runs the next batch, trying again after an outage as `retries` allows
/// (pauses of [`FIRST_RETRY_PAUSE`], doubling), saying so on `progress`:
/// the batch is safe to repeat. A Ctrl-C during a pause ends the waiting
/// with the last error. An error comes with the number of times the batch
/// was tried again.
async fn next_batch(
    pool: &PgPool,
    pruning: &mut Pruning,
    mut retries: Retries,
    progress: &Progress,
) -> Result<Option<u64>, (idem_runtime::Error, u32)> {
    let mut pause = FIRST_RETRY_PAUSE;
    let mut tried = 0;
    loop {
        let error = match pruning.next_batch(pool).await {
            Ok(batch) => return Ok(batch),
            Err(error) if retries.left > 0 && repeatable(&error) => error,
            Err(error) => return Err((error, tried)),
        };
        retries.left -= 1;
        tried += 1;
        progress.note(&format!(
            "a batch failed ({error}); trying it again in {:.2}s",
            pause.as_secs_f64()
        ));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = retries.interrupted.wait_for(|stop| *stop) => return Err((error, tried - 1)),
        }
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

/// Whether a failed batch is worth trying again: the server or the
/// connection went away (an outage, as the gate tells it), or PostgreSQL
/// rolled the batch back whole for a deadlock or a serialization failure.
/// Not an error of the request (a privilege, a missing table), which a
/// repeat meets again.
fn repeatable(error: &idem_runtime::Error) -> bool {
    let rolled_back = matches!(error, idem_runtime::Error::Database(sqlx::Error::Database(db))
        if db.code().is_some_and(|code| code == "40001" || code == "40P01"));
    rolled_back || error.is_outage()
}

/// Sleeps `pause`, or less if Ctrl-C comes first.
async fn pause(pause: Duration, mut interrupted: watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        _ = interrupted.wait_for(|stop| *stop) => {}
    }
}

/// Turns true at the first Ctrl-C (SIGINT); the second one exits at once
/// with [`INTERRUPTED_EXIT`].
fn on_interrupt() -> watch::Receiver<bool> {
    let (interrupt, interrupted) = watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            // No signal handling here: Ctrl-C keeps its default, an
            // immediate exit, which a batch survives whole.
            return;
        }
        let _ = interrupt.send(true);
        let _ = tokio::signal::ctrl_c().await;
        std::process::exit(i32::from(INTERRUPTED_EXIT));
    });
    interrupted
}

/// Which claims a prune takes, as its output says.
fn describe_cut(settled_before: Option<&str>) -> String {
    match settled_before {
        Some(before) => format!("settled before {before}, or past their window"),
        None => "past their window".to_owned(),
    }
}

/// The line that says how many claims were (or would be: `verb`)
/// compacted, if any.
fn describe_compacted(compacted: u64, verb: &str) -> String {
    if compacted == 0 {
        return String::new();
    }
    format!(
        "{verb} {compacted} claim{} past the window in which {} value{} kept: \
         {} slot{} still refuse{} duplicates\n",
        plural(compacted),
        if compacted == 1 { "its" } else { "their" },
        if compacted == 1 { " is" } else { "s are" },
        if compacted == 1 { "its" } else { "their" },
        plural(compacted),
        if compacted == 1 { "s" } else { "" },
    )
}

/// The output of `idem prune`.
pub fn render(outcome: &Outcome, format: Format) -> Result<String, CliError> {
    match (outcome, format) {
        (Outcome::Pruned(pruned), Format::Json) => output::json(pruned),
        (Outcome::DryRun(counted), Format::Json) => output::json(counted),
        (Outcome::Pruned(pruned), Format::Text) => Ok(format!(
            "deleted {} settled claim{} ({}, {})\n{}{PRUNED_AND_CACHES}\n",
            pruned.deleted,
            plural(pruned.deleted),
            describe_cut(pruned.settled_before.as_deref()),
            describe_account(pruned.account.as_deref()),
            describe_compacted(pruned.compacted, "compacted"),
        )),
        (Outcome::DryRun(counted), Format::Text) => {
            let mut text = format!(
                "would delete {} settled claim{} ({}, {}); nothing was deleted\n",
                counted.would_delete,
                plural(counted.would_delete),
                describe_cut(counted.settled_before.as_deref()),
                describe_account(counted.account.as_deref()),
            );
            text.push_str(&describe_compacted(counted.would_compact, "would compact"));
            if !counted.accounts.is_empty() {
                let rows: Vec<Vec<String>> = counted
                    .accounts
                    .iter()
                    .map(|count| vec![output::name(&count.account), count.claims.to_string()])
                    .collect();
                text.push_str(&output::table(&["ACCOUNT", "CLAIMS"], &rows));
            }
            Ok(text)
        }
    }
}

/// "in account acme" / "in every account"; the account as the command
/// shows a name (it is the operator's text, or the database's).
fn describe_account(account: Option<&str>) -> String {
    account.map_or_else(
        || "in every account".to_owned(),
        |account| format!("in account {}", output::name(account)),
    )
}

fn plural(count: u64) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// Parses `--batch-size`: 1 to 1,000,000.
pub fn parse_batch_size(text: &str) -> Result<NonZeroU32, String> {
    let size: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a batch size: write a whole number, e.g. 10000"))?;
    NonZeroU32::new(size)
        .filter(|size| size.get() <= 1_000_000)
        .ok_or_else(|| {
            format!(
                "a batch size of {size} is out of range: write 1 to 1000000, e.g. 10000 (the \
                 default: each batch then holds its row locks for tens of milliseconds)"
            )
        })
}
