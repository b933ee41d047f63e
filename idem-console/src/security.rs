//! Who gets in, what every response forbids, and the CSRF token of a
//! write. The rules are in the [module docs](super#security).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use axum::extract::{OriginalUri, Request, State};
use axum::http::{Extensions, HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha1::{Digest, Sha1};

use super::text::hex;
use super::{Access, State as ConsoleState, audit_log, pages};

/// The cookie that carries a browser's CSRF nonce.
const CSRF_COOKIE: &str = "idem_console_csrf";
/// The cookie that carries the console's token once it was presented.
const TOKEN_COOKIE: &str = "idem_console_token";

/// Who did a write, for the audit line: set it as a request extension in
/// the middleware of the service that mounts the console (its user, as
/// its authentication knows them). Without it the audit line says how the
/// request got in, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

/// A browser's CSRF nonce and the token its forms carry, put in the
/// request's extensions by [`guard`].
#[derive(Debug, Clone)]
pub(super) struct Csrf {
    /// The token the forms on this page carry.
    pub token: String,
    /// The nonce came with the request (a write is checked against it);
    /// `false`: it was made for this response.
    pub from_request: bool,
}

/// 32 bytes from the operating system; should it fail, from the standard
/// library's per-process random hasher keys (themselves seeded by the
/// operating system at first use), never from a constant.
pub(super) fn new_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    if getrandom::fill(&mut secret).is_err() {
        for chunk in secret.chunks_mut(8) {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(std::process::id().into());
            chunk.copy_from_slice(&hasher.finish().to_le_bytes()[..chunk.len()]);
        }
    }
    secret
}

/// The token of `nonce`: a digest of the console's secret around it (the
/// secret on both sides, so no digest can be extended into another's).
fn token_of(secret: &[u8; 32], nonce: &str) -> String {
    let mut digest = Sha1::new();
    digest.update(secret);
    digest.update(nonce.as_bytes());
    digest.update(secret);
    hex(&digest.finalize())
}

/// Compares without stopping at the first difference, so the time taken
/// says nothing of how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name`, if the request sent one.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// A nonce as this console makes them: 32 lowercase hex digits. Anything
/// else in the cookie is replaced, not trusted.
fn is_nonce(value: &str) -> bool {
    value.len() == 32
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The host the request was addressed to, without its port, lowercased;
/// `None` when the header is not exactly a host and an optional port
/// (`[::1]:8080`, `localhost`, `127.0.0.1:80`): anything else, such as
/// `[::1].evil.example` or `[::1]@evil.example`, is no name at all.
fn requested_host(request: &Request) -> Option<String> {
    let value = match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok()?.to_owned(),
        None => request.uri().authority()?.as_str().to_owned(),
    };
    host_of(&value)
}

fn host_of(value: &str) -> Option<String> {
    let is_port = |port: &str| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    let (host, port) = match value.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            host.parse::<std::net::Ipv6Addr>().ok()?;
            (host, after.strip_prefix(':'))
        }
        None => match value.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (value, None),
        },
    };
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':';
    let valid = !host.is_empty()
        && host.bytes().all(plain)
        && port.is_none_or(is_port)
        // After `]`, only a port.
        && (value.starts_with('[') == value.contains(']'))
        && (!value.starts_with('[') || value.ends_with(']') || port.is_some());
    valid.then(|| host.to_ascii_lowercase())
}

fn is_loopback_name(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The request presents `token`: as a bearer header, or as the cookie that
/// holds its digest (never the token itself: the cookie is plain hex
/// whatever the token's characters, and a leaked cookie is not the token).
fn presents(headers: &HeaderMap, secret: &[u8; 32], token: &str) -> bool {
    if token.is_empty() {
        // Nobody: nothing presented can match an empty token by accident.
        return false;
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_credentials);
    if bearer.is_some_and(|presented| same(presented.as_bytes(), token.as_bytes())) {
        return true;
    }
    cookie(headers, TOKEN_COOKIE)
        .is_some_and(|digest| same(digest.as_bytes(), token_cookie(secret, token).as_bytes()))
}

/// The credentials of an `Authorization` header value of the Bearer
/// scheme: the scheme's name in any case, then one or more spaces (RFC
/// 9110, 11.1 and 11.4); `None` for any other scheme.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
}

/// What the token's cookie holds.
fn token_cookie(secret: &[u8; 32], token: &str) -> String {
    token_of(secret, &format!("token:{token}"))
}

/// The `token` parameter of the query, and the query without it.
fn token_in_query(query: &str) -> Option<(String, String)> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).ok()?;
    let token = pairs.iter().find(|(k, _)| k == "token")?.1.clone();
    let rest: Vec<&(String, String)> = pairs.iter().filter(|(k, _)| k != "token").collect();
    Some((token, serde_urlencoded::to_string(rest).unwrap_or_default()))
}

/// Where the console is mounted, as the request found it (`""` at the
/// root, `/t/acme` under `nest("/t/{tenant}", ..)`): the path it was asked
/// by, less the path the router sees. Not the nest's route, which may hold
/// a parameter. Always one leading `/` and no backslash, so that no link
/// or redirect built on it can name another host.
pub(super) fn mount(uri: &Uri, extensions: &Extensions) -> String {
    let Some(OriginalUri(original)) = extensions.get::<OriginalUri>() else {
        return String::new();
    };
    let (outer, inner) = (original.path(), uri.path());
    let base = if inner == "/" {
        outer
    } else {
        outer.strip_suffix(inner).unwrap_or("")
    };
    let base = base.trim_end_matches('/').replace('\\', "%5C");
    match base.trim_start_matches('/') {
        "" => String::new(),
        rest => format!("/{rest}"),
    }
}

/// The console's pages: where a `?token=` redirect may lead (anything else
/// leads to the overview).
const PAGES: &[&str] = &["/", "/claims", "/claim", "/claim/resolve", "/audit"];

fn cookie_header(name: &str, value: &str, base: &str) -> Option<HeaderValue> {
    // Values are hex or a token already checked to be one header value.
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={base}/; HttpOnly; SameSite=Strict"
    ))
    .ok()
}

/// Lets in only who [`Access`] allows, gives the request its CSRF nonce,
/// and sets the headers every response carries. Every write attempt leaves
/// one audit line: this writes it for a write refused here, or answered
/// without reaching the resolution's handler (which writes its own).
pub(super) async fn guard(
    State(state): State<Arc<ConsoleState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let base = mount(request.uri(), request.extensions());
    let write = audit_log::is_write(request.method());
    if let Some(refusal) = admit(&state.access, &state.secret, &request, &base) {
        if write {
            let why = match state.access {
                Access::Loopback => "not addressed to a loopback name",
                Access::Token(_) => "no valid token presented",
                Access::BehindYourAuth => "refused",
            };
            audit_log::refused_at_the_door(&request, refusal.status(), why);
        }
        return secure(refusal);
    }
    let attempt =
        write.then(|| audit_log::Attempt::of(&request, who(&state.access, request.extensions())));
    let existing = cookie(request.headers(), CSRF_COOKIE)
        .filter(|nonce| is_nonce(nonce))
        .map(str::to_owned);
    let (nonce, from_request) = match existing {
        Some(nonce) => (nonce, true),
        None => (hex(&new_secret()[..16]), false),
    };
    request.extensions_mut().insert(Csrf {
        token: token_of(&state.secret, &nonce),
        from_request,
    });
    let mut response = next.run(request).await;
    if let Some(attempt) = attempt {
        attempt.unless_audited(&response);
    }
    if !from_request && let Some(value) = cookie_header(CSRF_COOKIE, &nonce, &base) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    secure(response)
}

/// `None`: let in; else the response that refuses.
fn admit(access: &Access, secret: &[u8; 32], request: &Request, base: &str) -> Option<Response> {
    match access {
        Access::BehindYourAuth => None,
        Access::Loopback => {
            let host = requested_host(request).unwrap_or_default();
            (!is_loopback_name(&host)).then(|| {
                pages::refusal(
                    StatusCode::FORBIDDEN,
                    "Not a loopback address",
                    &format!(
                        "This console answers requests addressed to 127.0.0.1, localhost or \
                         [::1] only, and this one was addressed to {host:?}. To reach it from \
                         elsewhere, start it with a token (idem console --token, or \
                         IDEM_CONSOLE_TOKEN)."
                    ),
                )
            })
        }
        Access::Token(token) => {
            if presents(request.headers(), secret, token) {
                return None;
            }
            let valid =
                |presented: &str| !token.is_empty() && same(presented.as_bytes(), token.as_bytes());
            // `?token=...` once: remembered in a cookie, and taken out of
            // the address bar (and of history) by a redirect.
            if request.method() == Method::GET
                && let Some((presented, rest)) = request.uri().query().and_then(token_in_query)
                && valid(&presented)
            {
                let path = request.uri().path();
                let path = PAGES.iter().find(|page| **page == path).unwrap_or(&"/");
                let location = format!(
                    "{base}{path}{}{rest}",
                    if rest.is_empty() { "" } else { "?" }
                );
                let mut response =
                    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
                if let Some(value) = cookie_header(TOKEN_COOKIE, &token_cookie(secret, token), base)
                {
                    response.headers_mut().append(header::SET_COOKIE, value);
                }
                return Some(response);
            }
            Some(pages::refusal(
                StatusCode::UNAUTHORIZED,
                "Token required",
                "This console needs its token: open the address `idem console` printed (it \
                 ends in ?token=...), or send Authorization: Bearer TOKEN.",
            ))
        }
    }
}

/// The headers every response carries: no caching, no framing, no
/// referrer beyond the console's own origin (`same-origin`, not
/// `no-referrer`: under that, browsers send `Origin: null` with the
/// console's own forms, which [`forged`] must refuse), no script or style
/// but the console's own, no form sent anywhere else.
fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(headers, header::CACHE_CONTROL, "no-store");
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::REFERRER_POLICY, "same-origin");
    response
}

/// Why a write is refused as forged, if it is: its form's token is not
/// the one of the nonce its browser sent, or it comes from another site.
pub(super) fn forged(headers: &HeaderMap, csrf: &Csrf, form_token: &str) -> Option<&'static str> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Some("the request came from another site");
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest);
        if origin_host.is_none() || origin_host != host {
            return Some("the request came from another origin");
        }
    }
    if !csrf.from_request {
        return Some("the browser sent no console cookie (reload the page, then try again)");
    }
    if !same(form_token.as_bytes(), csrf.token.as_bytes()) {
        return Some("the form's token is not this browser's (reload the page, then try again)");
    }
    None
}

/// Who made a request, for the audit line: the [`Operator`] the serving
/// code named, or how the request got in.
pub(super) fn who(access: &Access, extensions: &axum::http::Extensions) -> String {
    match extensions.get::<Operator>() {
        Some(Operator(name)) => name.clone(),
        None => match access {
            Access::Loopback => "a loopback user".to_owned(),
            Access::Token(_) => "a token holder".to_owned(),
            Access::BehindYourAuth => "an operator the mounting service did not name".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_the_secret_and_the_nonce() {
        let secret = [7u8; 32];
        let token = token_of(&secret, "0123456789abcdef0123456789abcdef");
        assert_eq!(token.len(), 40);
        assert_ne!(
            token,
            token_of(&[8u8; 32], "0123456789abcdef0123456789abcdef")
        );
        assert_ne!(token, token_of(&secret, "0123456789abcdef0123456789abcdee"));
        assert_ne!(new_secret(), new_secret());
    }

    #[test]
    fn loopback_names_are_told_from_others() {
        for name in ["localhost", "127.0.0.1", "127.8.9.1", "::1", "a.localhost"] {
            assert!(is_loopback_name(name), "{name}");
        }
        for name in [
            "example.com",
            "localhost.example.com",
            "10.0.0.1",
            "",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_name(name), "{name}");
        }
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("xidem_console_csrf=1; idem_console_csrf=2"),
        );
        assert_eq!(cookie(&headers, CSRF_COOKIE), Some("2"));
        assert!(is_nonce("0123456789abcdef0123456789abcdef"));
        assert!(!is_nonce("0123456789ABCDEF0123456789abcdef"));
        assert!(!is_nonce("x; Path=/"));
    }
}
