//! `idem console` in a real browser: the binary serves the test database,
//! a headless Chromium (Debian's, driven through chromedriver by
//! `idem_test_support::browser`) loads the overview, filters the list,
//! opens a claim in doubt, resolves it through its confirmation, and the
//! row changes in PostgreSQL; a hostile name renders as text and runs
//! nothing. With `IDEM_WRITE_SCREENSHOTS=1` it also writes the pictures in
//! docs/operations.md (docs/screenshots/).
//!
//! The two browser tests are ignored by `cargo test`, which needs nothing
//! but PostgreSQL, and listed there as ignored with the command that runs
//! them: `scripts/test-browser` (it installs Chromium and chromedriver when
//! missing, then runs `-- --ignored`).
//!
//! The request by request tests of the same pages (access, CSRF, races,
//! paging) are in the facade's `tests/testsuite/console/`.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use common::idem_with;
use idem::testing::{self, database_url};
use idem::{Gate, Identity, sqlx};
use idem_test_support::browser::{self, Browser};

/// `idem console` running; killed on drop.
struct Served {
    child: Child,
    url: String,
    /// Every line it wrote to stderr so far.
    said: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `idem console ARGS` on a free loopback port and waits for the
/// line that says where it listens.
fn serve(args: &[&str]) -> Served {
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("console")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("DATABASE_URL", database_url())
        .env_remove("IDEM_CONSOLE_TOKEN")
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idem console");
    // Owned (killed and waited for on drop) before anything can panic.
    let mut served = Served {
        child,
        url: String::new(),
        said: Default::default(),
    };
    let stderr = served.child.stderr.take().expect("its stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let said = served.said.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Everything it says goes on to the test's own output.
            eprintln!("idem console: {line}");
            said.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(line.clone());
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + browser::WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("idem console said nothing within {:?}", browser::WAIT));
        if let Some(rest) = line.strip_prefix("idem console: ") {
            served.url = rest
                .split_whitespace()
                .next()
                .expect("an address")
                .to_owned();
            return served;
        }
    }
}

/// Claims `id` in `gate`'s scope and leaves it in doubt (its holder gone,
/// its outcome unknown), claimed `minutes` ago.
async fn in_doubt(gate: &Gate, id: &Identity, minutes: i32) {
    drop(gate.claim(id).await.expect("claim"));
    sqlx::query(
        "UPDATE idem_records SET state = 'in_doubt', state_reason = 'body_in_doubt', \
                lease_expires_at = NULL, \
                created_at = now() - make_interval(mins => $4), \
                in_doubt_since = now() - make_interval(mins => $4 - 1) \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(id.address())
    .bind(gate.namespace_name())
    .bind(minutes)
    .execute(gate.pool())
    .await
    .expect("hold it in doubt");
}

async fn state(gate: &Gate, id: &Identity) -> Option<(String, Option<String>, Option<String>)> {
    sqlx::query_as(
        "SELECT state, state_reason, output_json FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(id.address())
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("read the claim")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: run scripts/test-browser"]
async fn an_operator_finds_a_claim_in_doubt_resolves_it_and_the_row_changes() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let charge = Identity::new("charge").part("ord_1017").part(4999_i64);
    let refund = Identity::new("refund").part("ord_0988");
    in_doubt(&gate, &charge, 95).await;
    in_doubt(&gate, &refund, 30).await;
    for i in 0..5 {
        gate.guard(&Identity::new("charge").part(format!("ord_{i}")))
            .run(async { Ok::<_, idem::Rejected>(()) })
            .await
            .expect("a settled charge");
    }
    let served = serve(&["--allow-writes"]);
    let browser = Browser::start().await;

    // The overview: the claims in doubt, oldest first.
    browser.goto(&served.url).await;
    assert_eq!(browser.text("h1").await, "Overview");
    assert!(
        browser
            .text("main")
            .await
            .contains("In doubt, oldest first")
    );
    if let Some(path) = browser::docs_screenshot("console-overview") {
        browser.screenshot(path).await;
    }

    // The list, filtered to the account through the form.
    browser
        .goto(&format!("{}claims?state=in_doubt", served.url))
        .await;
    browser
        .fill("form.filters input[name=account]", &account)
        .await;
    browser.submit("form.filters").await;
    let url = browser.current_url().await;
    assert!(
        url.contains("state=in_doubt") && url.contains(&account),
        "{url}"
    );
    let rows = browser.find_all("table.claims tbody tr").await;
    assert_eq!(rows.len(), 2, "the two claims in doubt of this account");
    // Oldest first: the charge, in doubt for longer.
    assert!(
        browser
            .text("table.claims tbody tr")
            .await
            .contains("charge")
    );
    if let Some(path) = browser::docs_screenshot("console-claims") {
        browser.screenshot(path).await;
    }

    // Its page: identity decoded, fence, and what can be done.
    browser.follow("table.claims tbody tr a.address").await;
    let page = browser.text("main").await;
    assert!(page.contains(&charge.address()), "{page}");
    assert!(page.contains(r#"["ord_1017", 4999]"#), "{page}");
    assert!(page.contains("body_in_doubt"));
    if let Some(path) = browser::docs_screenshot("console-claim") {
        browser.screenshot(path).await;
    }

    // It went through at the provider: settle it, replaying the receipt.
    browser.follow("a.button.succeeded").await;
    assert!(
        browser
            .text("p.change")
            .await
            .contains("in_doubt → success, kept forever")
    );
    browser
        .fill("textarea[name=output]", r#"{"receipt":"r_1017"}"#)
        .await;
    if let Some(path) = browser::docs_screenshot("console-confirm") {
        browser.screenshot(path).await;
    }
    browser.submit("form.resolve").await;
    let done = browser.text("main").await;
    assert!(done.contains("Resolved: in_doubt → success"), "{done}");
    assert_eq!(
        state(&gate, &charge).await,
        Some((
            "success".into(),
            Some("operator".into()),
            Some(r#"{"receipt":"r_1017"}"#.into())
        ))
    );

    // The refund did not happen: release it, and its retry may run.
    browser
        .goto(&format!(
            "{}claim?account={account}&address={}",
            served.url,
            refund.address()
        ))
        .await;
    browser.follow("a.button.release").await;
    browser.submit("form.resolve").await;
    assert!(browser.text("main").await.contains("deleted (released)"));
    assert_eq!(state(&gate, &refund).await, None);

    // Each write's audit line says who made it, and from where.
    let said = served
        .said
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .join("\n");
    let audit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("idem::console::audit") && l.contains(&refund.address()))
        .collect();
    assert!(
        audit
            .iter()
            .any(|l| l.contains("loopback user at 127.0.0.1:") && l.contains("release")),
        "no audit line names the operator and where they were: {said}"
    );

    // Resolving the same claim again from a stale page changes nothing.
    browser.client().back().await.expect("back");
    browser.submit("form.resolve").await;
    assert!(
        browser.text("main").await.contains("Nothing changed"),
        "{}",
        browser.text("main").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: run scripts/test-browser"]
async fn a_hostile_name_renders_as_text_and_runs_nothing() {
    let base = testing::gate().await;
    let name = format!(
        "\u{202e}<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>{}",
        testing::unique_name("h")
    );
    let gate = base.account(&name);
    let id = Identity::new("<b>charge</b>").part("\"quoted\"");
    in_doubt(&gate, &id, 10).await;
    let served = serve(&[]);
    let browser = Browser::start().await;
    let claim = format!(
        "{}claim?{}",
        served.url,
        serde_urlencoded::to_string([("account", name.as_str()), ("address", &id.address())])
            .expect("a query")
    );
    for url in [served.url.clone(), claim.clone()] {
        browser.goto(&url).await;
        assert_ne!(
            browser.title().await,
            "pwned",
            "{url}: a name ran as script"
        );
        assert!(
            browser.find_all("main img").await.is_empty(),
            "{url}: a name became markup"
        );
        assert!(
            browser.find_all("main b").await.is_empty(),
            "{url}: an action became markup"
        );
    }
    // On the claim's page the name reads as it is, its override shown.
    let shown = browser.text("dl.facts").await;
    assert!(shown.contains("<img src=x onerror="), "{shown}");
    assert!(shown.contains("\\u{202e}"), "{shown}");
    // Read-only: nothing offers to resolve it.
    assert!(browser.find_all("a.button").await.is_empty());
    assert!(browser.text("section.actions").await.contains("read-only"));

    // The audit page runs `idem audit` on the database, as the command does.
    browser.follow("header nav a[href$='audit']").await;
    let audit = browser.text("main").await;
    assert_eq!(browser.find_all("pre.audit").await.len(), 1, "{audit}");
    assert!(audit.contains("unique"), "{audit}");
}

#[test]
fn beyond_loopback_it_refuses_to_start_without_a_token() {
    let run =
        idem_with(&["console", "--listen", "0.0.0.0:0"], Some(&database_url())).expect_code(2);
    assert!(run.stderr.contains("beyond loopback"), "{}", run.stderr);
    assert!(run.stderr.contains("IDEM_CONSOLE_TOKEN"), "{}", run.stderr);
}
