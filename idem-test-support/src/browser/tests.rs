//! The browser harness end to end: a page served by axum on 127.0.0.1,
//! read, a form filled and posted, a link followed, screenshots decoded;
//! and nothing left running when a test panics.
//!
//! The tests that start a browser are ignored by `cargo test` (which needs
//! nothing but PostgreSQL) and run by `scripts/test-browser`; the others
//! start none and always run.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use axum::response::Html;
use axum::routing::get;
use axum::{Form, Router};

use super::*;

/// Serves a page with a form, and its answer, on 127.0.0.1; its address.
async fn serve() -> String {
    async fn page() -> Html<&'static str> {
        Html(
            "<!doctype html><html><head><title>Smoke</title></head><body>\
             <h1 id=title>Hello, browser</h1>\
             <form id=greet method=post action=/greet>\
             <label>Name <input name=name value=placeholder></label>\
             <select name=tone><option value=plain>plain</option><option value=warm>warm</option></select>\
             <button>Greet</button></form></body></html>",
        )
    }
    async fn greet(Form(form): Form<HashMap<String, String>>) -> Html<String> {
        let escape = |text: &str| {
            text.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        Html(format!(
            "<!doctype html><html><head><title>Greeted</title></head><body>\
             <p id=greeting class={}>Hello, {}!</p><a id=back href=/>again</a></body></html>",
            escape(&form["tone"]),
            escape(&form["name"]),
        ))
    }
    let app = Router::new()
        .route("/", get(page))
        .route("/greet", axum::routing::post(greet));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port on 127.0.0.1");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serving") });
    format!("http://{address}")
}

/// A fresh path for a test's PNG, in a directory removed on drop.
fn scratch_png(name: &str) -> (Scratch, PathBuf) {
    let scratch = Scratch::new();
    let path = scratch.path().join("shots").join(format!("{name}.png"));
    (scratch, path)
}

/// The PNG at `path`, decoded: its width and height.
fn decode_png(path: &Path) -> (u32, u32) {
    let bytes = fs::read(path).expect("the screenshot was written");
    assert!(!bytes.is_empty(), "{} is empty", path.display());
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .expect("a PNG header");
    let mut pixels = vec![0; reader.output_buffer_size().expect("a sane size")];
    let frame = reader.next_frame(&mut pixels).expect("the PNG decodes");
    assert!(
        pixels[..frame.buffer_size()].iter().any(|&byte| byte != 0),
        "the screenshot is all zeros"
    );
    (frame.width, frame.height)
}

/// The live processes (zombies excepted) in process group `group`, from
/// /proc: `pgrep` by group, without pgrep.
fn processes_in_group(group: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2] == group.to_string() {
            found.push(format!("{head})"));
        }
    }
    found
}

#[tokio::test]
#[ignore = "needs Chromium and chromedriver: run scripts/test-browser"]
async fn a_page_is_read_a_form_posted_and_a_screenshot_taken() {
    let site = serve().await;
    let browser = Browser::start().await;

    browser.goto(&format!("{site}/")).await;
    assert_eq!(browser.title().await, "Smoke");
    assert_eq!(browser.text("#title").await, "Hello, browser");
    assert_eq!(browser.find_all("form#greet input").await.len(), 1);
    assert!(browser.find_all("#greeting").await.is_empty());

    // Replaces the value there, with characters HTML must escape.
    browser.fill("input[name=name]", "Ada & <Bob>").await;
    browser.fill("select[name=tone]", "warm").await;
    browser.submit("form#greet").await;
    assert_eq!(browser.text("#greeting").await, "Hello, Ada & <Bob>!");
    assert_eq!(browser.current_url().await, format!("{site}/greet"));
    let source = browser.source().await;
    assert!(
        source.contains(r#"<p id="greeting" class="warm">Hello, Ada &amp; &lt;Bob&gt;!</p>"#),
        "{source}"
    );

    let (_scratch, path) = scratch_png("greeted");
    browser.screenshot(&path).await;
    assert_eq!(decode_png(&path), WINDOW);

    browser.follow("#back").await;
    assert_eq!(browser.current_url().await, format!("{site}/"));
    assert_eq!(browser.text("#title").await, "Hello, browser");
}

#[tokio::test]
#[ignore = "needs Chromium and chromedriver: run scripts/test-browser"]
async fn a_url_is_rendered_to_a_png() {
    let site = serve().await;
    let (_scratch, path) = scratch_png("page");
    screenshot_url(&site, &path).await;
    assert_eq!(decode_png(&path), WINDOW);
}

/// Writes docs/screenshots/browser-smoke.png only with
/// IDEM_WRITE_SCREENSHOTS=1; otherwise starts no browser.
#[tokio::test]
async fn the_docs_screenshot_is_written_only_when_asked() {
    let asked = env::var(WRITE_SCREENSHOTS).as_deref() == Ok("1");
    let site = serve().await;
    let written = write_docs_screenshot(&site, "browser-smoke").await;
    assert_eq!(written.is_some(), asked);
    if let Some(path) = written {
        assert!(path.ends_with("docs/screenshots/browser-smoke.png"));
        assert_eq!(decode_png(&path), WINDOW);
        fs::remove_file(&path).expect("removed");
        // Only when nothing else is there yet.
        let _ = fs::remove_dir(path.parent().expect("docs/screenshots"));
    }
}

#[test]
#[ignore = "needs Chromium and chromedriver: run scripts/test-browser"]
fn a_panicking_test_leaves_no_browser_running() {
    let (pid, scratch) = (std::sync::Mutex::new(None), std::sync::Mutex::new(None));
    let test = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let site = serve().await;
                let browser = Browser::start().await;
                browser.goto(&site).await;
                let group = browser.driver().pid();
                *pid.lock().unwrap() = Some(group);
                *scratch.lock().unwrap() = Some(browser.driver().scratch.path().to_path_buf());
                assert!(
                    processes_in_group(group)
                        .iter()
                        .any(|process| process.contains("chromium")),
                    "Chromium runs in chromedriver's group: {:?}",
                    processes_in_group(group)
                );
                panic!("the test fails with the browser open");
            })
    });
    assert!(test.is_err(), "the test panicked");
    let group = pid.lock().unwrap().expect("the browser started");
    assert_eq!(processes_in_group(group), Vec::<String>::new());
    let scratch = scratch
        .lock()
        .unwrap()
        .clone()
        .expect("the browser started");
    assert!(!scratch.exists(), "{} was removed", scratch.display());
}

#[test]
fn a_missing_chromedriver_says_how_to_install_it() {
    let missing = std::panic::catch_unwind(|| {
        Chromedriver::start_at(Path::new("/nonexistent/chromedriver"));
    })
    .expect_err("no chromedriver there");
    let message = missing
        .downcast_ref::<String>()
        .expect("a formatted message");
    assert!(message.contains("run scripts/ensure-chromium"), "{message}");
}
