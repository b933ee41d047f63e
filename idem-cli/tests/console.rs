//! `idem console` as a process: what it refuses to start with, and the
//! audit lines it writes. Its pages, request by request, are in the
//! facade's `tests/testsuite/console/`; in a browser, in
//! `console_browser.rs`.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::testing::{database_url, unique_name};

/// How long the console may take to start (or to refuse to), and to write
/// an audit line.
const WAIT: Duration = Duration::from_secs(30);

/// `idem console` running, its stderr in a file; killed on drop.
struct Served {
    child: Child,
    stderr: PathBuf,
    /// Where it listens, `127.0.0.1:PORT` (also when it listens on every
    /// address).
    address: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

impl Served {
    /// Everything it wrote to stderr so far.
    fn said(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its audit lines (target `idem::console::audit`) so far.
    fn audit_lines(&self) -> Vec<String> {
        self.said()
            .lines()
            .filter(|line| line.contains("idem::console::audit"))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until it wrote `count` audit lines (or more), and returns them.
    fn wait_for_audit_lines(&self, count: usize) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let lines = self.audit_lines();
            if lines.len() >= count || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// How `idem console` came out of its start-up.
enum Started {
    /// It listens.
    Listening(Served),
    /// It exited: its status and what it said.
    Exited(i32, String),
}

/// A file for a console's stderr, of this test alone.
fn stderr_file() -> PathBuf {
    std::env::temp_dir().join(format!("{}.stderr", unique_name("idem_console")))
}

/// Starts `idem console ARGS` with `IDEM_CONSOLE_TOKEN` set to `token` (or
/// unset), its stderr written to a file (not a terminal), and waits until
/// it listens or exits.
fn start(args: &[&str], token: Option<&str>) -> Started {
    // The tests' database is this run's own, made empty: the console
    // refuses to start without idem's table, so it is set up once first.
    static SCHEMA: std::sync::Once = std::sync::Once::new();
    SCHEMA.call_once(|| {
        common::idem(&["migrate"]).expect_code(0);
    });
    let path = stderr_file();
    let file = std::fs::File::create(&path).expect("a file for its stderr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .arg("console")
        .args(args)
        .env("DATABASE_URL", database_url())
        // What colours it writes must not depend on the test's terminal.
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(file);
    match token {
        Some(token) => command.env("IDEM_CONSOLE_TOKEN", token),
        None => command.env_remove("IDEM_CONSOLE_TOKEN"),
    };
    let child = command.spawn().expect("run idem console");
    let mut served = Served {
        child,
        stderr: path,
        address: String::new(),
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let said = served.said();
        if let Some(line) = said
            .lines()
            .find(|l| l.starts_with("idem console: http://"))
        {
            let url = line["idem console: http://".len()..]
                .split(['/', ' '])
                .next()
                .expect("an address");
            let port = url.rsplit(':').next().expect("a port");
            served.address = format!("127.0.0.1:{port}");
            return Started::Listening(served);
        }
        if let Some(status) = served.child.try_wait().expect("its status") {
            return Started::Exited(status.code().unwrap_or(-1), served.said());
        }
        assert!(
            Instant::now() < deadline,
            "idem console neither listened nor exited within {WAIT:?}: {said}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn listening(args: &[&str], token: Option<&str>) -> Served {
    match start(args, token) {
        Started::Listening(served) => served,
        Started::Exited(code, said) => panic!("idem console exited {code}: {said}"),
    }
}

/// Sends one HTTP/1.1 request to `address` as written (`head`: the request
/// line and headers, without the blank line), and returns the status.
fn request(address: &str, head: &str, body: &str) -> u16 {
    let mut stream = TcpStream::connect(address).expect("connect to the console");
    stream.set_read_timeout(Some(WAIT)).expect("a read timeout");
    let request = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

#[test]
fn a_token_too_short_to_resist_guessing_is_refused_saying_how_to_make_one() {
    for (listen, token) in [
        ("0.0.0.0:0", "a"),
        ("0.0.0.0:0", "s3cret-token"),
        // 31 hex digits: 124 bits.
        ("0.0.0.0:0", "0123456789abcdef0123456789abcde"),
        // 21 letters and digits: 125 bits.
        ("0.0.0.0:0", "Zq8rT1vW3xY5aB7cD9eFg"),
        // On loopback too: with a token, the token is all that keeps a
        // page elsewhere out.
        ("127.0.0.1:0", "a"),
    ] {
        match start(&["--listen", listen], Some(token)) {
            Started::Listening(served) => panic!(
                "idem console started on {listen} with the token {token:?}: {}",
                served.said()
            ),
            Started::Exited(code, said) => {
                assert_eq!(code, 2, "{token:?}: {said}");
                for part in ["128 bits", "openssl rand -hex 32"] {
                    assert!(said.contains(part), "{token:?}: no {part:?} in: {said}");
                }
                if token.len() > 1 {
                    assert!(!said.contains(token), "it printed the token: {said}");
                }
            }
        }
    }
}

#[test]
fn a_token_of_128_random_bits_starts_it_beyond_loopback_and_any_case_of_bearer_presents_it() {
    // What `openssl rand -hex 16` prints, and 22 letters and digits.
    for token in ["5d41402abc4b2a76b9719d911017c592", "Zq8rT1vW3xY5aB7cD9eFgH"] {
        let served = listening(&["--listen", "0.0.0.0:0"], Some(token));
        for (scheme, status) in [("Bearer", 200), ("bearer", 200), ("Basic", 401)] {
            let got = request(
                &served.address,
                &format!(
                    "GET /claims?limit=1 HTTP/1.1\r\nHost: console.internal\r\n\
                     Authorization: {scheme} {token}"
                ),
                "",
            );
            assert_eq!(got, status, "{scheme} {token}: {}", served.said());
        }
    }
}

#[test]
fn audit_lines_written_to_a_file_carry_no_colour_codes() {
    let served = listening(&["--listen", "127.0.0.1:0"], None);
    // A write to a read-only console: refused, and audited.
    let status = request(
        &served.address,
        &format!(
            "POST /claim/resolve HTTP/1.1\r\nHost: {}\r\n\
             Content-Type: application/x-www-form-urlencoded",
            served.address
        ),
        "account=acme&address=claim_0123456789abcdef01234567&fence=1&state=in_doubt&as=release&csrf=x",
    );
    assert_eq!(status, 403);
    let lines = served.wait_for_audit_lines(1);
    assert_eq!(lines.len(), 1, "{}", served.said());
    let said = served.said();
    assert!(
        !said.contains('\u{1b}'),
        "stderr is a file, and it holds terminal escape codes: {said:?}"
    );
    let line = &lines[0];
    assert!(
        line.contains(r#"operator="loopback user at 127.0.0.1:"#),
        "grep 'operator=\"...\"' finds nothing: {line:?}"
    );
    assert!(
        line.contains(r#"address=Some("claim_0123456789abcdef01234567")"#),
        "{line:?}"
    );
}

#[test]
fn a_write_refused_at_the_door_leaves_one_audit_line() {
    // A page on evil.example whose name now resolves to 127.0.0.1 (DNS
    // rebinding) posts a resolution: refused before the console reads it,
    // and the attempt is on record.
    let served = listening(&["--listen", "127.0.0.1:0", "--allow-writes"], None);
    let status = request(
        &served.address,
        "POST /claim/resolve HTTP/1.1\r\nHost: evil.example\r\n\
         Origin: http://evil.example\r\nContent-Type: application/x-www-form-urlencoded",
        "account=acme&address=claim_0123456789abcdef01234567&fence=1&state=in_doubt&as=release",
    );
    assert_eq!(status, 403);
    // A read refused at the door is no write: no line.
    let read = request(
        &served.address,
        "GET /claims HTTP/1.1\r\nHost: evil.example",
        "",
    );
    assert_eq!(read, 403);
    let lines = served.wait_for_audit_lines(1);
    std::thread::sleep(Duration::from_millis(300));
    let lines_now = served.audit_lines();
    assert_eq!(lines_now, lines, "{}", served.said());
    assert_eq!(lines.len(), 1, "{}", served.said());
    let line = &lines[0];
    for part in [
        "refused",
        r#"host="evil.example""#,
        r#"path="/claim/resolve""#,
        "127.0.0.1:",
    ] {
        assert!(line.contains(part), "no {part:?} in {line:?}");
    }
}
