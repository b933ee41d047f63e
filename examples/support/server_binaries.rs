//! PostgreSQL's server binaries, for a throwaway cluster: where they are,
//! and how to run them (as `postgres` when we are root, since `initdb`
//! refuses root). Shared by the examples' database finder and by the
//! restart test in `tests/faults.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fs};

/// The directory holding `initdb` and `pg_ctl`: the first on `PATH`, else
/// the highest version under `/usr/lib/postgresql` (Debian and Ubuntu keep
/// them off `PATH`).
pub fn server_binaries() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let path = env::var_os("PATH").unwrap_or_default();
    if let Some(dir) = env::split_paths(&path).find(|dir| has_both(dir)) {
        return Some(dir);
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version = name
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// `true` when this process runs as root: the server binaries must then run
/// as `postgres`.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `program` from `bin`, run in `dir`, through `runuser -u postgres` when
/// `as_postgres`.
pub fn server_command(bin: &Path, program: &str, as_postgres: bool, dir: &Path) -> Command {
    let program = bin.join(program);
    let mut command = if as_postgres {
        let mut runuser = Command::new("runuser");
        runuser.args(["-u", "postgres", "--"]).arg(program);
        runuser
    } else {
        Command::new(program)
    };
    command.current_dir(dir);
    command
}
