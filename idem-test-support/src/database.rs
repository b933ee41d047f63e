//! Finds a PostgreSQL for the examples and benchmarks, so `cargo run
//! --example quickstart` works on a fresh machine. In order:
//!
//! 1. `DATABASE_URL`, when set (and then nothing else is tried);
//! 2. a server answering at [`LOCAL_URL`], the default local port;
//! 3. the tests' shared throwaway server, when it is running
//!    ([`idem::testing::database_url`] starts it and leaves it running): the
//!    same server the tests use, rather than a second one beside it;
//! 4. a throwaway [`Cluster`] started from the local PostgreSQL binaries in a
//!    temporary directory, stopped and removed when [`Database`] is dropped;
//! 5. otherwise an error that says what to install or set.
//!
//! `IDEM_QUICKSTART_NO_LOCAL=1` skips steps 2 and 3: it exercises step 4 on
//! a machine whose own server is running.

use std::env;
use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use idem::sqlx::postgres::PgPoolOptions;
use idem::sqlx::{self, Connection, PgConnection, PgPool};

use idem::testing::server::redacted;

use crate::cluster::{Cluster, Setup};

/// Where a PostgreSQL installed from a package usually answers.
pub const LOCAL_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database to connect to; keep it alive as long as it is used.
pub struct Database {
    /// The connection URL.
    pub url: String,
    /// The throwaway server behind `url`, if one was started.
    _server: Option<Cluster>,
}

impl Database {
    /// A pool of at most `max_connections` connections to it.
    pub async fn pool(&self, max_connections: u32) -> Result<PgPool, sqlx::Error> {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url)
            .await
    }
}

/// How an example's `main` ends: its error printed, and a failure status.
/// `main` returns rather than exits, so that a throwaway server it started
/// is stopped and removed on the way out.
pub fn exit_code(outcome: Result<(), Box<dyn Error>>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Finds a database (see the module docs) and prints one line saying which.
pub async fn find() -> Result<Database, Box<dyn Error>> {
    if let Ok(url) = env::var("DATABASE_URL") {
        // Asked for by name: no fallback, but say why it does not answer
        // rather than let a pool time out later.
        answers(&url)
            .await
            .map_err(|why| format!("DATABASE_URL ({}) does not answer: {why}", redacted(&url)))?;
        println!("database: DATABASE_URL ({})", redacted(&url));
        return Ok(Database { url, _server: None });
    }
    let skip_local = env::var_os("IDEM_QUICKSTART_NO_LOCAL").is_some();
    let local = if skip_local {
        Err("skipped: IDEM_QUICKSTART_NO_LOCAL is set".to_owned())
    } else {
        answers(LOCAL_URL).await
    };
    if local.is_ok() {
        println!("database: the local server at {LOCAL_URL}");
        return Ok(Database {
            url: LOCAL_URL.to_owned(),
            _server: None,
        });
    }
    let shared = if skip_local {
        None
    } else {
        tokio::task::spawn_blocking(idem::testing::server::shared_if_running).await?
    };
    if let Some(url) = shared {
        println!("database: the tests' throwaway PostgreSQL at {url} (left running by them)");
        return Ok(Database { url, _server: None });
    }
    let server = tokio::task::spawn_blocking(|| Setup::throwaway()?.start())
        .await?
        .map_err(|why| {
            format!(
                "the quickstart needs a PostgreSQL and could not find or start one:\n  \
             - DATABASE_URL is not set\n  \
             - {LOCAL_URL} did not answer ({})\n  \
             - {why}\n\
             Either install PostgreSQL (Debian/Ubuntu: `apt-get install postgresql`; \
             macOS: `brew install postgresql`), or point DATABASE_URL at a server:\n  \
             DATABASE_URL=postgres://USER:PASSWORD@HOST:5432/DBNAME cargo run --example quickstart",
                local.err().unwrap_or_default(),
            )
        })?;
    let url = server.url();
    let version = server
        .binaries()
        .version()
        .unwrap_or_else(|_| "?".to_owned());
    println!("database: a throwaway PostgreSQL {version} at {url} (removed on exit)");
    Ok(Database {
        url,
        _server: Some(server),
    })
}

/// `Ok` when a connection to `url` opens within a few seconds.
async fn answers(url: &str) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(3), PgConnection::connect(url)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("no answer within 3 s".to_owned()),
    }
}
