//! What every `idem` command prints, run as a user runs it: no character
//! that `idem::shown::is_escaped` names (a terminal's escape sequence, a
//! bidirectional or invisible formatting character) in text, whatever the
//! names of the claims, by the one rule the console follows too; JSON as
//! it was, lossless; and no password of the database URL, however the URL
//! is written, in anything any command says.
//!
//! A new command gets a row in [`name_commands`] and [`url_commands`].

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Run, idem};
use idem::shown::{escaped, is_escaped};
use idem::sqlx;
use idem::{Gate, Identity, testing};

/// A name an attacker may choose: a terminal escape that clears the
/// screen, a bidirectional override, an Arabic letter mark, a zero-width
/// space, C0, DEL and C1 controls, a line separator, a backslash (no NUL:
/// neither a command line nor PostgreSQL text holds one).
fn hostile(tag: &str) -> String {
    format!(
        "{tag}\u{1b}[2J\u{202e}gnp.exe\u{61c}\u{200b}\x01\x7f\u{85}\u{2028}\\u{{41}}{}",
        testing::unique_name("")
    )
}

/// The characters of `text` that should have been escaped (line breaks
/// apart: every command prints lines).
fn hidden(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| c != '\n' && is_escaped(c))
        .collect()
}

/// The claims a run of the table works on, in an account and a namespace
/// of hostile names, with a hostile action and key part.
struct Claims {
    account: String,
    namespace: String,
    /// In doubt: shown, resolved.
    in_doubt: String,
    /// Pending, its lease gone: released.
    pending: String,
    /// A success settled in 2000: pruned.
    settled: String,
}

async fn set(gate: &Gate, id: &Identity, state: &str, settled_at: Option<&str>) {
    // The time in doubt is bound, not computed in a CASE: Citus refuses a
    // volatile function there on a distributed table.
    let in_doubt_since = (state == "in_doubt").then_some("now");
    sqlx::query(
        "UPDATE idem_records SET state = $1, lease_expires_at = NULL, \
             in_doubt_since = $6::timestamptz, \
             settled_at = $5::timestamptz \
         WHERE account = $2 AND kind = 'claim' AND address = $3 AND namespace = $4",
    )
    .bind(state)
    .bind(gate.account_name())
    .bind(id.address())
    .bind(gate.namespace_name())
    .bind(settled_at)
    .bind(in_doubt_since)
    .execute(gate.pool())
    .await
    .expect("set the claim's state");
}

async fn claims(base: &Gate) -> Claims {
    let account = hostile("acct");
    let namespace = hostile("ns");
    let gate = base.account(&account).namespace(&namespace);
    let action = hostile("act");
    let mut addresses = Vec::new();
    for (n, state, settled_at) in [
        (1, "in_doubt", None),
        (2, "pending", None),
        (3, "success", Some("2000-01-01T00:00:00Z")),
    ] {
        let id = Identity::new(&action).part(hostile("part")).part(n);
        let claim = gate.claim(&id).await.expect("claim");
        drop(claim);
        set(&gate, &id, state, settled_at).await;
        addresses.push(id.address());
    }
    Claims {
        account,
        namespace,
        in_doubt: addresses[0].clone(),
        pending: addresses[1].clone(),
        settled: addresses[2].clone(),
    }
}

/// Every command that prints a claim's names: what it is called, its
/// arguments, and whether its output names the account.
fn name_commands(c: &Claims) -> Vec<(&'static str, Vec<String>, bool)> {
    let scope = |args: Vec<&str>| -> Vec<String> {
        let mut args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        args.extend([
            "--account".to_owned(),
            c.account.clone(),
            "--namespace".to_owned(),
            c.namespace.clone(),
        ]);
        args
    };
    let prune = |yes: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["prune", "--settled-before", "2001-01-01", "--account"]
            .map(str::to_owned)
            .to_vec();
        args.push(c.account.clone());
        args.extend(yes.iter().map(|a| (*a).to_owned()));
        args
    };
    let missing = "claim_000000000000000000000000";
    vec![
        ("claims list", scope(vec!["claims", "list"]), true),
        (
            "claims list, cut",
            scope(vec!["claims", "list", "--limit", "1"]),
            true,
        ),
        (
            "claims list --count",
            scope(vec!["claims", "list", "--count"]),
            false,
        ),
        (
            "claims show",
            scope(vec!["claims", "show", &c.in_doubt]),
            true,
        ),
        (
            "claims show, none",
            scope(vec!["claims", "show", missing]),
            true,
        ),
        (
            "claims resolve without --yes",
            scope(vec!["claims", "resolve", &c.in_doubt, "--failed"]),
            true,
        ),
        (
            "claims release of a claim in doubt",
            scope(vec!["claims", "release", &c.in_doubt, "--yes"]),
            true,
        ),
        (
            "claims resolve",
            scope(vec!["claims", "resolve", &c.in_doubt, "--failed", "--yes"]),
            true,
        ),
        (
            "claims resolve of a kept failure",
            scope(vec!["claims", "resolve", &c.in_doubt, "--failed", "--yes"]),
            true,
        ),
        (
            "claims release without --yes",
            scope(vec!["claims", "release", &c.pending]),
            true,
        ),
        (
            "claims release",
            scope(vec!["claims", "release", &c.pending, "--yes"]),
            true,
        ),
        (
            "claims show of a success",
            scope(vec!["claims", "show", &c.settled]),
            true,
        ),
        ("prune --dry-run", prune(&["--dry-run"]), true),
        ("prune without --yes", prune(&[]), true),
        ("prune", prune(&["--yes"]), true),
    ]
}

/// Whether `value` holds the string `text` anywhere.
fn holds(value: &serde_json::Value, text: &str) -> bool {
    match value {
        serde_json::Value::String(s) => s == text,
        serde_json::Value::Array(items) => items.iter().any(|v| holds(v, text)),
        serde_json::Value::Object(fields) => fields.values().any(|v| holds(v, text)),
        _ => false,
    }
}

#[tokio::test]
async fn no_command_prints_a_hidden_character_of_a_name_in_text() {
    let base = testing::gate().await;
    let c = claims(&base).await;
    let shown_account = escaped(&c.account).into_owned();
    let mut failures = Vec::new();
    for (what, args, names_account) in name_commands(&c) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = idem(&args);
        for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
            let raw = hidden(text);
            if !raw.is_empty() {
                failures.push(format!("{what}: {stream} holds {raw:?}:\n{text}"));
            }
        }
        let said = format!("{}{}", run.stdout, run.stderr);
        if names_account && !said.contains(&shown_account) {
            failures.push(format!(
                "{what}: the account is not shown as the console shows it ({shown_account}):\n{said}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test]
async fn json_carries_names_exactly() {
    let base = testing::gate().await;
    let c = claims(&base).await;
    let mut failures = Vec::new();
    for (what, mut args, names_account) in name_commands(&c) {
        args.extend(["--format".to_owned(), "json".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = idem(&args);
        // What goes to stderr is for people, in JSON mode too.
        let raw = hidden(&run.stderr);
        if !raw.is_empty() {
            failures.push(format!("{what}: stderr holds {raw:?}:\n{}", run.stderr));
        }
        if run.stdout.is_empty() {
            continue;
        }
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&run.stdout) else {
            failures.push(format!("{what}: stdout is not JSON:\n{}", run.stdout));
            continue;
        };
        if names_account && !holds(&json, &c.account) {
            failures.push(format!(
                "{what}: the account is not in the JSON as it is:\n{json}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `idem ARGS` with `DATABASE_URL` set to `url` (or, with `flag`, given as
/// `--database-url`), stopped if it takes longer than a minute: none of
/// these can connect.
fn idem_at(args: &[&str], url: &str, flag: bool) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.args(args);
    if flag {
        command
            .args(["--database-url", url])
            .env_remove("DATABASE_URL");
    } else {
        command.env("DATABASE_URL", url);
    }
    let mut child = command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idem");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait for idem").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("idem's output");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Every command that takes `--database-url` (or `DATABASE_URL`).
fn url_commands() -> Vec<(&'static str, Vec<&'static str>)> {
    let address = "claim_000000000000000000000000";
    vec![
        ("migrate", vec!["migrate"]),
        ("migrate --check", vec!["migrate", "--check"]),
        ("audit", vec!["audit"]),
        ("claims list", vec!["claims", "list"]),
        ("claims show", vec!["claims", "show", address]),
        (
            "claims release",
            vec!["claims", "release", address, "--yes"],
        ),
        (
            "claims resolve",
            vec!["claims", "resolve", address, "--failed", "--yes"],
        ),
        (
            "prune",
            vec!["prune", "--settled-before", "2001-01-01", "--yes"],
        ),
        ("console", vec!["console", "--listen", "127.0.0.1:0"]),
    ]
}

#[test]
fn no_command_prints_the_password_of_its_database_url() {
    // Nothing listens on port 1: every command fails to connect, at once,
    // and says where it tried.
    let urls = [
        "postgres://postgres:s3cret@127.0.0.1:1/x",
        "postgres://postgres@127.0.0.1:1/x?password=s3cret",
        "postgres://postgres@127.0.0.1:1/x?sslmode=disable&Password=s3cret",
        // A parameter sqlx does not know, which it warns of, value and all.
        "postgres://postgres@127.0.0.1:1/x?pass=s3cret",
        // Malformed: a port that is none, a password with a space, with a
        // slash, and no scheme.
        "postgres://u:s3cret@host:notaport/db",
        "postgres://u:s3 cret@127.0.0.1:1/db",
        "postgres://u:s3/cret@127.0.0.1:1/db",
        "u:s3cret@127.0.0.1:1/db",
    ];
    let mut failures = Vec::new();
    for url in urls {
        for (what, args) in url_commands() {
            for flag in [false, true] {
                let run = idem_at(&args, url, flag);
                if run.code != 2 {
                    failures.push(format!(
                        "{what} on {url}: exit {} (expected 2, it cannot connect)\n{}",
                        run.code, run.stderr
                    ));
                }
                for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
                    if ["s3cret", "s3 cret", "s3%20cret", "s3/cret"]
                        .iter()
                        .any(|secret| text.contains(secret))
                    {
                        failures.push(format!(
                            "{what} on {url}: {stream} holds the password:\n{text}"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
