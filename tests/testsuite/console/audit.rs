//! The console's audit log (target `idem::console::audit`): every write
//! asked for leaves exactly one line, whether it was refused at the door
//! (a rebound name, no token), refused later (read-only, forged, not
//! understood, no such write), or applied.

use http::StatusCode;
use idem::console::Console;
use idem::{Identity, testing};
use idem_test_support::capture::Captured;

use super::support::{get, in_doubt, send, slot_query, writable};

/// A token long enough for a console beyond loopback.
const TOKEN: &str = "5d41402abc4b2a76b9719d911017c592";

/// The audit lines captured so far.
fn audit_lines(captured: &Captured) -> Vec<String> {
    captured
        .lines_with("idem::console::audit")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn every_write_attempt_leaves_exactly_one_audit_line() {
    let (captured, _default) = Captured::scoped();

    let gate = testing::gate().await;
    let id = Identity::new("charge").part("audited");
    let fence = in_doubt(&gate, &id).await;
    let loopback = writable(&gate);
    let with_token = Console::new(gate.pool().clone())
        .token(TOKEN)
        .allow_writes(true)
        .router();
    let read_only = Console::new(gate.pool().clone()).router();
    let slot = slot_query(gate.account_name(), None, &id.address());
    let page = get(
        &loopback,
        &format!("/claim/resolve?{slot}&fence={fence}&as=failed"),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let cookie = page.csrf_cookie().expect("a cookie");
    let csrf = page.csrf_field().expect("a token");
    let form = format!("{slot}&fence={fence}&state=in_doubt&as=failed&csrf={csrf}");
    let rebound = ("host", "evil.example:8080");
    let elsewhere = ("host", "console.internal:8080");
    let same_site = [
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:8080"),
        ("sec-fetch-site", "same-origin"),
    ];
    let wrong_token = format!("Bearer {TOKEN}x");
    // (what, console, method, path, headers, body, the answer)
    type Attempt<'a> = (
        &'a str,
        &'a axum::Router,
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        String,
        StatusCode,
    );
    let attempts: Vec<Attempt> = vec![
        (
            "a page on a rebound name",
            &loopback,
            "POST",
            "/claim/resolve",
            vec![rebound, ("origin", "http://evil.example:8080")],
            form.clone(),
            StatusCode::FORBIDDEN,
        ),
        (
            "a rebound name, another method",
            &loopback,
            "PUT",
            "/claim/resolve",
            vec![rebound],
            form.clone(),
            StatusCode::FORBIDDEN,
        ),
        (
            "a rebound name, another path",
            &loopback,
            "POST",
            "/",
            vec![rebound],
            String::new(),
            StatusCode::FORBIDDEN,
        ),
        (
            "no token",
            &with_token,
            "POST",
            "/claim/resolve",
            vec![elsewhere],
            form.clone(),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "a wrong token",
            &with_token,
            "POST",
            "/claim/resolve",
            vec![elsewhere, ("authorization", &wrong_token)],
            form.clone(),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "a read-only console",
            &read_only,
            "POST",
            "/claim/resolve",
            same_site.to_vec(),
            form.clone(),
            StatusCode::FORBIDDEN,
        ),
        (
            "another method",
            &loopback,
            "PUT",
            "/claim/resolve",
            same_site.to_vec(),
            form.clone(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            "a page that takes no write",
            &loopback,
            "POST",
            "/claims",
            same_site.to_vec(),
            form.clone(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            "no such page",
            &loopback,
            "DELETE",
            "/nowhere",
            same_site.to_vec(),
            String::new(),
            StatusCode::NOT_FOUND,
        ),
        (
            "another origin",
            &loopback,
            "POST",
            "/claim/resolve",
            vec![("cookie", &cookie), ("origin", "http://evil.example")],
            form.clone(),
            StatusCode::FORBIDDEN,
        ),
        (
            "a form not understood",
            &loopback,
            "POST",
            "/claim/resolve",
            same_site.to_vec(),
            format!("{form}&colour=red"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "the confirmed form",
            &loopback,
            "POST",
            "/claim/resolve",
            same_site.to_vec(),
            form.clone(),
            StatusCode::OK,
        ),
        (
            "the confirmed form again",
            &loopback,
            "POST",
            "/claim/resolve",
            same_site.to_vec(),
            form.clone(),
            StatusCode::CONFLICT,
        ),
    ];
    for (what, console, method, path, headers, body, status) in attempts {
        let before = audit_lines(&captured).len();
        let page = send(console, method, path, &headers, Some(body)).await;
        assert_eq!(page.status, status, "{what}: {}", page.body);
        let lines = audit_lines(&captured);
        assert_eq!(
            lines.len() - before,
            1,
            "{what}: {} audit lines, not one:\n{}",
            lines.len() - before,
            lines[before..].join("\n")
        );
    }
    // Reads are no writes: no line, let in or refused.
    let before = audit_lines(&captured).len();
    for (console, headers) in [
        (&loopback, vec![]),
        (&loopback, vec![rebound]),
        (&with_token, vec![elsewhere]),
    ] {
        send(console, "GET", "/claims?limit=1", &headers, None).await;
        send(console, "HEAD", "/", &headers, None).await;
    }
    assert_eq!(audit_lines(&captured).len(), before, "a read was audited");
}

/// The line of a write refused at the door says where it was addressed,
/// what it asked for, and why it was refused; the name it was addressed to
/// is recorded as a quoted value, so it cannot end the line.
#[tokio::test]
async fn a_write_refused_at_the_door_is_on_record_with_where_it_was_addressed() {
    let (captured, _default) = Captured::scoped();
    let gate = testing::gate().await;
    let console = writable(&gate);
    let page = send(
        &console,
        "POST",
        "/claim/resolve?x=1",
        &[("host", "evil.example"), ("origin", "http://evil.example")],
        Some("as=release".into()),
    )
    .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    let lines = audit_lines(&captured);
    assert_eq!(lines.len(), 1, "{lines:?}");
    for part in [
        "WARN",
        "refused at the door",
        r#"method="POST""#,
        r#"path="/claim/resolve""#,
        r#"host="evil.example""#,
        r#"origin="http://evil.example""#,
        "not addressed to a loopback name",
    ] {
        assert!(lines[0].contains(part), "no {part:?} in {:?}", lines[0]);
    }
}
