//! Shared by the integration tests: fresh PostgreSQL schemas, a TCP proxy
//! that injects faults, a throwaway cluster, a tracing capture, and the
//! history recorder and checker of the randomized tests.
#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod fault_proxy;
pub mod history;

#[allow(unused_imports)] // for the tests that cut the database off
pub use fault_proxy::Proxy;

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, PgPool};

/// Options for the test database, with `search_path` set to `schema`.
pub fn options_in(schema: &str) -> PgConnectOptions {
    let url = idem::testing::database_url();
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"));
    options.options([("search_path", schema)])
}

/// A schema of its own, empty, and a pool whose `search_path` is it: for
/// tests that set up, break or inspect idem's schema.
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

/// A pool whose connections carry `application_name`, so a test can find
/// (and kill) exactly its own backends.
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

/// Everything `tracing` printed in this test binary, from the first call of
/// [`Captured::global`] on. Global rather than scoped to one test: scoped
/// subscribers miss events whose callsites other tests' threads registered
/// first. Tests tell their lines apart by their gate's unique account.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn global() -> &'static Captured {
        static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
        CAPTURED.get_or_init(|| {
            let captured = Captured::default();
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter("idem=trace")
                .with_ansi(false)
                .with_writer(captured.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
            captured
        })
    }

    /// The captured lines that mention `needle`.
    pub fn lines_with(&self, needle: &str) -> String {
        let all = String::from_utf8_lossy(&self.0.lock().expect("captured")).into_owned();
        all.lines()
            .filter(|line| line.contains(needle))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("captured").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// The state of a claim row, straight from the table: `None` when absent.
pub async fn row_state(gate: &idem::Gate, address: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT state FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2 \
         AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("read idem_records")
}

/// How many claim rows an account holds, by state.
pub async fn count_rows(gate: &idem::Gate, state: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE account = $1 AND kind = 'claim' AND state = $2",
    )
    .bind(gate.account_name())
    .bind(state)
    .fetch_one(gate.pool())
    .await
    .expect("count idem_records")
}

/// Terminates every backend whose `application_name` is `name` (see
/// [`named_pool`]), from a connection of `admin`; returns how many died.
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

/// A tiny deterministic PRNG (xorshift64*), so a randomized test can print
/// its seed and be replayed without a dependency.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> XorShift {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// A seed from `variable` when set (to replay a run), else from the clock.
    pub fn seed_from_env(variable: &str) -> u64 {
        match std::env::var(variable) {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|e| panic!("{variable}={text} is not a u64 seed: {e}")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |elapsed| elapsed.as_nanos() as u64),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0), close enough for test workloads.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
