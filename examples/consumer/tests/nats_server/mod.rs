//! A NATS server with JetStream for the test: the one at `NATS_URL`
//! (default `nats://127.0.0.1:4222`) when it answers, else a throwaway
//! `nats-server -js` on a free port with a store directory of its own,
//! stopped and removed when the guard drops. No server binary: the test
//! fails and says how to get one (`scripts/ensure-nats`), never skips.
//! (`cargo test` lists the test as ignored; `scripts/test-consumer`
//! installs the binary and runs it.)

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The server the test talks to; a throwaway one is stopped on drop.
pub struct NatsServer {
    /// `nats://host:port`.
    pub url: String,
    /// The throwaway server and its store directory, if this guard started one.
    owned: Option<(Child, PathBuf)>,
}

impl NatsServer {
    /// The server at `NATS_URL`, or a throwaway one.
    pub fn ensure() -> NatsServer {
        let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        if answers(&url) {
            eprintln!("nats: using the server at {url}");
            return NatsServer { url, owned: None };
        }
        let binary = find_binary().unwrap_or_else(|| {
            panic!(
                "no NATS server answers at {url} and no `nats-server` binary was found \
                 (PATH, /usr/sbin, /usr/bin): run `scripts/ensure-nats` (installs Debian's \
                 nats-server and starts it with JetStream), or set NATS_URL to a server with \
                 JetStream"
            )
        });
        let port = free_port();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let store =
            std::env::temp_dir().join(format!("idem-consumer-nats-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&store)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", store.display()));
        let child = Command::new(&binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let wanted = url;
        let url = format!("nats://127.0.0.1:{port}");
        let server = NatsServer {
            url: url.clone(),
            owned: Some((child, store)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !answers(&url) {
            assert!(
                Instant::now() < deadline,
                "the throwaway nats-server ({}) did not answer at {url} within 10 s",
                binary.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "nats: nothing answered at {wanted}; started {} -js at {url} (stopped at the end)",
            binary.display()
        );
        server
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some((mut child, store)) = self.owned.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(store);
        }
    }
}

/// Whether something accepts TCP connections at `url`'s host and port.
fn answers(url: &str) -> bool {
    let address = url
        .trim_start_matches("nats://")
        .trim_end_matches('/')
        .to_owned();
    let Ok(mut addresses) = address.to_socket_addrs() else {
        return false;
    };
    addresses.any(|address| TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok())
}

fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| is_file(candidate))
}

fn is_file(path: &Path) -> bool {
    path.metadata().map(|m| m.is_file()).unwrap_or(false)
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|error| panic!("no free port on 127.0.0.1: {error}"));
    listener
        .local_addr()
        .unwrap_or_else(|error| panic!("no local address: {error}"))
        .port()
}
