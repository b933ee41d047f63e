//! Requests to a console's router, claims to show it, and links read back
//! out of its pages.

use axum::Router;
use axum::body::Body;
use http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt as _;
use idem::console::Console;
use idem::sqlx;
use idem::{Gate, Identity};
use tower::ServiceExt as _;

/// A response, read whole.
#[derive(Debug)]
pub struct Page {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Page {
    /// The CSRF cookie the console set, as a `Cookie` header value.
    pub fn csrf_cookie(&self) -> Option<String> {
        self.set_cookies()
            .into_iter()
            .find(|c| c.starts_with("idem_console_csrf="))
            .map(|c| c.split(';').next().unwrap_or_default().to_owned())
    }

    pub fn set_cookies(&self) -> Vec<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().expect("ascii cookie").to_owned())
            .collect()
    }

    /// The value of the hidden `csrf` field of the page's form.
    pub fn csrf_field(&self) -> Option<String> {
        self.hidden("csrf")
    }

    /// The value of the page form's hidden field `name`, as written (for
    /// fields whose values need no unescaping: tokens, states, numbers).
    pub fn hidden(&self, name: &str) -> Option<String> {
        let attribute = format!(r#"name="{name}" value=""#);
        let at = self.body.find(&attribute)?;
        let rest = &self.body[at + attribute.len()..];
        Some(rest[..rest.find('"')?].to_owned())
    }

    /// Every link to a claim's page, as (account, namespace, address),
    /// decoded (the links carry names as the pages show them,
    /// `idem::shown::escaped`: read back here), in the page's order.
    pub fn claim_links(&self) -> Vec<(String, Option<String>, String)> {
        self.links("claim?")
            .into_iter()
            .map(|pairs| {
                let get = |k: &str| {
                    pairs.iter().find(|(n, _)| n == k).map(|(_, v)| {
                        idem::shown::unescaped(v)
                            .unwrap_or_else(|e| {
                                panic!("a link's {k} {v:?} does not read back: {e}")
                            })
                            .into_owned()
                    })
                };
                (
                    get("account").expect("account"),
                    get("namespace"),
                    get("address").expect("address"),
                )
            })
            .collect()
    }

    /// The query of every `href` whose path ends in `path` (e.g.
    /// `"claims?"`), decoded.
    pub fn links(&self, path: &str) -> Vec<Vec<(String, String)>> {
        let mut found = Vec::new();
        for piece in self.body.split("href=\"").skip(1) {
            let href = &piece[..piece.find('"').expect("closed href")];
            let href = href.replace("&amp;", "&");
            if let Some(at) = href.find(path)
                && (at == 0 || href[..at].ends_with('/'))
            {
                let query = &href[at + path.len()..];
                found.push(serde_urlencoded::from_str(query).expect("a link's query"));
            }
        }
        found
    }

    /// The `href` of the "next page" link.
    pub fn next_page(&self) -> Option<String> {
        let at = self.body.find(r#"class="next" href=""#)?;
        let rest = &self.body[at + r#"class="next" href=""#.len()..];
        Some(rest[..rest.find('"')?].replace("&amp;", "&"))
    }
}

/// Sends one request to `router`, addressed to 127.0.0.1 unless `headers`
/// say otherwise.
pub async fn send(
    router: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Page {
    let mut request = Request::builder().method(method).uri(uri);
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        request = request.header(header::HOST, "127.0.0.1:8080");
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    let request = request
        .body(body.map_or_else(Body::empty, Body::from))
        .expect("a request");
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    Page {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).expect("utf-8 page"),
    }
}

pub async fn get(router: &Router, uri: &str) -> Page {
    send(router, "GET", uri, &[], None).await
}

/// Posts `form` to the resolution, as the console's own page in a browser
/// with `cookie` would.
pub async fn post(router: &Router, cookie: &str, form: &str) -> Page {
    send(
        router,
        "POST",
        "/claim/resolve",
        &[
            ("cookie", cookie),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin"),
        ],
        Some(form.to_owned()),
    )
    .await
}

/// A console over `gate`'s pool that may write, as a router.
pub fn writable(gate: &Gate) -> Router {
    Console::new(gate.pool().clone())
        .allow_writes(true)
        .router()
}

/// The query that addresses a claim's page.
pub fn slot_query(account: &str, namespace: Option<&str>, address: &str) -> String {
    let mut pairs = vec![("account", account), ("address", address)];
    if let Some(namespace) = namespace {
        pairs.push(("namespace", namespace));
    }
    serde_urlencoded::to_string(pairs).expect("a query")
}

/// Claims `id` in `gate` (an account, maybe a namespace) and leaves it in
/// doubt, as a body that did not know its outcome would; its fence.
pub async fn in_doubt(gate: &Gate, id: &Identity) -> i64 {
    let claim = gate.claim(id).await.expect("claim");
    let fence = claim.fence().expect("a fence");
    drop(claim);
    set_state(gate, id, "in_doubt").await;
    fence
}

/// Sets the state of `id`'s claim in `gate`'s scope, by hand, lease gone;
/// in doubt since now when that is its state. (No `CASE` around `now()`:
/// Citus refuses one in a statement that changes a distributed table.)
pub async fn set_state(gate: &Gate, id: &Identity, state: &str) {
    let since = if state == "in_doubt" { "now()" } else { "NULL" };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE idem_records SET state = $1, lease_expires_at = NULL, in_doubt_since = {since} \
         WHERE account = $2 AND kind = 'claim' AND address = $3 \
           AND namespace IS NOT DISTINCT FROM $4"
    )))
    .bind(state)
    .bind(gate.account_name())
    .bind(id.address())
    .bind(gate.namespace_name())
    .execute(gate.pool())
    .await
    .expect("set the state");
}

/// The state of `id`'s claim in `gate`'s scope, and its fence; `None`:
/// no claim.
pub async fn row(gate: &Gate, id: &Identity) -> Option<(String, i64, Option<String>)> {
    sqlx::query_as(
        "SELECT state, fence, output_json FROM idem_records \
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
