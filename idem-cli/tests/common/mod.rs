//! The real `idem` binary, run as a user would run it against the test
//! database. The database itself (schemas of a test's own, connections)
//! comes from `idem-test-support`, shared with the facade's tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::Command;

use idem::testing::database_url;

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts the exit status, showing everything the binary said otherwise.
    pub fn expect_code(self, code: i32) -> Run {
        assert_eq!(
            self.code, code,
            "exit status {} (expected {code})\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs `idem ARGS` with `DATABASE_URL` pointing at the test database.
pub fn idem(args: &[&str]) -> Run {
    idem_with(args, Some(&database_url()))
}

/// Runs `idem ARGS` with `DATABASE_URL` set to `url`, or unset.
pub fn idem_with(args: &[&str], url: Option<&str>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.args(args);
    match url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run idem: {e}"));
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Asserts that `text` (what the binary said) contains `part`, showing all
/// of `text` when it does not.
#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "no {part:?} in:\n{text}");
}

/// `idem COMMAND_LINE --schema SCHEMA`, the command line split at spaces;
/// for an argument that holds a space, call [`idem`] with the words.
pub fn idem_in(schema: &str, command_line: &str) -> Run {
    let mut args: Vec<&str> = command_line.split_whitespace().collect();
    args.extend(["--schema", schema]);
    idem(&args)
}

/// Whether the server is a Citus coordinator (the extension is created).
pub async fn on_citus(conn: &mut sqlx::PgConnection) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')")
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("ask whether this is Citus: {e}"))
}
