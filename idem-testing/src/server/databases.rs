//! Databases of the tests' and the examples' own, so nothing of idem's
//! lands in a database of the user's. On a server found at the default
//! address or started as a throwaway (never on one `DATABASE_URL` names,
//! which is used as it is):
//!
//! - a test run works in `idem_test_<host>_<run>` ([`for_this_run`]): every
//!   test binary of one `cargo test` (or `nextest`) shares it, whoever asks
//!   first creates it;
//! - an example works in `idem_example_<host>_<pid>` ([`OwnDatabase`]),
//!   dropped when it ends.
//!
//! Each creation first drops the databases of this machine's runs and
//! examples whose process has ended (the last run's stays until the next
//! one; `<host>` keeps two machines sharing a server out of each other's).

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::str::FromStr;

use sha1::{Digest as _, Sha1};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _, Executor as _, PgConnection};

use super::{Found, Server, block_on, redacted, run_id};

/// The prefix of a test run's database.
pub const TEST_PREFIX: &str = "idem_test";

/// The prefix of an example's database.
pub const EXAMPLE_PREFIX: &str = "idem_example";

/// The URL of this run's database on `server`, created unless it is there.
pub fn for_this_run(server: &Server) -> Result<String, String> {
    create(server, &name(TEST_PREFIX, run_id()))
}

/// A database of one process's own, for an example: created by
/// [`OwnDatabase::create`] on the tests' [`server`](super::server), and
/// dropped (its connections ended first) when this is dropped. With
/// `DATABASE_URL` set, that database as it is, left alone.
#[derive(Debug)]
pub struct OwnDatabase {
    server: Server,
    /// Its name, when it was created here (and is dropped here).
    name: Option<String>,
    url: String,
}

impl OwnDatabase {
    /// Finds the server as the tests do and creates
    /// `idem_example_<host>_<pid>` there. Blocks.
    pub fn create() -> Result<OwnDatabase, String> {
        let server = super::server().clone()?;
        if server.found == Found::Named {
            return Ok(OwnDatabase {
                url: server.url.clone(),
                server,
                name: None,
            });
        }
        let name = name(EXAMPLE_PREFIX, std::process::id());
        let url = create(&server, &name)?;
        Ok(OwnDatabase {
            server,
            name: Some(name),
            url,
        })
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One line saying where it is, for a person.
    pub fn describe(&self) -> String {
        match &self.name {
            None => self.server.describe(),
            Some(name) => format!(
                "{}, in a database of its own ({name}, dropped on exit)",
                self.server.describe()
            ),
        }
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            // On exit: a failure leaves a database the next creation drops.
            let _ = drop_database(&self.server.url, name);
        }
    }
}

/// `<prefix>_<host>_<owner>`: lowercase letters, digits and `_`, so it
/// needs no quoting anywhere.
fn name(prefix: &str, owner: u32) -> String {
    format!("{prefix}_{}_{owner}", host_tag())
}

/// Six hex digits of this machine's name: two machines (or containers)
/// sharing one server never take the other's databases for their own.
fn host_tag() -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let digest = Sha1::digest(host.trim().as_bytes());
    digest[..3]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// `server_url` with its database replaced by `name`.
pub fn with_database(server_url: &str, name: &str) -> Result<String, String> {
    let mut url = url::Url::parse(server_url)
        .map_err(|e| format!("{} is not a URL: {e}", redacted(server_url)))?;
    url.set_path(&format!("/{name}"));
    Ok(url.into())
}

/// Creates `name` on `server` unless it is there, after dropping what
/// ended runs and examples left; its URL.
fn create(server: &Server, name: &str) -> Result<String, String> {
    let url = with_database(&server.url, name)?;
    let options = PgConnectOptions::from_str(&server.url).map_err(|e| e.to_string())?;
    let shown = redacted(&server.url);
    block_on(async move {
        let mut conn = options
            .connect()
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        sweep(&mut conn).await;
        let created = conn
            .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await;
        let _ = conn.close().await;
        match created {
            Ok(_) => Ok(()),
            Err(error) if is_duplicate(&error) => Ok(()),
            Err(error) => Err(format!(
                "could not create the database {name} on {shown} ({error}): let user postgres \
                 create databases there, or set DATABASE_URL to a database idem may use"
            )),
        }
    })??;
    Ok(url)
}

/// There already (42P04), or created by another process at the same
/// moment (the catalog's unique index, 23505).
fn is_duplicate(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|code| code == "42P04" || code == "23505")
}

/// Drops `name` on the server at `server_url`, ending its connections first
/// (`DROP DATABASE ... WITH (FORCE)` is PostgreSQL 13's; this works on 12).
pub fn drop_database(server_url: &str, name: &str) -> Result<(), String> {
    let options = PgConnectOptions::from_str(server_url).map_err(|e| e.to_string())?;
    let name = name.to_owned();
    block_on(async move {
        let mut conn = options.connect().await.map_err(|e| e.to_string())?;
        let dropped = drop_on(&mut conn, &name).await;
        let _ = conn.close().await;
        dropped
    })?
}

async fn drop_on(conn: &mut PgConnection, name: &str) -> Result<(), String> {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(name)
    .execute(&mut *conn)
    .await
    .map_err(|e| e.to_string())?;
    conn.execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Drops the databases this machine's ended runs and examples left, and
/// nobody is connected to. Best effort: what cannot be dropped now is tried
/// again next time.
async fn sweep(conn: &mut PgConnection) {
    // A database someone is connected to is in use, whatever its name says:
    // its owner may run where this process cannot see it (another PID
    // namespace sharing the machine's name).
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database WHERE datname LIKE 'idem\\_%' \
         AND datname NOT IN (SELECT datname FROM pg_stat_activity WHERE datname IS NOT NULL)",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    let host = host_tag();
    for name in names {
        let Some(owner) = owner_of(&name, &host) else {
            continue;
        };
        if owner != run_id() && owner != std::process::id() && alive(owner) == Some(false) {
            let _ = drop_on(conn, &name).await;
        }
    }
}

/// The process a database of ours on `host` belongs to: the `<owner>` of
/// `idem_test_<host>_<owner>` or `idem_example_<host>_<owner>`.
fn owner_of(name: &str, host: &str) -> Option<u32> {
    let rest = [TEST_PREFIX, EXAMPLE_PREFIX]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix)?.strip_prefix('_'))?;
    let owner = rest.strip_prefix(host)?.strip_prefix('_')?;
    owner
        .chars()
        .all(|c| c.is_ascii_digit())
        .then(|| owner.parse().ok())
        .flatten()
}

/// Whether process `pid` runs on this machine; `None` when that cannot be
/// told (then nothing is dropped).
fn alive(pid: u32) -> Option<bool> {
    if Path::new("/proc/self").exists() {
        return Some(Path::new(&format!("/proc/{pid}")).exists());
    }
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()
        .map(|status| status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_named_for_its_kind_host_and_owner_and_read_back() {
        let host = host_tag();
        assert_eq!(host.len(), 6);
        let test = name(TEST_PREFIX, 4242);
        assert_eq!(test, format!("idem_test_{host}_4242"));
        assert_eq!(owner_of(&test, &host), Some(4242));
        assert_eq!(owner_of(&name(EXAMPLE_PREFIX, 7), &host), Some(7));
        // Another machine's, a user's own, and look-alikes are not ours.
        assert_eq!(owner_of(&test, "000000"), None);
        for other in [
            "idem_test",
            "idem_partitioned",
            "idem_test_x_1",
            &format!("idem_test_{host}_1x"),
            &format!("idem_test_{host}_"),
        ] {
            assert_eq!(owner_of(other, &host), None, "{other}");
        }
    }

    #[test]
    fn the_database_is_swapped_in_the_url_and_the_rest_kept() {
        assert_eq!(
            with_database(
                "postgres://postgres@127.0.0.1:5432/postgres",
                "idem_test_a_1"
            )
            .expect("a URL"),
            "postgres://postgres@127.0.0.1:5432/idem_test_a_1"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1?sslmode=disable", "d").expect("a URL"),
            "postgres://u:p@h:1/d?sslmode=disable"
        );
    }

    /// Whether database `name` exists on the server at `server_url`.
    fn exists(server_url: &str, name: &str) -> bool {
        let options = PgConnectOptions::from_str(server_url).expect("the server's URL");
        let name = name.to_owned();
        block_on(async move {
            let mut conn = options.connect().await.expect("connect to the server");
            let found: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
                    .bind(&name)
                    .fetch_optional(&mut conn)
                    .await
                    .expect("read pg_database");
            found.is_some()
        })
        .expect("a runtime")
    }

    /// The tests' server, as every test finds it.
    fn the_server() -> Server {
        super::super::url_or_exit();
        super::super::server().clone().expect("resolved above")
    }

    #[test]
    fn an_example_works_in_a_database_of_its_own_that_is_gone_when_it_ends() {
        let server = the_server();
        let own = OwnDatabase::create().expect("a database of its own");
        let Some(name) = own.name.clone() else {
            // DATABASE_URL names the database: used as it is, nothing made.
            assert_eq!(server.found, Found::Named);
            assert_eq!(own.url(), server.url);
            return;
        };
        assert_ne!(server.found, Found::Named);
        assert!(own.url().ends_with(&format!("/{name}")), "{}", own.url());
        assert!(exists(&server.url, &name), "{name} was created");
        drop(own);
        assert!(
            !exists(&server.url, &name),
            "{name} is dropped when it ends"
        );
    }

    #[test]
    fn what_ended_runs_left_is_dropped_and_nothing_else() {
        let server = the_server();
        if server.found == Found::Named {
            // Nothing is created or dropped on a server DATABASE_URL names
            // (`for_this_run` is never called for it): see the test above.
            return;
        }
        // A pid that ran and ended; pid 1 runs as long as the machine does.
        let mut ended = Command::new("true").spawn().expect("run true");
        let ended_pid = ended.id();
        ended.wait().expect("true ends");
        let left = name(TEST_PREFIX, ended_pid);
        let live = name(EXAMPLE_PREFIX, 1);
        let users = "idem_test_of_a_user";
        let options = PgConnectOptions::from_str(&server.url).expect("the server's URL");
        let planted = [left.clone(), live.clone(), users.to_owned()];
        block_on(async move {
            let mut conn = options.connect().await.expect("connect");
            for name in &planted {
                conn.execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .await
                    .expect("plant a database");
            }
        })
        .expect("a runtime");
        let url = for_this_run(&server).expect("this run's database");
        let (left_kept, live_kept, users_kept) = (
            exists(&server.url, &left),
            exists(&server.url, &live),
            exists(&server.url, users),
        );
        for name in [&live, users] {
            drop_database(&server.url, name).expect("clean up");
        }
        assert!(
            url.ends_with(&format!("/{}", name(TEST_PREFIX, run_id()))),
            "{url}"
        );
        assert!(!left_kept, "an ended run's database is dropped");
        assert!(live_kept, "a live process's database is kept");
        assert!(
            users_kept,
            "a database not named as idem's is never dropped"
        );
    }

    #[test]
    fn this_process_is_alive_and_an_unused_pid_is_not() {
        assert_eq!(alive(std::process::id()), Some(true));
        // Above Linux's largest pid_max.
        assert_eq!(alive(4_194_304 + 1), Some(false));
    }
}
