//! The database an example or benchmark works in, found the one way the
//! tests find theirs (`idem::testing::server`): `DATABASE_URL` as it is;
//! else a server at the default address that lets user `postgres` in, or
//! else the tests' throwaway server (started, and its binaries fetched,
//! if need be; `IDEM_THROWAWAY=1` goes straight there), in a database of
//! the example's own, dropped when it ends.

use std::error::Error;
use std::process::ExitCode;

use idem::sqlx::postgres::PgPoolOptions;
use idem::sqlx::{self, PgPool};
use idem::testing::server::databases::OwnDatabase;

/// A database to work in; keep it alive as long as it is used: dropping
/// it drops a database created for it.
pub struct Database {
    /// The connection URL.
    pub url: String,
    own: OwnDatabase,
}

impl Database {
    /// A pool of at most `max_connections` connections to it.
    pub async fn pool(&self, max_connections: u32) -> Result<PgPool, sqlx::Error> {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url)
            .await
    }

    /// One line saying where it is.
    pub fn describe(&self) -> String {
        self.own.describe()
    }
}

/// How an example's `main` ends: its error printed, and a failure status.
/// `main` returns rather than exits, so that its database is dropped on the
/// way out.
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
    let own = tokio::task::spawn_blocking(OwnDatabase::create).await??;
    println!("database: {}", own.describe());
    Ok(Database {
        url: own.url().to_owned(),
        own,
    })
}
