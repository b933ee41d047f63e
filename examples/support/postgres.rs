//! Finds a PostgreSQL for the examples, so `cargo run --example quickstart`
//! works on a fresh machine. In order:
//!
//! 1. `DATABASE_URL`, when set (and then nothing else is tried);
//! 2. a server answering at [`LOCAL_URL`], the default local port;
//! 3. a throwaway server started from the local PostgreSQL binaries in a
//!    temporary directory, stopped and removed when [`Database`] is dropped;
//! 4. otherwise an error that says what to install or set.
//!
//! `IDEM_QUICKSTART_NO_LOCAL=1` skips step 2: it exercises step 3 on a
//! machine whose own server is running.

use std::error::Error;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use std::{env, fs};

use idem::sqlx::{Connection, PgConnection};

#[path = "server_binaries.rs"]
mod server_binaries;

use server_binaries::{is_root, server_binaries, server_command};

/// Where a PostgreSQL installed from a package usually answers.
pub const LOCAL_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database to connect to; keep it alive as long as it is used.
pub struct Database {
    /// The connection URL.
    pub url: String,
    /// The throwaway server behind `url`, if one was started.
    _server: Option<Throwaway>,
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
    let local = if env::var_os("IDEM_QUICKSTART_NO_LOCAL").is_some() {
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
    let server = Throwaway::start().map_err(|why| {
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
    println!(
        "database: a throwaway PostgreSQL {} at {} (removed on exit)",
        server.version, server.url
    );
    Ok(Database {
        url: server.url.clone(),
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

/// `url` with its password, if any, replaced by `***`.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// A PostgreSQL server of our own in a temporary directory. Dropping it stops
/// the server and removes the directory.
struct Throwaway {
    url: String,
    version: String,
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

impl Throwaway {
    fn start() -> Result<Throwaway, String> {
        let bin = server_binaries().ok_or(
            "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under \
             /usr/lib/postgresql/*/bin",
        )?;
        // initdb refuses to run as root, so as root the server runs as the
        // `postgres` user that the PostgreSQL packages create.
        let as_postgres = is_root();
        if as_postgres && !succeeds(Command::new("id").args(["-u", "postgres"])) {
            return Err(
                "running as root, where initdb refuses to run, and there is no \
                        `postgres` user to run it as"
                    .to_owned(),
            );
        }
        let version = output_of(Command::new(bin.join("pg_ctl")).arg("--version"))?
            .split_whitespace()
            .nth(2)
            .unwrap_or("(unknown version)")
            .to_owned();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        let dir = env::temp_dir().join(format!("idem-quickstart-{}-{nanos}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("could not create {}: {e}", dir.display()))?;
        // From here on, dropping `server` cleans up whatever was made.
        let mut server = Throwaway {
            url: String::new(),
            version,
            dir,
            bin,
            as_postgres,
        };
        if as_postgres {
            output_of(Command::new("chown").arg("postgres").arg(&server.dir))?;
        }
        let data = server.dir.join("data");
        output_of(server.command("initdb").arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        ]))?;
        let port = free_port()?;
        // pg_ctl hands `-o` to a shell: quote the socket directory.
        let options = format!(
            "-p {port} -k '{}' -c listen_addresses=127.0.0.1",
            server.dir.display()
        );
        let log = server.dir.join("server.log");
        let started = output_of(
            server
                .command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-o", &options, "-w", "-t", "30", "start"]),
        );
        if let Err(why) = started {
            let log = fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("{why}\nserver log:\n{log}"));
        }
        server.url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        Ok(server)
    }

    /// Runs one of the server binaries, as `postgres` when we are root.
    fn command(&self, program: &str) -> Command {
        server_command(&self.bin, program, self.as_postgres, &self.dir)
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        // Fast shutdown disconnects any client still connected. Before a
        // successful start there is nothing to stop, and pg_ctl says so.
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            eprintln!("could not remove {}: {error}", self.dir.display());
        }
    }
}

/// A port nobody listens on now (the OS picks it).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("could not find a free port: {e}"))
}

fn succeeds(command: &mut Command) -> bool {
    output_of(command).is_ok()
}

/// Runs `command` to completion; its stdout, or an error carrying its output.
fn output_of(command: &mut Command) -> Result<String, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run {program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!(
            "{program} {} failed ({}):\n{stdout}{stderr}",
            command
                .get_args()
                .map(|arg| arg.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            output.status
        ))
    }
}
