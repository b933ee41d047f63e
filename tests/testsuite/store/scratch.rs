//! For the store's tests: a connection to the tests' PostgreSQL (found or
//! started by `idem::testing::database_url`) whose `search_path` is a
//! fresh schema of the test's own, dropped after.

use std::time::{SystemTime, UNIX_EPOCH};

use idem::sqlx;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// A connection in a schema of its own.
pub(crate) struct Scratch {
    pub conn: PgConnection,
    schema: String,
}

impl Scratch {
    /// A fresh, empty schema named after `prefix`. Fails (never skips) when
    /// no PostgreSQL answers.
    pub(crate) async fn new(prefix: &str) -> Scratch {
        let url = idem::testing::database_url();
        let mut conn = PgConnection::connect(&url).await.unwrap_or_else(|error| {
            panic!(
                "this test could not connect to the PostgreSQL at {} ({error}); set \
                 DATABASE_URL to a server you can use",
                idem::shown::redacted(&url)
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
    pub(crate) async fn drop(mut self) {
        let drop = format!("DROP SCHEMA {} CASCADE", self.schema);
        self.conn
            .execute(AssertSqlSafe(drop))
            .await
            .expect("drop the test's schema");
    }
}
