//! Runs one parsed command: connect, do the work, render the result.

use idem_runtime::operations::ClaimState;
use sqlx::PgPool;

use crate::audit;
use crate::claims::{self, ListFilter, NamespaceFilter, ScopeFilter};
use crate::cli::{ClaimsCommand, Command, ScopeArgs, TableArgs};
use crate::connect::connect;
use crate::error::CliError;
use crate::migrate;
use crate::output::Format;
use crate::prune;

/// What a command that ran to the end prints, and whether it found
/// something wrong (audit findings, schema problems): exit status 1.
#[derive(Debug)]
pub struct Done {
    /// For stdout.
    pub output: String,
    /// Exit with 1 rather than 0.
    pub found: bool,
    /// A line for stderr beside the output (what a script reading stdout
    /// must not parse, and a person must not miss): that a list was cut.
    pub note: Option<String>,
}

impl Done {
    fn clean(output: String) -> Done {
        Done {
            output,
            found: false,
            note: None,
        }
    }
}

/// Runs `command`.
pub async fn run(command: Command) -> Result<Done, CliError> {
    match command {
        Command::Audit(args) => {
            let pool = connect(args.database.database_url.as_deref(), None).await?;
            let report = audit::audit(&pool, &args.schemas).await?;
            pool.close().await;
            let output = match args.format.format {
                Format::Text => audit::render::text(&report),
                Format::Json => audit::render::json(&report)?,
            };
            Ok(Done {
                output,
                found: report.lets_duplicates_in(),
                note: None,
            })
        }
        Command::Migrate(args) => {
            let schema = args.table.schema.as_deref();
            let pool = connect(args.table.database.database_url.as_deref(), schema).await?;
            let action = match (args.check, args.partitions, args.distributed) {
                (true, _, _) => migrate::Action::Check,
                (false, _, true) => migrate::Action::SetUpDistributed,
                (false, None, false) => migrate::Action::SetUp,
                (false, Some(partitions), false) => migrate::Action::SetUpPartitioned(partitions),
            };
            let report = migrate::migrate(&pool, schema, action).await?;
            pool.close().await;
            Ok(Done {
                output: migrate::render(&report, args.format.format)?,
                found: !report.ok(),
                note: None,
            })
        }
        Command::Claims(ClaimsCommand::List(args)) => {
            let filter = ListFilter::new()
                .scope(scope(&args.scope))
                .state(args.state.map(ClaimState::from))
                .older_than(args.older_than)
                .limit(args.limit);
            if args.count {
                let count =
                    on_table(&args.table, async |pool| claims::count(pool, &filter).await).await?;
                return Ok(Done::clean(claims::render_count(
                    count,
                    args.format.format,
                )?));
            }
            let listed = on_table(&args.table, async |pool| {
                claims::list_counted(pool, &filter).await
            })
            .await?;
            Ok(Done {
                output: claims::render_list(&listed.claims, args.format.format)?,
                found: false,
                note: listed.cut_note(),
            })
        }
        Command::Claims(ClaimsCommand::Show(args)) => {
            let claim = &args.claim;
            claims::check_address(&claim.address)?;
            let (found, steps) = on_table(&claim.table, async |pool| {
                let found = claims::find(pool, &claim.address, &scope(&claim.scope)).await?;
                let steps = claims::steps(pool, &found).await?;
                Ok((found, steps))
            })
            .await?;
            Ok(Done::clean(claims::render_claim(
                &found,
                &steps,
                args.format.format,
            )?))
        }
        Command::Claims(ClaimsCommand::Release(args)) => {
            let claim = &args.claim;
            claims::check_address(&claim.address)?;
            let released = on_table(&claim.table, async |pool| {
                claims::release(pool, &claim.address, &scope(&claim.scope), args.yes).await
            })
            .await?;
            Ok(Done::clean(claims::render_released(
                &released,
                args.format.format,
            )?))
        }
        Command::Claims(ClaimsCommand::Resolve(args)) => {
            let claim = &args.claim;
            claims::check_address(&claim.address)?;
            let resolution = claims::resolution(&args)?;
            let resolved = on_table(&claim.table, async |pool| {
                claims::resolve(
                    pool,
                    &claim.address,
                    &scope(&claim.scope),
                    resolution,
                    args.yes,
                )
                .await
            })
            .await?;
            Ok(Done::clean(claims::render_resolved(
                &resolved,
                args.format.format,
            )?))
        }
        Command::Console(args) => {
            crate::console::check(&args)?;
            let pool = crate::connect::connect_with(
                args.table.database.database_url.as_deref(),
                args.table.schema.as_deref(),
                crate::console::POOL_SIZE,
            )
            .await?;
            claims::ensure_table(&pool).await?;
            crate::console::serve(pool, &args).await?;
            Ok(Done::clean(String::new()))
        }
        Command::Prune(args) => {
            let outcome =
                on_table(&args.table, async |pool| prune::prune(pool, &args).await).await?;
            Ok(Done::clean(prune::render(&outcome, args.format.format)?))
        }
    }
}

/// Connects to the database `table` names (`search_path` set to its schema
/// when it names one), fails, saying what to do, when idem_records is not
/// there, runs `work`, and closes the connection: the life of every command
/// that reads or changes claims.
async fn on_table<T>(
    table: &TableArgs,
    work: impl AsyncFnOnce(&PgPool) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let pool = connect(
        table.database.database_url.as_deref(),
        table.schema.as_deref(),
    )
    .await?;
    claims::ensure_table(&pool).await?;
    let done = work(&pool).await?;
    pool.close().await;
    Ok(done)
}

fn scope(args: &ScopeArgs) -> ScopeFilter<'_> {
    ScopeFilter::new()
        .account(args.account.as_deref())
        .namespace(match (&args.namespace, args.no_namespace) {
            (Some(name), _) => NamespaceFilter::Named(name),
            (None, true) => NamespaceFilter::Without,
            (None, false) => NamespaceFilter::Any,
        })
}
