//! A throwaway PostgreSQL cluster of a test's own, in a temporary
//! directory, so that the test can restart it cleanly and crash it without
//! touching the server the other tests use. Stopped and removed on drop.

#[path = "../../examples/support/server_binaries.rs"]
mod server_binaries;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use idem::sqlx::postgres::PgConnectOptions;
use server_binaries::{is_root, server_binaries, server_command};

pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// initdb refuses to run as root: then everything runs as `postgres`.
    as_postgres: bool,
    port: u16,
}

impl Cluster {
    /// Creates and starts one, or panics saying what to install. Blocking:
    /// call it from `spawn_blocking`.
    pub fn start() -> Cluster {
        let bin = server_binaries().unwrap_or_else(|| {
            panic!(
                "this test needs PostgreSQL's server binaries (initdb, pg_ctl) on PATH or under \
                 /usr/lib/postgresql/*/bin: install them (Debian/Ubuntu: `apt-get install \
                 postgresql`; macOS: `brew install postgresql`)"
            )
        });
        let as_postgres = is_root();
        let dir = std::env::temp_dir().join(idem::testing::unique_name("idem-cluster"));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        let cluster = Cluster {
            dir,
            bin,
            as_postgres,
            port,
        };
        if as_postgres {
            run(Command::new("chown").arg("postgres").arg(&cluster.dir));
        }
        run(cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.data())
            .args(["-U", "postgres", "--auth=trust", "--no-sync"]));
        cluster.pg_ctl(&["start"]);
        cluster
    }

    /// Connection options for its `postgres` database.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// A clean restart (`pg_ctl restart -m fast`): sessions are ended,
    /// everything committed is kept. Blocking.
    pub fn restart(&self) {
        self.pg_ctl(&["-m", "fast", "restart"]);
    }

    /// A crash (`pg_ctl stop -m immediate`, then start after `down`): no
    /// shutdown checkpoint, and WAL not yet written by the WAL writer (an
    /// asynchronous commit's) is lost; the start replays the rest.
    /// Blocking.
    pub fn crash(&self, down: Duration) {
        self.pg_ctl(&["-m", "immediate", "stop"]);
        std::thread::sleep(down);
        self.pg_ctl(&["start"]);
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `pg_ctl` with `arguments`, waiting until it is done.
    fn pg_ctl(&self, arguments: &[&str]) {
        // pg_ctl hands `-o` to a shell: quote the socket directory. A
        // throwaway cluster needs no durability against the machine
        // crashing (fsync off); a crash of the server alone still loses
        // what the WAL writer had not written.
        let options = format!(
            "-p {} -k '{}' -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40",
            self.port,
            self.dir.display()
        );
        let mut command = self.command("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-o", &options, "-w", "-t", "60"])
            .args(arguments);
        run(&mut command);
    }

    fn command(&self, program: &str) -> Command {
        server_command(&self.bin, program, self.as_postgres, &self.dir)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `command`; its stdout, or a panic with its output.
fn run(command: &mut Command) -> String {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("could not run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
