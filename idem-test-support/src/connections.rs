//! Connections to the test database that a test can tell apart: a single
//! connection for set-up, and pools whose backends a test can find and kill.

use std::str::FromStr;
use std::time::Duration;

use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, Connection, PgConnection, PgPool};

/// One connection to the test database ([`idem::testing::database_url`]).
///
/// # Panics
/// When no PostgreSQL answers, or it refuses the connection, saying why.
pub async fn connect() -> PgConnection {
    let url = idem::testing::database_url();
    let attempt = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url)).await;
    let error = match attempt {
        Ok(Ok(connection)) => return connection,
        Ok(Err(error)) => error.to_string(),
        Err(_) => "no answer within 10 s".to_owned(),
    };
    // database_url saw something listen there: say what it answered.
    panic!(
        "these tests could not connect to the PostgreSQL at {}: {error}; set DATABASE_URL to a \
         server you can use",
        idem::testing::server::redacted(&url)
    )
}

/// A pool whose connections carry `application_name`, so a test can find
/// (and kill, with [`terminate_backends`]) exactly its own backends.
///
/// # Panics
/// When no PostgreSQL answers.
pub async fn named_pool(application_name: &str, max_connections: u32) -> PgPool {
    let url = idem::testing::database_url();
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"))
        .application_name(application_name);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Terminates every backend whose `application_name` is `name` (see
/// [`named_pool`]), from a connection of `admin`; returns how many died.
///
/// # Panics
/// When the statement fails.
pub async fn terminate_backends(admin: &PgPool, name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(name)
    .fetch_one(admin)
    .await
    .unwrap_or_else(|e| panic!("terminate the backends of {name}: {e}"))
}

/// Terminates `name`'s backends (see [`named_pool`]) that wait on a lock;
/// returns how many died (0: none waits yet).
///
/// On one PostgreSQL a waiting backend says so in `pg_stat_activity`. On a
/// Citus coordinator it does not: the lock it waits on is held on the
/// worker that has the row, and the coordinator's backend waits on the
/// worker's answer. There `citus_lock_waits` names the waiting statement by
/// its global pid, which is the coordinator backend's node id and pid.
///
/// # Panics
/// When the statement fails.
pub async fn terminate_lock_waiters(admin: &PgPool, name: &str) -> i64 {
    const ON_POSTGRESQL: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
         FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'";
    const ON_CITUS: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) \
         FROM pg_stat_activity a \
         WHERE a.application_name = $1 \
           AND (a.wait_event_type = 'Lock' \
                OR citus_calculate_gpid((SELECT nodeid FROM pg_dist_node WHERE groupid = 0), \
                                        a.pid) IN (SELECT waiting_gpid FROM citus_lock_waits))";
    let on_citus: bool =
        sqlx::query_scalar("SELECT to_regclass('pg_catalog.citus_lock_waits') IS NOT NULL")
            .fetch_one(admin)
            .await
            .unwrap_or_else(|e| panic!("ask whether this is Citus: {e}"));
    sqlx::query_scalar(if on_citus { ON_CITUS } else { ON_POSTGRESQL })
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap_or_else(|e| panic!("terminate the lock waiters of {name}: {e}"))
}
