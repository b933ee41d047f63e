//! A real browser for tests: headless Chromium driven over WebDriver, for
//! the operator console's pages (and screenshots of them for the docs).
//!
//! ```no_run
//! # async fn example() {
//! use idem_test_support::browser::Browser;
//!
//! let browser = Browser::start().await; // its own chromedriver and Chromium
//! browser.goto("http://127.0.0.1:8080/").await;
//! assert_eq!(browser.text("h1").await, "Claims");
//! browser.fill("input[name=account]", "acct-1").await;
//! browser.submit("form#search").await; // waits for the page the POST loads
//! assert!(browser.current_url().await.ends_with("/search"));
//! browser.screenshot("target/search.png").await;
//! # }
//! ```
//!
//! Why it is built this way:
//!
//! - **Debian's `chromium` and `chromium-driver`** (`scripts/ensure-chromium`
//!   installs them): the same version of both, from a registry the machines
//!   reach; nothing downloads a browser build at run time. When
//!   `chromedriver` is missing, [`Browser::start`] panics saying to run
//!   `scripts/ensure-chromium`: a browser test never skips silently. The
//!   tests that start one are `#[ignore]`d with the reason
//!   `needs Chromium and chromedriver: run scripts/test-browser`, so the
//!   README's `cargo test` needs no browser and says what it left out;
//!   `scripts/test-browser` installs both and runs exactly those tests.
//! - **One chromedriver per browser**, started with `--port=0` (it picks a
//!   free port and prints it, so no port is raced for) and waited for until
//!   `/status` says ready. Tests run in parallel, as threads of one test
//!   binary or as processes under nextest, without sharing anything.
//! - **fantoccini without TLS**: chromedriver is reached over plain HTTP on
//!   127.0.0.1 with hyper's `HttpConnector`, so neither OpenSSL nor rustls
//!   is built for it.
//! - **Flags that work as root in a container**: `--headless=new
//!   --no-sandbox --disable-dev-shm-usage --disable-gpu`, a 1280x900 window
//!   grown by its frame so that pages and screenshots get 1280x900
//!   ([`WINDOW`]), `--hide-scrollbars` for steady screenshots, and a fresh
//!   profile. chromedriver runs with `HOME` and the XDG directories in a
//!   scratch directory of its own, so Chromium writes nothing (crash
//!   reports, caches) outside it; the directory goes when the browser does.
//! - **Nothing outlives a test, even one that panics**: dropping a
//!   [`Browser`] (which unwinding does) ends its WebDriver session
//!   synchronously (Chromium quits), then kills chromedriver's whole process
//!   group, where every Chromium process lives, and reaps chromedriver.
//!   Only a test process killed outright (SIGKILL, abort) leaves them.
//!   Chromium double-forks a few helpers (its crash handlers among them):
//!   they exit with it, and init reaps them, so `pgrep chromium` may list
//!   them as `<defunct>` for a few seconds after a test.
//! - **Every wait is bounded** by [`WAIT`] (30 s): starting, loading,
//!   finding, waiting for the next page. Each helper panics saying what it
//!   was doing, which is the report a failing test wants; [`Browser::client`]
//!   gives fantoccini's client for anything else.

use std::fs::{self, File};
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use std::{env, thread};

use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// The longest any one step waits: starting chromedriver or Chromium,
/// loading a page, finding an element, waiting for the next page.
pub const WAIT: Duration = Duration::from_secs(30);

/// The size of the page's area (the viewport), in CSS pixels: what
/// screenshots measure. The window is made larger by its frame to fit it.
pub const WINDOW: (u32, u32) = (1280, 900);

/// Set to `1` to make [`docs_screenshot`] (and so
/// [`write_docs_screenshot`]) write `docs/screenshots/*.png`.
pub const WRITE_SCREENSHOTS: &str = "IDEM_WRITE_SCREENSHOTS";

/// What to do when the browser or its driver is missing.
const INSTALL_HINT: &str = "run scripts/ensure-chromium (as root; it installs Debian's chromium and \
     chromium-driver)";

/// Where Debian's packages put the two programs; found on `PATH` otherwise.
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// What chromedriver prints once it listens.
const STARTED: &str = "started successfully on port ";

/// A running `chromedriver`, killed (with everything it started) on drop.
///
/// [`Browser::start`] starts one per browser; start one by hand only to
/// drive it with a WebDriver client of your own, at [`Chromedriver::url`].
#[derive(Debug)]
pub struct Chromedriver {
    child: Child,
    port: u16,
    // Dropped after the processes are killed (fields drop after `drop`).
    scratch: Scratch,
}

impl Chromedriver {
    /// Starts `chromedriver` on a free port of 127.0.0.1 and waits (at most
    /// [`WAIT`]) until it is ready for sessions. Blocks; panics when
    /// chromedriver is missing ("run scripts/ensure-chromium") or does not
    /// come up (with its log).
    pub fn start() -> Chromedriver {
        let program = find_program(CHROMEDRIVER, "chromedriver").unwrap_or_else(|| {
            panic!("browser: no chromedriver at {CHROMEDRIVER} nor on PATH: {INSTALL_HINT}")
        });
        Chromedriver::start_at(&program)
    }

    /// [`Chromedriver::start`] with the program given.
    fn start_at(program: &Path) -> Chromedriver {
        let scratch = Scratch::new();
        let home = scratch.path().join("home");
        for dir in [home.join(".config"), home.join(".cache")] {
            fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("browser: creating {}: {e}", dir.display()));
        }
        let log = File::create(scratch.log())
            .unwrap_or_else(|e| panic!("browser: creating {}: {e}", scratch.log().display()));
        let log_too = log.try_clone().expect("browser: the log file's handle");
        let child = Command::new(program)
            .arg("--port=0")
            // Chromium's crash reports, caches and NSS database stay in the
            // scratch directory, not in the user's home.
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_too)
            // A group of its own, which Chromium's processes join: killing
            // the group on drop leaves nothing behind.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "browser: could not run {}: {e}: {INSTALL_HINT}",
                    program.display()
                )
            });
        let mut driver = Chromedriver {
            child,
            port: 0,
            scratch,
        };
        // A panic below drops `driver`, which kills it.
        let deadline = Instant::now() + WAIT;
        driver.port = loop {
            if let Some(port) = driver.log().split(STARTED).nth(1).and_then(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            }) {
                break port;
            }
            if let Ok(Some(status)) = driver.child.try_wait() {
                panic!(
                    "browser: chromedriver exited ({status}) before it listened; its log:\n{}",
                    driver.log()
                );
            }
            driver.give_up_after(deadline, "to start listening");
            thread::sleep(Duration::from_millis(20));
        };
        while !http(driver.port, "GET", "/status", Duration::from_secs(2))
            .is_ok_and(|(status, body)| status == 200 && body.contains("\"ready\":true"))
        {
            driver.give_up_after(deadline, "to answer ready on /status");
            thread::sleep(Duration::from_millis(20));
        }
        driver
    }

    /// Panics, with the log, once `deadline` has passed.
    fn give_up_after(&self, deadline: Instant, waiting_for: &str) {
        if Instant::now() >= deadline {
            panic!(
                "browser: chromedriver took longer than {WAIT:?} {waiting_for}; its log:\n{}",
                self.log()
            );
        }
    }

    /// Where it listens: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its process id, which is also its process group's.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What chromedriver has printed so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.scratch.log()).unwrap_or_default()
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // chromedriver is not reaped yet, so its pid (the group's id) cannot
        // have been reused: the signal reaches only its group.
        let group = Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// A headless Chromium with a WebDriver session, its own chromedriver and a
/// fresh profile; both closed on drop, including when a test panics.
///
/// Each helper takes a CSS selector, waits at most [`WAIT`], and panics
/// saying what it was doing when it fails.
#[derive(Debug)]
pub struct Browser {
    client: Client,
    session: Option<String>,
    // Dropped last: the session is ended before the driver is killed.
    driver: Chromedriver,
}

impl Browser {
    /// Starts chromedriver, then Chromium through it (each bounded by
    /// [`WAIT`]). Panics when either is missing, saying to run
    /// `scripts/ensure-chromium`.
    pub async fn start() -> Browser {
        let driver = tokio::task::spawn_blocking(Chromedriver::start)
            .await
            .unwrap_or_else(|e| match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => panic!("browser: starting chromedriver: {e}"),
            });
        let chromium = find_program(CHROMIUM, "chromium").unwrap_or_else(|| {
            panic!("browser: no Chromium at {CHROMIUM} nor on PATH: {INSTALL_HINT}")
        });
        let profile = driver.scratch.path().join("profile");
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    format!("--window-size={},{}", WINDOW.0, WINDOW.1),
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            // The browser's own bounds, below ours: a page that never loads
            // fails the command rather than hanging it.
            "timeouts": { "pageLoad": WAIT.as_millis(), "script": WAIT.as_millis(), "implicit": 0 },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("a JSON object")
        };
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        let url = driver.url();
        let connecting = builder.connect(&url);
        let client = match tokio::time::timeout(WAIT, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!(
                "browser: chromedriver could not start Chromium ({}): {e}\nchromedriver's log:\n{}\n{INSTALL_HINT} if it is missing",
                chromium.display(),
                driver.log()
            ),
            Err(_) => panic!(
                "browser: Chromium did not start within {WAIT:?}; chromedriver's log:\n{}",
                driver.log()
            ),
        };
        let session = client.session_id().await.ok().flatten();
        let browser = Browser {
            client,
            session,
            driver,
        };
        browser.fit_viewport().await;
        browser
    }

    /// Grows the window by what its frame takes (in headless Chromium too,
    /// about 140 pixels of height), so that pages, and screenshots, get
    /// exactly [`WINDOW`].
    async fn fit_viewport(&self) {
        let frame = bounded(
            "measuring the window's frame".into(),
            self.client.execute(
                "return [window.outerWidth - window.innerWidth, \
                         window.outerHeight - window.innerHeight];",
                vec![],
            ),
        )
        .await;
        let frame = |index: usize| {
            frame[index]
                .as_u64()
                .and_then(|pixels| u32::try_from(pixels).ok())
                .unwrap_or(0)
        };
        let (width, height) = (WINDOW.0 + frame(0), WINDOW.1 + frame(1));
        bounded(
            format!("resizing the window to {width}x{height}"),
            self.client.set_window_size(width, height),
        )
        .await
    }

    /// fantoccini's client, for what the helpers do not cover (its waits
    /// are not bounded by [`WAIT`] unless you bound them).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// This browser's chromedriver.
    pub fn driver(&self) -> &Chromedriver {
        &self.driver
    }

    /// Loads `url` and waits for it to load.
    pub async fn goto(&self, url: &str) {
        bounded(format!("loading {url}"), self.client.goto(url)).await
    }

    /// The first element that matches `css`, waiting for one to appear.
    pub async fn find(&self, css: &str) -> Element {
        let finding = self
            .client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css));
        match tokio::time::timeout(WAIT + Duration::from_secs(5), finding).await {
            Ok(Ok(element)) => element,
            Ok(Err(e)) => panic!(
                "browser: no element matches `{css}` on {} within {WAIT:?}: {e}",
                self.current_url().await
            ),
            Err(_) => panic!("browser: looking for `{css}` took longer than {WAIT:?}"),
        }
    }

    /// Every element that matches `css` now (none is no error: this is how
    /// to check that something is absent).
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        bounded(
            format!("finding `{css}`"),
            self.client.find_all(Locator::Css(css)),
        )
        .await
    }

    /// The rendered text of the first element that matches `css`.
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        bounded(format!("reading the text of `{css}`"), element.text()).await
    }

    /// Clicks the first element that matches `css`. To click what loads
    /// another page and wait for it, [`Browser::follow`].
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        bounded(format!("clicking `{css}`"), element.click()).await
    }

    /// Clicks the first element that matches `css` (a link, a button) and
    /// waits until the page it loads has loaded.
    pub async fn follow(&self, css: &str) {
        self.mark_page().await;
        self.click(css).await;
        self.wait_for_new_page(&format!("clicking `{css}`")).await
    }

    /// Replaces the value of the form field that matches `css` with `value`
    /// (typed as a person would); for a `<select>`, picks the option whose
    /// value is `value`.
    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        let what = format!("filling `{css}` with {value:?}");
        if bounded(what.clone(), field.tag_name()).await == "select" {
            return bounded(what, field.select_by_value(value)).await;
        }
        bounded(what.clone(), field.clear()).await;
        bounded(what, field.send_keys(value)).await
    }

    /// Submits the form that matches `css` as a person would, by clicking
    /// its submit button (the form's `requestSubmit()` when it has none),
    /// and waits until the page the submission loads has loaded.
    pub async fn submit(&self, css: &str) {
        let form = self.find(css).await;
        let what = format!("submitting `{css}`");
        self.mark_page().await;
        let buttons = bounded(
            what.clone(),
            form.find_all(Locator::Css(
                "button[type=submit], button:not([type]), input[type=submit]",
            )),
        )
        .await;
        match buttons.first() {
            Some(button) => bounded(what.clone(), button.click()).await,
            None => {
                let form = serde_json::to_value(&form).expect("an element serializes");
                bounded(
                    what.clone(),
                    self.client
                        .execute("arguments[0].requestSubmit();", vec![form]),
                )
                .await;
            }
        }
        self.wait_for_new_page(&what).await
    }

    /// The address of the page shown.
    pub async fn current_url(&self) -> String {
        bounded("reading the URL".into(), self.client.current_url())
            .await
            .to_string()
    }

    /// The page's title.
    pub async fn title(&self) -> String {
        bounded("reading the title".into(), self.client.title()).await
    }

    /// The page's HTML as the browser has it now (scripts' changes
    /// included).
    pub async fn source(&self) -> String {
        bounded("reading the page source".into(), self.client.source()).await
    }

    /// Writes what the window shows ([`WINDOW`]) to `path` as a PNG,
    /// creating its directory.
    pub async fn screenshot(&self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        let png = bounded("taking a screenshot".into(), self.client.screenshot()).await;
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("browser: creating {}: {e}", dir.display()));
        }
        fs::write(path, png).unwrap_or_else(|e| panic!("browser: writing {}: {e}", path.display()));
    }

    /// Tags the page shown, so that [`Browser::wait_for_new_page`] can tell
    /// it from the next one (even at the same URL, as a POST's answer is).
    async fn mark_page(&self) {
        bounded(
            "marking the page".into(),
            self.client.execute("window.__idemOldPage = true;", vec![]),
        )
        .await;
    }

    /// Waits until the page marked by [`Browser::mark_page`] is gone and
    /// its successor has loaded.
    async fn wait_for_new_page(&self, after: &str) {
        let waiting = async {
            loop {
                // Fails while the navigation is under way: asked again.
                let loaded = self
                    .client
                    .execute(
                        "return window.__idemOldPage === undefined \
                         && document.readyState === 'complete';",
                        vec![],
                    )
                    .await;
                if matches!(loaded, Ok(Value::Bool(true))) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        };
        if tokio::time::timeout(WAIT, waiting).await.is_err() {
            panic!(
                "browser: no new page loaded within {WAIT:?} after {after} (still at {})",
                self.current_url().await
            );
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Synchronous, so that it happens even when the runtime is going
        // away with a panicking test: chromedriver quits Chromium and waits
        // for it. Then the driver's drop kills whatever is left.
        if let Some(session) = self.session.take() {
            let _ = http(
                self.driver.port,
                "DELETE",
                &format!("/session/{session}"),
                Duration::from_secs(10),
            );
        }
    }
}

/// Loads `url` in a browser of its own and writes a screenshot of it to
/// `path` (a PNG; the directory is created).
pub async fn screenshot_url(url: &str, path: impl AsRef<Path>) {
    let browser = Browser::start().await;
    browser.goto(url).await;
    browser.screenshot(path).await;
}

/// Where a screenshot for the docs named `name` goes,
/// `docs/screenshots/NAME.png` in the repository, when
/// `IDEM_WRITE_SCREENSHOTS=1`; `None` otherwise, so a test writes the docs'
/// pictures only when asked:
///
/// ```no_run
/// # async fn example(browser: &idem_test_support::browser::Browser) {
/// if let Some(path) = idem_test_support::browser::docs_screenshot("claims") {
///     browser.screenshot(path).await;
/// }
/// # }
/// ```
pub fn docs_screenshot(name: &str) -> Option<PathBuf> {
    let asked = env::var(WRITE_SCREENSHOTS).is_ok_and(|value| value == "1");
    asked.then(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/screenshots")
            .join(format!("{name}.png"))
    })
}

/// Loads `url` in a browser of its own and writes it to
/// `docs/screenshots/NAME.png` when `IDEM_WRITE_SCREENSHOTS=1`
/// ([`docs_screenshot`]); returns the path written, if any.
pub async fn write_docs_screenshot(url: &str, name: &str) -> Option<PathBuf> {
    let path = docs_screenshot(name)?;
    screenshot_url(url, &path).await;
    Some(path)
}

/// `fixed` when it exists, else `name` on `PATH`.
fn find_program(fixed: &str, name: &str) -> Option<PathBuf> {
    let fixed = Path::new(fixed);
    if fixed.is_file() {
        return Some(fixed.to_path_buf());
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Runs `work`, at most [`WAIT`]; panics saying `what` failed or hung.
async fn bounded<T>(what: String, work: impl Future<Output = Result<T, CmdError>>) -> T {
    match tokio::time::timeout(WAIT, work).await {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => panic!("browser: {what} failed: {e}"),
        Err(_) => panic!("browser: {what} took longer than {WAIT:?}"),
    }
}

/// One bodiless HTTP/1.1 request to chromedriver on 127.0.0.1, blocking
/// (for `drop`, where no runtime may be at hand): the status and the body.
/// chromedriver answers `Connection: close` yet keeps the connection open,
/// so the body is read by its `Content-Length`.
fn http(port: u16, method: &str, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let mut length = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A directory of one chromedriver's own (its log, Chromium's profile and
/// home), removed on drop.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = env::temp_dir().join(format!(
            "idem-browser-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // Left by an earlier process with this pid that was killed.
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("browser: creating {}: {e}", path.display()));
        Scratch(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn log(&self) -> PathBuf {
        self.0.join("chromedriver.log")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests;
