//! Schemas of a test's own on the shared server: for tests that set up,
//! break or inspect idem's schema without touching anyone else's.

use std::str::FromStr;
use std::time::Duration;

use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, Executor, PgConnection, PgPool};

/// Options for the test database ([`idem::testing::database_url`]), with
/// `search_path` set to `schema`.
///
/// # Panics
/// When `DATABASE_URL` is not a PostgreSQL URL.
pub fn options_in(schema: &str) -> PgConnectOptions {
    let url = idem::testing::database_url();
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"));
    options.options([("search_path", schema)])
}

/// A schema of its own, empty, and a pool whose `search_path` is it.
///
/// # Panics
/// When no PostgreSQL answers or the schema cannot be created.
pub async fn fresh_schema(max_connections: u32) -> (String, PgPool) {
    let admin = idem::testing::pool_with(1).await;
    let schema = idem::testing::unique_name("idem_t");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("cannot create schema {schema}: {e}"));
    admin.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(20))
        .connect_with(options_in(&schema))
        .await
        .unwrap_or_else(|e| panic!("cannot connect into schema {schema}: {e}"));
    (schema, pool)
}

/// `name` as an SQL identifier, always quoted.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates the schemas `names` (only these are ever dropped again).
///
/// # Panics
/// When one cannot be created.
pub async fn create_schemas(conn: &mut PgConnection, names: &[&str]) {
    for name in names {
        let sql = format!("CREATE SCHEMA {}", ident(name));
        conn.execute(sqlx::AssertSqlSafe(sql))
            .await
            .unwrap_or_else(|e| panic!("cannot create schema {name}: {e}"));
    }
}

/// Drops the schemas `names`, which the test created.
///
/// # Panics
/// When one cannot be dropped.
pub async fn drop_schemas(conn: &mut PgConnection, names: &[&str]) {
    for name in names {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", ident(name));
        conn.execute(sqlx::AssertSqlSafe(sql))
            .await
            .unwrap_or_else(|e| panic!("cannot drop schema {name}: {e}"));
    }
}

/// Runs `sql` (several statements) on `conn`.
///
/// # Panics
/// When a statement fails, showing the SQL.
pub async fn run_sql(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"));
}
