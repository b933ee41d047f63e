//! A PostgreSQL cluster of our own: `initdb` into a directory, `pg_ctl
//! start` on a port, trust authentication for `postgres` on 127.0.0.1.
//!
//! One implementation for every use: a test that restarts and crashes its
//! own server ([`Cluster::start`]), and the `pg-cluster` tool behind
//! `scripts/ensure-postgres` and `scripts/pg-matrix`, which leaves its
//! cluster running ([`Cluster::keep_running`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use std::{fs, io};

use idem::sqlx::postgres::PgConnectOptions;
use idem::testing::server;

use crate::binaries::{Binaries, BinariesError};
use crate::process::{self, ProcessError};

/// Why a cluster could not be set up or started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No server binaries to run.
    #[error(transparent)]
    Binaries(#[from] BinariesError),
    /// `initdb` or `pg_ctl` failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The server did not start; its log says why.
    #[error("PostgreSQL in {} did not start: {source}\nserver log:\n{log}", .dir.display())]
    Start {
        /// The cluster's directory.
        dir: PathBuf,
        /// What `pg_ctl` said.
        #[source]
        source: ProcessError,
        /// The server's log.
        log: String,
    },
    /// A directory or port could not be had.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

/// How to lay out and start a cluster: [`Setup::throwaway`] for the usual
/// case, its fields for the rest.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The server binaries; their major version is the cluster's.
    pub binaries: Binaries,
    /// The cluster's directory: its data directory is `data` inside, its
    /// socket and `server.log` are in it.
    pub dir: PathBuf,
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    /// The server's `max_connections`: a test suite running in parallel,
    /// each test with a small pool, needs more than the default 100.
    pub max_connections: u32,
    /// `fsync`: off for a cluster whose data does not outlive the run (a
    /// crash of the server alone still loses what the WAL writer had not
    /// written); on for one that is reused from run to run.
    pub fsync: bool,
    /// Further server settings, each passed as `-c name=value` on every
    /// start (`shared_preload_libraries=citus`, say): none by default.
    pub settings: Vec<(String, String)>,
}

impl Setup {
    /// The machine's binaries (else the pinned build, fetched once), a
    /// fresh temporary directory, a free port, `fsync` off.
    pub fn throwaway() -> Result<Setup, ClusterError> {
        let binaries = Binaries::find()?;
        let dir = std::env::temp_dir().join(idem::testing::unique_name("idem-cluster"));
        Ok(Setup {
            binaries,
            dir,
            port: free_port()?,
            max_connections: 40,
            fsync: false,
            settings: Vec::new(),
        })
    }

    /// Creates the cluster unless `dir` already holds one of the same major
    /// version (another major's is recreated), starts it and waits until it
    /// accepts connections. Blocking.
    pub fn start(self) -> Result<Cluster, ClusterError> {
        fs::create_dir_all(&self.dir).map_err(|source| ClusterError::Io {
            what: format!("create {}", self.dir.display()),
            source,
        })?;
        // From here on, dropping `cluster` stops whatever was started.
        let cluster = Cluster {
            setup: self,
            keep: false,
        };
        cluster.setup.binaries.own(&cluster.setup.dir)?;
        cluster.initdb()?;
        cluster.start_again()?;
        Ok(cluster)
    }
}

/// A running cluster. Dropped, it is stopped and its directory removed,
/// unless [`Cluster::keep_running`] let it go.
#[derive(Debug)]
pub struct Cluster {
    setup: Setup,
    keep: bool,
}

impl Cluster {
    /// A throwaway cluster ([`Setup::throwaway`]), started. Blocking: call
    /// it from `spawn_blocking` in async code.
    ///
    /// # Panics
    /// When it cannot be started, saying what to install.
    pub fn start() -> Cluster {
        Setup::throwaway()
            .and_then(Setup::start)
            .unwrap_or_else(|error| panic!("a throwaway PostgreSQL cluster: {error}"))
    }

    /// Its URL, for the `postgres` user and database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.setup.port)
    }

    /// Its TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.setup.port
    }

    /// Connection options for its `postgres` database.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.setup.port)
            .username("postgres")
            .database("postgres")
    }

    /// The binaries it runs.
    pub fn binaries(&self) -> &Binaries {
        &self.setup.binaries
    }

    /// A clean restart (`pg_ctl restart -m fast`): sessions are ended,
    /// everything committed is kept. Blocking.
    ///
    /// # Panics
    /// When the server does not come back.
    pub fn restart(&self) {
        self.pg_ctl(&["-m", "fast", "restart"])
            .unwrap_or_else(|error| panic!("restart the cluster: {error}"));
    }

    /// A crash (`pg_ctl stop -m immediate`, then start after `down`): no
    /// shutdown checkpoint, and WAL not yet written by the WAL writer (an
    /// asynchronous commit's) is lost; the start replays the rest.
    /// Blocking.
    ///
    /// # Panics
    /// When the server does not stop or come back.
    pub fn crash(&self, down: Duration) {
        self.stop_immediately()
            .unwrap_or_else(|error| panic!("crash the cluster: {error}"));
        std::thread::sleep(down);
        self.start_again()
            .unwrap_or_else(|error| panic!("start the crashed cluster: {error}"));
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`), as a crash
    /// would: [`Cluster::start_again`] brings it back. Blocking.
    pub fn stop_immediately(&self) -> Result<(), ClusterError> {
        self.pg_ctl(&["-m", "immediate", "stop"])?;
        Ok(())
    }

    /// Starts the server (`pg_ctl start`) and waits until it accepts
    /// connections; an error carries its log. Blocking.
    pub fn start_again(&self) -> Result<(), ClusterError> {
        self.pg_ctl(&["start"])
            .map_err(|source| ClusterError::Start {
                dir: self.setup.dir.clone(),
                source,
                log: fs::read_to_string(self.log()).unwrap_or_default(),
            })?;
        Ok(())
    }

    /// Lets it run on after this process is gone; its URL. Stop it with
    /// [`stop`].
    pub fn keep_running(mut self) -> String {
        self.keep = true;
        self.url()
    }

    /// Its data directory.
    fn data(&self) -> PathBuf {
        self.setup.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.setup.dir.join("server.log")
    }

    /// `initdb`, unless the data directory already holds a cluster of the
    /// binaries' major version.
    fn initdb(&self) -> Result<(), ClusterError> {
        let data = self.data();
        let major = self.setup.binaries.major()?;
        match fs::read_to_string(data.join("PG_VERSION")) {
            Ok(made_by) if made_by.trim() == major => return Ok(()),
            _ => {
                let _ = fs::remove_dir_all(&data);
            }
        }
        process::output_of(
            self.setup
                .binaries
                .command("initdb", &self.setup.dir)
                .args(server::initdb_arguments(&data)),
        )?;
        Ok(())
    }

    /// `pg_ctl` with `arguments`, waiting until it is done.
    fn pg_ctl(&self, arguments: &[&str]) -> Result<String, ProcessError> {
        // pg_ctl hands `-o` to a shell: server_options quotes. The log
        // file keeps the server off our stdout, so a caller capturing it
        // does not wait on the server.
        let Setup {
            dir,
            port,
            max_connections,
            fsync,
            settings,
            ..
        } = &self.setup;
        let fsync = if *fsync { "on" } else { "off" };
        let settings: Vec<(String, String)> = [
            ("fsync".to_owned(), fsync.to_owned()),
            ("max_connections".to_owned(), max_connections.to_string()),
        ]
        .into_iter()
        .chain(settings.iter().cloned())
        .collect();
        let options = server::server_options(*port, Some(dir.as_path()), &settings);
        process::output_of(
            self.setup
                .binaries
                .command("pg_ctl", dir)
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.log())
                .args(["-o", &options, "-w", "-t", "60"])
                .args(arguments),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        stop(&self.setup.binaries, &self.setup.dir);
        let _ = fs::remove_dir_all(&self.setup.dir);
    }
}

/// Stops the cluster in `dir` at once (`pg_ctl stop -m immediate`), if one
/// runs there. Blocking.
pub fn stop(binaries: &Binaries, dir: &Path) {
    let _ = binaries
        .command("pg_ctl", dir)
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-m", "immediate", "-w", "stop"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A port nobody listens on now (the OS picks it).
pub fn free_port() -> Result<u16, ClusterError> {
    server::free_port().map_err(|source| ClusterError::Io {
        what: "find a free port".to_owned(),
        source,
    })
}
