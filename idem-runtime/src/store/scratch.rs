//! For the store's own tests: a connection to the tests' PostgreSQL
//! (found or started as `testing::database_url` does it, by
//! `crate::test_server`) whose `search_path` is a fresh schema of the
//! test's own, dropped after. Not through `crate::testing`, which sits
//! above the store and needs its feature.

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// A connection in a schema of its own.
pub(super) struct Scratch {
    pub conn: PgConnection,
    schema: String,
}

impl Scratch {
    /// A fresh, empty schema named after `prefix`. Fails (never skips) when
    /// no PostgreSQL answers.
    pub(super) async fn new(prefix: &str) -> Scratch {
        let url = crate::test_server::url_or_exit();
        let mut conn = PgConnection::connect(url).await.unwrap_or_else(|error| {
            panic!(
                "this test could not connect to the PostgreSQL at {} ({error}); set \
                 DATABASE_URL to a server you can use",
                crate::test_server::redacted(url)
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
