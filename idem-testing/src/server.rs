//! Where the tests' PostgreSQL comes from, and the throwaway server they
//! start when none answers (`idem::testing::server`). Not a stable API:
//! public only so that idem's own test support (the examples, the
//! `pg-cluster` tool) finds and runs the server binaries the same way.
//!
//! [`resolve`] decides, in order, and every test, example and script of
//! idem's goes through it:
//!
//! 1. `DATABASE_URL`, when set, and nothing else: used as it is; if nothing
//!    answers there, the error says so in one line;
//! 2. unless [`THROWAWAY_VAR`] is set, [`DEFAULT_URL_VAR`] or
//!    [`DEFAULT_DATABASE_URL`], when a server there lets us in (one that
//!    answers but refuses the login, as a fresh `apt-get install
//!    postgresql` does, is passed over with a notice);
//! 3. one throwaway server per user, shared by every test binary: data in
//!    `${TMPDIR:-/tmp}/idem-test-<uid>/`, started under a file lock so that
//!    test binaries running in parallel start exactly one, reused while it
//!    runs, and left running (one line on stderr, once per run, says where
//!    and how to stop it). Its binaries are the machine's, else a pinned
//!    build fetched once into a cache ([`fetch`]);
//! 4. otherwise an error, in one line, saying what to install or set.
//!
//! On a server found in steps 2 and 3, nothing is written into its
//! databases: each test run works in a database of its own
//! ([`databases`]), dropped by the next run.

pub mod databases;
pub mod fetch;

use std::env;
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

/// Where tests look for PostgreSQL when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Directories searched for the server binaries before `PATH` and
/// `/usr/lib/postgresql/*/bin`, separated like `PATH`.
pub const BIN_DIRS_VAR: &str = "IDEM_TEST_PG_BIN_DIRS";

/// Where to look for a running server when `DATABASE_URL` is not set,
/// instead of [`DEFAULT_DATABASE_URL`].
pub const DEFAULT_URL_VAR: &str = "IDEM_TEST_DEFAULT_URL";

/// Set (to anything but `0` or nothing), the tests and examples use the
/// throwaway server even when one answers at the default address: they
/// never touch a server of the user's unless `DATABASE_URL` names it.
pub const THROWAWAY_VAR: &str = "IDEM_THROWAWAY";

/// What to do when there is no server to be had, said at the end of every
/// such error.
pub(crate) const REMEDY: &str = "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql; macOS: brew \
                      install postgresql) or set DATABASE_URL=postgres://USER@HOST:PORT/DATABASE";

/// The server settings of the shared throwaway server: enough connections
/// for a suite running in parallel, each test with a small pool.
const SHARED_MAX_CONNECTIONS: u32 = 200;

/// The server the tests use, as [`resolve`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Its URL: `DATABASE_URL` as it is, or its maintenance database
    /// (`postgres`), where databases of the tests' own are created.
    pub url: String,
    /// How it was found.
    pub found: Found,
}

/// How [`resolve`] found the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// `DATABASE_URL` named it: used as it is, nothing created there.
    Named,
    /// It answered at the default address and let us in.
    Default,
    /// The shared throwaway server.
    Throwaway,
}

impl Server {
    /// One line saying which server this is, for a person.
    pub fn describe(&self) -> String {
        match self.found {
            Found::Named => format!("DATABASE_URL ({})", redacted(&self.url)),
            Found::Default => format!("the local server at {}", redacted(&self.url)),
            Found::Throwaway => format!("a throwaway PostgreSQL at {}", self.url),
        }
    }
}

/// [`resolve`], once per process: a test binary starts or finds its
/// server once, and when there is none every test fails at once with the
/// same line rather than each waiting out a timeout.
pub fn server() -> &'static Result<Server, String> {
    static RESOLVED: OnceLock<Result<Server, String>> = OnceLock::new();
    RESOLVED.get_or_init(resolve)
}

/// The URL the tests of this process use: `DATABASE_URL` as it is, else
/// this run's database on the [`server`] ([`databases::for_this_run`]),
/// created on first use. Once per process.
pub(crate) fn resolved() -> &'static Result<String, String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| {
        let server = server().as_ref().map_err(Clone::clone)?;
        match server.found {
            Found::Named => Ok(server.url.clone()),
            Found::Default | Found::Throwaway => databases::for_this_run(server),
        }
    })
}

/// [`resolved`]'s URL, or, when there is none, its reason printed on
/// stderr in one line and this process ended: every test in it needs a
/// database, and one line says more than hundreds of failures.
pub(crate) fn url_or_exit() -> &'static str {
    match resolved() {
        Ok(url) => url,
        Err(why) => {
            // Once: tests running in parallel threads all get here, and the
            // first to say it ends the process while the others wait.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                // Straight to the process's stderr: the test harness
                // captures what `eprintln!` prints inside a test.
                // One line, whatever the reason quotes (a URL, a server's
                // error text): a line break in it is escaped.
                let _ = writeln!(
                    io::stderr(),
                    "idem tests: {} (stopping: every test here needs a PostgreSQL)",
                    idem_runtime::shown::escaped_rendering(why)
                );
                std::process::exit(1)
            });
            // Not reached: `call_once` ended the process, or waits forever
            // for the thread that is ending it.
            std::process::exit(1)
        }
    }
}

fn throwaway_asked() -> bool {
    env::var(THROWAWAY_VAR).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// The server the tests use (see the module docs), or why there is none,
/// in one line.
pub fn resolve() -> Result<Server, String> {
    // Set but empty (`DATABASE_URL= cargo test`) reads as unset.
    if let Some(url) = env::var("DATABASE_URL").ok().filter(|url| !url.is_empty()) {
        // Asked for by name: no fallback, which would hide a typo.
        // The login too, not only the socket: a port where something
        // accepts and never answers PostgreSQL's startup (a forward to
        // nothing, a hung server) otherwise hands every test a URL that
        // fails each on its own.
        return match logs_in(&url) {
            Ok(()) => Ok(Server {
                url,
                found: Found::Named,
            }),
            Err(Login::NoAnswer(why)) => Err(format!(
                "DATABASE_URL={} does not answer ({why}): start that server, or unset \
                 DATABASE_URL to let the tests start a throwaway PostgreSQL",
                redacted(&url)
            )),
            Err(Login::Refused(why)) => Err(format!(
                "DATABASE_URL={} does not let the tests in ({why}): fix its user, password or \
                 database, or unset DATABASE_URL to let the tests start a throwaway PostgreSQL",
                redacted(&url)
            )),
        };
    }
    let default = env::var(DEFAULT_URL_VAR).unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let passed_over = if throwaway_asked() {
        format!("{THROWAWAY_VAR} is set")
    } else {
        match logs_in(&default) {
            Ok(()) => {
                return Ok(Server {
                    url: default,
                    found: Found::Default,
                });
            }
            Err(Login::NoAnswer(why)) => {
                format!("nothing answers at {} ({why})", redacted(&default))
            }
            Err(Login::Refused(why)) => format!(
                "the PostgreSQL at {} refused the login ({why}; set DATABASE_URL to use it)",
                redacted(&default)
            ),
        }
    };
    let url = shared_throwaway(&passed_over)
        .map_err(|why| format!("idem needs a PostgreSQL: {passed_over}, and {why}"))?;
    Ok(Server {
        url,
        found: Found::Throwaway,
    })
}

/// Why a server could not be logged in to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    /// Nothing accepts a connection there.
    NoAnswer(String),
    /// Something answers, and refused to let us in (a password wanted, no
    /// such user or database): PostgreSQL's words.
    Refused(String),
}

/// `Ok` when a server at `url` lets us in within a few seconds.
pub fn logs_in(url: &str) -> Result<(), Login> {
    answers(url).map_err(Login::NoAnswer)?;
    let options = PgConnectOptions::from_str(url).map_err(|e| Login::Refused(e.to_string()))?;
    block_on(async move {
        use sqlx::{ConnectOptions as _, Connection as _};
        match tokio::time::timeout(Duration::from_secs(10), options.connect()).await {
            Ok(Ok(connection)) => {
                let _ = connection.close().await;
                Ok(())
            }
            Ok(Err(error)) => Err(Login::Refused(error.to_string())),
            Err(_) => Err(Login::Refused(
                "no answer to the login within 10 s".to_owned(),
            )),
        }
    })
    .unwrap_or_else(|why| Err(Login::Refused(why)))
}

/// Runs `future` to completion on a runtime of its own, on a thread of its
/// own: callable from synchronous code and from inside another runtime
/// alike (the tests' resolution happens in either).
pub(crate) fn block_on<F>(future: F) -> Result<F::Output, String>
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|runtime| runtime.block_on(future))
                    .map_err(|e| format!("start a runtime: {e}"))
            })
            .join()
            .unwrap_or_else(|_| Err("the connecting thread panicked".to_owned()))
    })
}

/// `Ok` when something accepts a connection where `url` points, within a
/// few seconds. Only the socket is tried ([`logs_in`] also logs in).
pub fn answers(url: &str) -> Result<(), String> {
    let options =
        PgConnectOptions::from_str(url).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    let (host, port) = (options.get_host(), options.get_port());
    if let Some(socket) = options.get_socket().map(PathBuf::as_path).or_else(|| {
        // A host that is a path names the socket's directory.
        host.starts_with('/').then(|| Path::new(host))
    }) {
        return answers_on_socket(socket, port);
    }
    let addresses = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}:{port}: {e}"))?;
    let mut why = format!("{host}:{port} resolves to no address");
    for address in addresses {
        match TcpStream::connect_timeout(&address, Duration::from_secs(3)) {
            Ok(_) => return Ok(()),
            Err(e) => why = format!("{address}: {e}"),
        }
    }
    Err(why)
}

#[cfg(unix)]
fn answers_on_socket(socket: &Path, port: u16) -> Result<(), String> {
    // A directory holds the socket under PostgreSQL's name for it.
    let path = if socket.is_dir() {
        socket.join(format!(".s.PGSQL.{port}"))
    } else {
        socket.to_owned()
    };
    std::os::unix::net::UnixStream::connect(&path)
        .map(drop)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(not(unix))]
fn answers_on_socket(socket: &Path, _port: u16) -> Result<(), String> {
    Err(format!(
        "{}: Unix sockets need a Unix system",
        socket.display()
    ))
}

/// The directory holding the machine's server binaries (`initdb` and
/// `pg_ctl`): the first of [`BIN_DIRS_VAR`]'s, else the first on `PATH`,
/// else the highest version under `/usr/lib/postgresql` (Debian and Ubuntu
/// keep them off `PATH`).
pub fn local_binaries() -> Option<PathBuf> {
    let listed = |var: &str| {
        env::var_os(var)
            .map(|dirs| env::split_paths(&dirs).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    listed(BIN_DIRS_VAR)
        .into_iter()
        .chain(listed("PATH"))
        .find(|dir| has_server_tools(dir))
        .or_else(|| {
            versioned_entries(Path::new("/usr/lib/postgresql"))
                .into_iter()
                .map(|version| version.join("bin"))
                .rfind(|bin| has_server_tools(bin))
        })
}

fn has_server_tools(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// The entries of `dir` named by a version number (`9.6`, `15`), oldest
/// first by number (`9.6` before `10`); none when `dir` cannot be read.
/// PostgreSQL's packages lay out both their binaries and their clusters so.
pub fn versioned_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version = name
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            Some((version, entry.path()))
        })
        .collect();
    versions.sort();
    versions.into_iter().map(|(_, path)| path).collect()
}

/// `true` when this process runs as root, where `initdb` and `postgres`
/// refuse to run: they are then run as the `postgres` user.
pub fn is_root() -> bool {
    uid() == Some(0)
}

/// `true` when the `postgres` user the PostgreSQL packages create exists.
pub fn postgres_user_exists() -> bool {
    postgres_uid().is_some()
}

/// `runuser`: on `PATH`, else where Debian keeps it (`/usr/sbin`, `/sbin`,
/// off the `PATH` that `su` without `-` leaves root), else the bare name.
fn runuser() -> PathBuf {
    runuser_on(env::var_os("PATH").as_deref())
}

fn runuser_on(path: Option<&std::ffi::OsStr>) -> PathBuf {
    path.map(|dirs| env::split_paths(dirs).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("runuser"))
        .find(|program| program.is_file())
        .unwrap_or_else(|| PathBuf::from("runuser"))
}

/// `program` from `bin`, run in `dir`, as the `postgres` user when
/// `as_postgres` (through `runuser`, which needs no password as root).
pub fn command(bin: &Path, program: &str, as_postgres: bool, dir: &Path) -> Command {
    let program = bin.join(program);
    let mut command = if as_postgres {
        let mut runuser = Command::new(runuser());
        runuser.args(["-u", "postgres", "--"]).arg(program);
        runuser
    } else {
        Command::new(program)
    };
    command.current_dir(dir);
    command
}

/// `initdb`'s arguments for a cluster in `data`: user `postgres`, trust
/// authentication (the server listens on 127.0.0.1 only), no fsync of the
/// new files.
pub fn initdb_arguments(data: &Path) -> Vec<std::ffi::OsString> {
    let mut arguments = vec!["-D".into(), data.as_os_str().to_owned()];
    arguments.extend(["-U", "postgres", "--auth=trust", "--no-sync"].map(Into::into));
    arguments
}

/// The server options `pg_ctl -o` hands to the server (through a shell):
/// `port` on 127.0.0.1 only (its clusters trust every local login), the
/// Unix socket in `socket_dir` (none without), and `settings` as `-c
/// name=value`, each quoted.
pub fn server_options(
    port: u16,
    socket_dir: Option<&Path>,
    settings: &[(String, String)],
) -> String {
    let socket_dir = socket_dir.map(|dir| dir.display().to_string());
    let mut options = format!(
        "-p {port} -k {} -c listen_addresses=127.0.0.1",
        shell_quoted(socket_dir.as_deref().unwrap_or_default())
    );
    for (name, value) in settings {
        options.push_str(" -c ");
        options.push_str(&shell_quoted(&format!("{name}={value}")));
    }
    options
}

/// `word` quoted for the shell `pg_ctl` hands `-o` to: in single quotes,
/// each single quote in it closed, escaped and reopened.
pub fn shell_quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A port nobody listens on now (the OS picks it).
pub fn free_port() -> io::Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
}

/// The directory holding server binaries to run: the machine's
/// ([`local_binaries`]), else the pinned build of [`fetch::DEFAULT_MAJOR`]
/// from the cache, fetched into it first if need be.
pub fn binaries() -> Result<PathBuf, String> {
    match local_binaries() {
        Some(bin) => Ok(bin),
        None => fetch::binaries(fetch::DEFAULT_MAJOR)
            .map_err(|why| format!("no PostgreSQL server binaries are installed, and {why}")),
    }
}

/// The shared throwaway server's URL, started first if it is not running;
/// `passed_over` says why the default server was not used.
fn shared_throwaway(passed_over: &str) -> Result<String, String> {
    let server = Shared::here()?;
    server.running(passed_over).map_err(|why| {
        format!(
            "the throwaway PostgreSQL in {} could not be started ({why}); set DATABASE_URL to use \
             another",
            server.dir.display()
        )
    })
}

fn url_on(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// What tells one run of the tests from another: the process that started
/// this one when that is `cargo` (or `nextest`, or `rustdoc` for
/// doctests), whose every test binary belongs to one run; otherwise this
/// process itself (an example, which `cargo run` replaces itself with, so
/// that its parent is the shell: each example run is a run of its own).
pub fn run_id() -> u32 {
    #[cfg(unix)]
    {
        let parent = std::os::unix::process::parent_id();
        let name = fs::read_to_string(format!("/proc/{parent}/comm")).unwrap_or_default();
        if ["cargo", "cargo-nextest", "nextest", "rustdoc"].contains(&name.trim()) {
            return parent;
        }
    }
    std::process::id()
}

/// The shared throwaway server: its directory holds `data`, `server.log`,
/// `port` (where it listens, for people; the server's own `postmaster.pid`
/// is what is believed) and `lock`.
struct Shared {
    dir: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    /// The user that owns `dir` and runs the server: this process's, or
    /// `postgres`'s when this process runs as root.
    owner: u32,
    as_postgres: bool,
}

impl Shared {
    /// This user's: in `${TMPDIR:-/tmp}/idem-test-<uid>`, run by the
    /// machine's binaries.
    fn here() -> Result<Shared, String> {
        let uid = uid().ok_or("this process's user id is unknown")?;
        let as_postgres = uid == 0;
        let owner = if as_postgres {
            postgres_uid().ok_or_else(|| {
                "running as root, where PostgreSQL refuses to run, and there is no `postgres` \
                 user to run it as: run as another user, or create one (useradd --system \
                 postgres), or set DATABASE_URL=postgres://USER@HOST:PORT/DATABASE"
                    .to_owned()
            })?
        } else {
            uid
        };
        // No binaries in $IDEM_TEST_PG_BIN_DIRS, on PATH or in
        // /usr/lib/postgresql/*/bin: the pinned build, fetched once.
        let bin = binaries()?;
        // `pg_ctl` starts `postgres` through /bin/sh, its path inside double
        // quotes, where these characters are the shell's own.
        if let Some(c) = shell_special(&bin.display().to_string()) {
            return Err(format!(
                "the server binaries' directory {} holds {c:?}, which pg_ctl's shell would read \
                 as its own: point {} (or IDEM_TEST_PG_BIN_DIRS) at a directory whose path has \
                 none of \" $ ` \\",
                bin.display().to_string().escape_debug(),
                fetch::CACHE_VAR
            ));
        }
        // Per user: two users' test runs on one machine each get their
        // own server, and neither can write in the other's directory.
        let dir = env::temp_dir().join(format!("idem-test-{uid}"));
        Ok(Shared {
            data: dir.join("data"),
            dir,
            bin,
            owner,
            as_postgres,
        })
    }

    /// Its URL, after starting it unless it already runs; says so on
    /// stderr once per run ([`run_id`]), with `passed_over`.
    fn running(&self, passed_over: &str) -> Result<String, String> {
        self.make_dir()?;
        // Held until this function returns: a test binary running alongside
        // waits here, then finds the server this one started. An flock is
        // let go when its process dies, so a lock file left by a killed
        // run stops no one.
        let lock_path = self.dir.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("open {}: {e}", lock_path.display()))?;
        lock.lock()
            .map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
        let (port, how) = match self.port_running() {
            Some(port) => (port, "already running"),
            None => (self.start()?, "started now"),
        };
        let url = url_on(port);
        // Once per run: every test binary of a `cargo test` resolves its
        // server, and ten identical lines say no more than one.
        let announced = self.dir.join("announced");
        let run = run_id().to_string();
        if fs::read_to_string(&announced).ok().as_deref() != Some(run.as_str()) {
            let _ = fs::write(&announced, &run);
            let version = fs::read_to_string(self.data.join("PG_VERSION")).unwrap_or_default();
            // Straight to the process's stderr: the test harness captures
            // what `eprintln!` prints inside a test, and this line is for
            // the person running the tests, whichever test asks first.
            let _ = writeln!(
                io::stderr(),
                "idem: {passed_over}: using a throwaway PostgreSQL {} at {url} ({how}; left \
                 running for the next run; stop it with `{}`)",
                version.trim(),
                self.stop_command()
            );
        }
        Ok(url)
    }

    /// Creates its directory, readable by its owner only, and makes sure
    /// no one else owns it: `/tmp` is everyone's, and a directory another
    /// user made in our name could hold their server and data.
    fn make_dir(&self) -> Result<(), String> {
        let shown = self.dir.display();
        // `pg_ctl start` hands its paths to /bin/sh inside double quotes,
        // where these characters are the shell's own (`$(...)` runs).
        if let Some(c) = shell_special(&shown.to_string()) {
            return Err(format!(
                "{} holds {c:?}, which pg_ctl's shell would read as its own: point TMPDIR at a \
                 directory whose path has none of \" $ ` \\",
                shown.to_string().escape_debug()
            ));
        }
        match fs::create_dir(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(format!(
                    "create {shown}: {e}; point TMPDIR at a directory you can write in"
                ));
            }
        }
        let metadata = fs::symlink_metadata(&self.dir).map_err(|e| format!("{shown}: {e}"))?;
        if !metadata.is_dir() {
            return Err(format!("{shown} is not a directory: remove it"));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
            // Root hands the directory to `postgres` (it made it, or made
            // it on an earlier run); anyone else must already own it.
            if self.as_postgres && (metadata.uid() == 0 || metadata.uid() == self.owner) {
                self.run(Command::new("chown").arg("postgres").arg(&self.dir))?;
            } else if metadata.uid() != self.owner {
                return Err(format!(
                    "{shown} belongs to user id {}, not to {}: remove it, or point TMPDIR \
                     elsewhere",
                    metadata.uid(),
                    self.owner
                ));
            }
            fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("chmod 700 {shown}: {e}"))?;
        }
        if self.as_postgres {
            // `postgres` must reach the directory through TMPDIR's parents
            // too, which root's own temporary directory may not let it.
            let reachable = Command::new(runuser())
                .args(["-u", "postgres", "--", "test", "-w"])
                .arg(&self.dir)
                .stdin(Stdio::null())
                .status()
                .map_err(|e| {
                    format!(
                        "could not run runuser (util-linux), which root runs PostgreSQL through as \
                         user postgres: {e}"
                    )
                })?
                .success();
            if !reachable {
                return Err(format!(
                    "user postgres, which runs PostgreSQL for root, cannot write in {shown}: point \
                     TMPDIR at a directory it can reach (TMPDIR=/tmp)"
                ));
            }
            // And run the binaries, which a cache under root's home would
            // hide from it.
            let postgres = self.bin.join("postgres");
            let runnable = Command::new(runuser())
                .args(["-u", "postgres", "--", "test", "-x"])
                .arg(&postgres)
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if !runnable {
                return Err(format!(
                    "user postgres, which runs PostgreSQL for root, cannot run {}: point {} at a \
                     directory it can reach (/var/tmp/idem-pg-cache)",
                    postgres.display(),
                    fetch::CACHE_VAR
                ));
            }
        }
        Ok(())
    }

    /// The port its server listens on, when one runs from its data
    /// directory, is ready and answers there. The server's own
    /// `postmaster.pid` says so: a `port` file or a listening port alone
    /// could be left over from a server that is gone, or be someone else's.
    fn port_running(&self) -> Option<u16> {
        let pid_file = fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = pid_file.lines().map(str::trim).collect();
        let pid: u32 = lines.first()?.parse().ok()?;
        let port: u16 = lines.get(3)?.parse().ok()?;
        // The eighth line, from PostgreSQL 10 on, is the server's state.
        let ready = lines.get(7).is_none_or(|state| *state == "ready");
        if !ready {
            return None;
        }
        match postmaster_alive(pid, &self.data) {
            Some(true) | None => answers(&url_on(port)).is_ok().then_some(port),
            // Not visible here as this server's postmaster: gone, or running
            // in another PID namespace that shares this TMPDIR (a container
            // with the host's network). The server on its port says which:
            // taking a live one for dead would remove its lock file and
            // start a second server on its data.
            Some(false) => self.serves_here(port).then_some(port),
        }
    }

    /// Whether the server on `port` lets us in and runs from this data
    /// directory.
    fn serves_here(&self, port: u16) -> bool {
        use sqlx::{ConnectOptions as _, Connection as _};
        if answers(&url_on(port)).is_err() {
            return false;
        }
        let Ok(ours) = fs::canonicalize(&self.data) else {
            return false;
        };
        let Ok(options) = PgConnectOptions::from_str(&url_on(port)) else {
            return false;
        };
        block_on(async move {
            let connected = tokio::time::timeout(Duration::from_secs(10), options.connect()).await;
            let Ok(Ok(mut connection)) = connected else {
                return false;
            };
            let directory: Result<String, _> = sqlx::query_scalar("SHOW data_directory")
                .fetch_one(&mut connection)
                .await;
            let _ = connection.close().await;
            directory
                .is_ok_and(|directory| fs::canonicalize(directory).ok().as_ref() == Some(&ours))
        })
        .unwrap_or(false)
    }

    /// Creates the cluster unless the data directory holds one of the
    /// binaries' major version, starts it on a free port, and records the
    /// port.
    fn start(&self) -> Result<u16, String> {
        let major = self.major()?;
        // First: a server that runs from this data directory but did not
        // answer must keep its data, whatever version made it.
        self.forget_dead_postmaster()?;
        let made_by = fs::read_to_string(self.data.join("PG_VERSION")).unwrap_or_default();
        if made_by.trim() != major {
            // Another major's data cannot be started by these binaries; it
            // held only tests' rows.
            let _ = fs::remove_dir_all(&self.data);
            // Made beside and renamed into place when complete: an initdb
            // killed midway (it writes PG_VERSION early) leaves no `data`
            // that the next run would take for a cluster.
            let fresh = self.dir.join("data.initdb");
            let _ = fs::remove_dir_all(&fresh);
            self.run(self.server_command("initdb").args(initdb_arguments(&fresh)))
                .map_err(|why| format!("{why}; remove {} to start afresh", self.dir.display()))?;
            fs::rename(&fresh, &self.data).map_err(|e| {
                format!(
                    "rename {} to {}: {e}; remove {} to start afresh",
                    fresh.display(),
                    self.data.display(),
                    self.dir.display()
                )
            })?;
        }
        // The port is free when picked, and may be taken by the time the
        // server binds it: then another.
        let mut attempts = 0;
        let port = loop {
            attempts += 1;
            let port = free_port().map_err(|e| format!("find a free port: {e}"))?;
            match self.start_on(port) {
                Ok(()) => break port,
                Err((why, log)) if attempts < 3 && log.contains("Address already in use") => {
                    let _ = why;
                }
                Err((why, log)) => {
                    let last = log.lines().rev().find(|line| !line.trim().is_empty());
                    return Err(format!(
                        "{why}; the server's log {} ends: {}; remove {} to start afresh",
                        self.dir.join("server.log").display(),
                        last.unwrap_or("(empty)"),
                        self.dir.display()
                    ));
                }
            }
        };
        let port_file = self.dir.join("port");
        fs::write(&port_file, format!("{port}\n"))
            .map_err(|e| format!("write {}: {e}", port_file.display()))?;
        Ok(port)
    }

    /// `pg_ctl start` on `port`; on failure, why and what the server
    /// logged meanwhile.
    fn start_on(&self, port: u16) -> Result<(), (String, String)> {
        let log = self.dir.join("server.log");
        let logged_before = fs::metadata(&log).map_or(0, |m| m.len());
        // fsync off: the rows are tests' own, each under an account of its
        // own, and a server that lost them to a crash of the machine is
        // started afresh by removing the directory. No Unix socket: the
        // tests connect over TCP, and a socket's path has a length limit
        // that a long TMPDIR exceeds.
        let settings = [
            ("fsync", "off".to_owned()),
            ("max_connections", SHARED_MAX_CONNECTIONS.to_string()),
        ]
        .map(|(name, value)| (name.to_owned(), value));
        self.run(
            self.server_command("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&log)
                .args(["-o", &server_options(port, None, &settings)])
                .args(["-w", "-t", "60", "start"]),
        )
        .map(drop)
        .map_err(|why| {
            let logged = fs::read(&log).unwrap_or_default();
            let start = usize::try_from(logged_before)
                .unwrap_or(0)
                .min(logged.len());
            (why, String::from_utf8_lossy(&logged[start..]).into_owned())
        })
    }

    /// Removes `postmaster.pid` when the process it names is not a
    /// postgres (killed with SIGKILL, the machine rebooted): PostgreSQL
    /// itself refuses to start when that PID has since gone to another
    /// process of the same user. When it is a postgres, that server runs
    /// but did not answer (in another network namespace or container, or
    /// still starting): say so, since starting a second one cannot work.
    fn forget_dead_postmaster(&self) -> Result<(), String> {
        let pid_file = self.data.join("postmaster.pid");
        let pid: Option<u32> = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse().ok());
        match pid.map(|pid| (pid, postmaster_alive(pid, &self.data))) {
            Some((_, Some(false))) => {
                let _ = fs::remove_file(&pid_file);
            }
            Some((pid, Some(true))) => {
                return Err(format!(
                    "its server (PID {pid}) runs but does not answer on 127.0.0.1 here (started \
                     in another network namespace or container?): stop it with `{}`",
                    self.stop_command()
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The shell command that stops its server, for people to paste.
    fn stop_command(&self) -> String {
        let runuser = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        format!(
            "{runuser}{} -D {} stop",
            for_shell(&self.bin.join("pg_ctl")),
            for_shell(&self.data)
        )
    }

    /// The binaries' major version (`15`), as `PG_VERSION` says it.
    fn major(&self) -> Result<String, String> {
        // "pg_ctl (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)".
        let said = self.run(Command::new(self.bin.join("pg_ctl")).arg("--version"))?;
        let version = said.split_whitespace().nth(2).unwrap_or_default();
        Ok(version.split('.').next().unwrap_or_default().to_owned())
    }

    fn server_command(&self, program: &str) -> Command {
        command(&self.bin, program, self.as_postgres, &self.dir)
    }

    /// Runs `command` to completion; its stdout, or what went wrong in one
    /// line.
    fn run(&self, command: &mut Command) -> Result<String, String> {
        let program = command.get_program().to_string_lossy().into_owned();
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not run {program}: {e}"))?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let said = String::from_utf8_lossy(&output.stderr);
        let said = said
            .lines()
            .find(|line| !line.trim().is_empty())
            .unwrap_or("");
        Err(format!("{program} failed ({}): {said}", output.status))
    }
}

/// The first character of `path` that `/bin/sh` reads as its own inside
/// double quotes, as `pg_ctl` hands it paths.
fn shell_special(path: &str) -> Option<char> {
    path.chars()
        .find(|c| matches!(c, '"' | '$' | '`' | '\\' | '\n'))
}

/// `path` as one shell word: as it is when that is safe, else quoted.
fn for_shell(path: &Path) -> String {
    let shown = path.display().to_string();
    if shown
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c))
    {
        shown
    } else {
        shell_quoted(&shown)
    }
}

/// Whether `pid` is a running postgres working in `data` (a postmaster
/// works in its data directory): `None` where that cannot be told (no
/// `/proc`). A PID from a stale `postmaster.pid` may have gone to another
/// cluster's postgres since, the machine's own among them: that one is not
/// this server, and `pg_ctl stop` on this data directory would signal it.
fn postmaster_alive(pid: u32, data: &Path) -> Option<bool> {
    if !Path::new("/proc/self").exists() {
        return None;
    }
    // `comm` stays the program's name while PostgreSQL rewrites its
    // process title; anyone may read it, whoever runs the process.
    let postgres =
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres");
    // A postmaster just killed stays a zombie until its parent (often
    // init) reaps it: dead all the same. The state follows the `)` that
    // ends the name in `stat`.
    let zombie = fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
    });
    // Another user's process hides its directory: not this server, which
    // runs as this user (or as `postgres` for root, who can read it).
    let here = !Path::new("/proc/self/cwd").exists()
        || fs::read_link(format!("/proc/{pid}/cwd"))
            .ok()
            .zip(fs::canonicalize(data).ok())
            .is_some_and(|(cwd, data)| cwd == data);
    Some(postgres && !zombie && here)
}

/// The `postgres` user's id, when there is such a user.
fn postgres_uid() -> Option<u32> {
    let said = Command::new("id")
        .args(["-u", "postgres"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !said.status.success() {
        return None;
    }
    String::from_utf8_lossy(&said.stdout).trim().parse().ok()
}

/// This process's effective user id.
fn uid() -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        // On Linux /proc/self belongs to the process's effective user; no
        // libc call (and no `unsafe`) needed.
        if let Ok(metadata) = fs::metadata("/proc/self") {
            return Some(metadata.uid());
        }
    }
    let said = Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&said.stdout).trim().parse().ok()
}

/// `url` with its passwords, if any, replaced by `***`: the user info's
/// (up to the last `@`, as URL parsers read a raw `@` in a password), a
/// `password` query parameter's, and in what is not a URL at all (libpq's
/// `key=value` form) the value of `password`. The rule of
/// [`idem_runtime::shown::redacted`], which the `idem` command follows too.
/// Then escaped ([`idem_runtime::shown::escaped`]): a line break or a
/// control character in it cannot start a line that reads as another of
/// idem's.
pub fn redacted(url: &str) -> String {
    idem_runtime::shown::escaped(&idem_runtime::shown::redacted(url)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_entries_go_by_number_and_pass_over_other_names() {
        let dir = env::temp_dir().join(format!("idem-versioned-{}", std::process::id()));
        for name in ["10", "9.6", "15", "latest"] {
            fs::create_dir_all(dir.join(name)).expect("create a version directory");
        }
        let names: Vec<String> = versioned_entries(&dir)
            .iter()
            .filter_map(|path| path.file_name())
            .map(|name| name.to_string_lossy().into_owned())
            .collect();
        fs::remove_dir_all(&dir).expect("remove the directories");
        assert_eq!(names, ["9.6", "10", "15"]);
        assert!(
            versioned_entries(&dir).is_empty(),
            "no directory, no versions"
        );
    }

    #[test]
    fn settings_reach_the_server_as_one_shell_word_each() {
        assert_eq!(shell_quoted("citus.shard_count=4"), "'citus.shard_count=4'");
        assert_eq!(
            shell_quoted("search_path='$user', public"),
            r"'search_path='\''$user'\'', public'"
        );
    }

    #[test]
    fn passwords_are_not_repeated_in_errors() {
        assert_eq!(
            redacted("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redacted("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
    }

    #[test]
    fn a_closed_port_does_not_answer_and_says_where() {
        let port = free_port().expect("a free port");
        let why = answers(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
            .expect_err("nothing listens on a port just freed");
        assert!(why.contains(&port.to_string()), "{why}");
    }
    #[test]
    fn passwords_anywhere_in_the_url_are_not_repeated() {
        // A raw `@` in the password: URL parsers take the last `@` as the end
        // of the user info, and so must the redaction.
        assert_eq!(
            redacted("postgres://u:p@ss3cret@127.0.0.1:1/db"),
            "postgres://u:***@127.0.0.1:1/db"
        );
        // sqlx takes the password from the query too.
        assert_eq!(
            redacted("postgres://u@127.0.0.1:1/db?sslmode=disable&password=s3cret"),
            "postgres://u@127.0.0.1:1/db?sslmode=disable&password=***"
        );
        // Not a URL at all (libpq's key=value form, which sqlx refuses).
        let said = redacted("host=127.0.0.1 port=1 user=u password=s3cret dbname=d");
        assert!(!said.contains("s3cret"), "{said}");
        let said = redacted("host=h password = 'two words' user=u");
        assert!(!said.contains("two") && !said.contains("words"), "{said}");
    }

    /// A scratch directory for one test, removed by the caller.
    fn scratch(name: &str) -> PathBuf {
        let dir = env::temp_dir().join(format!("idem-shared-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a scratch directory");
        dir
    }

    /// Server binaries that only say they are PostgreSQL `major`: `initdb`
    /// makes a half-made data directory and fails, as one killed would.
    #[cfg(unix)]
    fn fake_binaries(dir: &Path, major: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let bin = dir.join("bin");
        fs::create_dir_all(&bin).expect("create the fake bin directory");
        let scripts = [
            (
                "pg_ctl",
                format!("#!/bin/sh\necho 'pg_ctl (PostgreSQL) {major}.1'\n"),
            ),
            (
                "initdb",
                format!("#!/bin/sh\nmkdir -p \"$2\" && echo {major} > \"$2/PG_VERSION\"\nexit 1\n"),
            ),
        ];
        for (name, text) in scripts {
            let path = bin.join(name);
            fs::write(&path, text).expect("write a fake binary");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        bin
    }

    fn shared_in(dir: &Path, bin: PathBuf) -> Shared {
        let owner = uid().expect("this process's uid");
        let server = dir.join("idem-test");
        Shared {
            data: server.join("data"),
            dir: server,
            bin,
            owner,
            as_postgres: false,
        }
    }

    /// A live process named `postgres` (a copy of `sleep`) working in `cwd`.
    #[cfg(target_os = "linux")]
    fn fake_postmaster(dir: &Path, cwd: &Path) -> std::process::Child {
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|path| Path::new(path).is_file())
            .expect("a sleep binary");
        let program = dir.join("postgres");
        fs::copy(sleep, &program).expect("copy sleep");
        Command::new(&program)
            .arg("30")
            .current_dir(cwd)
            .spawn()
            .expect("start the fake postmaster")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_live_server_s_data_is_never_removed_for_another_major() {
        let dir = scratch("live");
        let server = shared_in(&dir, fake_binaries(&dir, "99"));
        fs::create_dir_all(&server.data).expect("create the data directory");
        fs::write(server.data.join("PG_VERSION"), "15\n").expect("write PG_VERSION");
        // Its server runs, though it does not answer here (another network
        // namespace, or still starting).
        let mut postmaster = fake_postmaster(&dir, &server.data);
        fs::write(
            server.data.join("postmaster.pid"),
            format!(
                "{}\n{}\n0\n1\n\n127.0.0.1\n0\nready\n",
                postmaster.id(),
                server.data.display()
            ),
        )
        .expect("write postmaster.pid");
        let started = server.start();
        let kept = server.data.join("PG_VERSION").is_file();
        let _ = postmaster.kill();
        let _ = postmaster.wait();
        fs::remove_dir_all(&dir).expect("remove the scratch directory");
        let why = started.expect_err("a second server cannot start over a live one");
        assert!(why.contains("runs but does not answer"), "{why}");
        assert!(kept, "the live server's data directory was removed");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_stale_pid_that_names_someone_else_s_postgres_is_forgotten() {
        let dir = scratch("reused");
        let server = shared_in(&dir, fake_binaries(&dir, "15"));
        fs::create_dir_all(&server.data).expect("create the data directory");
        // The PID went, after a SIGKILL or a reboot, to another cluster's
        // process: also a `postgres`, but working in its own data directory.
        let mut other = fake_postmaster(&dir, &dir);
        let pid_file = server.data.join("postmaster.pid");
        fs::write(&pid_file, format!("{}\n", other.id())).expect("write postmaster.pid");
        let forgot = server.forget_dead_postmaster();
        let gone = !pid_file.exists();
        let _ = other.kill();
        let _ = other.wait();
        fs::remove_dir_all(&dir).expect("remove the scratch directory");
        forgot.expect("a PID that is not this server's is not this server");
        assert!(
            gone,
            "postmaster.pid naming another cluster's process is removed"
        );
    }

    #[cfg(unix)]
    #[test]
    fn an_initdb_that_did_not_finish_leaves_no_cluster_to_start() {
        let dir = scratch("halfmade");
        let server = shared_in(&dir, fake_binaries(&dir, "15"));
        fs::create_dir_all(&server.dir).expect("create the server directory");
        let started = server.start();
        let half_made = server.data.join("PG_VERSION").exists();
        fs::remove_dir_all(&dir).expect("remove the scratch directory");
        started.expect_err("the fake initdb fails");
        assert!(
            !half_made,
            "a data directory with PG_VERSION but no finished cluster is taken for one next time"
        );
    }

    #[test]
    fn a_directory_pg_ctl_s_shell_would_rewrite_is_refused_in_one_line() {
        for odd in ["dq\"quote", "dollar$(id)", "back`id`tick", "back\\slash"] {
            let dir = scratch("odd").join(odd);
            fs::create_dir_all(&dir).expect("create the odd directory");
            let server = shared_in(&dir, PathBuf::from("/nonexistent"));
            let made = server.make_dir();
            fs::remove_dir_all(dir.parent().expect("a parent")).expect("remove the scratch");
            let why = made.expect_err(odd);
            assert!(why.contains("TMPDIR") && !why.contains('\n'), "{why}");
        }
    }

    #[test]
    fn runuser_is_found_off_path_where_debian_keeps_it() {
        let found = runuser_on(Some(std::ffi::OsStr::new("/nonexistent")));
        if ["/usr/sbin/runuser", "/sbin/runuser"]
            .iter()
            .any(|path| Path::new(path).is_file())
        {
            assert!(found.is_absolute(), "{}", found.display());
        }
    }

    /// Set in the environment of a child test process started by
    /// [`a_database_url_where_postgresql_never_answers_stops_the_tests_in_one_line`].
    const CHILD_VAR: &str = "IDEM_TEST_SERVER_CHILD";

    /// What every test process does first, in a child process of the test
    /// below (a no-op otherwise, since it may end its process): ask for the
    /// tests' URL.
    #[test]
    fn the_tests_url_asked_for_in_a_child_process() {
        if env::var_os(CHILD_VAR).is_none() {
            return;
        }
        let url = url_or_exit();
        panic!("the tests were handed {url}, where no PostgreSQL answers");
    }

    /// `DATABASE_URL` naming a port where something accepts connections
    /// and never answers PostgreSQL's startup (a port forward to nothing, a
    /// hung server, another service): nothing answers there, so the test
    /// process must say so in one line and exit, as for a closed port. It
    /// was handed the URL, and each test then failed on its own after 10 s
    /// (the quickstart after 30 s, "pool timed out", naming no URL).
    #[test]
    fn a_database_url_where_postgresql_never_answers_stops_the_tests_in_one_line() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let port = listener.local_addr().expect("its address").port();
        // Accepts, holds every connection open, and says nothing.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for connection in listener.incoming() {
                held.push(connection);
            }
        });
        let started = std::time::Instant::now();
        let child = Command::new(env::current_exe().expect("this test binary"))
            .args([
                "--exact",
                "server::tests::the_tests_url_asked_for_in_a_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, "1")
            .env(
                "DATABASE_URL",
                format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            )
            .stdin(Stdio::null())
            .output()
            .expect("run the child test process");
        let said = String::from_utf8_lossy(&child.stderr);
        let stopping: Vec<&str> = said
            .lines()
            .filter(|line| line.contains("stopping"))
            .collect();
        assert_eq!(
            child.status.code(),
            Some(1),
            "the test process went on with a URL where nothing answers: {said}"
        );
        assert!(
            stopping.len() == 1 && stopping[0].contains("DATABASE_URL"),
            "{said}"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{said}");
    }

    /// The binaries of a real server for the test below: the machine's, else
    /// the pinned build when it is in the cache (none is fetched here).
    fn real_binaries() -> Option<PathBuf> {
        local_binaries().or_else(|| {
            fetch::pinned(fetch::DEFAULT_MAJOR)
                .ok()
                .and_then(|pin| fetch::cached_in(&fetch::cache_dir(), pin))
        })
    }

    /// A run in a PID namespace of its own that shares the machine's
    /// network and `TMPDIR` (a container with host networking, a sandbox)
    /// cannot see the shared server's postmaster, though the server
    /// answers on the port its `postmaster.pid` records. Such a run took
    /// the server for one killed and removed its `postmaster.pid`: its
    /// own start then failed ("pre-existing shared memory block is still
    /// in use"), the live server shut itself down within a minute ("data
    /// directory lock file is invalid") under every run using it, and the
    /// printed stop command no longer worked. A server that runs is reused
    /// ("later runs reuse it while it runs"), and left alone.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_running_server_whose_postmaster_is_not_visible_here_is_reused_and_left_alone() {
        let Some(bin) = real_binaries() else {
            eprintln!("no PostgreSQL server binaries here: nothing to check");
            return;
        };
        let dir = scratch("hidden");
        let as_postgres = is_root();
        let owner = if as_postgres {
            postgres_uid().expect("a postgres user to run the server as root")
        } else {
            uid().expect("this process's uid")
        };
        let server_dir = dir.join("idem-test");
        let server = Shared {
            data: server_dir.join("data"),
            dir: server_dir,
            bin,
            owner,
            as_postgres,
        };
        server.make_dir().expect("the server's directory");
        let port = server.start().expect("a real server starts");
        let pid_file = server.data.join("postmaster.pid");
        let recorded = fs::read_to_string(&pid_file).expect("postmaster.pid");
        // What the run in the other PID namespace reads: the same file,
        // whose PID names no process it can see.
        let (_, rest) = recorded.split_once('\n').expect("more than the PID");
        fs::write(&pid_file, format!("{}\n{rest}", 4_194_304 + 1)).expect("hide the PID");
        let reused = server.port_running();
        let running = server.running("a test");
        let kept = pid_file.is_file();
        // Put the file back as the server wrote it, and stop the server.
        fs::write(&pid_file, &recorded).expect("restore postmaster.pid");
        let _ = server.run(
            server
                .server_command("pg_ctl")
                .arg("-D")
                .arg(&server.data)
                .args(["-m", "immediate", "-w", "stop"]),
        );
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(
            reused,
            Some(port),
            "a server that runs and answers is reused"
        );
        assert_eq!(
            running,
            Ok(url_on(port)),
            "the tests are handed the server that runs"
        );
        assert!(kept, "the live server's postmaster.pid was removed");
    }

    /// The child test above, run with `DATABASE_URL=url`: its exit code and
    /// its stderr.
    fn child_with_database_url(url: &str) -> (Option<i32>, String) {
        let child = Command::new(env::current_exe().expect("this test binary"))
            .args([
                "--exact",
                "server::tests::the_tests_url_asked_for_in_a_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, "1")
            .env("DATABASE_URL", url)
            .stdin(Stdio::null())
            .output()
            .expect("run the child test process");
        (
            child.status.code(),
            String::from_utf8_lossy(&child.stderr).into_owned(),
        )
    }

    /// The message the child stopped with, from `idem tests:` to the end of
    /// its `(stopping: ...)`, however many lines it took.
    fn stop_message(said: &str) -> Option<&str> {
        let start = said.find("idem tests:")?;
        let end = said[start..].find("(stopping")? + start;
        let close = said[end..].find(')')? + end + 1;
        Some(&said[start..close])
    }

    /// `DATABASE_URL` values a user could set by mistake (not a URL, no such
    /// database on a server that answers, a closed port with a password in
    /// the URL): the tests stop with status 1 and one line that names
    /// `DATABASE_URL` and never repeats the password.
    #[test]
    fn a_database_url_that_cannot_be_used_stops_in_one_line_without_its_password() {
        let closed = TcpListener::bind("127.0.0.1:0")
            .expect("a port")
            .local_addr()
            .expect("its address")
            .port();
        for url in [
            "not a url at all".to_owned(),
            format!("postgres://postgres:hunter2secret@127.0.0.1:{closed}/postgres"),
            "postgres://postgres:hunter2secret@127.0.0.1:5432/idem_no_such_database_at_all"
                .to_owned(),
            format!("host=127.0.0.1 port={closed} user=postgres password=hunter2secret"),
        ] {
            let (code, said) = child_with_database_url(&url);
            assert_eq!(code, Some(1), "{url}: {said}");
            let message = stop_message(&said).unwrap_or_else(|| panic!("{url}: {said}"));
            assert!(
                !message.contains('\n'),
                "{url}: more than one line: {message}"
            );
            assert!(message.contains("DATABASE_URL"), "{url}: {message}");
            assert!(
                !said.contains("hunter2secret"),
                "{url}: the password: {said}"
            );
        }
    }

    /// A `DATABASE_URL` with a line break in it (pasted from a file, or
    /// chosen to forge a line): still one line, the break escaped, so
    /// nothing after it reads as another line of idem's.
    #[test]
    fn a_database_url_with_a_line_break_still_stops_in_one_line() {
        let closed = TcpListener::bind("127.0.0.1:0")
            .expect("a port")
            .local_addr()
            .expect("its address")
            .port();
        let url = format!(
            "postgres://postgres@127.0.0.1:{closed}/postgres\nidem tests: all is well, carry on"
        );
        let (code, said) = child_with_database_url(&url);
        assert_eq!(code, Some(1), "{said}");
        let message = stop_message(&said).unwrap_or_else(|| panic!("{said}"));
        assert!(!message.contains('\n'), "more than one line: {message:?}");
    }
}
