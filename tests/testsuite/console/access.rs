//! Who gets in: loopback names only by default (a rebound DNS name is
//! refused), the token when one is set (header, cookie, or once in the
//! address, then out of it), and every response's headers.

use http::StatusCode;
use idem::console::{Access, Console};
use idem::testing;

use super::support::send;

#[tokio::test]
async fn by_default_only_requests_addressed_to_a_loopback_name_get_in() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).router();
    for host in [
        "127.0.0.1:8080",
        "localhost:8080",
        "[::1]:8080",
        "localhost",
        "127.0.0.2",
    ] {
        let page = send(&console, "GET", "/claims?limit=1", &[("host", host)], None).await;
        assert_eq!(page.status, StatusCode::OK, "{host}");
    }
    // A page on evil.example whose name now resolves to 127.0.0.1 (DNS
    // rebinding) sends its own name.
    for host in [
        "evil.example",
        "evil.example:8080",
        "127.0.0.1.evil.example",
        "0.0.0.0:8080",
        "",
    ] {
        let page = send(&console, "GET", "/", &[("host", host)], None).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{host:?}");
        assert!(!page.body.contains("claims"), "a refusal shows data");
    }
}

#[tokio::test]
async fn with_a_token_only_its_holder_gets_in() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone())
        .token("s3cret-token")
        .router();
    let host = ("host", "console.internal:8080");
    for (headers, status) in [
        (vec![host], StatusCode::UNAUTHORIZED),
        (
            vec![host, ("authorization", "Bearer wrong")],
            StatusCode::UNAUTHORIZED,
        ),
        (
            vec![host, ("authorization", "Bearer s3cret-token")],
            StatusCode::OK,
        ),
        (
            vec![host, ("cookie", "idem_console_token=s3cret-token")],
            StatusCode::UNAUTHORIZED,
        ),
    ] {
        let page = send(&console, "GET", "/claims?limit=1", &headers, None).await;
        assert_eq!(page.status, status, "{headers:?}");
    }
    // Once in the address: a cookie, and a redirect that takes the token
    // out of the address (and of the history), keeping the rest.
    let opened = send(
        &console,
        "GET",
        "/claims?state=in_doubt&token=s3cret-token",
        &[host],
        None,
    )
    .await;
    assert_eq!(opened.status, StatusCode::SEE_OTHER);
    assert_eq!(opened.headers["location"], "/claims?state=in_doubt");
    let cookie = opened
        .set_cookies()
        .into_iter()
        .find(|c| c.starts_with("idem_console_token="))
        .expect("a token cookie");
    assert!(
        !cookie.contains("s3cret-token"),
        "the cookie holds the token itself"
    );
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let page = send(
        &console,
        "GET",
        "/claims?state=in_doubt",
        &[host, ("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    let wrong = send(&console, "GET", "/?token=guess", &[host], None).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);

    // An empty token lets nobody in.
    let empty = Console::new(gate.pool().clone())
        .access(Access::Token(String::new()))
        .router();
    for headers in [vec![host], vec![host, ("authorization", "Bearer ")]] {
        let page = send(&empty, "GET", "/?token=", &headers, None).await;
        assert_eq!(page.status, StatusCode::UNAUTHORIZED);
    }
}

/// "send `Authorization: Bearer ...`": the scheme's name is
/// case-insensitive, and one or more spaces may follow it (RFC 9110,
/// 11.1 and 11.4); anything else is not the token presented.
#[tokio::test]
async fn the_bearer_scheme_is_read_whatever_its_case() {
    let gate = testing::gate().await;
    let token = "9f86d081884c7d659a2feaa0c55ad015";
    let console = Console::new(gate.pool().clone()).token(token).router();
    let host = ("host", "console.internal:8080");
    for (header, status) in [
        (format!("Bearer {token}"), StatusCode::OK),
        (format!("bearer {token}"), StatusCode::OK),
        (format!("BEARER {token}"), StatusCode::OK),
        (format!("bEaReR   {token}"), StatusCode::OK),
        (format!("Basic {token}"), StatusCode::UNAUTHORIZED),
        (format!("Bearer{token}"), StatusCode::UNAUTHORIZED),
        (format!("Bearers {token}"), StatusCode::UNAUTHORIZED),
        (token.to_owned(), StatusCode::UNAUTHORIZED),
        (format!("bearer {token}x"), StatusCode::UNAUTHORIZED),
    ] {
        let page = send(
            &console,
            "GET",
            "/claims?limit=1",
            &[host, ("authorization", &header)],
            None,
        )
        .await;
        assert_eq!(page.status, status, "Authorization: {header}");
    }
}

#[tokio::test]
async fn every_response_forbids_caching_framing_referrers_and_foreign_scripts() {
    let gate = testing::gate().await;
    let console = Console::new(gate.pool().clone()).router();
    for uri in ["/", "/claims", "/claims?stat=x", "/assets/console.css"] {
        let page = send(&console, "GET", uri, &[], None).await;
        let h = &page.headers;
        assert_eq!(h["cache-control"], "no-store", "{uri}");
        assert_eq!(h["x-frame-options"], "DENY", "{uri}");
        assert_eq!(h["referrer-policy"], "same-origin", "{uri}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
            "{uri}"
        );
    }
    let refused = send(&console, "GET", "/", &[("host", "evil.example")], None).await;
    assert_eq!(refused.headers["x-frame-options"], "DENY");
}
