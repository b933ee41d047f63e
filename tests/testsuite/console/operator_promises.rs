//! The operator console's promises, attacked from its docs: its writes (fenced, exactly once),
//! its overview's counts, its tokens, and its audit lines.

use http::StatusCode;
use idem::console::{Console, check_token};
use idem::operations::{self, Slot};
use idem::{Disposition, Outcome};
use idem::{Gate, Identity, testing};
use idem_test_support::capture::Captured;

use super::support::{get, in_doubt, post, row, send, set_state, slot_query, writable};

/// One write attempt: its label, the console, method, path, headers and
/// body.
type Attempt<'a> = (
    String,
    &'a axum::Router,
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Option<String>,
);

const TOKEN: &str = "5d41402abc4b2a76b9719d911017c592";

/// The confirmation page of `as` for `id` at `fence`: its cookie and form.
async fn confirm(
    console: &axum::Router,
    gate: &Gate,
    id: &Identity,
    fence: i64,
    asked: &str,
) -> (String, String) {
    let slot = slot_query(gate.account_name(), gate.namespace_name(), &id.address());
    let page = get(
        console,
        &format!("/claim/resolve?{slot}&fence={fence}&as={asked}"),
    )
    .await;
    assert_eq!(
        page.status,
        StatusCode::OK,
        "the confirmation: {}",
        page.body
    );
    let cookie = page.csrf_cookie().expect("a cookie");
    let csrf = page.csrf_field().expect("a csrf field");
    let state = page.hidden("state").expect("the state shown");
    let fence_shown = page.hidden("fence").unwrap_or_else(|| fence.to_string());
    (
        cookie,
        format!("{slot}&fence={fence_shown}&as={asked}&state={state}&csrf={csrf}"),
    )
}

/// docs/operations.md (Resolving): "only in the state and at the fence the
/// confirmation showed (a claim taken over since is not changed [...])".
/// The claim confirmed is released by someone else, claimed anew and held
/// in doubt again: a new claim, which the old confirmation must not change
/// even if its fence came out the same.
#[tokio::test]
async fn console_a_confirmation_never_applies_to_a_claim_made_anew_since() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let mut broken = Vec::new();
    for asked in ["release", "failed"] {
        let id = Identity::new("red39_console").part(testing::unique_name("c").as_str());
        let fence = in_doubt(&gate, &id).await;
        let (cookie, form) = confirm(&console, &gate, &id, fence, asked).await;
        // Meanwhile: released by another operator, claimed anew, in doubt.
        let address = id.address();
        operations::resolve(
            gate.pool(),
            Slot::new(gate.account_name(), gate.namespace_name(), &address),
            Outcome::Failed(Disposition::Release),
        )
        .await
        .expect("released");
        let new_fence = in_doubt(&gate, &id).await;
        let page = post(&console, &cookie, &form).await;
        let after = row(&gate, &id).await;
        if after.as_ref().map(|r| r.0.as_str()) != Some("in_doubt") {
            broken.push(format!(
                "as={asked}: the confirmation shown at fence {fence} changed the claim made anew \
                 since (fence {new_fence}): now {after:?}, answer {} {}",
                page.status,
                page.body.chars().take(300).collect::<String>()
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The same confirmation raced against the claim changing state under it
/// (pending shown, in doubt since) at one instant: nothing changes when it
/// moved first, and the confirmation applies exactly once otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_a_confirmation_raced_against_a_state_change_changes_nothing_it_did_not_show() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let mut broken = Vec::new();
    for round in 0..6 {
        let id = Identity::new("red39_console_race")
            .part(round as u64)
            .part(testing::unique_name("r").as_str());
        let claim = gate.claim(&id).await.expect("claim");
        let fence = claim.fence().expect("fence");
        drop(claim);
        set_state(&gate, &id, "pending").await;
        let (cookie, form) = confirm(&console, &gate, &id, fence, "release").await;
        assert!(form.contains("state=pending"), "{form}");
        let barrier = tokio::sync::Barrier::new(2);
        let (page, ()) = tokio::join!(
            async {
                barrier.wait().await;
                post(&console, &cookie, &form).await
            },
            async {
                barrier.wait().await;
                set_state(&gate, &id, "in_doubt").await;
            }
        );
        let after = row(&gate, &id).await;
        let released = after.is_none();
        let ok = page.status == StatusCode::OK;
        // Either released first (then the state change found nothing) or
        // refused and the claim is in doubt.
        if released != ok {
            broken.push(format!(
                "round {round}: answer {} but the claim is {after:?}",
                page.status
            ));
        }
        if !released && after.as_ref().map(|r| r.0.as_str()) != Some("in_doubt") {
            broken.push(format!("round {round}: the claim is {after:?}"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// docs/operations.md: "its totals of claims pending, in doubt and failed
/// are exact, however many of their groups (account, state, action) the
/// table below them has room for (the first 500, saying so when there are
/// more)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_overview_totals_are_exact_beyond_500_groups() {
    let gate = testing::gate_on(testing::pool_with(8).await).await;
    let actions = 530usize;
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            for i in (chunk..actions).step_by(8) {
                let id = Identity::new(format!("red39_group_{i:04}")).part(1u8);
                let claim = gate.claim(&id).await.expect("claim");
                drop(claim); // left pending
            }
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    // And 3 in doubt on top.
    for i in 0..3u8 {
        in_doubt(&gate, &Identity::new("red39_group_doubt").part(i)).await;
    }
    let console = Console::new(gate.pool().clone()).router();
    let page = get(&console, &format!("/?account={}", gate.account_name())).await;
    assert_eq!(page.status, StatusCode::OK);
    let text = page.body.replace(['\u{a0}', ','], "");
    assert!(
        text.contains(&actions.to_string()),
        "the overview does not show the exact total of {actions} pending claims (the groups \
         overflow 500):\n{}",
        text.chars().take(4000).collect::<String>()
    );
    let lower = text.to_lowercase();
    assert!(
        lower.contains("only the first groups are shown")
            || lower.contains("first 500")
            || lower.contains("at least"),
        "the overview does not say its table of groups was cut at 500:\n{}",
        strip_tags(&page.body)
    );
    // The table shows at most 500 group rows.
    let groups = page.body.matches("red39_group_").count();
    assert!(groups <= 1100, "{groups} mentions of the groups");
}

/// docs/operations.md (Security): "at least 128 bits, counted as its
/// length times the bits of the smallest alphabet its characters fit [...]
/// so 32 hex digits or 22 letters and digits".
#[test]
fn console_short_tokens_are_refused_by_the_rule_the_docs_state() {
    let cases: [(&str, usize, bool); 10] = [
        ("hex lower 32", 32, true),
        ("hex lower 31", 31, false),
        ("digits 39", 39, true),
        ("digits 38", 38, false),
        ("alnum mixed 22", 22, true),
        ("alnum mixed 21", 21, false),
        ("alnum lower 25", 25, true),
        ("alnum lower 24", 24, false),
        ("base64 22", 22, true),
        ("other 20", 20, true),
    ];
    let mut broken = Vec::new();
    for (what, n, ok) in cases {
        let token: String = match what {
            w if w.starts_with("hex") => "0123456789abcdef".chars().cycle().take(n).collect(),
            w if w.starts_with("digits") => "0123456789".chars().cycle().take(n).collect(),
            "alnum mixed 22" | "alnum mixed 21" => {
                "aB3dE5gH7jK9mN1pQ2sT4vW6".chars().cycle().take(n).collect()
            }
            w if w.starts_with("alnum lower") => {
                "abcdefghijklmnopqrstuvwxyz0123".chars().take(n).collect()
            }
            "base64 22" => "aB3-_+/=".chars().cycle().take(n).collect(),
            _ => "a!b@c#d$e%".chars().cycle().take(n).collect(),
        };
        if check_token(&token).is_ok() != ok {
            broken.push(format!(
                "{what} ({token}): check_token said {:?}",
                check_token(&token)
            ));
        }
    }
    // Whitespace and an empty token.
    if check_token("").is_ok() {
        broken.push("the empty token was taken".into());
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// "send `Authorization: Bearer ...` (the scheme in any case)": every case
/// of the scheme lets in; another scheme, or the token cut or padded, does
/// not.
#[tokio::test]
async fn console_the_bearer_scheme_is_case_insensitive_and_nothing_else_gets_in() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).token(TOKEN).router();
    let host = ("host", "console.internal:8080");
    let mut broken = Vec::new();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} {TOKEN}");
        let page = send(
            &console,
            "GET",
            "/claims?limit=1",
            &[host, ("authorization", &auth)],
            None,
        )
        .await;
        if page.status != StatusCode::OK {
            broken.push(format!("{auth:?}: {}", page.status));
        }
    }
    for auth in [
        format!("Basic {TOKEN}"),
        format!("Bearer {}", &TOKEN[..31]),
        format!("Bearer {TOKEN}0"),
        format!("Bearer{TOKEN}"),
        TOKEN.to_owned(),
        format!("Bearer {}", TOKEN.to_uppercase()),
        "Bearer ".to_owned(),
    ] {
        let page = send(
            &console,
            "GET",
            "/claims?limit=1",
            &[host, ("authorization", &auth)],
            None,
        )
        .await;
        if page.status == StatusCode::OK {
            broken.push(format!("{auth:?} got in"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

fn audit_lines(captured: &Captured) -> Vec<String> {
    captured
        .lines_with("idem::console::audit")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// docs/operations.md (Audit): "Every write attempt leaves exactly one line
/// [...] refused at the door [...] refused later [...] or applied", with
/// every write method, odd paths, a body larger than the extractor takes,
/// a form of another content type, and no content type.
#[tokio::test]
async fn console_every_odd_write_attempt_leaves_exactly_one_audit_line() {
    let (captured, _guard) = Captured::scoped();
    let gate = testing::gate().await;
    let id = Identity::new("red39_audit").part(testing::unique_name("a").as_str());
    let fence = in_doubt(&gate, &id).await;
    let loopback = writable(&gate);
    let read_only = Console::new(gate.pool().clone()).router();
    let with_token = Console::new(gate.pool().clone())
        .token(TOKEN)
        .allow_writes(true)
        .router();
    let (cookie, form) = confirm(&loopback, &gate, &id, fence, "failed").await;
    let big = format!("{form}&pad={}", "x".repeat(3 * 1024 * 1024));
    let mut broken = Vec::new();
    let same_site = vec![
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:8080"),
        ("sec-fetch-site", "same-origin"),
    ];
    let mut attempts: Vec<Attempt<'_>> = Vec::new();
    for method in ["POST", "PUT", "PATCH", "DELETE", "PURGE"] {
        for path in [
            "/claim/resolve",
            "/claim/resolve/",
            "/",
            "/claim",
            "/x/../claim/resolve",
            "//claim/resolve",
        ] {
            attempts.push((
                format!("{method} {path} loopback"),
                &loopback,
                method,
                path,
                same_site.clone(),
                Some(form.clone()),
            ));
            attempts.push((
                format!("{method} {path} rebound"),
                &loopback,
                method,
                path,
                vec![("host", "evil.example")],
                Some(form.clone()),
            ));
            attempts.push((
                format!("{method} {path} no token"),
                &with_token,
                method,
                path,
                vec![("host", "console.internal")],
                Some(form.clone()),
            ));
            attempts.push((
                format!("{method} {path} read-only"),
                &read_only,
                method,
                path,
                same_site.clone(),
                Some(form.clone()),
            ));
        }
    }
    attempts.push((
        "a 3 MiB form".into(),
        &loopback,
        "POST",
        "/claim/resolve",
        same_site.clone(),
        Some(big),
    ));
    let mut json = same_site.clone();
    json.push(("content-type", "application/json"));
    attempts.push((
        "a JSON body".into(),
        &loopback,
        "POST",
        "/claim/resolve",
        json,
        Some("{}".into()),
    ));
    attempts.push((
        "no body".into(),
        &loopback,
        "POST",
        "/claim/resolve",
        same_site.clone(),
        None,
    ));
    attempts.push((
        "a body not UTF-8".into(),
        &loopback,
        "POST",
        "/claim/resolve",
        same_site.clone(),
        Some("csrf=%FF%FE&as=%C0".into()),
    ));
    attempts.push((
        "no host".into(),
        &loopback,
        "POST",
        "/claim/resolve",
        vec![("host", "")],
        Some(form.clone()),
    ));
    for (what, console, method, path, headers, body) in attempts {
        let before = audit_lines(&captured).len();
        let page = send(console, method, path, &headers, body).await;
        let lines = audit_lines(&captured);
        if lines.len() - before != 1 {
            broken.push(format!(
                "{what}: {} audit lines (answer {}), not one:\n{}",
                lines.len() - before,
                page.status,
                lines[before..].join("\n")
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
    // Only the one well-formed, same-site write applied.
    assert_eq!(
        row(&gate, &id).await.map(|r| r.0).as_deref(),
        Some("failed")
    );
}

fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                out.push(' ');
            }
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    let all: Vec<char> = out
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .collect();
    all[all.len().saturating_sub(2500)..].iter().collect()
}
