//! The audit lines of writes that never reach the resolution's handler
//! (target `idem::console::audit`): refused at the door, or refused by the
//! router before the form was read. With the handler's own lines, every
//! write attempt leaves exactly one. Every value a request chose is
//! recorded with `Debug`, so that none can end the line and forge another.

use axum::extract::{OriginalUri, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;

use super::Operator;

/// Put in the extensions of every response of the resolution's handler,
/// which writes the audit line of its request itself: the guard writes one
/// only for a write whose response lacks it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Audited;

/// Marks `response` as audited by the handler that made it.
pub(super) fn audited(mut response: Response) -> Response {
    response.extensions_mut().insert(Audited);
    response
}

/// Whether a request asks to change something: any method but those that
/// only read.
pub(super) fn is_write(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// A header's value as sent, whatever its bytes; `""` when absent.
fn header_text(headers: &HeaderMap, name: header::HeaderName) -> String {
    headers
        .get(name)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// The path the request was asked by (where the console is nested too).
fn asked_path(request: &Request) -> String {
    match request.extensions().get::<OriginalUri>() {
        Some(OriginalUri(uri)) => uri.path().to_owned(),
        None => request.uri().path().to_owned(),
    }
}

/// The line of a write refused at the door (`why`), before anything of it
/// was read but its method, path and headers: nobody was let in, so the
/// operator is nobody; `connection` is what the serving code named it (the
/// `idem` command: how it would get in, and from where).
pub(super) fn refused_at_the_door(request: &Request, status: StatusCode, why: &str) {
    let connection = request
        .extensions()
        .get::<Operator>()
        .map(|Operator(name)| name.as_str());
    tracing::warn!(
        target: "idem::console::audit",
        operator = "nobody: not admitted",
        connection = ?connection,
        method = ?request.method().as_str(),
        path = ?asked_path(request),
        host = ?header_text(request.headers(), header::HOST),
        origin = ?header_text(request.headers(), header::ORIGIN),
        status = status.as_u16(),
        why,
        "write refused at the door"
    );
}

/// What the guard keeps of a write it let in, for the line it writes
/// should no handler write one.
pub(super) struct Attempt {
    who: String,
    method: String,
    path: String,
}

impl Attempt {
    pub(super) fn of(request: &Request, who: String) -> Attempt {
        Attempt {
            who,
            method: request.method().as_str().to_owned(),
            path: asked_path(request),
        }
    }

    /// Writes the line of this write unless the handler that answered it
    /// did (`response` carries [`Audited`]): no handler takes it (no such
    /// page, no write there), or its form could not be read.
    pub(super) fn unless_audited(self, response: &Response) {
        if response.extensions().get::<Audited>().is_some() {
            return;
        }
        let status = response.status();
        let why = match status {
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
                "no write is taken there: the one write is POST claim/resolve"
            }
            _ => "the request could not be read",
        };
        tracing::warn!(
            target: "idem::console::audit",
            operator = ?self.who,
            method = ?self.method,
            path = ?self.path,
            status = status.as_u16(),
            why,
            "write refused"
        );
    }
}
