//! Shared by the integration tests: the real `idem` binary, a real
//! PostgreSQL, and schemas of their own.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{Connection, Executor, PgConnection};

/// `DATABASE_URL`, or the local server the workspace's tests use.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A connection to the test database.
///
/// # Panics
/// When no PostgreSQL answers, saying how to start one.
pub async fn connect() -> PgConnection {
    let url = database_url();
    let attempt = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url)).await;
    match attempt {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => no_database(&url, &error.to_string()),
        Err(_) => no_database(&url, "no answer within 10 s"),
    }
}

fn no_database(url: &str, error: &str) -> ! {
    panic!(
        "idem-cli's tests need a PostgreSQL, and none answered at {url}: {error}\n\
         Start one: `scripts/ensure-postgres` (starts the machine's cluster, or a throwaway one, \
         on 127.0.0.1:5432), or on Debian `pg_ctlcluster <version> main start`; or point \
         DATABASE_URL at a server you have."
    )
}

/// A schema name no other test, process or run uses.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// `name` as an SQL identifier, always quoted.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates the schemas `names` (only these are ever dropped again).
pub async fn create_schemas(conn: &mut PgConnection, names: &[&str]) {
    for name in names {
        let sql = format!("CREATE SCHEMA {}", ident(name));
        conn.execute(sqlx::AssertSqlSafe(sql))
            .await
            .unwrap_or_else(|e| panic!("cannot create schema {name}: {e}"));
    }
}

/// Drops the schemas `names`, which the test created.
pub async fn drop_schemas(conn: &mut PgConnection, names: &[&str]) {
    for name in names {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", ident(name));
        conn.execute(sqlx::AssertSqlSafe(sql))
            .await
            .unwrap_or_else(|e| panic!("cannot drop schema {name}: {e}"));
    }
}

/// Runs `sql` (several statements) on `conn`.
pub async fn run_sql(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"));
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts the exit status, showing everything the binary said otherwise.
    pub fn expect_code(self, code: i32) -> Run {
        assert_eq!(
            self.code, code,
            "exit status {} (expected {code})\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs `idem ARGS` with `DATABASE_URL` pointing at the test database.
pub fn idem(args: &[&str]) -> Run {
    idem_with(args, Some(&database_url()))
}

/// Runs `idem ARGS` with `DATABASE_URL` set to `url`, or unset.
pub fn idem_with(args: &[&str], url: Option<&str>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.args(args);
    match url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run idem: {e}"));
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
