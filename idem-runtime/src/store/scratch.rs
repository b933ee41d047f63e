//! For the store's own tests: a connection to a real PostgreSQL
//! (`DATABASE_URL`, or the local default) whose `search_path` is a fresh
//! schema of the test's own, dropped after. Not through `crate::testing`,
//! which sits above the store.

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// Where the tests look for PostgreSQL when `DATABASE_URL` is not set.
const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A connection in a schema of its own.
pub(super) struct Scratch {
    pub conn: PgConnection,
    schema: String,
}

impl Scratch {
    /// A fresh, empty schema named after `prefix`. Fails (never skips) when
    /// no PostgreSQL answers.
    pub(super) async fn new(prefix: &str) -> Scratch {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
        let mut conn = PgConnection::connect(&url).await.unwrap_or_else(|error| {
            panic!(
                "this test needs PostgreSQL and none answered at {url} ({error}); start one, or \
                 point DATABASE_URL at one"
            )
        });
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let schema = format!("{prefix}_{}_{nanos}", std::process::id());
        conn.execute(AssertSqlSafe(format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema}"
        )))
        .await
        .expect("create a schema of the test's own");
        Scratch { conn, schema }
    }

    /// Drops the schema and everything in it.
    pub(super) async fn drop(mut self) {
        let drop = format!("DROP SCHEMA {} CASCADE", self.schema);
        self.conn
            .execute(AssertSqlSafe(drop))
            .await
            .expect("drop the test's schema");
    }
}
