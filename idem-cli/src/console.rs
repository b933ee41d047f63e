//! `idem console`: serves the operator console
//! ([`idem_console`]) until Ctrl-C, with `idem audit` behind its
//! audit page and every write's audit line on stderr.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;
use idem_console::{Audit, Console, Operator, TOKEN_MIN_BITS, check_token};
use sqlx::PgPool;

use crate::audit;
use crate::cli::ConsoleArgs;
use crate::error::CliError;

/// How many connections the console's pool may open: a page's few
/// statements run at once, and a few browsers may look at once.
pub const POOL_SIZE: u32 = 4;

/// `idem audit`'s findings, as the command prints them.
struct CommandAudit;

impl Audit for CommandAudit {
    fn findings<'a>(
        &'a self,
        pool: &'a PgPool,
    ) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async move {
            audit::audit(pool, &[])
                .await
                .map(|report| audit::render::text(&report))
                .map_err(|error| error.to_string())
        })
    }
}

/// Refuses to listen beyond loopback without a token, and to take a token
/// too short to resist guessing (on loopback too: with a token, the token
/// is all that keeps a page elsewhere out).
pub fn check(args: &ConsoleArgs) -> Result<(), CliError> {
    let token = args.token.as_deref().filter(|t| !t.is_empty());
    if !args.listen.ip().is_loopback() && token.is_none() {
        return Err(CliError::Usage(format!(
            "--listen {} is beyond loopback: anyone who reaches it could read (and with \
             --allow-writes, resolve) claims. Give it a token of at least {TOKEN_MIN_BITS} random \
             bits: export IDEM_CONSOLE_TOKEN=$(openssl rand -hex 32), then idem console --listen \
             {}, and open it once at /?token=<that token>",
            args.listen, args.listen
        )));
    }
    if let Some(token) = args.token.as_deref()
        && let Err(weak) = check_token(token)
    {
        return Err(CliError::Usage(format!(
            "{weak}, e.g. export IDEM_CONSOLE_TOKEN=$(openssl rand -hex 32) before starting \
             idem console again{}",
            if args.listen.ip().is_loopback() {
                " (or give no token, to answer loopback names only)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Serves the console on `args.listen` over `pool` until Ctrl-C.
pub async fn serve(pool: PgPool, args: &ConsoleArgs) -> Result<(), CliError> {
    check(args)?;
    let mut console = Console::new(pool.clone())
        .allow_writes(args.allow_writes)
        .audit(CommandAudit);
    let how = match args.token.as_deref() {
        Some(token) => {
            console = console.token(token);
            "token holder"
        }
        None => "loopback user",
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|error| {
            CliError::Usage(format!(
                "cannot listen on {}: {error} (is another program on that port? pick another \
                 with --listen)",
                args.listen
            ))
        })?;
    let address = listener.local_addr().unwrap_or(args.listen);
    let router = console
        .router()
        .layer(axum::middleware::from_fn(move |request, next| {
            name_operator(how, request, next)
        }));
    eprintln!(
        "idem console: http://{address}/{} ({}); Ctrl-C stops it",
        if args.token.is_some() {
            "?token=<your token>"
        } else {
            ""
        },
        if args.allow_writes {
            "writes allowed"
        } else {
            "read-only"
        },
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .map_err(|error| CliError::Usage(format!("the console stopped: {error}")))?;
    pool.close().await;
    Ok(())
}

/// Names who made a request, for the console's audit lines: how they got
/// in, and from where.
async fn name_operator(how: &'static str, mut request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| *peer);
    let name = match peer {
        Some(peer) => format!("{how} at {peer}"),
        None => how.to_owned(),
    };
    request.extensions_mut().insert(Operator(name));
    next.run(request).await
}
