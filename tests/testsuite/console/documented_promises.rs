//! Each test takes one promise of the console's docs (the
//! module docs of `idem::console`, docs/operations.md "The console") and
//! attacks it: hostile hosts and paths, forged and raced writes, names
//! and rows an attacker chose, damaged cursors, odd mounts. Each asserts
//! what the docs promise, so a break fails.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idem::console::{Access, Audit, Console, Operator};
use idem::sqlx;
use idem::{Gate, Identity, testing};
use tokio::sync::Barrier;

use super::support::{Page, get, in_doubt, post, row, send, slot_query, writable};

const SECURITY_HEADERS: [(&str, &str); 3] = [
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "same-origin"),
];

fn assert_secured(page: &Page, what: &str) {
    for (name, value) in SECURITY_HEADERS {
        assert_eq!(
            page.headers.get(name).and_then(|v| v.to_str().ok()),
            Some(value),
            "{what}: header {name} (status {})",
            page.status
        );
    }
    let csp = page
        .headers
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        csp.contains("frame-ancestors 'none'"),
        "{what}: CSP {csp:?}"
    );
}

/// The confirmation of `asked` for `id` in `gate`'s scope, through
/// `console`: its cookie and the form its button posts.
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
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let csrf = page.csrf_field().expect("the form carries a token");
    let state = page
        .hidden("state")
        .expect("the form carries the state it shows");
    let cookie = page.csrf_cookie().expect("a cookie");
    (
        cookie,
        format!("{slot}&fence={fence}&as={asked}&state={state}&csrf={csrf}"),
    )
}

async fn state_of(gate: &Gate, id: &Identity) -> Option<String> {
    row(gate, id).await.map(|r| r.0)
}

// ---------------------------------------------------------------------
// Access
// ---------------------------------------------------------------------

/// "by default only requests addressed to a loopback name (`127.0.0.1`,
/// `localhost`, `[::1]`)": a Host that merely starts with one is not one.
#[tokio::test]
async fn the_loopback_check_refuses_hosts_that_only_start_like_a_loopback_name() {
    let gate = testing::gate().await;
    in_doubt(&gate, &Identity::new("charge").part("host")).await;
    let console = Console::new(gate.pool().clone()).router();
    let mut got_in: Vec<(&str, u16)> = Vec::new();
    for host in [
        "[::1].evil.example",
        "[::1]evil.example:8080",
        "[::1]@evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io:8080",
        "127.1",
        "[::ffff:127.0.0.1]:8080",
        "evil.example:127.0.0.1",
    ] {
        let page = send(&console, "GET", "/claims", &[("host", host)], None).await;
        if page.status != StatusCode::FORBIDDEN {
            got_in.push((host, page.status.as_u16()));
        }
    }
    assert_eq!(got_in, vec![], "Hosts that are not loopback names got in");
}

/// Loopback names in any case or IPv6 spelling get in (a browser may send
/// either).
#[tokio::test]
async fn the_loopback_check_takes_every_spelling_of_a_loopback_name() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).router();
    for host in [
        "LOCALHOST:8080",
        "LocalHost",
        "[0:0:0:0:0:0:0:1]:8080",
        "127.255.255.254:1",
    ] {
        let page = send(&console, "GET", "/claims?limit=1", &[("host", host)], None).await;
        assert_eq!(page.status, StatusCode::OK, "{host}: {}", page.body);
    }
}

/// "Every response is `no-store`, framed by nobody, ...": a path the
/// console has no page for is a response too, and a rebound name gets no
/// further on it than on a page.
#[tokio::test]
async fn a_path_without_a_page_is_secured_and_refused_off_loopback_too() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).router();
    let missing = get(&console, "/no-such-page").await;
    assert!(missing.status.is_client_error(), "{}", missing.status);
    assert_secured(&missing, "a path without a page");
    let rebound = send(
        &console,
        "GET",
        "/no-such-page",
        &[("host", "evil.example")],
        None,
    )
    .await;
    assert_eq!(rebound.status, StatusCode::FORBIDDEN, "rebound name");
    // The method a page does not take.
    let wrong = send(&console, "DELETE", "/claims", &[], None).await;
    assert!(wrong.status.is_client_error());
    assert_secured(&wrong, "a method a page does not take");
}

/// "the cookie that opening `?token=...` once sets": the redirect that
/// takes the token out of the address stays on the console, whatever the
/// path looks like.
#[tokio::test]
async fn the_redirect_that_drops_the_token_never_leaves_the_console() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).token("T0k").router();
    let host = ("host", "console.internal:8080");
    let mut off: Vec<(&str, String)> = Vec::new();
    for uri in [
        "//evil.example/?token=T0k",
        "///evil.example/?token=T0k",
        "/\\evil.example/?token=T0k",
        "//evil.example/claims?token=T0k",
        "/%2Fevil.example?token=T0k",
        "/claims/..//evil.example?token=T0k",
    ] {
        let page = send(&console, "GET", uri, &[host], None).await;
        if let Some(location) = page.headers.get("location") {
            let location = location.to_str().unwrap().to_owned();
            if !location.starts_with('/')
                || location.starts_with("//")
                || location.starts_with("/\\")
            {
                off.push((uri, location));
            }
        }
        assert_secured(&page, uri);
    }
    assert_eq!(off, vec![], "redirected off the console");
}

/// The token: given twice, empty, huge, or in the wrong place, it lets in
/// only its holder; a refusal shows no data.
#[tokio::test]
async fn a_token_lets_in_its_holder_only_however_it_is_presented() {
    let gate = testing::gate().await;
    in_doubt(&gate, &Identity::new("charge").part("tok")).await;
    let console = Console::new(gate.pool().clone())
        .token("s3cret;x=1")
        .router();
    let host = ("host", "console.internal:8080");
    let long = "a".repeat(20_000);
    let refused: Vec<(String, Vec<(&str, String)>)> = vec![
        ("/?token=guess&token=s3cret%3Bx%3D1".into(), vec![]),
        ("/?token=".into(), vec![]),
        (format!("/?token={long}"), vec![]),
        ("/".into(), vec![("authorization", "Bearer s3cret".into())]),
        (
            "/".into(),
            vec![("authorization", "Basic s3cret;x=1".into())],
        ),
        (
            "/".into(),
            vec![("authorization", format!("Bearer {long}"))],
        ),
        (
            "/".into(),
            vec![("cookie", "idem_console_token=s3cret;x=1".into())],
        ),
        ("/".into(), vec![("cookie", "x=1".into())]),
        ("/".into(), vec![("cookie", "idem_console_token=".into())]),
        // The token in a POST's query is not the `?token=` of a page.
        ("/claim/resolve?token=s3cret%3Bx%3D1".into(), vec![]),
    ];
    for (uri, extra) in refused {
        let mut headers = vec![host];
        headers.extend(extra.iter().map(|(n, v)| (*n, v.as_str())));
        let method = if uri.starts_with("/claim/resolve") {
            "POST"
        } else {
            "GET"
        };
        let page = send(&console, method, &uri, &headers, None).await;
        assert_eq!(
            page.status,
            StatusCode::UNAUTHORIZED,
            "{uri:.60} {extra:.60?}"
        );
        assert!(!page.body.contains(gate.account_name()), "a refusal leaks");
        assert!(page.headers.get("location").is_none());
    }
    // The token with characters a cookie cannot carry, given first: in.
    let opened = send(
        &console,
        "GET",
        "/claims?token=s3cret%3Bx%3D1&token=s3cret%3Bx%3D1",
        &[host],
        None,
    )
    .await;
    assert_eq!(opened.status, StatusCode::SEE_OTHER);
    assert_eq!(opened.headers["location"], "/claims");
    let cookie = opened
        .set_cookies()
        .into_iter()
        .find(|c| c.starts_with("idem_console_token="))
        .expect("a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = send(
        &console,
        "GET",
        "/claims",
        &[host, ("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
}

// ---------------------------------------------------------------------
// Mounting
// ---------------------------------------------------------------------

/// "Every link is relative, so the pages work wherever the router is
/// nested": nested under a path with a parameter (one console per
/// tenant), its links (and its stylesheet and script) stay under the path
/// the browser asked for.
#[tokio::test]
async fn nested_under_a_path_with_a_parameter_links_stay_under_it() {
    let gate = testing::gate().await;
    in_doubt(&gate, &Identity::new("charge").part(1)).await;
    let app = axum::Router::new().nest("/t/{tenant}", writable(&gate));
    let page = get(
        &app,
        &format!("/t/acme/claims?account={}", gate.account_name()),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let leaving: Vec<&str> = page
        .body
        .split(['"'])
        .filter(|piece| piece.starts_with('/') && !piece.starts_with("/t/acme/"))
        .collect();
    assert_eq!(
        leaving,
        Vec::<&str>::new(),
        "links and assets leave the mount"
    );
}

/// The same mount: its CSRF cookie is sent back on the path the browser
/// is on (else no write can ever pass the CSRF check).
#[tokio::test]
async fn nested_under_a_path_with_a_parameter_its_cookie_comes_back() {
    let gate = testing::gate().await;
    let app = axum::Router::new().nest("/t/{tenant}", writable(&gate));
    let page = get(&app, "/t/acme/claims?limit=1").await;
    assert_eq!(page.status, StatusCode::OK);
    let cookies = page.set_cookies();
    assert!(
        cookies.iter().all(|c| c.contains("Path=/t/acme/")),
        "{cookies:?}"
    );
}

/// The same mount with a token: `?token=` redirects to the page the
/// browser asked for, under the path it is on.
#[tokio::test]
async fn nested_under_a_path_with_a_parameter_the_token_redirect_stays_under_it() {
    let gate = testing::gate().await;
    let tokened = axum::Router::new().nest(
        "/t/{tenant}",
        Console::new(gate.pool().clone()).token("T0k").router(),
    );
    let opened = send(
        &tokened,
        "GET",
        "/t/acme/claims?token=T0k",
        &[("host", "console.internal")],
        None,
    )
    .await;
    assert_eq!(opened.status, StatusCode::SEE_OTHER);
    assert_eq!(opened.headers["location"], "/t/acme/claims");
    let cookies = opened.set_cookies();
    assert!(
        cookies.iter().all(|c| c.contains("Path=/t/acme/")),
        "{cookies:?}"
    );
}

// ---------------------------------------------------------------------
// Errors: bad parameters are 400, never an outage
// ---------------------------------------------------------------------

/// "bad parameters must be 400 with a message that says what to do, never
/// 5xx" (and DESIGN: "an error of the request itself is never an
/// outage"): a NUL byte, which no PostgreSQL text holds, in a name.
#[tokio::test]
async fn a_nul_in_a_name_is_a_bad_request_not_an_outage() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let mut outages: Vec<(&str, u16)> = Vec::new();
    for uri in [
        "/claims?account=%00",
        "/claims?account=a%00b&state=in_doubt",
        "/claims?namespace=%00",
        "/claims?action=%00",
        "/claim?account=%00&address=claim_000000000000000000000000",
        "/claim?account=a&namespace=%00&address=claim_000000000000000000000000",
        "/claim/resolve?account=%00&address=claim_000000000000000000000000&fence=1&as=failed",
        // A cursor carries its account in hex: 00 decodes to a NUL.
        "/claims?after=0.00.claim_1.-",
        "/claims?state=in_doubt&after=0.00.claim_1.-",
        "/claims?after=0.61.claim_1.n00",
    ] {
        let page = get(&console, uri).await;
        if page.status.is_server_error() {
            outages.push((uri, page.status.as_u16()));
        }
    }
    assert_eq!(
        outages,
        vec![],
        "requests refused as outages, not as requests"
    );
}

/// "Damaged/hostile cursors" are refused as damaged, not as an outage: a
/// cursor whose instant PostgreSQL cannot represent.
#[tokio::test]
async fn a_cursor_out_of_every_range_is_damaged_not_an_outage() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).router();
    let mut wrong: Vec<(String, u16)> = Vec::new();
    for after in [
        "9223372036854775807.61.claim_1.-",
        "-9223372036854775808.61.claim_1.-",
        "-300000000000000000.61.claim_1.n",
    ] {
        for state in ["in_doubt", "pending", "failed"] {
            let uri = format!("/claims?state={state}&after={after}");
            let page = get(&console, &uri).await;
            if page.status != StatusCode::BAD_REQUEST {
                wrong.push((uri, page.status.as_u16()));
            }
        }
    }
    assert_eq!(wrong, vec![], "damaged cursors not refused as damaged");
}

/// Durations and limits at their edges are answered (or refused as
/// requests), never an outage nor a panic.
#[tokio::test]
async fn durations_and_limits_at_their_edges_are_answered() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).router();
    for uri in [
        "/claims?older_than=18446744073709551615",
        "/claims?older_than=18446744073709551615s&state=in_doubt",
        "/claims?older_than=30000000000w&state=pending",
        "/claims?older_than=0s",
        "/?pending_older_than=18446744073709551615",
        "/?pending_older_than=0",
        "/claims?limit=500",
    ] {
        let page = get(&console, uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
    }
    for uri in [
        "/claims?limit=501",
        "/claims?limit=-1",
        "/claims?limit=1e3",
        "/claims?limit=99999999999999999999",
        "/claims?older_than=99999999999999999999",
        "/claims?older_than=1h30",
        "/claims?older_than=%E2%91%A0s",
        "/claims?state=IN_DOUBT",
        "/claims?%ff=1",
        "/claim?account=a&address=claim_1&values=SHOWN",
        "/claim/resolve?account=a&address=claim_1&fence=99999999999999999999&as=failed",
        "/audit?x=1",
    ] {
        let page = get(&writable(&gate), uri).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
    }
}

/// "nothing a request sends may panic the server", nor be answered as an
/// outage: odd bytes, sizes and shapes in every page's parameters.
#[tokio::test]
async fn odd_parameters_on_every_page_are_answered_never_as_a_failure() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let many = (0..5_000)
        .map(|i| format!("p{i}=1"))
        .collect::<Vec<_>>()
        .join("&");
    let long = "%E2%80%AE".repeat(4_000);
    let uris = vec![
        format!("/claims?{many}"),
        format!("/claims?account={long}"),
        format!("/claims?after=1.{}.claim_1.-", "%C3%A9".repeat(2)),
        "/claims?after=1.e.claim_1.-".to_owned(),
        "/claims?after=1..claim_1.-".to_owned(),
        "/claims?after=.61.claim_1.-".to_owned(),
        "/claims?after=1.61.claim_1.n%C3%A9".to_owned(),
        "/claims?after=%00".to_owned(),
        "/claims?state=".to_owned(),
        "/claims?state&account".to_owned(),
        "/claims?=x".to_owned(),
        "/claims?&&&".to_owned(),
        "/claims?%".to_owned(),
        "/claims?account=%zz".to_owned(),
        "/claim?account=&address=claim_1".to_owned(),
        format!("/claim?account=a&address={}", "a".repeat(64)),
        "/claim?account=a&address=claim_1&namespace=".to_owned(),
        "/claim/resolve?account=a&address=claim_1&fence=-9223372036854775808&as=release".to_owned(),
        "/claim/resolve?account=a&address=claim_1&fence=%2B1&as=release".to_owned(),
        "/?pending_older_than=".to_owned(),
        "/?pending_older_than=1w1w1w1w".to_owned(),
        "/?pending_older_than=00000000000000000000000000001s".to_owned(),
        "/assets/console.css?x=%00".to_owned(),
    ];
    let mut failed = Vec::new();
    for uri in &uris {
        let page = get(&console, uri).await;
        if page.status.is_server_error() {
            failed.push((
                uri.chars().take(80).collect::<String>(),
                page.status.as_u16(),
            ));
        }
        assert_secured(&page, &uri[..uri.len().min(60)]);
    }
    assert_eq!(failed, Vec::<(String, u16)>::new());
}

// ---------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------

/// "only at the fence the confirmation showed", in the claim it names:
/// the same address without a namespace, in the empty namespace and in
/// another account are three claims, and resolving one leaves the others.
#[tokio::test]
async fn the_empty_namespace_none_and_another_account_are_three_claims_to_resolve() {
    let base = testing::gate().await;
    let other = base.account(testing::unique_name("other"));
    let id = Identity::new("charge").part("same");
    let without = base.clone();
    let empty = base.namespace("");
    let fences = [
        in_doubt(&without, &id).await,
        in_doubt(&empty, &id).await,
        in_doubt(&other, &id).await,
    ];
    let console = writable(&base);

    // The empty namespace's claim, as its own page links it.
    let shown = get(
        &console,
        &format!(
            "/claim?{}",
            slot_query(base.account_name(), Some(""), &id.address())
        ),
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK);
    let (cookie, form) = confirm(&console, &empty, &id, fences[1], "failed").await;
    let done = post(&console, &cookie, &form).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(state_of(&empty, &id).await.as_deref(), Some("failed"));
    assert_eq!(state_of(&without, &id).await.as_deref(), Some("in_doubt"));
    assert_eq!(state_of(&other, &id).await.as_deref(), Some("in_doubt"));

    // The one without a namespace, released.
    let (cookie, form) = confirm(&console, &without, &id, fences[0], "release").await;
    let done = post(&console, &cookie, &form).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(state_of(&without, &id).await, None);
    assert_eq!(state_of(&empty, &id).await.as_deref(), Some("failed"));
    assert_eq!(state_of(&other, &id).await.as_deref(), Some("in_doubt"));
}

/// "only at the fence the confirmation showed (a claim taken over since is
/// not changed)": a real takeover by a gate between the confirmation and
/// the post, not a fence bumped by hand.
#[tokio::test]
async fn a_claim_taken_over_between_confirmation_and_post_stays_its_new_holders() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let id = Identity::new("charge").part("takeover");
    let first = gate
        .guard(&id)
        .lease(Duration::from_millis(300))
        .claim()
        .await
        .expect("claim");
    let fence = first.fence().expect("a fence");
    crate::support::holders::vanish(first); // its holder vanished: pending, lease running out
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (cookie, form) = confirm(&console, &gate, &id, fence, "release").await;
    let second = gate
        .guard(&id)
        .lease(Duration::from_secs(300))
        .claim()
        .await
        .expect("taken over");
    let new_fence = second.fence().expect("a fence");
    assert!(new_fence > fence);
    let refused = post(&console, &cookie, &form).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    let (state, now, _) = row(&gate, &id).await.expect("still claimed");
    assert_eq!((state.as_str(), now), ("pending", new_fence));
    second.settle().await.expect("its holder settles it");
    assert_eq!(state_of(&gate, &id).await.as_deref(), Some("success"));
}

/// "exactly once": a confirmation kept open in a second tab after the
/// claim was released from the first and claimed anew (in doubt again,
/// same address) changes nothing of the new claim.
#[tokio::test]
async fn a_stale_tab_does_not_resolve_the_claim_made_after_its_release() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let id = Identity::new("charge").part("second_tab");
    let fence = in_doubt(&gate, &id).await;
    let (cookie, release) = confirm(&console, &gate, &id, fence, "release").await;
    let (other_tab, succeed) = confirm(&console, &gate, &id, fence, "succeeded").await;
    let done = post(&console, &cookie, &release).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let new_fence = in_doubt(&gate, &id).await;
    assert_ne!(new_fence, fence);
    let stale = post(&console, &other_tab, &format!("{succeed}&output=1")).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    let (state, now, output) = row(&gate, &id).await.expect("the new claim");
    assert_eq!((state.as_str(), now, output), ("in_doubt", new_fence, None));
}

/// "exactly once however many operators click at once": operators in
/// different browsers on two consoles over one database, each with its own
/// confirmation.
#[tokio::test]
async fn operators_on_two_consoles_racing_resolve_a_claim_once() {
    const PER_CONSOLE: usize = 6;
    let gate = testing::gate().await;
    let consoles = [writable(&gate), writable(&gate)];
    let id = Identity::new("charge").part("two_consoles");
    let fence = in_doubt(&gate, &id).await;
    let mut forms = Vec::new();
    for (c, console) in consoles.iter().enumerate() {
        for i in 0..PER_CONSOLE {
            let asked = ["succeeded", "failed", "release"][(i + c) % 3];
            let (cookie, form) = confirm(console, &gate, &id, fence, asked).await;
            forms.push((console.clone(), cookie, form, asked));
        }
    }
    let barrier = Arc::new(Barrier::new(forms.len()));
    let mut racers = tokio::task::JoinSet::new();
    for (console, cookie, form, asked) in forms {
        let barrier = barrier.clone();
        racers.spawn(async move {
            barrier.wait().await;
            (asked, post(&console, &cookie, &form).await)
        });
    }
    let results = racers.join_all().await;
    let won: Vec<&str> = results
        .iter()
        .filter(|(_, p)| p.status == StatusCode::OK)
        .map(|(a, _)| *a)
        .collect();
    assert_eq!(won.len(), 1, "{won:?}");
    for (_, page) in &results {
        assert!(
            page.status == StatusCode::OK || page.status == StatusCode::CONFLICT,
            "{}: {}",
            page.status,
            page.body
        );
    }
    let expected = match won[0] {
        "succeeded" => Some("success"),
        "failed" => Some("failed"),
        _ => None,
    };
    assert_eq!(state_of(&gate, &id).await.as_deref(), expected);
}

/// "only a claim still pending or in doubt, only at the fence the
/// confirmation showed": a success, a kept failure, a fence from the
/// future and a claim that is gone are each refused and left as they are.
#[tokio::test]
async fn settled_claims_and_fences_never_shown_are_not_resolved() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let probe = Identity::new("charge").part("probe");
    let probe_fence = in_doubt(&gate, &probe).await;
    let (cookie, probe_form) = confirm(&console, &gate, &probe, probe_fence, "release").await;
    let csrf = probe_form.rsplit("csrf=").next().unwrap().to_owned();
    for state in ["success", "failed"] {
        let id = Identity::new("charge").part(state);
        let fence = in_doubt(&gate, &id).await;
        super::support::set_state(&gate, &id, state).await;
        let slot = slot_query(gate.account_name(), None, &id.address());
        let page = get(
            &console,
            &format!("/claim/resolve?{slot}&fence={fence}&as=release"),
        )
        .await;
        assert_eq!(page.status, StatusCode::CONFLICT, "{state}: {}", page.body);
        for asked in ["succeeded", "failed", "release"] {
            let forced = post(
                &console,
                &cookie,
                &format!("{slot}&fence={fence}&state=in_doubt&as={asked}&csrf={csrf}&output=1"),
            )
            .await;
            assert_eq!(forced.status, StatusCode::CONFLICT, "{state} {asked}");
            assert_eq!(state_of(&gate, &id).await.as_deref(), Some(state));
        }
    }
    // A fence ahead of the claim's (no confirmation ever showed it).
    let slot = slot_query(gate.account_name(), None, &probe.address());
    let ahead = post(
        &console,
        &cookie,
        &format!(
            "{slot}&fence={}&state=in_doubt&as=release&csrf={csrf}",
            probe_fence + 1
        ),
    )
    .await;
    assert_eq!(ahead.status, StatusCode::CONFLICT, "{}", ahead.body);
    assert_eq!(state_of(&gate, &probe).await.as_deref(), Some("in_doubt"));
    // Gone since: a conflict too, nothing created.
    let gone = Identity::new("charge").part("gone");
    let slot = slot_query(gate.account_name(), None, &gone.address());
    let missing = post(
        &console,
        &cookie,
        &format!("{slot}&fence=1&state=in_doubt&as=succeeded&csrf={csrf}"),
    )
    .await;
    assert!(missing.status.is_client_error(), "{}", missing.status);
    assert_eq!(state_of(&gate, &gone).await, None);
}

/// "GET /claim/resolve: the confirmation": a GET carrying the whole form,
/// token included, or a method override, writes nothing.
#[tokio::test]
async fn a_get_carrying_the_form_writes_nothing() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let id = Identity::new("charge").part("get");
    let fence = in_doubt(&gate, &id).await;
    let (cookie, form) = confirm(&console, &gate, &id, fence, "release").await;
    for (method, extra) in [
        ("GET", vec![]),
        ("GET", vec![("x-http-method-override", "POST")]),
        ("HEAD", vec![]),
        ("PUT", vec![]),
        ("PATCH", vec![]),
    ] {
        let mut headers = vec![("cookie", cookie.as_str())];
        headers.extend(extra);
        let page = send(
            &console,
            method,
            &format!("/claim/resolve?{form}"),
            &headers,
            None,
        )
        .await;
        assert_ne!(page.status, StatusCode::OK, "{method}: {}", page.body);
        assert_eq!(
            state_of(&gate, &id).await.as_deref(),
            Some("in_doubt"),
            "{method}"
        );
    }
}

/// A write in another encoding (JSON, multipart, with the real token) or
/// with a field given twice is refused as a request and changes nothing.
#[tokio::test]
async fn a_write_in_another_shape_is_refused_and_changes_nothing() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let id = Identity::new("charge").part("shape");
    let fence = in_doubt(&gate, &id).await;
    let (cookie, form) = confirm(&console, &gate, &id, fence, "release").await;
    let csrf = form.rsplit("csrf=").next().unwrap().to_owned();
    let json = format!(
        r#"{{"account":"{}","address":"{}","fence":{fence},"as":"release","csrf":"{csrf}"}}"#,
        gate.account_name(),
        id.address()
    );
    let multipart = format!(
        "--b\r\nContent-Disposition: form-data; name=\"as\"\r\n\r\nrelease\r\n--b\r\n\
         Content-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n--b--\r\n"
    );
    for (body, what) in [
        (json, "json"),
        (multipart, "multipart"),
        (format!("{form}&as=succeeded"), "as twice"),
        (format!("{form}&csrf={csrf}"), "csrf twice"),
        (format!("{form}&fence={}", fence + 1), "fence twice"),
        (format!("{form}&_method=DELETE"), "a method field"),
        (format!("{form}&token=x"), "a token field"),
    ] {
        let page = post(&console, &cookie, &body).await;
        assert!(
            page.status.is_client_error(),
            "{what}: {} {}",
            page.status,
            page.body
        );
        assert_eq!(
            state_of(&gate, &id).await.as_deref(),
            Some("in_doubt"),
            "{what}"
        );
    }
}

/// The output an operator types: huge, deeply nested, or JSON at its
/// edges: refused as a request or kept exactly, never an outage.
#[tokio::test]
async fn an_output_at_the_edges_of_json_is_kept_exactly_or_refused() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    for (i, (output, kept)) in [
        ("\"a\\u0000b\"".to_owned(), Some(true)),
        ("\"\\ud83d\\ude00 \u{202e}\"".to_owned(), Some(true)),
        ("null".to_owned(), Some(true)),
        ("-0".to_owned(), Some(true)),
        ("\"\\ud800\"".to_owned(), None),
        (format!("{}{}", "[".repeat(5_000), "]".repeat(5_000)), None),
        (format!("\"{}\"", "x".repeat(3 << 20)), None),
    ]
    .into_iter()
    .enumerate()
    {
        let id = Identity::new("charge").part(i);
        let fence = in_doubt(&gate, &id).await;
        let (cookie, form) = confirm(&console, &gate, &id, fence, "succeeded").await;
        let body = format!(
            "{form}&{}",
            serde_urlencoded::to_string([("output", &output)]).unwrap()
        );
        let page = post(&console, &cookie, &body).await;
        let (state, _, stored) = row(&gate, &id).await.expect("a claim");
        if page.status == StatusCode::OK {
            assert_eq!(state, "success", "{i}");
            assert_eq!(stored.as_deref(), Some(output.as_str()), "{i}: not kept");
            assert_ne!(kept, Some(false), "{i}: {output:.40} accepted");
        } else {
            assert!(
                page.status.is_client_error(),
                "{i} ({output:.40}): {} {:.300}",
                page.status,
                page.body
            );
            assert_eq!(state, "in_doubt", "{i}");
            assert_ne!(
                kept,
                Some(true),
                "{i}: {output:.40} refused: {:.300}",
                page.body
            );
        }
    }
}

// ---------------------------------------------------------------------
// Audit
// ---------------------------------------------------------------------

use idem_test_support::capture::Captured;

/// "every write is logged ... with who did it ... what was asked and what
/// happened": the audit line names the operator the service set, and a
/// name chosen by whoever made the claim cannot add a line of its own.
#[tokio::test]
async fn an_audit_line_names_the_operator_and_no_name_forges_another() {
    let (captured, _default) = Captured::scoped();

    let base = testing::gate().await;
    let forged = format!(
        "{}\nFORGED INFO idem::console::audit: resolution operator=root result=success",
        testing::unique_name("t")
    );
    let gate = base.account(&forged);
    let id = Identity::new("charge").part("audited");
    let fence = in_doubt(&gate, &id).await;
    let console = Console::new(base.pool().clone())
        .behind_your_auth()
        .allow_writes(true)
        .router()
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                request
                    .extensions_mut()
                    .insert(Operator("alice@ops".into()));
                next.run(request).await
            },
        ));
    let (cookie, form) = confirm(&console, &gate, &id, fence, "failed").await;
    let done = post(&console, &cookie, &form).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    // A forged write is logged too.
    let refused = send(
        &console,
        "POST",
        "/claim/resolve",
        &[("cookie", &cookie), ("origin", "http://evil.example")],
        Some(form.clone()),
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);

    let log = captured.text();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    for line in &lines {
        assert!(
            !line.starts_with("FORGED"),
            "a claim's account wrote a line of its own into the audit log:\n{log}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("alice@ops") && l.contains("resolution") && l.contains("failed")),
        "no audit line names the operator and the result: {log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("forged") && l.contains("alice@ops")),
        "the forged write is not logged: {log}"
    );
}

/// "every write is logged ... with who did it ..., what was asked and
/// what happened": a write refused (as forged, as read-only, as not
/// JSON) is a write asked for, and its line says which claim it was for.
#[tokio::test]
async fn every_write_asked_for_is_logged_with_the_claim_it_was_for() {
    let (captured, _default) = Captured::scoped();
    let gate = testing::gate().await;
    let console = writable(&gate);
    let mut ids = Vec::new();
    for what in ["forged", "not_json", "read_only"] {
        let id = Identity::new("charge").part(what);
        let fence = in_doubt(&gate, &id).await;
        ids.push((what, id, fence));
    }
    // Forged: from another origin.
    let (cookie, form) = confirm(&console, &gate, &ids[0].1, ids[0].2, "release").await;
    let page = send(
        &console,
        "POST",
        "/claim/resolve",
        &[("cookie", &cookie), ("origin", "http://evil.example")],
        Some(form),
    )
    .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    // Not JSON.
    let (cookie, form) = confirm(&console, &gate, &ids[1].1, ids[1].2, "succeeded").await;
    let page = post(&console, &cookie, &format!("{form}&output=%7Bnope")).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    // Read-only.
    let read_only = Console::new(gate.pool().clone()).router();
    let slot = slot_query(gate.account_name(), None, &ids[2].1.address());
    let page = post(
        &read_only,
        &cookie,
        &format!("{slot}&fence={}&as=release&csrf=x", ids[2].2),
    )
    .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);

    let log = captured.text();
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("idem::console::audit"))
        .collect();
    let unlogged: Vec<&str> = ids
        .iter()
        .filter(|(_, id, _)| !audit.iter().any(|l| l.contains(&id.address())))
        .map(|(what, ..)| *what)
        .collect();
    assert_eq!(
        unlogged,
        Vec::<&str>::new(),
        "writes asked for with no audit line naming their claim:\n{log}"
    );
}

/// "a database outage must be 503 and say so": the database stops
/// answering between the confirmation and the post; the answer is 503,
/// says the resolution may or may not be applied, and trying again once
/// it answers applies it once.
#[tokio::test]
async fn a_write_during_an_outage_is_503_and_trying_again_applies_it_once() {
    let gate = testing::gate().await;
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(500))
        .connect(&testing::database_url())
        .await
        .expect("a pool");
    let console = Console::new(pool.clone()).allow_writes(true).router();
    let id = Identity::new("charge").part("outage");
    let fence = in_doubt(&gate, &id).await;
    let (cookie, form) = confirm(&console, &gate, &id, fence, "failed").await;
    let held = pool.acquire().await.expect("the only connection");
    let page = post(&console, &cookie, &form).await;
    assert_eq!(
        page.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        page.body
    );
    assert!(page.body.contains("may or may not"), "{}", page.body);
    assert_eq!(state_of(&gate, &id).await.as_deref(), Some("in_doubt"));
    drop(held);
    let page = post(&console, &cookie, &form).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let again = post(&console, &cookie, &form).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(state_of(&gate, &id).await.as_deref(), Some("failed"));
}

// ---------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------

const HIDDEN: [char; 8] = [
    '\u{202e}', '\u{2066}', '\u{200f}', '\u{061c}', '\u{200b}', '\u{feff}', '\u{1b}', '\u{85}',
];

fn hidden_in(body: &str) -> Vec<char> {
    HIDDEN.into_iter().filter(|c| body.contains(*c)).collect()
}

/// "control and bidirectional characters are shown as escapes": in an
/// identity's key parts and in a stored output shown on asking, as in
/// names.
#[tokio::test]
async fn key_parts_and_stored_values_show_hidden_characters_as_escapes() {
    let gate = testing::gate().await;
    let hostile: String = HIDDEN.iter().collect::<String>() + "gnp.exe";
    let id = Identity::new(format!("act{hostile}")).part(hostile.as_str());
    let output = hostile.clone();
    gate.guard(&id)
        .replay()
        .run(async move { Ok::<_, idem::Rejected>(output) })
        .await
        .expect("run");
    let console = writable(&gate);
    let slot = slot_query(gate.account_name(), None, &id.address());
    let page = get(&console, &format!("/claim?{slot}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        hidden_in(&page.body),
        Vec::<char>::new(),
        "the claim's page"
    );
    let list = get(
        &console,
        &format!("/claims?account={}", gate.account_name()),
    )
    .await;
    assert_eq!(hidden_in(&list.body), Vec::<char>::new(), "the list");
    let shown = get(&console, &format!("/claim?{slot}&values=shown")).await;
    assert_eq!(shown.status, StatusCode::OK);
    assert_eq!(
        hidden_in(&shown.body),
        Vec::<char>::new(),
        "the stored output, shown on asking"
    );
}

/// "names longer than 80 characters are cut on the page (the links keep
/// them whole)": names of many-byte characters, cut anywhere, and the
/// claim opens from its link.
#[tokio::test]
async fn long_names_of_wide_characters_are_cut_and_their_links_open() {
    let base = testing::gate().await;
    for name in [
        format!("{}{}", "é".repeat(79), testing::unique_name("a")),
        format!("{}{}", "👩‍👩‍👧".repeat(30), testing::unique_name("b")),
        format!("{}&namespace=x#{}", "a+b%20c", testing::unique_name("c")),
    ] {
        let gate = base.account(&name).namespace(&name);
        let id = Identity::new("charge").part(1);
        in_doubt(&gate, &id).await;
        let console = Console::new(base.pool().clone()).router();
        let list = get(
            &console,
            &format!(
                "/claims?{}",
                serde_urlencoded::to_string([("account", &name)]).unwrap()
            ),
        )
        .await;
        assert_eq!(list.status, StatusCode::OK, "{}", list.body);
        let hrefs: Vec<String> = list
            .body
            .split("href=\"")
            .skip(1)
            .map(|p| p[..p.find('"').unwrap()].replace("&amp;", "&"))
            .filter(|h| h.starts_with("/claim?"))
            .collect();
        assert_eq!(hrefs.len(), 1, "{name}: {hrefs:?}");
        let page = get(&console, &hrefs[0]).await;
        assert_eq!(page.status, StatusCode::OK, "{name}: {}", page.body);
        assert!(page.body.contains(&id.address()));
    }
}

/// Rows written by SQL directly ("identities not in idem's format, rows
/// written by SQL directly"): listed, and each opens from its link,
/// saying what is wrong with it, never an error page.
#[tokio::test]
async fn rows_written_by_hand_are_listed_and_open_from_their_links() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let long_address = format!("claim_{}", "0".repeat(70));
    for (address, identity) in [
        (
            "claim_ffffffffffffffffffffffff".to_owned(),
            vec![0xff, 0x00, 0xfe],
        ),
        ("legacy_order_1".to_owned(), b"charge:ord_1".to_vec()),
        (long_address.clone(), vec![]),
    ] {
        sqlx::query(
            "INSERT INTO idem_records (account, kind, address, state, identity, \
                                       in_doubt_since) \
             VALUES ($1, 'claim', $2, 'in_doubt', $3, now())",
        )
        .bind(&account)
        .bind(&address)
        .bind(&identity)
        .execute(gate.pool())
        .await
        .expect("insert by hand");
    }
    let console = writable(&gate);
    let mut unopened: Vec<(String, u16)> = Vec::new();
    for list in [
        format!("/claims?account={account}"),
        format!("/claims?account={account}&state=in_doubt"),
    ] {
        let page = get(&console, &list).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let links = page.claim_links();
        assert_eq!(links.len(), 3, "{list}: {links:?}");
        for (a, n, address) in links {
            let opened = get(
                &console,
                &format!("/claim?{}", slot_query(&a, n.as_deref(), &address)),
            )
            .await;
            if opened.status != StatusCode::OK {
                unopened.push((address, opened.status.as_u16()));
            }
        }
    }
    assert_eq!(unopened, vec![], "claims listed whose link does not open");
    let overview = get(&console, "/").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
}

// ---------------------------------------------------------------------
// Paging
// ---------------------------------------------------------------------

/// "a page starts after the last claim of the page before": under every
/// filter combination, with ties in `created_at`, and with claims added
/// and deleted between pages, every claim there throughout appears once.
#[tokio::test]
async fn every_claim_present_throughout_appears_once_under_every_filter() {
    let base = testing::gate().await;
    let account = base.account_name().to_owned();
    let scopes = [
        base.clone(),
        base.namespace(""),
        base.namespace("a"),
        base.namespace("ab"),
    ];
    let mut all = Vec::new();
    for i in 0..6 {
        for action in ["charge", "refund"] {
            let id = Identity::new(action).part(i);
            for gate in &scopes {
                in_doubt(gate, &id).await;
                let state = match i % 3 {
                    0 => "success",
                    1 => "in_doubt",
                    _ => "failed",
                };
                super::support::set_state(gate, &id, state).await;
                all.push((gate.clone(), id.clone(), action, state));
            }
        }
    }
    sqlx::query("UPDATE idem_records SET created_at = '2026-01-01T00:00:00Z' WHERE account = $1")
        .bind(&account)
        .execute(base.pool())
        .await
        .unwrap();
    let console = Console::new(base.pool().clone()).router();
    let mut extra = 0;
    for state in ["", "in_doubt", "failed", "success"] {
        for namespace in ["", "&namespace=a", "&namespace=ab", "&without_namespace=1"] {
            for action in ["", "&action=refund"] {
                let first = format!(
                    "/claims?account={account}&limit=2{}{namespace}{action}",
                    if state.is_empty() {
                        String::new()
                    } else {
                        format!("&state={state}")
                    }
                );
                let expected: std::collections::BTreeSet<_> = all
                    .iter()
                    .filter(|(g, _, a, s)| {
                        (state.is_empty() || *s == state)
                            && (action.is_empty() || *a == "refund")
                            && match namespace {
                                "" => true,
                                "&without_namespace=1" => g.namespace_name().is_none(),
                                n => g.namespace_name() == Some(&n["&namespace=".len()..]),
                            }
                    })
                    .map(|(g, id, ..)| {
                        (
                            account.clone(),
                            g.namespace_name().map(str::to_owned),
                            id.address(),
                        )
                    })
                    .collect();
                let mut shown = Vec::new();
                let mut uri = first.clone();
                for page_no in 0..200 {
                    let page = get(&console, &uri).await;
                    assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
                    shown.extend(page.claim_links());
                    // Between pages: a claim added (same instant), a
                    // claim of another action deleted and re-added.
                    extra += 1;
                    let late = Identity::new("late").part(extra);
                    in_doubt(&scopes[page_no % scopes.len()], &late).await;
                    sqlx::query(
                        "UPDATE idem_records SET created_at = '2026-01-01T00:00:00Z' \
                         WHERE account = $1 AND address = $2",
                    )
                    .bind(&account)
                    .bind(late.address())
                    .execute(base.pool())
                    .await
                    .unwrap();
                    match page.next_page() {
                        Some(next) => uri = next,
                        None => break,
                    }
                }
                let shown_set: std::collections::BTreeSet<_> = shown.iter().cloned().collect();
                assert_eq!(shown_set.len(), shown.len(), "{first}: a claim twice");
                let missing: Vec<_> = expected.difference(&shown_set).collect();
                assert!(missing.is_empty(), "{first}: never shown: {missing:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------
// Building the console
// ---------------------------------------------------------------------

struct Findings;

impl Audit for Findings {
    fn findings<'a>(
        &'a self,
        _pool: &'a sqlx::PgPool,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async { Ok("FINDINGS-7f3a: 2 claims in doubt".to_owned()) })
    }
}

/// "Build it with [`Console::new`] and its methods": an option set before
/// a clone is kept by every option after it.
#[tokio::test]
async fn options_set_before_a_clone_are_kept_by_the_options_after_it() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone())
        .audit(Findings)
        .access(Access::Loopback);
    let kept = console.clone();
    let router = console.allow_writes(true).router();
    let page = get(&router, "/audit").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains("FINDINGS-7f3a"),
        "the audit given before the clone is gone: {}",
        page.body
    );
    let page = get(&kept.router(), "/audit").await;
    assert!(page.body.contains("FINDINGS-7f3a"));
}

/// A read-only console refuses every write, whatever the request carries,
/// and shows no form anywhere.
#[tokio::test]
async fn a_read_only_console_refuses_every_write_however_it_is_asked() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("ro");
    let fence = in_doubt(&gate, &id).await;
    let console = Console::new(gate.pool().clone()).router();
    let slot = slot_query(gate.account_name(), None, &id.address());
    for uri in ["/", "/claims", &format!("/claim?{slot}")] {
        let page = get(&console, uri).await;
        assert!(!page.body.contains("<form method=\"post\""), "{uri}");
        assert!(!page.body.contains("claim/resolve?"), "{uri}");
    }
    let cookie = get(&console, "/").await.csrf_cookie().unwrap();
    for (method, body) in [
        ("POST", format!("{slot}&fence={fence}&as=release&csrf=x")),
        ("POST", String::new()),
        ("PUT", format!("{slot}&fence={fence}&as=release")),
        ("DELETE", String::new()),
    ] {
        let page = send(
            &console,
            method,
            "/claim/resolve",
            &[("cookie", &cookie), ("sec-fetch-site", "same-origin")],
            Some(body),
        )
        .await;
        assert!(page.status.is_client_error(), "{method}: {}", page.status);
        assert_eq!(state_of(&gate, &id).await.as_deref(), Some("in_doubt"));
    }
}
