//! `pg-cluster ensure`: a PostgreSQL answering where idem's tests look for
//! one, started if need be. In order:
//!
//! 1. something already answers on the port: say what, done;
//! 2. else the machine's own cluster (Debian/Ubuntu: the newest version in
//!    `/etc/postgresql`, cluster `main`), when it is configured for the port;
//! 3. else a cluster of our own under `$TMPDIR/idem-ci-pg/<port>`, reused on
//!    the next run. It keeps running; the last line printed says how to stop
//!    it.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use idem::sqlx::{Connection, PgConnection};
use idem_test_support::binaries::{self, Binaries};
use idem_test_support::cluster::Setup;
use idem_test_support::process;

use crate::{BoxError, SUITE_CONNECTIONS};

/// How long a started server may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// Makes sure a PostgreSQL answers on `port`, and prints its URL.
pub async fn ensure(port: u16) -> Result<(), BoxError> {
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    if listening(port) {
        return describe(&url).await;
    }
    eprintln!("pg-cluster: nothing answers on 127.0.0.1:{port}; starting PostgreSQL");
    if let Some(version) = machine_cluster_for(port) {
        eprintln!("pg-cluster: starting the machine's cluster {version}/main");
        let started = process::output_of(Command::new("pg_ctlcluster").args([
            "--skip-systemctl-redirect",
            &version,
            "main",
            "start",
        ]));
        match started {
            Ok(_) if wait_listening(port) => return describe(&url).await,
            Ok(_) => {
                return Err(format!(
                    "cluster {version}/main started but does not answer on 127.0.0.1:{port} \
                     after {} s; its log is under /var/log/postgresql",
                    READY_WITHIN.as_secs()
                )
                .into());
            }
            Err(error) => eprintln!(
                "pg-cluster: could not start cluster {version}/main ({error}); creating a cluster \
                 of our own"
            ),
        }
    }
    let dir = std::env::temp_dir().join("idem-ci-pg");
    let binaries = Binaries::local()?;
    let stop = stop_command(&binaries, &dir.join(port.to_string()));
    tokio::task::spawn_blocking(move || own_cluster(binaries, dir, port)).await??;
    describe(&url).await?;
    eprintln!("pg-cluster: stop it with: {stop}");
    Ok(())
}

/// Our own cluster, in `parent/<port>`: reused when its data directory is
/// of the binaries' major version, and left running.
fn own_cluster(binaries: Binaries, parent: PathBuf, port: u16) -> Result<(), BoxError> {
    fs::create_dir_all(&parent)?;
    binaries.own(&parent)?;
    let setup = Setup {
        binaries,
        dir: parent.join(port.to_string()),
        port,
        max_connections: SUITE_CONNECTIONS,
        // Reused from run to run: a machine crash must not corrupt it.
        fsync: true,
        settings: Vec::new(),
    };
    setup.start()?.keep_running();
    Ok(())
}

/// Which server answers at `url`, or why the tests' URL does not get in;
/// prints the URL.
async fn describe(url: &str) -> Result<(), BoxError> {
    let mut connection = PgConnection::connect(url).await.map_err(|error| {
        format!(
            "a server answers, but {url} does not get in: {error}\nAllow it (pg_hba.conf: host \
             all postgres 127.0.0.1/32 trust) or point DATABASE_URL elsewhere."
        )
    })?;
    let version: String = idem::sqlx::query_scalar("SELECT version()")
        .fetch_one(&mut connection)
        .await?;
    let _ = connection.close().await;
    eprintln!("pg-cluster: {url} answers: {version}");
    println!("{url}");
    Ok(())
}

/// The newest version in `/etc/postgresql` whose cluster `main` listens on
/// `port`, when `pg_ctlcluster` can start it.
fn machine_cluster_for(port: u16) -> Option<String> {
    if !process::succeeds(Command::new("sh").args(["-c", "command -v pg_ctlcluster"])) {
        return None;
    }
    let newest = binaries::versioned_entries(Path::new("/etc/postgresql")).pop()?;
    let version = newest.file_name()?.to_string_lossy().into_owned();
    let conf = newest.join("main/postgresql.conf");
    let configured = fs::read_to_string(conf).ok()?;
    (configured_port(&configured) == port).then_some(version)
}

/// The last `port = N` of a `postgresql.conf`, else PostgreSQL's 5432.
fn configured_port(conf: &str) -> u16 {
    conf.lines()
        .rev()
        .find_map(|line| {
            let (name, value) = line.split_once('=')?;
            if name.trim() != "port" {
                return None;
            }
            let digits: String = value
                .trim()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or(5432)
}

/// `true` when something accepts TCP connections on `port`.
fn listening(port: u16) -> bool {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok()
}

fn wait_listening(port: u16) -> bool {
    let deadline = Instant::now() + READY_WITHIN;
    while Instant::now() < deadline {
        if listening(port) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    false
}

/// The command line that stops the cluster in `dir`.
fn stop_command(binaries: &Binaries, dir: &Path) -> String {
    let runuser = if binaries.as_postgres() {
        "runuser -u postgres -- "
    } else {
        ""
    };
    format!(
        "{runuser}{} -D {} -m fast stop",
        binaries.dir().join("pg_ctl").display(),
        dir.join("data").display()
    )
}

#[cfg(test)]
mod tests {
    use super::configured_port;

    #[test]
    fn the_last_port_setting_wins_and_comments_are_ignored() {
        let conf = "#port = 5433\nport = 5434 # first\nport=5435\t# second\n";
        assert_eq!(configured_port(conf), 5435);
        assert_eq!(configured_port("listen_addresses = '*'"), 5432);
    }
}
